"""
The preflight (attention_kernels/preflight.py), on CPU: its children, timeout, comparison,
cache and dispatch are the code a GPU run uses; only the kernels are stand-ins. The test hook
NANOHFA_PREFLIGHT_ENTRIES names a file of fake Triton entries (FAKES below): one that aborts
the process, one that never returns, one that returns wrong numbers, one that raises as a
compile error, and a correct one that notes each call in a file (so a test can see whether a
child ran it). Each failure is one line and the run trains on PyTorch with the losses of a
kernel='torch' run; a pass is cached (no child the second time) until the kernel sources
change; under torchrun a failure on one node sends every rank to PyTorch; kernel='triton'
stops with one line before anything is written.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import attention_kernels
import tokenizer as tok
from attention_kernels import preflight
from model import GPTConfig

ROOT = Path(__file__).resolve().parents[1]
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40
TIMEOUT = 30  # kernel_preflight_timeout here: time for a real kernel in the interpreter on a loaded machine
HANG_TIMEOUT = 8  # where every entry is a fake that returns at once, or never: what the hang costs

FAKES = '''
import os, time
from attention_kernels import ha, hfa, linear

TORCH = {{'linear': linear.reference, 'hfa': hfa.lifted, 'ha': ha.blockwise}}  # the right numbers
MARK = {mark!r}


def abort(family):
    return lambda *args: os.abort()


def hang(family):
    return lambda *args: time.sleep(3600)


def wrong(family):
    return lambda *args: TORCH[family](*args) * 1.01


def compile_error(family):
    def entry(*args):
        raise RuntimeError("PassManager::run failed")  # what a Triton compile that fails in MLIR raises
    return entry


def illegal_access(family):
    def entry(*args):  # what torch raises after a kernel's illegal memory access
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return entry


def ok(family):
    def entry(*args):
        with open(MARK, 'a') as f:  # a child ran this entry
            f.write(family + '\\n')
        return TORCH[family](*args)
    return entry


ENTRIES = {{f: globals()[kind](f) for f, kind in {kinds!r}.items()}}
'''


def fakes(folder, **kinds):
    """A file of fake Triton entries, {family: kind}; the file where 'ok' entries note their calls."""
    path, mark = Path(folder) / 'fake_entries.py', Path(folder) / 'ran.txt'
    path.write_text(FAKES.format(mark=str(mark), kinds=kinds))
    return path, mark


def runs(mark):
    return mark.read_text().split() if mark.exists() else []


@pytest.fixture(scope='module')
def char_data(tmp_path_factory):
    import numpy as np
    d = tmp_path_factory.mktemp('preflight_char')
    enc = tok.CharTokenizer.from_text([TEXT])
    ids = np.array(enc.encode(TEXT), dtype=np.uint16)
    ids[:3000].tofile(d / 'train.bin')
    ids[3000:].tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps(enc.meta()))
    return d


def train_args(data_dir, out_dir, **kw):
    cfg = dict(data_dir=data_dir, out_dir=out_dir, device='cpu', n_layer=3, attn_layers='linear,hfa_v1,ha',
               n_head=2, n_embd=32, block_size=16, batch_size=4, max_iters=3, lr_decay_iters=3, warmup_iters=1,
               eval_interval=3, eval_iters=2, log_interval=1, dropout=0.0, gradient_accumulation_steps=2,
               peak_flops=1e12, kernel_preflight_timeout=TIMEOUT)
    cfg.update(kw)
    return ['train.py'] + [f'--{k}={v}' for k, v in cfg.items()]


def env(tmp, entries=None):
    """The subprocess's environment: its own cache folder, and the fake entries if given."""
    e = {**os.environ, 'NANOHFA_CACHE': str(tmp / 'cache'), 'OMP_NUM_THREADS': '1'}
    if entries:
        e[preflight.ENTRIES_ENV] = str(entries)
    return e


