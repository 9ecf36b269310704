"""
The preflight (attention_kernels/preflight.py), on CPU: its children, timeout, comparison,
cache and dispatch are the code a GPU run uses; only the kernels are stand-ins. The test hook
NANOHFA_PREFLIGHT_ENTRIES names a file of fake Triton entries (FAKES below): one that aborts
the process, one that never returns, one that returns wrong numbers, one that raises as a
compile error, and a correct one that notes each call in a file (so a test can see whether a
child ran it), and ones that hang noting their process id (so a test can signal the child).
Each failure is one line and the run trains on PyTorch with the losses of a kernel='torch'
run; a verdict about the kernel is cached (no child the second time) until the kernel sources
change or `--forget` removes it; what the machine did (a slow import, a SIGKILL from outside)
is said and checked again next run; a cache folder that cannot be written is a warning; two
writers lose no verdict; a stop during the preflight leaves no child; under torchrun a failure
on one node sends every rank to PyTorch, and a preflight that cannot fit in ddp_timeout stops
the run; kernel='triton' stops with one line before anything is written.
"""

import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import attention_kernels
from nanohfa import tokenizer as tok
from attention_kernels import preflight
from nanohfa.errors import UserError
from model import GPTConfig, kernel_heads

ROOT = Path(__file__).resolve().parents[1]
TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n" * 40
TIMEOUT = 30  # kernel_preflight_timeout here: time for a real kernel in the interpreter on a loaded machine
HANG_TIMEOUT = 8  # where every entry is a fake that returns at once, or never: what the hang costs

FAKES = '''
import os, time
from attention_kernels import ha, hfa, linear

TORCH = {{'linear': linear.reference, 'hfa': hfa.lifted, 'ha': ha.blockwise}}  # the right numbers
MARK = {mark!r}
FOLDER = {folder!r}  # where the hanging entries note their process id: <family>.pid


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


def hang_noted(family):
    def entry(*args):  # the kernel is running: its process id out, then never a result
        with open(os.path.join(FOLDER, family + '.pid.tmp'), 'w') as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(FOLDER, family + '.pid.tmp'), os.path.join(FOLDER, family + '.pid'))
        time.sleep(3600)
    return entry


def hang_once(family):
    def entry(*args):  # the first child hangs (a test kills it from outside), later ones are right
        once = os.path.join(FOLDER, family + '.once')
        if not os.path.exists(once):
            open(once, 'w').close()
            hang_noted(family)(*args)
        return ok(family)(*args)
    return entry


ENTRIES = {{f: globals()[kind](f) for f, kind in {kinds!r}.items()}}
'''


def fakes(folder, **kinds):
    """A file of fake Triton entries, {family: kind}; the file where 'ok' entries note their calls."""
    path, mark = Path(folder) / 'fake_entries.py', Path(folder) / 'ran.txt'
    path.write_text(FAKES.format(mark=str(mark), folder=str(folder), kinds=kinds))
    return path, mark


def child_pid(folder, family, timeout=120):
    """The process id a hanging entry noted, once its child is running the kernel."""
    path = Path(folder) / f'{family}.pid'
    deadline = time.time() + timeout
    while not path.exists():
        assert time.time() < deadline, f"no child ran {family}'s entry within {timeout} s"
        time.sleep(0.05)
    return int(path.read_text())


