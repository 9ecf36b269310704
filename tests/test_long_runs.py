"""
What a long run needs besides exact resume (tests/test_reliability.py): an out_dir belongs to
one run (a lock, no silent overwrite, nothing done by a resume that has nothing to do), a stop
within seconds even during a long evaluation (one process and DDP), a full disk as one line,
progress a researcher can read (iteration / max_iters, percentage, ETA, evaluation progress,
the notices a nanoGPT user needs) and a CPU peak measured once. Tiny runs on a random
character dataset; independent runs start together. (nanoGPT's checkpoints:
tests/test_nanogpt_checkpoints.py; sample.py: tests/test_sample.py.)
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nanohfa import data
from nanohfa import hardware

pytestmark = pytest.mark.slow  # every test here runs train.py in a subprocess

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--device=cpu', '--eval_iters=2', '--eval_interval=2',
        '--warmup_iters=1', '--learning_rate=1e-2']


def env(**extra):
    return {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1', **extra}


LAUNCHED = []


def launch(log, *args, script='train.py', torchrun=False, **extra_env):
    """A script in the repository, stdout and stderr to `log` and `log`.err."""
    launcher = [PY, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2'] if torchrun else [PY]
    LAUNCHED.append(subprocess.Popen([*launcher, script, *map(str, args)], cwd=ROOT, env=env(**extra_env),
                                     stdout=open(log, 'w'), stderr=open(f'{log}.err', 'w'), start_new_session=True))
    return LAUNCHED[-1]


@pytest.fixture(scope='module', autouse=True)
def _no_process_left():
    """A failed test must not leave its runs behind (one of them trains for 100,000 iterations)."""
    yield
    for p in LAUNCHED:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def finish(p, log, timeout=300):
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        raise
    return {'rc': rc, 'out': Path(log).read_text(), 'err': Path(f'{log}.err').read_text()}


def wait_for(path, text, proc, timeout=240):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if Path(path).exists() and text in Path(path).read_text():
            return
        assert proc.poll() is None, f"ended (rc {proc.returncode}) before printing {text!r}:\n{Path(path).read_text()}"
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s")


def low_peak_cache(folder):
    """A peak_flops.json whose CPU peak (1 thread, measured just now) is 1 MFLOP/s: what a tiny model
    reaches is far above it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / 'peak_flops.json').write_text(json.dumps({hardware.peak_key('cpu', 1): {'flops': 1e6,
                                                                                       'measured_at': time.time()}}))
    return folder


def checksums(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob('*')) if p.is_file() and p.name != '.lock'}


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def one_error_line(r):
    lines = [l for l in r['err'].splitlines() if l.strip()]
    assert r['rc'] == 2 and len(lines) == 1 and lines[0].startswith('error: '), r
    assert 'Traceback' not in r['err'] + r['out']
    return lines[0]


@pytest.fixture(scope='module')
def char_data(tmp_path_factory):
    d = tmp_path_factory.mktemp('long_data')
    rng = np.random.default_rng(0)
    rng.integers(0, 16, 3000).astype(np.uint16).tofile(d / 'train.bin')
    rng.integers(0, 16, 1500).astype(np.uint16).tofile(d / 'val.bin')  # longer than GPT-2's context
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16, 'itos': list('abcdefghijklmnop')}))
    return d


