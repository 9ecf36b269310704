"""A nanoGPT user's habits: GPT-2 weights (GPT.from_pretrained, nanoGPT's finetune and eval
configs unchanged, sample.py --init_from=gpt2), wandb offline, --help on every command line,
the Hub's failure messages and options of prepare_openwebtext.py, its summary, and the guard
that keeps every test from changing global state.

Offline throughout: the GPT-2 weights are a tiny randomly initialised GPT-2 written by
transformers itself (2 layers, width 16, GPT-2's vocabulary), placed in a temporary Hugging
Face cache under the names 'gpt2' and 'gpt2-xl' (the cache's own layout), and read with
HF_HUB_OFFLINE=1, so the real name resolution of transformers finds them there.
"""

import http.server
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig

pytestmark = pytest.mark.slow  # subprocesses: make test, not make test-fast
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SNAPSHOT = '0123456789abcdef0123456789abcdef01234567'  # the cache's commit folder name
TINY_CHAR = ['--device=cpu', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
             '--gradient_accumulation_steps=1', '--eval_iters=2', '--eval_interval=2', '--log_interval=100']


def run(args, env=None, check=True, timeout=300, **kw):
    e = {**os.environ, 'OMP_NUM_THREADS': '1', **(env or {})}
    r = subprocess.run([PY, *map(str, args)], cwd=ROOT, env={k: v for k, v in e.items() if v is not None},
                       capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


@pytest.fixture(scope='module')
def tiny_gpt2(tmp_path_factory):
    """(folder written by save_pretrained, a Hugging Face cache holding it as gpt2 and gpt2-xl)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    root = tmp_path_factory.mktemp('gpt2')
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=64, vocab_size=50257, initializer_range=0.2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    GPT2LMHeadModel(cfg).save_pretrained(root / 'folder')
    for name in ('gpt2', 'gpt2-xl'):
        repo = root / 'hub' / f'models--{name}'
        shutil.copytree(root / 'folder', repo / 'snapshots' / SNAPSHOT)
        (repo / 'refs').mkdir()
        (repo / 'refs' / 'main').write_text(SNAPSHOT)
    return root / 'folder', root / 'hub'


def hub_env(cache):
    return {'HF_HUB_CACHE': str(cache), 'HF_HUB_OFFLINE': '1'}


@pytest.fixture(scope='module')
def gpt2_data(tmp_path_factory):
    d = tmp_path_factory.mktemp('gpt2_data')
    rng = np.random.default_rng(0)
    rng.integers(0, 50257, 3000).astype(np.uint16).tofile(d / 'train.bin')
    rng.integers(0, 50257, 1000).astype(np.uint16).tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'gpt2', 'vocab_size': 50257}))
    return d


@pytest.fixture(scope='module')
def char_data(tmp_path_factory):
    d = tmp_path_factory.mktemp('char_data')
    rng = np.random.default_rng(0)
    itos = list('abcdefghijklmnop')
    rng.integers(0, 16, 3000).astype(np.uint16).tofile(d / 'train.bin')
    rng.integers(0, 16, 600).astype(np.uint16).tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16, 'itos': itos}))
    return d


# -- GPT-2 weights ---------------------------------------------------------------------

def test_from_pretrained_logits_equal_transformers(tiny_gpt2):
    from transformers import GPT2LMHeadModel
    folder, _ = tiny_gpt2
    theirs = GPT2LMHeadModel.from_pretrained(folder).eval()
    ours = GPT.from_pretrained(str(folder)).eval()
    assert ours.config.n_layer == 2 and ours.config.block_size == 64 and ours.config.vocab_size == 50257
    idx = torch.randint(0, 50257, (3, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(idx).logits
        logits, loss = ours(idx, idx)
    assert logits.abs().max() > 1  # large enough weights that a wrong detail would show
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert loss.item() == pytest.approx(F.cross_entropy(expected.view(-1, 50257), idx.view(-1)).item(), rel=1e-5)
    # the comparison can fail: the same weights with the exact GELU (not GPT-2's tanh one) differ
    exact = GPT(GPTConfig(**{**ours.config.__dict__, 'gelu': 'exact'})).eval()
    exact.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (exact(idx, idx)[0] - expected).abs().max() > 1e-3


def test_from_pretrained_allows_only_dropout(tiny_gpt2, tmp_path):
    folder, _ = tiny_gpt2
    assert GPT.from_pretrained(str(folder), {'dropout': 0.1}).config.dropout == 0.1
    with pytest.raises(ValueError, match='only dropout can be overridden, not n_layer'):
        GPT.from_pretrained(str(folder), {'n_layer': 3})
    other = tmp_path / 'relu'
    shutil.copytree(folder, other)
    cfg = json.loads((other / 'config.json').read_text())
    (other / 'config.json').write_text(json.dumps({**cfg, 'activation_function': 'relu'}))
    with pytest.raises(ValueError, match="activation_function='relu', which this GPT does not implement"):
        GPT.from_pretrained(str(other))


def fixed_windows_loss(model, split, batch_size, block_size, eval_iters):
    """train.py's evaluation, written again: the fixed windows (generator seed 0), mean loss."""
    offsets = torch.randint(len(split) - block_size, (eval_iters * batch_size,), generator=torch.Generator().manual_seed(0))
    x = torch.stack([torch.from_numpy(split[i:i + block_size].astype(np.int64)) for i in offsets])
    y = torch.stack([torch.from_numpy(split[i + 1:i + 1 + block_size].astype(np.int64)) for i in offsets])
    with torch.no_grad():
        return F.cross_entropy(model(x).logits.reshape(-1, 50257), y.reshape(-1)).item()


def test_nanogpt_eval_config_runs_unchanged_offline(tiny_gpt2, gpt2_data, tmp_path):
    """config/eval_gpt2.py (nanoGPT's values: init_from='gpt2', eval_only, batch 8) evaluates the
    weights the cache holds under 'gpt2'; the loss is transformers' own on the same windows.
    Only sizes are overridden (the tiny model's context is 64)."""
    from transformers import GPT2LMHeadModel
    folder, cache = tiny_gpt2
    out = tmp_path / 'out'
    r = run(['train.py', 'config/eval_gpt2.py', f'--data_dir={gpt2_data}', f'--out_dir={out}', '--device=cpu',
             '--block_size=32', '--eval_iters=2'], env=hub_env(cache))
    assert "Overriding config with config/eval_gpt2.py:" in r.stdout and "  init_from = 'gpt2'" in r.stdout
    step = [l for l in r.stdout.splitlines() if l.startswith('step ')]
    assert len(step) == 1 and step[0].startswith('step 0: ')
    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    val = np.memmap(gpt2_data / 'val.bin', dtype=np.uint16, mode='r')
    assert f"val loss {fixed_windows_loss(hf, val, 8, 32, 2):.4f}" in step[0]
    assert not out.exists()  # eval_only writes nothing, not even out_dir


def test_nanogpt_finetune_config_runs_unchanged_offline_then_resumes_and_samples(tiny_gpt2, gpt2_data, tmp_path):
    """config/finetune_shakespeare.py (init_from='gpt2-xl', constant lr 3e-5, ...) finetunes the
    cached weights; the run resumes from its own checkpoint and sample.py decodes it in GPT-2 tokens."""
    _, cache = tiny_gpt2
    out = tmp_path / 'ft'
    sizes = [f'--data_dir={gpt2_data}', f'--out_dir={out}', '--device=cpu', '--block_size=32', '--eval_iters=2',
             '--gradient_accumulation_steps=2', '--max_iters=2', '--always_save_checkpoint=True']
    r = run(['train.py', 'config/finetune_shakespeare.py', *sizes], env=hub_env(cache))
    assert "Overriding config with config/finetune_shakespeare.py:" in r.stdout
    assert "  init_from = 'gpt2-xl'" in r.stdout and "  learning_rate = 3e-05" in r.stdout
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == 2 and ckpt['model_args']['gelu'] == 'tanh' and ckpt['model_args']['bias'] is True
    assert ckpt['model_args']['n_embd'] == 16 and ckpt['model_args']['vocab_size'] == 50257
    r = run(['train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=4'], env=hub_env(cache))
    assert [rec['iter'] for rec in jsonl(out / 'train_log.jsonl')] == [0, 1, 2, 3]
    a = run(['sample.py', f'--out_dir={out}', '--start=Hello', '--max_new_tokens=5', '--device=cpu'])
    text = '\n'.join(l for l in a.stdout.splitlines() if not l.startswith('Overriding'))
    assert text.startswith('Hello') and text.endswith('\n---------------')


def test_sample_from_gpt2_name_equals_sampling_the_weights_here(tiny_gpt2):
    from nanohfa import tokenizer as tok
    folder, cache = tiny_gpt2
    r = run(['sample.py', '--init_from=gpt2', '--start=Hello', '--max_new_tokens=8', '--device=cpu'],
            env=hub_env(cache))
    model = GPT.from_pretrained(str(folder)).eval()
    enc = tok.GPT2Tokenizer()
    torch.manual_seed(1337)  # sample.py's default seed, temperature and top_k
    y = model.generate(torch.tensor([enc.encode('Hello')]), 8, temperature=0.8, top_k=200)
    assert enc.decode(y[0].tolist()) + '\n---------------\n' in r.stdout


def test_gpt2_name_offline_and_not_cached_is_one_line(tmp_path):
    r = run(['sample.py', '--init_from=gpt2-medium', '--device=cpu'], env=hub_env(tmp_path), check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: could not load GPT-2 weights 'gpt2-medium'") and 'offline:' in lines[0]


# -- wandb -----------------------------------------------------------------------------

def wandb_records(run_dir):
    """The records of a run's .wandb file (wandb's log format: 7-byte header, 32 KiB blocks of
    chunks with a 7-byte header each: crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb
    raw = next(Path(run_dir).glob('run-*.wandb')).read_bytes()
    assert raw[:4] == b':W&B'
    pos, block, out, buf = 7, 32768, [], b''
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack('<IHB', raw[pos:pos + 7])
        if n == 0 and kind == 0:  # padding to the end of the block
            pos += left
            continue
        buf = raw[pos + 7:pos + 7 + n] if kind in (1, 2) else buf + raw[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
    return out


def wandb_history(run_dir):
    return [{i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in wandb_records(run_dir) if r.WhichOneof('record_type') == 'history']


def test_wandb_offline_logs_nanogpt_keys_and_resume_continues_the_run(char_data, tmp_path):
    out, wdir = tmp_path / 'run', tmp_path / 'wb'
    wdir.mkdir()
    env = {'WANDB_MODE': 'offline', 'WANDB_DIR': str(wdir)}
    run(['train.py', *TINY_CHAR, f'--data_dir={char_data}', f'--out_dir={out}', '--max_iters=4', '--wandb_log=True',
         '--wandb_run_name=tiny'], env=env)
    run(['train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=6'], env=env)  # wandb_log from the ckpt
    runs = sorted((wdir / 'wandb').glob('offline-run-*'))
    assert len(runs) == 2
    run_id = torch.load(out / 'ckpt.pt', weights_only=True)['wandb_run_id']
    assert run_id and all(r.name.endswith(f'-{run_id}') for r in runs)  # one wandb run, continued
    meta = [r.run for d in runs for r in wandb_records(d) if r.WhichOneof('record_type') == 'run']
    assert [(m.run_id, m.display_name) for m in meta] == [(run_id, 'tiny')] * 2
    first, second = wandb_history(runs[0]), wandb_history(runs[1])
    assert [h['iter'] for h in first] == [0, 2, 4] and [h['iter'] for h in second] == [6]
    log = jsonl(out / 'log.jsonl')
    assert log[-1].get('mfu') is not None  # measured once training time exists (not at iteration 0)
    for h, rec in zip(first + second, log):
        nanogpt = {'iter', 'train/loss', 'val/loss', 'lr'} | ({'mfu'} if rec.get('mfu') is not None else set())
        assert nanogpt <= h.keys()
        if rec.get('mfu') is not None:
            assert h['mfu'] == pytest.approx(100 * rec['mfu'])  # nanoGPT logs it in percent
        assert (h['iter'], h['train/loss'], h['val/loss'], h['lr']) == (rec['iter'], rec['train_loss'],
                                                                        rec['val_loss'], rec['lr'])


def test_wandb_is_imported_only_when_asked(char_data, tmp_path):
    """A wandb that cannot be imported: runs without wandb_log never notice; with it, one line."""
    fake = tmp_path / 'fake'
    (fake / 'wandb').mkdir(parents=True)
    (fake / 'wandb' / '__init__.py').write_text("raise ImportError('this wandb cannot be imported')\n")
    env = {'PYTHONPATH': str(fake)}
    args = ['train.py', *TINY_CHAR, f'--data_dir={char_data}', f'--out_dir={tmp_path / "o"}', '--max_iters=2']
    run(args, env=env)
    r = run(args + ['--wandb_log=True'], env=env, check=False)
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: wandb_log=True needs the wandb package: pip install wandb (WANDB_MODE=offline logs without an account)")
    assert 'model:' not in r.stdout  # refused before the model is built


# -- every command line has --help ----------------------------------------------------------

COMMANDS = {c[-1]: c for c in (['train.py'], ['sample.py'], ['prepare_openwebtext.py'], ['prepare_shakespeare.py'],
                                ['compare.py'], ['bench.py'], ['eval.py'],
                                ['-m', 'experiments.colliding_agents'], ['-m', 'experiments.theory_limits'],
                                ['-m', 'experiments.beyond_pairwise'], ['-m', 'experiments.random_features'])}


@pytest.fixture(scope='module')
def helps():
    """Every command line's --help, started together (each spends seconds importing torch)."""
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = {name: subprocess.Popen([PY, *cmd, '--help'], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE) for name, cmd in COMMANDS.items()}
    return {name: (p.wait(300), *p.communicate()) for name, p in procs.items()}


@pytest.mark.parametrize('name', list(COMMANDS))
def test_every_command_line_has_help(helps, name):
    rc, out, err = helps[name]
    assert rc == 0 and out.startswith('usage:') and 'Traceback' not in err, err


# -- prepare_openwebtext.py: the Hub path ---------------------------------------------------

class _NotFound(http.server.SimpleHTTPRequestHandler):
    """A stand-in for the Hub that knows no dataset; remembers the paths asked for."""
    paths = []

    def do_GET(self):
        self.paths.append(self.path)
        self.send_error(404)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


NO_OFFLINE = {'HF_HUB_OFFLINE': None, 'HF_DATASETS_OFFLINE': None, 'TRANSFORMERS_OFFLINE': None,
              'HF_HUB_DISABLE_TELEMETRY': '1',  # and straight to the local stand-in, no proxy
              **{v: None for v in ('HTTPS_PROXY', 'https_proxy', 'HTTP_PROXY', 'http_proxy', 'ALL_PROXY', 'all_proxy')}}


def test_prepare_online_failure_says_online_and_passes_the_revision(tmp_path):
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**NO_OFFLINE, 'HF_ENDPOINT': f'http://127.0.0.1:{server.server_port}'}
        r = run(['prepare_openwebtext.py', f'--root={tmp_path}', '--hf_revision=refs/convert/parquet'],
                env=env, check=False)
    finally:
        server.shutdown()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "could not load 'Skylion007/openwebtext' (revision refs/convert/parquet)" in lines[0]
    assert "the Hub is reachable, so this is not a network problem" in lines[0] and 'offline' not in lines[0]
    assert any('refs%2Fconvert%2Fparquet' in p for p in _NotFound.paths), _NotFound.paths  # reached the Hub
    assert not any(tmp_path.iterdir())


def test_prepare_hf_config_picks_the_configuration(tmp_path):
    """A dataset folder with two configurations (README metadata, as on the Hub): --hf_config
    chooses which one is prepared; the summary is a table and names the next command."""
    ds = tmp_path / 'two_configs'
    ds.mkdir()
    small = [f"small document {i}." for i in range(10)]
    (ds / 'small.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in small))
    (ds / 'large.jsonl').write_text(''.join(json.dumps({'text': 'large document ' * 50}) + '\n' for _ in range(10)))
    (ds / 'README.md').write_text("---\nconfigs:\n- config_name: small\n  data_files: small.jsonl\n"
                                  "- config_name: large\n  data_files: large.jsonl\n---\n")
    r = run(['prepare_openwebtext.py', f'--hf_id={ds}', '--hf_config=small', '--tokenizer=char',
             f'--root={tmp_path / "data"}', '--name=picked', '--val_fraction=0.2'])
    meta = json.loads((tmp_path / 'data' / 'picked' / 'meta.json').read_text())
    assert meta['train_tokens'] + meta['val_tokens'] == sum(map(len, small))
    lines = r.stdout.splitlines()
    assert f"wrote {tmp_path / 'data' / 'picked'}:" in lines
    assert f"  tokenizer  char (vocabulary {meta['vocab_size']})" in lines
    assert f"  train      {meta['train_tokens']:>13,} tokens  (train.bin)" in lines
    assert lines[-1] == f"next: python train.py config/cpu_sa.py --data_dir={tmp_path / 'data' / 'picked'}"
    assert '{' not in r.stdout  # a table, not meta.json


# -- the guard in conftest.py ---------------------------------------------------------------

def test_guard_fails_a_test_that_changes_global_state(tmp_path):
    shutil.copy(ROOT / 'tests' / 'conftest.py', tmp_path / 'conftest.py')
    (tmp_path / 'test_leaky.py').write_text(
        "import os\nimport torch\n\n"
        "def test_dtype():\n    torch.set_default_dtype(torch.float64)\n\n"
        "def test_threads():\n    torch.set_num_threads(torch.get_num_threads() + 1)\n\n"
        "def test_env():\n    os.environ['NANOHFA_LEAK'] = '1'\n\n"
        "def test_clean():\n    torch.zeros(1)\n")
    r = run(['-m', 'pytest', '-q', '-p', 'no:cacheprovider', str(tmp_path)], check=False)
    assert r.returncode == 1, r.stdout
    summary = r.stdout.strip().splitlines()[-1]
    assert '4 passed, 3 errors' in summary, r.stdout
    for what in ('default dtype torch.float32 -> torch.float64', 'environment variables [\'NANOHFA_LEAK\']'):
        assert what in r.stdout
    # a test module that changes the dtype when imported (as one once did) stops the session
    (tmp_path / 'test_leaky.py').unlink()
    (tmp_path / 'test_import.py').write_text("import torch\ntorch.set_default_dtype(torch.float64)\n\n"
                                            "def test_nothing():\n    pass\n")
    r = run(['-m', 'pytest', '-q', '-p', 'no:cacheprovider', str(tmp_path)], check=False)
    assert r.returncode != 0 and 'passed' not in r.stdout
    assert 'importing the test modules changed global state: default dtype torch.float32 -> torch.float64' in r.stdout + r.stderr
