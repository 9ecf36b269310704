"""
Reliability of train.py / sample.py under faults: exact resume after SIGKILL, atomic
checkpoints (crash mid-save), keep_last, SIGTERM/SIGINT, the NaN/inf guard, safe loading of
checkpoints and meta.pkl, and DDP (torchrun, gloo) under SIGTERM and the death of a rank.

Each train.py run is a subprocess on a tiny character dataset (a 1-layer, 32-wide GPT).
Subprocesses start torch slowly on a loaded machine, so independent runs are launched
together and awaited together (two phases for the single-process faults, one for DDP).
Faults at a precise point run train.py under tests/train_hooks.py with
NANOHFA_TEST_DIE_AT=ITER[:RANK[:WHERE]]: hooks installed from outside, train.py has none.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow  # subprocesses: make test, not make test-fast
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
ITOS = list("abcdefghijklmnop")
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--device=cpu', '--eval_iters=2', '--eval_interval=4',
        '--warmup_iters=2', '--lr_decay_iters=12', '--learning_rate=1e-2', '--log_interval=1000',
        '--dropout=0.1']  # dropout > 0: exact resume must also restore the torch RNG
EVAL_KEYS = ('iter', 'train_loss', 'val_loss', 'val_ppl', 'lr', 'tokens', 'skipped_steps', 'params')


def make_data(folder, itos=ITOS, n_train=3000, n_val=600, seed=0):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rng.integers(0, len(itos), n_train).astype(np.uint16).tofile(folder / 'train.bin')
    rng.integers(0, len(itos), n_val).astype(np.uint16).tofile(folder / 'val.bin')
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': len(itos), 'itos': itos}))
    return folder


def env(**extra):
    e = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    e.pop('NANOHFA_TEST_DIE_AT', None)
    e.update(extra)
    return e


def hooked(script, extra_env):
    """The script, under tests/train_hooks.py when a fault is to be injected."""
    return ['tests/train_hooks.py', script] if 'NANOHFA_TEST_DIE_AT' in extra_env else [script]


def start(args, log, script='train.py', **extra_env):
    """Popen of a script in the repository, stdout+stderr to the file `log`."""
    f = open(log, 'w')
    return subprocess.Popen([PY, *hooked(script, extra_env), *map(str, args)], cwd=ROOT, env=env(**extra_env),
                            stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def wait(p, timeout=300):
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise


def train_args(data, out, max_iters=12, *more):
    return [*TINY, f'--data_dir={data}', f'--out_dir={out}', f'--max_iters={max_iters}', *more]


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def load(path):
    return torch.load(path, map_location='cpu', weights_only=True)


def wait_for_lines(path, n, proc, timeout=240):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before {n} training steps"
        time.sleep(0.05)
    raise AssertionError(f"no {n} lines in {path} after {timeout}s")


# -----------------------------------------------------------------------------
# single process: every run of both phases, launched together

@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('rel')
    data = make_data(tmp / 'data')
    o = {k: tmp / k for k in ('ref', 'kill', 'save', 'term', 'sigterm', 'sigint')}
    logs = {k: tmp / f'{k}.log' for k in o}
    # phase 1
    p = {
        'ref': start(train_args(data, o['ref'], 12, '--keep_last=2'), logs['ref']),
        'kill': start(train_args(data, o['kill'], 12), logs['kill'], NANOHFA_TEST_DIE_AT='10'),
        'save': start(train_args(data, o['save'], 12), logs['save'], NANOHFA_TEST_DIE_AT='8:0:save'),
        # SIGTERM during step 7: stops at iteration 8, an evaluation iteration not yet evaluated
        'term': start(train_args(data, o['term'], 12), logs['term'], NANOHFA_TEST_DIE_AT='7:0:term'),
        'sigterm': start(train_args(data, o['sigterm'], 100000), logs['sigterm']),
        'sigint': start(train_args(data, o['sigint'], 100000), logs['sigint']),
    }
    for k, sig in (('sigterm', signal.SIGTERM), ('sigint', signal.SIGINT)):
        wait_for_lines(o[k] / 'train_log.jsonl', 3, p[k])
        os.kill(p[k].pid, sig)
    r = {k: wait(v) for k, v in p.items()}
    # what the crashes left on disk, before any resume touches it
    state = {
        'kill_ckpt_iter': load(o['kill'] / 'ckpt.pt')['iter_num'],
        'save_ckpt_iter': load(o['save'] / 'ckpt.pt')['iter_num'],
        'save_tmp_size': (o['save'] / 'ckpt.pt.tmp').stat().st_size if (o['save'] / 'ckpt.pt.tmp').exists() else None,
        'sig_ckpt': {k: load(o[k] / 'ckpt.pt')['iter_num'] for k in ('sigterm', 'sigint') if (o[k] / 'ckpt.pt').exists()},
        'sig_steps': {k: len(jsonl(o[k] / 'train_log.jsonl')) for k in ('sigterm', 'sigint')},
        'logs1': {k: v.read_text() for k, v in logs.items()},
    }
    # phase 2: resumes, the NaN guard from ref's final checkpoint, unsafe pickles
    for k in ('nan', 'skip'):
        shutil.copytree(o['ref'], tmp / k)
    nan_ckpt = tmp / 'nan' / 'ckpt.pt'
    state['nan_ckpt_before'] = (nan_ckpt.read_bytes(), nan_ckpt.stat().st_mtime_ns)
    evil = tmp / 'evil'
    evil.mkdir()
    marker = tmp / 'pwned'
    torch.save({'model': Evil(f'touch {marker}')}, evil / 'ckpt.pt')
    evil_data = make_data(tmp / 'evil_data')
    (evil_data / 'meta.json').unlink()
    (evil_data / 'meta.pkl').write_bytes(__import__('pickle').dumps(
        {'vocab_size': 16, 'itos': dict(enumerate(ITOS)), 'x': Evil(f'touch {marker}')}))
    resume = ['--init_from=resume']
    phase2 = {
        'kill2': (train_args(data, o['kill'], 12, *resume), {}),
        'save2': (train_args(data, o['save'], 12, *resume), {}),
        'term2': (train_args(data, o['term'], 12, *resume), {}),
        'sigterm2': (train_args(data, o['sigterm'], state['sig_steps']['sigterm'] + 2, *resume), {}),
        'nan': (train_args(data, tmp / 'nan', 16, *resume, '--learning_rate=1e30', '--decay_lr=False'), {}),
        'skip': (train_args(data, tmp / 'skip', 16, *resume, '--learning_rate=1e30', '--decay_lr=False',
                            '--skip_nonfinite=True', '--log_interval=1'), {}),
        'evil_train': (train_args(data, evil, 12, *resume), {}),
        'evil_meta': (train_args(evil_data, tmp / 'evil_meta_out', 12), {}),
    }
    p2 = {k: start(a, tmp / f'{k}.log', **e) for k, (a, e) in phase2.items()}
    p2['evil_sample'] = start([f'--out_dir={evil}', '--device=cpu', '--max_new_tokens=2'],
                              tmp / 'evil_sample.log', script='sample.py')
    r.update({k: wait(v) for k, v in p2.items()})
    state['logs2'] = {k: (tmp / f'{k}.log').read_text() for k in p2}
    return {'out': o, 'rc': r, 'tmp': tmp, 'marker': marker, **state}


class Evil:
    """Pickles as a call to os.system: loading it with plain pickle would run a shell command."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return os.system, (self.cmd,)