def gone(pid, timeout=10):
    """The process has ended (no /proc entry, or a zombie: it holds nothing) within timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            state = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[0]
        except OSError:
            return True
        if state in ('Z', 'X'):
            return True
        time.sleep(0.05)
    return False


def check(cfg, timeout=TIMEOUT, **kw):
    """preflight.run for a GPTConfig, as train.py calls it (on CPU, with the fake entries)."""
    return preflight.run(kernel_heads(cfg), cfg.kernel, 'cpu', 'float32', 16, timeout, check=cfg.kernel_check, **kw)


def cached(folder):
    path = Path(folder) / 'preflight.json'
    return json.loads(path.read_text()) if path.exists() else {}


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
    assert line['linear'].endswith("the preflight's process died (SIGABRT) (cached in "
                                   f"{tmp_path / 'a' / 'cache' / 'preflight.json'}; python -m "
                                   f"attention_kernels.preflight --forget linear checks it again); using PyTorch for linear")
    assert line['hfa'].endswith(f"no result within {HANG_TIMEOUT} s in the preflight (a hang; if only slow, raise "
                                f"kernel_preflight_timeout, and under torchrun ddp_timeout with it) (cached in "
                                f"{tmp_path / 'a' / 'cache' / 'preflight.json'}; python -m attention_kernels.preflight "
                                f"--forget hfa checks it again); using PyTorch for hfa")
    assert line['ha'].startswith("nanoHFA: triton ha fwd (ha float32 dh=16 causal cpu sm_90 tiles ")
    assert line['ha'].endswith("disagrees with PyTorch in the preflight: out relative RMSE 1.0e-02 > 2.0e-04 (cached "
                               f"in {tmp_path / 'a' / 'cache' / 'preflight.json'}; python -m attention_kernels.preflight "
                               f"--forget ha checks it again); using PyTorch for ha")
    assert not preflight_lines(results['bad'][1])  # no family passed: nothing on stdout
    kernels = json.loads((tmp_path / 'bad' / 'run.json').read_text())['kernels']
    assert {f: k['path'] for f, k in kernels.items()} == {'linear': 'pytorch', 'hfa': 'pytorch', 'ha': 'pytorch'}
    assert {f: 'nanoHFA: ' + k['why'] for f, k in kernels.items()} == line
    table = cached(tmp_path / 'a' / 'cache')  # a crash, a hang and wrong numbers: verdicts about the kernel
    assert sorted(v['stage'] + ' ' + str(v['ok']) for v in table.values()) == ['fwd False'] * 3

    err = preflight_lines(results['mixed'][2])
    assert len(err) == 1 and err[0].startswith('nanoHFA: triton linear fwd (linear float32 dh=16 causal cpu ')
    assert err[0].endswith("raised in the preflight: RuntimeError: PassManager::run failed (cached in "
                           f"{tmp_path / 'b' / 'cache' / 'preflight.json'}; python -m attention_kernels.preflight "
                           f"--forget linear checks it again); using PyTorch for linear")
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
    monkeypatch.setenv('NANOHFA_CACHE', str(tmp_path / 'cache'))
    monkeypatch.setattr(attention_kernels, '_pytorch_for', {})
    return tmp_path


@pytest.mark.slow
def test_a_pass_is_cached_and_a_changed_kernel_source_checks_again(isolated, monkeypatch, capsys):
    entries, mark = fakes(isolated, ha='ok')
    monkeypatch.setenv(preflight.ENTRIES_ENV, str(entries))
    cfg = GPTConfig(n_layer=1, attention='ha', n_head=2, n_embd=32, block_size=16)
    first = check(cfg)
    assert first['ha']['path'] == 'triton' and runs(mark) == ['ha']
    assert 'passed the preflight (child start ' in capsys.readouterr().out

    again = check(cfg)
    assert again['ha']['path'] == 'triton' and runs(mark) == ['ha']  # no child started
    path = isolated / 'cache' / 'preflight.json'
    assert f"passed the preflight (cached {time.strftime('%Y-%m-%d')}" in capsys.readouterr().out
    table = json.loads(path.read_text())
    key, = table
    assert f"src {preflight.source_hash()} | {first['ha']['config']}" in key and table[key]['ok']

    assert check(GPTConfig(**{**cfg.__dict__, 'kernel_check': False})) == {}
    assert check(GPTConfig(**{**cfg.__dict__, 'kernel': 'torch'})) == {}
    assert runs(mark) == ['ha']  # kernel_check=False or kernel='torch': no preflight

    entries.write_text(entries.read_text() + '# the kernel source changed\n')
    check(cfg)
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


# -----------------------------------------------------------------------------
# what the machine does is not the kernel's: said, not cached, checked again

SLOW_SITE = '''
import os, sys, time
if '--child' in sys.argv and os.path.exists({flag!r}):  # a preflight child on a cold file system
    time.sleep(600)
'''


def one_family(attention='ha'):
    return GPTConfig(n_layer=1, attention=attention, n_head=2, n_embd=32, block_size=16)


@pytest.mark.slow
def test_a_slow_import_is_said_not_cached_and_checked_again(isolated, monkeypatch, capsys):
    """A child whose interpreter takes longer than preflight_import_timeout to start
    (sitecustomize sleeps in it, as imports on a cold network file system do) is the machine's
    doing: PyTorch for this run, nothing cached; the next run starts a child again."""
    entries, mark = fakes(isolated, ha='ok')
    site, flag = isolated / 'site', isolated / 'slow'
    site.mkdir()
    (site / 'sitecustomize.py').write_text(SLOW_SITE.format(flag=str(flag)))
    flag.touch()
    monkeypatch.setenv('PYTHONPATH', str(site))
    monkeypatch.setenv(preflight.ENTRIES_ENV, str(entries))
    first = check(one_family(), import_timeout=3)
    err = capsys.readouterr().err.strip().splitlines()
    assert first['ha']['path'] == 'pytorch' and len(err) == 1 and runs(mark) == []
    assert err[0].startswith('nanoHFA: triton ha start (ha float32 dh=16 causal cpu ')
    assert err[0].endswith("the preflight's process took more than 3 s to import torch and triton "
                           "(preflight_import_timeout): not the kernel's doing, so not cached: the next run "
                           "checks it again; using PyTorch for ha")
    assert cached(isolated / 'cache') == {}

    flag.unlink()  # the file system is warm now
    monkeypatch.setattr(attention_kernels, '_pytorch_for', {})  # a new run
    again = check(one_family())
    assert again['ha']['path'] == 'triton' and runs(mark) == ['ha'] and len(cached(isolated / 'cache')) == 1


@pytest.mark.slow
def test_a_sigkill_from_outside_is_not_the_kernels_verdict(isolated, monkeypatch, capsys):
    """The out-of-memory killer's SIGKILL reaches a child while its kernel runs: PyTorch for
    this run, the line says killed from outside, nothing cached; the next run (the same kernel
    source) starts a child again, which passes and is cached."""
    entries, mark = fakes(isolated, ha='hang_once')
    monkeypatch.setenv(preflight.ENTRIES_ENV, str(entries))
    killer = threading.Thread(target=lambda: os.kill(child_pid(isolated, 'ha'), signal.SIGKILL))
    killer.start()
    first = check(one_family(), timeout=300)  # the kill, not the timeout, ends it
    killer.join()
    err = capsys.readouterr().err.strip().splitlines()
    assert first['ha']['path'] == 'pytorch' and len(err) == 1
    assert err[0].startswith('nanoHFA: triton ha fwd (ha float32 dh=16 causal cpu ')
    assert err[0].endswith("the preflight's process was killed from outside (SIGKILL: out of memory?): not the "
                           "kernel's doing, so not cached: the next run checks it again; using PyTorch for ha")
    assert cached(isolated / 'cache') == {}

    monkeypatch.setattr(attention_kernels, '_pytorch_for', {})
    again = check(one_family())
    assert again['ha']['path'] == 'triton' and runs(mark) == ['ha'] and len(cached(isolated / 'cache')) == 1


@pytest.mark.slow
def test_a_kernel_failure_is_cached_until_forget_removes_it(isolated, monkeypatch, capsys):
    """A child that aborts while its kernel runs is the kernel's verdict: cached, and the line
    names the cache and how to check again; `--forget linear` removes it, and the next run
    starts a child."""
    entries, _ = fakes(isolated, linear='abort')
    monkeypatch.setenv(preflight.ENTRIES_ENV, str(entries))
    path = isolated / 'cache' / 'preflight.json'
    check(one_family('linear'))
    fresh = capsys.readouterr().err.strip()
    assert fresh.endswith(f"the preflight's process died (SIGABRT) (cached in {path}; python -m "
                          f"attention_kernels.preflight --forget linear checks it again); using PyTorch for linear")
    check(one_family('linear'))
    assert f"died (SIGABRT) (cached {time.strftime('%Y-%m-%d')}" in capsys.readouterr().err  # no child
    assert f"in {path}; python -m attention_kernels.preflight --forget linear checks it again)" in fresh

    r = subprocess.run([sys.executable, '-m', 'attention_kernels.preflight', '--forget', 'linear'], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == (f"1 cached verdict(s) of 'linear' removed from {path}; the next "
                                                      f"run checks again"), r.stderr
    assert cached(isolated / 'cache') == {}
    check(one_family('linear'))
    assert f"died (SIGABRT) (cached in {path};" in capsys.readouterr().err  # a child again


# -----------------------------------------------------------------------------
# the cache folder: unwritable, shared by writers at once

def private_mount_prefix():
    """A command prefix that runs its command in a mount namespace of its own, where a tmpfs
    can be mounted (root; else a user namespace), or None where neither is possible."""
    prefix = ['unshare', '--mount'] if os.geteuid() == 0 else ['unshare', '--user', '--map-root-user', '--mount']
    if not shutil.which('unshare') or subprocess.run([*prefix, 'true'], capture_output=True).returncode:
        return None
    return prefix


MOUNT = {'read-only': 'mount -t tmpfs -o ro,size=64k tmpfs "$0"',
         'full': 'mount -t tmpfs -o size=64k tmpfs "$0" && { cat /dev/zero > "$0/fill" 2>/dev/null; true; }'}


@pytest.mark.slow
def test_a_read_only_or_full_cache_folder_is_a_warning_and_the_run_trains(char_data, tmp_path):
    """train.py with NANOHFA_CACHE on a read-only filesystem, and on a full one (tmpfs mounts in
    a mount namespace of the run's own): the preflight passes, its verdict cannot be cached,
    one warning says so, and the run trains on Triton."""
    prefix = private_mount_prefix()
    if prefix is None:
        pytest.skip('needs unshare and a mount namespace (root, or user namespaces)')
    entries, _ = fakes(tmp_path, ha='ok')
    procs = {}
    for kind, mount in MOUNT.items():
        cache = tmp_path / f'cache_{kind}'
        cache.mkdir()
        e = {**env(tmp_path, entries), 'NANOHFA_CACHE': str(cache)}
        args = train_args(char_data, tmp_path / f'out_{kind}', n_layer=1, attn_layers='', attention='ha', max_iters=2,
                          eval_interval=2)
        procs[kind] = subprocess.Popen([*prefix, 'sh', '-c', f'{mount} && exec "$@"', str(cache), sys.executable,
                                        *args], cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
    for kind, proc in procs.items():
        rc, out, err = finish(proc)
        cache = tmp_path / f'cache_{kind}'
        assert rc == 0, err[-3000:]
        why = 'Read-only file system' if kind == 'read-only' else 'No space left on device'
        warnings = [x for x in err.splitlines() if 'warning' in x]
        assert warnings == [f"nanoHFA: warning: the kernel preflight's verdicts cannot be cached in {cache}/"
                            f"preflight.json ({why}); they are checked again next run (NANOHFA_CACHE names "
                            f"another folder)"], err[-3000:]
        assert 'passed the preflight (child start ' in out
        assert json.loads((tmp_path / f'out_{kind}' / 'run.json').read_text())['kernels']['ha']['path'] == 'triton'
        assert not (cache / 'preflight.json').exists()  # the mount is gone with the run: the folder as it was


def test_the_cache_is_the_users_outside_the_checkout_by_default(monkeypatch, tmp_path):
    """NANOHFA_CACHE if set; else $XDG_CACHE_HOME/nanohfa; else ~/.cache/nanohfa: never the
    checkout, which the nodes of a cluster share."""
    monkeypatch.setenv('NANOHFA_CACHE', str(tmp_path / 'mine'))
    assert preflight.cache_path() == tmp_path / 'mine' / 'preflight.json'
    monkeypatch.delenv('NANOHFA_CACHE')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert preflight.cache_path() == tmp_path / 'xdg' / 'nanohfa' / 'preflight.json'
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert preflight.cache_path() == tmp_path / 'home' / '.cache' / 'nanohfa' / 'preflight.json'
    assert ROOT not in preflight.cache_path().parents


WRITER = '''
import os, sys, time
from pathlib import Path
from attention_kernels import preflight
path, me, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
while not go.exists():  # every writer starts at once
    time.sleep(0.01)
for i in range(40):
    assert preflight._write_cache(path, {f'{me} {i}': {'ok': True}})
print(os.getpid())
'''


@pytest.mark.slow
def test_two_writers_at_once_lose_no_verdict(tmp_path):
    """Two processes add 40 verdicts each to one cache file at once, each as process 1 of a pid
    namespace of its own where one can be made (two nodes sharing a home folder can share a
    pid): every verdict is there, no writer fails, no temporary file is left."""
    pidns = ['unshare', '--pid', '--fork'] if os.geteuid() == 0 and shutil.which('unshare') else []
    path, go = tmp_path / 'cache' / 'preflight.json', tmp_path / 'go'
    procs = [subprocess.Popen([*pidns, sys.executable, '-c', WRITER, str(path), name, str(go)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ('a', 'b')]
    time.sleep(1)
    go.touch()
    results = [finish(p, timeout=120) for p in procs]
    assert all(rc == 0 for rc, _, _ in results), [err[-2000:] for _, _, err in results]
    if pidns:
        assert [out.strip() for _, out, _ in results] == ['1', '1']  # the same pid in both
    assert sorted(json.loads(path.read_text())) == sorted(f'{w} {i}' for w in 'ab' for i in range(40))
    assert sorted(p.name for p in path.parent.iterdir()) == ['preflight.json', 'preflight.json.lock']


# -----------------------------------------------------------------------------
# a stop during the preflight; its budget under torchrun; the package knows no model

@pytest.mark.slow
def test_a_stop_during_the_preflight_leaves_no_child(char_data, tmp_path):
    """SIGTERM to train.py while its preflight child runs a kernel: the child is killed, train.py
    says so in one line and ends by SIGTERM, nothing written. SIGKILL to train.py (no handler
    runs): the child dies with it."""
    procs, folders = {}, {}
    for sig in ('SIGTERM', 'SIGKILL'):
        folders[sig] = tmp_path / sig
        folders[sig].mkdir()
        entries, _ = fakes(folders[sig], ha='hang_noted')
        procs[sig] = start(train_args(char_data, tmp_path / f'out_{sig}', n_layer=1, attn_layers='', attention='ha',
                                      kernel_preflight_timeout=300), env(folders[sig], entries))
    for sig, proc in procs.items():
        child = child_pid(folders[sig], 'ha')
        proc.send_signal(getattr(signal, sig))
        rc, out, err = finish(proc, timeout=60)
        assert rc == -getattr(signal, sig), err[-3000:]
        assert gone(child), f"the preflight's child {child} outlived train.py ({sig})"
        assert not (tmp_path / f'out_{sig}').exists()
        if sig == 'SIGTERM':
            assert preflight_lines(err) == [] and 'Traceback' not in err
            assert err.strip().splitlines()[-1] == ("nanoHFA: SIGTERM during the kernel preflight: its 1 child "
                                                    "process(es) stopped, nothing written")


def test_a_preflight_that_cannot_fit_in_ddp_timeout_stops_before_any_child(isolated, monkeypatch):
    """Under torchrun the other ranks wait for the preflight at most ddp_timeout: both budgets
    and the margin past it stop the run with one line, on every rank, before any child."""
    entries, mark = fakes(isolated, ha='ok')
    monkeypatch.setenv(preflight.ENTRIES_ENV, str(entries))
    for local_rank in (0, 1):
        with pytest.raises(UserError) as e:
            check(one_family(), timeout=500, import_timeout=120, ddp_timeout=600, local_rank=local_rank)
        assert str(e.value) == ("preflight_import_timeout=120 s + kernel_preflight_timeout=500 s (+ 30 s) "
                                "exceed ddp_timeout=600 s: under torchrun the other ranks would stop waiting for the "
                                "preflight; raise ddp_timeout to at least 650 or lower the preflight's timeouts")
    assert check(one_family(), timeout=450, import_timeout=120, ddp_timeout=600, local_rank=1) == \
        {'ha': {'path': None, 'why': 'checked by local rank 0'}}  # it fits: the other ranks wait
    assert runs(mark) == [] and not (isolated / 'cache').exists()


def project_modules():
    return {p.stem for p in ROOT.glob('*.py')} | {'nanohfa'}


def test_the_kernel_package_imports_nothing_of_the_model():
    """attention_kernels/ imports no module of the project outside itself (model.py, the
    tokenizer, ...), at the top of a file or inside a function; errors.UserError alone, for
    its one-line stop. The model gives the preflight its heads (model.kernel_heads)."""
    found = []
    for path in sorted((ROOT / 'attention_kernels').rglob('*.py')):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found += [(path.relative_to(ROOT).as_posix(), n) for n in names
                      if n.split('.')[0] in project_modules() and n != 'nanohfa.errors']
    assert found == []


def test_kernel_heads_give_the_preflight_the_models_families():
    cfg = GPTConfig(n_layer=3, attn_layers='sa,hfa_v2,ha', n_head=4, n_embd=64, hfa_order=3, n_hfa_head=2,
                    ha_window1=8, ha_window2=4, ha_share_kv=True)
    heads = kernel_heads(cfg)
    assert [(h['family'], h['heads'], h['factors']) for h in heads] == [('sa', 4, 1), ('sa', 2, 1), ('hfa', 2, 3),
                                                                        ('ha', 4, 1)]
    assert heads[3]['windows'] == [8, 4] and heads[3]['shared'] and heads[2]['head_size'] == 16
    assert json.loads(json.dumps(heads)) == heads  # plain data