@pytest.fixture(scope='module')
def runs(char_data, tmp_path_factory):
    """Every subprocess of this file but DDP's, in three phases of runs started together."""
    tmp = tmp_path_factory.mktemp('long')
    base = [*TINY, f'--data_dir={char_data}']
    log = lambda name: tmp / f'{name}.log'
    # phase 1: a finished run to build on, a long run that holds its out_dir, and runs that print
    t_launch = time.time()
    p = {
        'base': launch(log('base'), *base, f'--out_dir={tmp / "base"}', '--max_iters=4', '--lr_decay_iters=4'),
        'holder': launch(log('holder'), *base, f'--out_dir={tmp / "held"}', '--max_iters=100000',
                         '--log_interval=1'),
        'progress': launch(log('progress'), *base, f'--out_dir={tmp / "progress"}', '--max_iters=6',
                           '--lr_decay_iters=600', '--warmup_iters=8', '--log_interval=1', '--eval_interval=3',
                           '--attn_layers=sa,ha', '--n_layer=2'),
        'mixed': launch(log('mixed'), *base, f'--out_dir={tmp / "mixed"}', '--eval_only=True',
                        '--attention=hfa_v1', '--n_hfa_head=1'),
        'triton_cpu': launch(log('triton_cpu'), *base, f'--out_dir={tmp / "triton"}', '--eval_only=True',
                             '--attention=linear', '--kernel=triton', '--eval_iters=1'),
        'gpt2_size': launch(log('gpt2_size'), '--device=cpu', f'--data_dir={char_data}', f'--out_dir={tmp / "big"}',
                            '--eval_iters=1'),
        # a cached CPU peak far below what the run reaches (as one measured under a heavy load), and a given one
        'mfu_low_cache': launch(log('mfu_low_cache'), *base, f'--out_dir={tmp / "mfu_low_cache"}', '--max_iters=4',
                                '--lr_decay_iters=4', '--threads=1', '--log_interval=1',
                                NANOHFA_CACHE=str(low_peak_cache(tmp / 'peak_cache'))),
        'mfu_given': launch(log('mfu_given'), *base, f'--out_dir={tmp / "mfu_given"}', '--max_iters=4',
                            '--lr_decay_iters=4', '--peak_flops=1000.0', '--log_interval=1'),
    }
    r = {'base': finish(p['base'], log('base'))}
    r['base_wall'] = (tmp / 'base' / 'log.jsonl').stat().st_mtime - t_launch  # to the last log line
    wait_for(log('gpt2_size'), 'a CPU config trains in minutes', p['gpt2_size'])
    os.killpg(p['gpt2_size'].pid, signal.SIGKILL)
    r['gpt2_size'] = finish(p['gpt2_size'], log('gpt2_size'))
    wait_for(log('holder'), 'iter 2/', p['holder'])
    os.kill(p['holder'].pid, signal.SIGSTOP)  # holds its lock, writes nothing while the intruder runs
    r['held_before'] = checksums(tmp / 'held')
    intruder = launch(log('intruder'), *base, f'--out_dir={tmp / "held"}', '--max_iters=4')
    r['intruder'] = finish(intruder, log('intruder'))
    r['held_after'] = checksums(tmp / 'held')
    r['holder_pid'] = p['holder'].pid
    os.kill(p['holder'].pid, signal.SIGKILL)  # no stale lock: the next run takes the out_dir
    r['holder'] = finish(p['holder'], log('holder'))
    r.update({k: finish(p[k], log(k)) for k in ('progress', 'mixed', 'triton_cpu', 'mfu_low_cache', 'mfu_given')})

    # phase 2: on copies of the finished run
    for name in ('overwrite', 'finished', 'eval_stop', 'disk_full', 'disk_fills'):
        shutil.copytree(tmp / 'base', tmp / name, ignore=shutil.ignore_patterns('.lock'))
    held_iter = torch.load(tmp / 'held' / 'ckpt.pt', weights_only=True)['iter_num']
    r['overwrite_before'] = checksums(tmp / 'overwrite')
    r['finished_before'] = checksums(tmp / 'finished')
    r['disk_full_before'] = checksums(tmp / 'disk_full')
    r['disk_fills_before'] = checksums(tmp / 'disk_fills')
    p = {
        'resume_held': launch(log('resume_held'), *base, f'--out_dir={tmp / "held"}', '--init_from=resume',
                              f'--max_iters={held_iter + 2}'),
        'overwrite': launch(log('overwrite'), *base, f'--out_dir={tmp / "overwrite"}', '--max_iters=2',
                            '--overwrite=True'),
        'finished': launch(log('finished'), f'--out_dir={tmp / "finished"}', '--init_from=resume'),
        'eval_stop': launch(log('eval_stop'), f'--out_dir={tmp / "eval_stop"}', '--init_from=resume', '--max_iters=100',
                            '--eval_interval=8', '--eval_iters=100000', '--lr_decay_iters=100'),
        'disk_full': launch(log('disk_full'), 'train.py', f'--out_dir={tmp / "disk_full"}', '--init_from=resume',
                            '--max_iters=6', '--lr_decay_iters=6', script='tests/train_hooks.py',
                            NANOHFA_TEST_DIE_AT='6:0:nospace'),  # every write of that save: No space left on device
        'disk_fills': launch(log('disk_fills'), 'train.py', f'--out_dir={tmp / "disk_fills"}', '--init_from=resume',
                             '--max_iters=6', '--lr_decay_iters=6', script='tests/train_hooks.py',
                             NANOHFA_TEST_DIE_AT='6:0:full'),
    }
    wait_for(log('eval_stop'), 'evaluating iteration 8:', p['eval_stop'])
    t_signal = time.time()
    os.kill(p['eval_stop'].pid, signal.SIGTERM)
    r['eval_stop'] = finish(p['eval_stop'], log('eval_stop'))
    r['eval_stop_s'] = time.time() - t_signal
    r.update({k: finish(v, log(k)) for k, v in p.items() if k != 'eval_stop'})
    return {'dir': tmp, **r}