def losses(out):
    return [(r['iter'], r['loss'], r['lr']) for r in jsonl(out / 'train_log.jsonl')]


def evals(out):
    return [tuple(r[k] for k in EVAL_KEYS) for r in jsonl(out / 'log.jsonl')]


def test_reference_run(runs):
    assert runs['rc']['ref'] == 0, runs['logs1']['ref']
    ref = runs['out']['ref']
    assert [r[0] for r in losses(ref)] == list(range(12))
    assert [r[0] for r in evals(ref)] == [0, 4, 8, 12]


def test_exact_resume_after_sigkill(runs):
    """SIGKILL at the start of iteration 10 (checkpoint at 8), then --init_from=resume:
    per-iteration losses and evaluation records are bit-identical to an uninterrupted run."""
    assert runs['rc']['kill'] == -signal.SIGKILL
    assert runs['kill_ckpt_iter'] == 8
    assert runs['rc']['kill2'] == 0, runs['logs2']['kill2']
    assert 'resuming from' in runs['logs2']['kill2'] and 'at iteration 8' in runs['logs2']['kill2']
    assert losses(runs['out']['kill']) == losses(runs['out']['ref'])
    assert evals(runs['out']['kill']) == evals(runs['out']['ref'])


def test_crash_during_save_keeps_previous_checkpoint(runs):
    """SIGKILL halfway through writing the iteration-8 checkpoint: ckpt.pt is still the
    iteration-4 one and loads; the half-written file is only ckpt.pt.tmp; resuming from 4
    reproduces the uninterrupted run exactly (and the stale .tmp is simply overwritten)."""
    assert runs['rc']['save'] == -signal.SIGKILL
    assert runs['save_ckpt_iter'] == 4
    assert runs['save_tmp_size'] and runs['save_tmp_size'] > 0
    assert runs['rc']['save2'] == 0, runs['logs2']['save2']
    assert losses(runs['out']['save']) == losses(runs['out']['ref'])
    assert evals(runs['out']['save']) == evals(runs['out']['ref'])
    assert not (runs['out']['save'] / 'ckpt.pt.tmp').exists()
    assert load(runs['out']['save'] / 'ckpt.pt')['iter_num'] == 12