def start(args, e, launcher=()):
    return subprocess.Popen([sys.executable, *launcher, *args], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def losses(out_dir):
    train = [json.loads(x)['loss'] for x in (out_dir / 'train_log.jsonl').read_text().splitlines()]
    val = [json.loads(x)['val_loss'] for x in (out_dir / 'log.jsonl').read_text().splitlines()]
    return train, val


def preflight_lines(text):
    return [x for x in text.splitlines() if ' the preflight' in x]


@pytest.mark.slow
def test_each_failure_is_one_line_and_training_goes_on_with_pytorch(char_data, tmp_path):
    """Three runs at once: kernel='torch'; kernel='auto' with linear aborting, HFA never
    returning and HA wrong; kernel='auto' with linear raising at compile, HFA's real Triton
    kernel (the interpreter) and a correct HA."""
    for d in ('a', 'b'):
        (tmp_path / d).mkdir()
    bad, _ = fakes(tmp_path / 'a', linear='abort', hfa='hang', ha='wrong')
    mixed, mark = fakes(tmp_path / 'b', linear='compile_error', ha='ok')
    procs = {'torch': start(train_args(char_data, tmp_path / 'torch', kernel='torch'), env(tmp_path / 'a', bad)),
             'bad': start(train_args(char_data, tmp_path / 'bad', kernel_preflight_timeout=HANG_TIMEOUT),
                          env(tmp_path / 'a', bad)),
             'mixed': start(train_args(char_data, tmp_path / 'mixed'), env(tmp_path / 'b', mixed))}
    results = {k: finish(p) for k, p in procs.items()}
    for name, (rc, out, err) in results.items():
        assert rc == 0, f"{name}:\n{out[-2000:]}\n{err[-3000:]}"
    assert not preflight_lines(results['torch'][1] + results['torch'][2])  # kernel='torch': no preflight

    err = preflight_lines(results['bad'][2])
    assert len(err) == 3, results['bad'][2]
    line = {f: next(x for x in err if x.startswith(f"nanoHFA: triton {f} ")) for f in ('linear', 'hfa', 'ha')}
    assert line['linear'].endswith("the preflight's process died (SIGABRT); using PyTorch for linear")
    assert line['hfa'].endswith(f"no result within {HANG_TIMEOUT} s in the preflight (a hang, or raise "
                                f"kernel_preflight_timeout); using PyTorch for hfa")
    assert line['ha'].startswith("nanoHFA: triton ha fwd (ha float32 dh=16 causal cpu sm_90 tiles ")
    assert "disagrees with PyTorch in the preflight: out relative RMSE 1.0e-02 > 2.0e-04; using PyTorch for ha" \
        in line['ha']
    assert not preflight_lines(results['bad'][1])  # no family passed: nothing on stdout
    kernels = json.loads((tmp_path / 'bad' / 'run.json').read_text())['kernels']
    assert {f: k['path'] for f, k in kernels.items()} == {'linear': 'pytorch', 'hfa': 'pytorch', 'ha': 'pytorch'}
    assert {f: 'nanoHFA: ' + k['why'] for f, k in kernels.items()} == line

    err = preflight_lines(results['mixed'][2])
    assert len(err) == 1 and err[0].startswith('nanoHFA: triton linear fwd (linear float32 dh=16 causal cpu ')
    assert err[0].endswith("raised in the preflight: RuntimeError: PassManager::run failed; using PyTorch for linear")
    passed = preflight_lines(results['mixed'][1])
    assert len(passed) == 2 and all('passed the preflight (child start ' in x for x in passed)
    assert [x.split()[1] for x in passed] == ['hfa', 'ha'] and runs(mark) == ['ha']  # the fake ran in a child
    kernels = json.loads((tmp_path / 'mixed' / 'run.json').read_text())['kernels']
    assert {f: k['path'] for f, k in kernels.items()} == {'linear': 'pytorch', 'hfa': 'triton', 'ha': 'triton'}

    want = losses(tmp_path / 'torch')
    assert losses(tmp_path / 'bad') == want and losses(tmp_path / 'mixed') == want  # exactly: the same path


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """preflight.run in this process: its own cache folder, and no family sent to PyTorch
    before or after the test."""
    monkeypatch.setattr(tok, 'CACHE', tmp_path / 'cache')
    monkeypatch.setattr(attention_kernels, '_pytorch_for', {})
    return tmp_path


@pytest.mark.slow
def test_a_pass_is_cached_and_a_changed_kernel_source_checks_again(isolated, monkeypatch, capsys):
    entries, mark = fakes(isolated, ha='ok')
    monkeypatch.setenv(preflight.ENTRIES_ENV, str(entries))
    cfg = GPTConfig(n_layer=1, attention='ha', n_head=2, n_embd=32, block_size=16)
    first = preflight.run(cfg, 'cpu', 'float32', 16, TIMEOUT)
    assert first['ha']['path'] == 'triton' and runs(mark) == ['ha']
    assert 'passed the preflight (child start ' in capsys.readouterr().out

    again = preflight.run(cfg, 'cpu', 'float32', 16, TIMEOUT)
    assert again['ha']['path'] == 'triton' and runs(mark) == ['ha']  # no child started
    assert f"passed the preflight (cached " in capsys.readouterr().out
    table = json.loads((isolated / 'cache' / 'preflight.json').read_text())
    key, = table
    assert f"src {preflight.source_hash()} | {first['ha']['config']}" in key and table[key]['ok']

    assert preflight.run(GPTConfig(**{**cfg.__dict__, 'kernel_check': False}), 'cpu', 'float32', 16) == {}
    assert preflight.run(GPTConfig(**{**cfg.__dict__, 'kernel': 'torch'}), 'cpu', 'float32', 16) == {}
    assert runs(mark) == ['ha']  # kernel_check=False or kernel='torch': no preflight

    entries.write_text(entries.read_text() + '# the kernel source changed\n')
    preflight.run(cfg, 'cpu', 'float32', 16, TIMEOUT)
    assert runs(mark) == ['ha', 'ha'] and len(json.loads((isolated / 'cache' / 'preflight.json').read_text())) == 2
    assert not attention_kernels._pytorch_for


def test_a_family_the_preflight_failed_is_computed_by_pytorch(monkeypatch):
    """dispatch's side: kernel='auto' sends the family to PyTorch on CUDA, the others keep
    Triton; kernel='triton' is not changed (a run with it has stopped before)."""
    import torch
    monkeypatch.setattr(attention_kernels, '_pytorch_for', {})
    route = attention_kernels.route
    before = [route('auto', f, torch.bfloat16, 'cuda') for f in ('ha', 'hfa')]
    attention_kernels.use_pytorch('ha', 'triton ha fwd (...): ...; using PyTorch for ha')
    assert before == ['triton', 'triton']
    assert route('auto', 'ha', torch.bfloat16, 'cuda') == 'torch_blockwise'
    assert route('auto', 'hfa', torch.bfloat16, 'cuda') == before[1]
    assert route('triton', 'ha', torch.bfloat16, 'cuda') == before[0]


@pytest.mark.slow
def test_kernel_triton_stops_with_one_line_before_writing_anything(char_data, tmp_path):
    entries, _ = fakes(tmp_path, linear='wrong')
    out = tmp_path / 'out'
    rc, stdout, stderr = finish(start(train_args(char_data, out, kernel='triton', n_layer=1, attn_layers='',
                                                 attention='linear'), env(tmp_path, entries)))
    assert rc == 2, stderr
    errors = [x for x in stderr.splitlines() if x.startswith('error:')]
    assert len(errors) == 1 and errors[0].startswith('error: triton linear fwd (linear float32 dh=16 causal cpu ')
    assert errors[0].endswith("; kernel='triton' stops here (kernel='auto' would use PyTorch for linear)")
    assert 'disagrees with PyTorch in the preflight: out relative RMSE' in errors[0]
    assert 'Traceback' not in stderr and not out.exists()


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_under_torchrun_a_failure_on_one_node_sends_every_rank_to_pytorch(char_data, tmp_path):
    """Two nodes of one process each (two torchrun agents, gloo): each node's local rank 0
    runs the preflight; HA passes on node 0 and disagrees on node 1, so both ranks use PyTorch."""
    port, out = free_port(), tmp_path / 'out'
    procs = []
    for node, kind in enumerate(('ok', 'wrong')):
        (tmp_path / str(node)).mkdir()
        entries, _ = fakes(tmp_path / str(node), ha=kind)
        launcher = ['-m', 'torch.distributed.run', '--nnodes=2', f'--node_rank={node}', '--nproc_per_node=1',
                    '--master_addr=127.0.0.1', f'--master_port={port}']
        procs.append(start(train_args(char_data, out, n_layer=1, attn_layers='', attention='ha', max_iters=2,
                                      eval_interval=2), env(tmp_path / str(node), entries), launcher))
    (rc0, out0, err0), (rc1, out1, err1) = [finish(p) for p in procs]
    assert rc0 == 0 and rc1 == 0, err0[-3000:] + err1[-3000:]
    assert 'passed the preflight' in out0
    assert preflight_lines(err0) == ["nanoHFA: triton ha failed the preflight on another node; using PyTorch for ha"]
    assert len(preflight_lines(err1)) == 1 and 'disagrees with PyTorch in the preflight' in err1
    kernels = json.loads((out / 'run.json').read_text())['kernels']  # rank 0's record
    assert kernels['ha']['path'] == 'pytorch'
    assert kernels['ha']['why'] == "triton ha failed the preflight on another node; using PyTorch for ha"


@pytest.mark.slow
def test_gpu_check_reports_every_verdict_a_crash_included(tmp_path):
    """tools/gpu_check.sh's preflight (`python -m attention_kernels.preflight --report`): a
    child that aborts, one that meets an illegal memory access and one that hangs are three
    verdicts in the file, and the script exits 0 (what failed is the kernel, not the report)."""
    entries, _ = fakes(tmp_path, linear='abort', hfa='illegal_access', ha='hang')
    out = tmp_path / 'preflight.json'
    rc, stdout, stderr = finish(start(['-m', 'attention_kernels.preflight', '--report', str(out), '--timeout', '3',
                                       '--device', 'cpu', '--T', '16', '--dh', '16', '--dtype', 'float32'],
                                      env(tmp_path, entries)))
    assert rc == 0, stderr
    recs = {r['case']: r for r in json.loads(out.read_text())}
    assert [json.loads(x)['case'] for x in stdout.splitlines()] == list(recs) == ['linear dh=16', 'hfa dh=16',
                                                                                  'ha dh=16']
    assert recs['linear dh=16']['verdict'] == "the preflight's process died (SIGABRT)"
    assert recs['hfa dh=16']['verdict'] == 'illegal memory access in the preflight (CUDA error 700)'
    assert recs['ha dh=16']['verdict'].startswith('no result within 3 s in the preflight')
    assert recs['ha dh=16']['config'].startswith('ha float32 dh=16 causal window cpu sm_90 tiles ')