# -----------------------------------------------------------------------------
# an out_dir belongs to one run

def test_second_run_into_a_running_out_dir_fails_at_once(runs):
    line = one_error_line(runs['intruder'])
    assert f"out_dir '{runs['dir'] / 'held'}' is in use by another run (pid {runs['holder_pid']} on " in line
    assert 'wait for it to end, or choose another --out_dir' in line
    assert runs['held_after'] == runs['held_before']


def test_a_killed_run_leaves_no_stale_lock(runs):
    assert runs['holder']['rc'] == -signal.SIGKILL
    r = runs['resume_held']
    assert r['rc'] == 0, r
    assert 'resuming from' in r['out']


def test_overwrite_moves_the_old_run_aside(runs):
    r, out = runs['overwrite'], runs['dir'] / 'overwrite'
    assert r['rc'] == 0, r
    aside, = out.glob('replaced-*')
    assert f"the previous run's checkpoint and logs moved to {aside}" in r['out']
    moved = {Path(p.name): h for p, h in checksums(aside).items()}
    assert moved == runs['overwrite_before']  # every file of the old run, byte for byte
    assert torch.load(out / 'ckpt.pt', weights_only=True)['iter_num'] == 2


def test_resuming_a_finished_run_changes_nothing(runs):
    r = runs['finished']
    assert r['rc'] == 0 and not r['err'], r
    assert 'is finished (iteration 4 = max_iters, evaluated); nothing to do' in r['out']
    assert checksums(runs['dir'] / 'finished') == runs['finished_before']


# -----------------------------------------------------------------------------
# a stop within seconds, a full disk

def test_sigterm_during_a_long_evaluation_stops_within_seconds(runs):
    """The evaluation at iteration 8 (2 x 100,000 batches) shows progress; SIGTERM abandons it
    at the next batch, the steps up to 8 are saved (not evaluated), and the process exits."""
    r, out = runs['eval_stop'], runs['dir'] / 'eval_stop'
    assert r['rc'] == 0, r
    assert re.search(r'evaluating iteration 8: \d+/\d+ batches, \d+ s, about \d+ s to go', r['out'])
    assert 'stopped by signal at iteration 8; checkpoint saved to' in r['out']
    assert runs['eval_stop_s'] < 30, runs['eval_stop_s']  # one step and a save, on a loaded machine
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == 8 and ckpt['evaluated'] is False  # the resumed run evaluates 8
    assert [rec['iter'] for rec in jsonl(out / 'log.jsonl')] == [0, 2, 4]


def test_a_full_disk_is_one_line_and_keeps_the_checkpoint(runs):
    line = one_error_line(runs['disk_full'])
    out = runs['dir'] / 'disk_full'
    assert 'could not write the checkpoint of iteration 6' in line and 'No space left on device' in line
    assert f"the last good checkpoint {out / 'ckpt.pt'} (iteration 4) is untouched" in line
    assert not (out / 'ckpt.pt.tmp').exists() and not (out / 'ckpt.pt.tmp').is_symlink()
    assert checksums(out)[Path('ckpt.pt')] == runs['disk_full_before'][Path('ckpt.pt')]


def test_a_disk_that_fills_during_the_save_says_so(runs):
    """On a real full disk torch's zip writer raises its own RuntimeError ("unexpected pos 718144
    vs 718032") from the OSError; the line names the OSError (tests/train_hooks.py raises the same
    ENOSPC where the checkpoint is written; a 300 kB tmpfs gives the same line)."""
    line = one_error_line(runs['disk_fills'])
    out = runs['dir'] / 'disk_fills'
    assert 'could not write the checkpoint of iteration 6' in line and '(No space left on device)' in line, line
    assert 'unexpected pos' not in line and 'inline_container' not in line
    assert f"the last good checkpoint {out / 'ckpt.pt'} (iteration 4) is untouched" in line
    assert not (out / 'ckpt.pt.tmp').exists()
    assert checksums(out)[Path('ckpt.pt')] == runs['disk_fills_before'][Path('ckpt.pt')]