def test_keep_last(runs):
    kept = sorted(p.name for p in runs['out']['ref'].glob('ckpt_*.pt'))
    assert kept == ['ckpt_0000008.pt', 'ckpt_0000012.pt']
    assert [load(runs['out']['ref'] / k)['iter_num'] for k in kept] == [8, 12]


def test_sigterm_at_an_eval_iteration_resumes_exactly(runs):
    """SIGTERM during step 7: the step finishes, iteration 8 is saved before its evaluation ran.
    The resumed run must still evaluate iteration 8 (it used to skip it) and match exactly."""
    assert runs['rc']['term'] == 0, runs['logs1']['term']
    assert 'stopped by signal at iteration 8' in runs['logs1']['term']
    assert runs['rc']['term2'] == 0, runs['logs2']['term2']
    assert losses(runs['out']['term']) == losses(runs['out']['ref'])
    assert evals(runs['out']['term']) == evals(runs['out']['ref'])


@pytest.mark.parametrize('kind', ['sigterm', 'sigint'])
def test_signal_finishes_step_saves_and_exits_0(runs, kind):
    log = runs['logs1'][kind]
    assert runs['rc'][kind] == 0, log
    n = runs['sig_steps'][kind]  # steps completed = lines in train_log.jsonl
    assert f'stopped by signal at iteration {n}; checkpoint saved' in log
    assert runs['sig_ckpt'][kind] == n
    assert 'Traceback' not in log


def test_sigterm_checkpoint_resumes(runs):
    n = runs['sig_steps']['sigterm']
    assert runs['rc']['sigterm2'] == 0, runs['logs2']['sigterm2']
    assert f'at iteration {n}' in runs['logs2']['sigterm2']
    assert [r[0] for r in losses(runs['out']['sigterm'])] == list(range(n + 2))


def test_nonfinite_loss_stops_and_leaves_checkpoint(runs):
    log = runs['logs2']['nan']
    assert runs['rc']['nan'] == 2, log
    err = [l for l in log.splitlines() if l.startswith('error:')]
    assert len(err) == 1 and 'non-finite loss or gradient at iteration 13' in err[0], log
    assert 'Traceback' not in log
    ckpt = runs['tmp'] / 'nan' / 'ckpt.pt'
    assert (ckpt.read_bytes(), ckpt.stat().st_mtime_ns) == runs['nan_ckpt_before']


def test_skip_nonfinite_counts_skipped_steps(runs):
    assert runs['rc']['skip'] == 0, runs['logs2']['skip']
    skipped = runs['logs2']['skip'].count('step skipped')
    assert skipped == 3  # iteration 12's huge update makes 13, 14, 15 non-finite
    last = jsonl(runs['tmp'] / 'skip' / 'log.jsonl')[-1]
    assert last['iter'] == 16 and last['skipped_steps'] == skipped
    assert load(runs['tmp'] / 'skip' / 'ckpt.pt')['skipped_steps'] == skipped


@pytest.mark.parametrize('kind', ['evil_train', 'evil_sample'])
def test_checkpoint_with_code_is_refused(runs, kind):
    log = runs['logs2'][kind]
    assert runs['rc'][kind] == 2, log
    err = [l for l in log.splitlines() if l.startswith('error:')]
    assert len(err) == 1 and err[0].startswith('error: checkpoint'), log
    assert 'posix.system' in err[0] and 'refusing to load it' in err[0], log
    assert 'Traceback' not in log
    assert not runs['marker'].exists(), "the pickled os.system call ran"


def test_meta_pkl_with_code_is_refused(runs):
    log = runs['logs2']['evil_meta']
    assert runs['rc']['evil_meta'] == 2, log
    assert 'meta.pkl is not a plain metadata pickle' in log and 'refusing to load posix.system' in log, log
    assert 'Traceback' not in log
    assert not runs['marker'].exists(), "the pickled os.system call ran"