# -----------------------------------------------------------------------------
# progress and notices

def test_log_lines_show_iteration_of_max_percentage_and_eta(runs):
    r = runs['progress']
    assert r['rc'] == 0, r
    lines = re.findall(r'^iter (\d+)/6 \((\d+)%\): loss [\d.]+, time \d+ms, [\d,]+ tokens/s, mfu [\d.]+%, eta (\w+)$',
                       r['out'], re.M)
    assert [int(i) for i, _, _ in lines] == [1, 2, 3, 4, 5]
    assert [int(p) for _, p, _ in lines] == [33, 50, 67, 83, 100]
    assert lines[-1][2] == '0s' and all(re.fullmatch(r'\d+s|\d+m\d\ds', e) for _, _, e in lines)


def test_schedule_notices(runs):
    out = runs['progress']['out']
    assert "note: max_iters=6 is below warmup_iters=8: the run ends while the learning rate still warms up" in out
    assert "note: lr_decay_iters=600 differs from max_iters=6: the cosine reaches min_lr" in out


def test_banner_names_layers_in_order_and_mixed_heads(runs):
    assert 'attention per layer sa,ha' in runs['progress']['out']
    assert runs['mixed']['rc'] == 0, runs['mixed']
    assert 'attention hfa_v1 (1 HFA + 1 SA heads)' in runs['mixed']['out']


def test_triton_on_cpu_says_it_is_the_interpreter(runs):
    r = runs['triton_cpu']
    assert r['rc'] == 0, r
    assert "note: kernel='triton' on cpu runs Triton's interpreter, for testing the kernels" in r['out']


def test_a_gpt2_sized_run_on_cpu_says_what_fits(runs):
    out = runs['gpt2_size']['out']
    assert re.search(r"note: 85M parameters x 491,520 tokens per iteration is a GPU-sized run: at least [\d,]+ s per "
                     r"iteration on this cpu .*; a CPU config trains in minutes: python train.py config/cpu_sa.py", out)


def test_elapsed_counts_the_whole_run(runs):
    """log.jsonl's elapsed_s (compare.py's wall time) includes starting up, not only the loop."""
    final = jsonl(runs['dir'] / 'base' / 'log.jsonl')[-1]
    assert final['elapsed_s'] > runs['base_wall'] - 2, (final['elapsed_s'], runs['base_wall'])


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, 'CACHE', tmp_path)
    monkeypatch.setattr(hardware, 'measured_matmul_flops', lambda *a, **k: calls.append(a) or 1.5e10)
    first = hardware.peak_flops('cpu', cached=True)
    second = hardware.peak_flops('cpu', cached=True)
    assert first == second and first[0] == 1.5e10 and len(calls) == 1
    assert str(tmp_path / 'peak_flops.json') in first[1] and 'measured on this machine' in first[1]
    assert hardware.peak_flops('cpu', 2e9, cached=True) == (2e9, 'given')


def test_cpu_peak_is_measured_again_when_old(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(hardware, 'CACHE', tmp_path)
    monkeypatch.setattr(hardware, 'measured_matmul_flops', lambda *a, **k: calls.append(a) or 3e10)
    key = hardware.peak_key('cpu', torch.get_num_threads())
    for old in ({'flops': 1e9, 'measured_at': time.time() - hardware.PEAK_MAX_AGE_S - 60}, 1e9):  # a bare number: an older cache
        (tmp_path / 'peak_flops.json').write_text(json.dumps({key: old}))
        assert hardware.peak_flops('cpu', cached=True)[0] == 3e10
    assert len(calls) == 2
    assert json.loads((tmp_path / 'peak_flops.json').read_text())[key]['flops'] == 3e10
    assert hardware.peak_flops('cpu', cached=True)[0] == 3e10 and len(calls) == 2  # fresh now: read, not measured


def test_a_peak_measured_again_is_at_least_what_the_run_reached(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, 'CACHE', tmp_path)
    monkeypatch.setattr(hardware, 'measured_matmul_flops', lambda *a, **k: 1e9)
    flops, source = hardware.remeasured_peak('cpu', 2.5e9)
    assert flops == 2.5e9 and 'measured again (an MFU above 100% was seen)' in source
    assert f"with this run's {torch.get_num_threads()} thread" in source
    assert hardware.peak_flops('cpu', cached=True)[0] == 2.5e9  # the next run starts from it
    assert hardware.remeasured_peak('cpu', 0.5e9)[0] == 1e9


def test_threads_beyond_the_free_cores_get_a_notice(monkeypatch):
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, 'getloadavg', lambda: (1.7, 1.0, 1.0))
    note = hardware.busy_cores_notice(2)
    assert note.startswith('note: 2 threads on 2 cores with a load average of 1.7 (about 1 free)')
    assert 'OMP_NUM_THREADS=1 or --threads=1' in note
    assert hardware.busy_cores_notice(1) is None
    monkeypatch.setattr(os, 'getloadavg', lambda: (0.2, 0.1, 0.1))
    assert hardware.busy_cores_notice(2) is None


def test_mfu_never_passes_100_percent(runs):
    """A cached CPU peak below what the run reaches is measured again (and the cache updated); a
    given peak is kept, the MFU clamped at 100% with a note."""
    mfus = lambda r: [float(m) for m in re.findall(r', mfu ([\d.]+)%', r['out'])]
    r = runs['mfu_low_cache']
    assert r['rc'] == 0, r
    assert "with this run's 1 thread" in r['out']
    assert r['out'].count('note: MFU ') == 1 and 'measured again (an MFU above 100% was seen)' in r['out']
    assert mfus(r) and max(mfus(r)) <= 100
    assert all(rec['mfu'] is None or rec['mfu'] <= 1 for rec in jsonl(runs['dir'] / 'mfu_low_cache' / 'log.jsonl'))
    cached = json.loads((runs['dir'] / 'peak_cache' / 'peak_flops.json').read_text())
    assert list(cached.values())[0]['flops'] > 1e6
    r = runs['mfu_given']
    assert r['rc'] == 0, r
    assert r['out'].count('note: MFU ') == 1 and 'that peak is too low; MFU is shown as at most 100%' in r['out']
    assert mfus(r) and set(mfus(r)) == {100.0}
    assert jsonl(runs['dir'] / 'mfu_given' / 'log.jsonl')[-1]['mfu'] == 1.0


def test_prepare_hint_names_a_config_that_fits(tmp_path):
    for tokenizer in ('gpt2', 'char'):
        (tmp_path / tokenizer).mkdir()
        (tmp_path / tokenizer / 'meta.json').write_text(json.dumps({'tokenizer': tokenizer, 'vocab_size': 50257}))
        last = data.summary(tmp_path / tokenizer).splitlines()[-1]
        assert last.startswith('next: python train.py config/cpu_sa.py --data_dir='), last


# -----------------------------------------------------------------------------
# DDP: both processes abandon an evaluation together

def test_ddp_sigterm_during_a_long_evaluation(char_data, tmp_path):
    out = tmp_path / 'ddp'
    first = launch(tmp_path / 'first.log', *TINY, f'--data_dir={char_data}', f'--out_dir={out}', '--max_iters=2',
                   '--lr_decay_iters=2', torchrun=True)
    assert finish(first, tmp_path / 'first.log')['rc'] == 0
    p = launch(tmp_path / 'ddp.log', f'--out_dir={out}', '--init_from=resume', '--max_iters=100', '--eval_interval=4',
               '--eval_iters=100000', '--lr_decay_iters=100', torchrun=True)
    wait_for(tmp_path / 'ddp.log', 'evaluating iteration 4:', p)
    t_signal = time.time()
    os.kill(p.pid, signal.SIGTERM)  # torchrun forwards it to both workers
    r = finish(p, tmp_path / 'ddp.log')
    assert time.time() - t_signal < 60
    assert 'stopped by signal at iteration 4; checkpoint saved to' in r['out'], r
    ckpt = torch.load(out / 'ckpt.pt', weights_only=True)
    assert ckpt['iter_num'] == 4 and ckpt['evaluated'] is False and len(ckpt['rng']['ranks']) == 2