# -----------------------------------------------------------------------------
# DDP: torchrun, 2 CPU processes, gloo; both faults launched together

def torchrun(args, log, **extra_env):
    f = open(log, 'w')
    cmd = [PY, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', *hooked('train.py', extra_env),
           *map(str, args)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env(**extra_env), stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True)


@pytest.fixture(scope='module')
def ddp_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('ddp')
    data = make_data(tmp / 'data')
    term, stop, die, ref = tmp / 'term', tmp / 'stop', tmp / 'die', tmp / 'ref'
    p_term = torchrun(train_args(data, term, 100000, '--ddp_timeout=60'), tmp / 'term.log')
    # the exact-resume run stops at a known iteration: rank 0 sends itself SIGTERM during step 5
    # (a signal sent from outside on a poll would land at an iteration that depends on speed)
    p_stop = torchrun(train_args(data, stop, 12), tmp / 'stop.log', NANOHFA_TEST_DIE_AT='5:0:term')
    t0 = time.time()
    p_die = torchrun(train_args(data, die, 100000, '--ddp_timeout=60'), tmp / 'die.log', NANOHFA_TEST_DIE_AT='6:1')
    p_ref = torchrun(train_args(data, ref, 12), tmp / 'ref.log')
    wait_for_lines(term / 'train_log.jsonl', 3, p_term, timeout=400)
    os.kill(p_term.pid, signal.SIGTERM)  # the torchrun process only; it forwards SIGTERM to its workers
    rc_term = wait(p_term, 240)
    rc_die = wait(p_die, 300)
    die_s = time.time() - t0
    rc_ref = wait(p_ref, 300)
    rc_stop = wait(p_stop, 300)
    n = len(jsonl(term / 'train_log.jsonl'))
    term_ckpt_iter = load(term / 'ckpt.pt')['iter_num'] if (term / 'ckpt.pt').exists() else None
    n_stop = len(jsonl(stop / 'train_log.jsonl'))
    resume = torchrun(train_args(data, stop, 12, '--init_from=resume'), tmp / 'resume.log')
    rc_resume = wait(resume, 300)
    return {'term': term, 'stop': stop, 'die': die, 'ref': ref, 'rc_term': rc_term, 'rc_die': rc_die,
            'die_s': die_s, 'rc_ref': rc_ref, 'rc_stop': rc_stop, 'rc_resume': rc_resume, 'n': n,
            'n_stop': n_stop, 'term_ckpt_iter': term_ckpt_iter,
            **{f'{k}_log': (tmp / f'{k}.log').read_text() for k in ('term', 'stop', 'die', 'ref', 'resume')}}


def test_ddp_sigterm_to_torchrun(ddp_runs):
    """All ranks stop at the same step; rank 0 saves a checkpoint that loads and matches the log."""
    log, n = ddp_runs['term_log'], ddp_runs['n']
    assert f'stopped by signal at iteration {n};' in log, log
    assert ddp_runs['term_ckpt_iter'] == n


def test_ddp_resume_after_sigterm_is_exact(ddp_runs):
    """2 processes, dropout 0.1: rank 0 gets SIGTERM during step 5, both ranks stop at iteration 6
    and save; resumed to 12, the losses and evaluations equal an uninterrupted 2-process run bit
    for bit (data order and every rank's RNG)."""
    assert ddp_runs['rc_ref'] == 0, ddp_runs['ref_log']
    assert ddp_runs['rc_stop'] == 0, ddp_runs['stop_log']
    assert 'stopped by signal at iteration 6;' in ddp_runs['stop_log'] and ddp_runs['n_stop'] == 6
    assert ddp_runs['rc_resume'] == 0, ddp_runs['resume_log']
    assert 'at iteration 6' in ddp_runs['resume_log']
    assert losses(ddp_runs['stop']) == losses(ddp_runs['ref'])
    assert evals(ddp_runs['stop']) == evals(ddp_runs['ref'])


def test_ddp_dead_rank_does_not_hang(ddp_runs):
    """Rank 1 SIGKILLs itself at iteration 6: the run ends (non-zero) well before the test
    timeout instead of hanging, and ckpt.pt is still the last good one (iteration 4)."""
    assert ddp_runs['rc_die'] != 0, ddp_runs['die_log']
    assert ddp_runs['die_s'] < 300
    assert load(ddp_runs['die'] / 'ckpt.pt')['iter_num'] == 4
    assert [r['iter'] for r in jsonl(ddp_runs['die'] / 'train_log.jsonl')] == list(range(6))
