"""train.py's training loop: MFU in the log lines and in log.jsonl, the first step of each
session timed apart (tokens/s without compilation), the compile notice, the non-finite
message when no checkpoint exists yet, and no host-device sync per step (on CUDA: torch's
sync-debug mode counts them; everywhere: the step's code reads nothing back but under
skip_nonfinite, counted by tests/train_hooks.py). Tiny runs on a random character dataset,
as tests/test_reliability.py."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=2', '--device=cpu', '--eval_iters=2', '--warmup_iters=2',
        '--learning_rate=1e-2']


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp('loop_data')
    rng = np.random.default_rng(0)
    rng.integers(0, 16, 3000).astype(np.uint16).tofile(folder / 'train.bin')
    rng.integers(0, 16, 600).astype(np.uint16).tofile(folder / 'val.bin')
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16, 'itos': list('abcdefghijklmnop')}))
    return folder


def start(data, out, *args, env=None, script=None):
    cmd = [sys.executable, *(script or ['train.py']), *TINY, f'--data_dir={data}', f'--out_dir={out}', *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, 'OMP_NUM_THREADS': '1', **(env or {})})


def finish(p):
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def train(data, out, *args, **kw):
    return finish(start(data, out, *args, **kw))


def jsonl(path):
    return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


@pytest.fixture(scope='module')
def runs(data, tmp_path_factory):
    """Every run of this file, started together (torch starts slowly on a loaded machine)."""
    tmp = tmp_path_factory.mktemp('loop')
    (tmp / 'nan').mkdir()
    (tmp / 'nan' / 'ckpt.pt').write_bytes(b'an older run')
    two = ['--lr_decay_iters=8', '--eval_interval=4', '--log_interval=100']
    reads = ['--max_iters=6', '--lr_decay_iters=6', '--eval_interval=3', '--log_interval=2']
    hooks = ['tests/train_hooks.py', 'train.py']
    p = {
        'main': start(data, tmp / 'main', '--max_iters=10', '--lr_decay_iters=10', '--eval_interval=5',
                      '--log_interval=2', '--peak_flops=1e11'),
        'two': start(data, tmp / 'two', '--max_iters=4', *two),
        # TORCH_COMPILE_DISABLE makes torch.compile a no-op: the notice, not compilation, is tested
        'compile': start(data, tmp / 'compile', '--max_iters=2', '--eval_interval=2', '--log_interval=1',
                         '--compile=True', env={'TORCH_COMPILE_DISABLE': '1'}),
        'nan': start(data, tmp / 'nan', '--max_iters=8', '--eval_interval=4', '--log_interval=100',
                     '--learning_rate=1e30', '--overwrite=True'),
        'reads': start(data, tmp / 'reads', *reads, script=hooks, env={'NANOHFA_TEST_READS': str(tmp / 'reads.json')}),
        'reads_skip': start(data, tmp / 'reads_skip', *reads, '--skip_nonfinite=True', script=hooks,
                            env={'NANOHFA_TEST_READS': str(tmp / 'reads_skip.json')}),
    }
    r = {k: finish(v) for k, v in p.items()}
    assert r['two'].returncode == 0, r['two'].stdout + r['two'].stderr
    r['two_resumed'] = train(data, tmp / 'two', '--max_iters=8', '--init_from=resume', *two)
    return {'dir': tmp, **r}


@pytest.fixture
def run(runs):
    r = runs['main']
    assert r.returncode == 0, r.stdout + r.stderr
    return runs['dir'] / 'main', r.stdout


@pytest.mark.slow
def test_log_lines_print_mfu_against_the_given_peak(run):
    out, stdout = run
    fpt = json.loads((out / 'run.json').read_text())['flops_per_token']
    lines = re.findall(r'iter (\d+)/10 \(\d+%\): loss [\d.]+, time \d+ms, ([\d,]+) tokens/s, mfu ([\d.]+)%', stdout)
    assert [int(i) for i, _, _ in lines] == [2, 4, 6, 8]  # log_interval=2; iteration 0 is the first step
    for _, tps, mfu in lines:
        slack = 100 * fpt * 0.5 / 1e11 + 0.005  # tokens/s is printed to the unit, MFU to 0.01%
        assert float(mfu) == pytest.approx(100 * fpt * float(tps.replace(',', '')) / 1e11, abs=slack)


@pytest.mark.slow
def test_log_jsonl_and_run_json_carry_mfu(run):
    out, _ = run
    info = json.loads((out / 'run.json').read_text())
    assert info['peak_flops'] == 1e11 and info['peak_flops_source'] == 'given'
    log = jsonl(out / 'log.jsonl')
    assert [r['iter'] for r in log] == [0, 5, 10] and log[0]['mfu'] is None  # nothing trained at 0
    for r in log[1:]:
        assert 0 < r['mfu'] == pytest.approx(info['flops_per_token'] * r['tokens_per_s'] / 1e11, abs=1e-4)


@pytest.mark.slow
def test_train_log_carries_the_gradient_norm_before_clipping(run):
    """Every step's global gradient norm, as clip_grad_norm_ returns it (before clipping), one
    per train_log.jsonl line, a measured number that changes as the model trains."""
    out, _ = run
    norms = [r['grad_norm'] for r in jsonl(out / 'train_log.jsonl')]
    assert len(norms) == 10 and all(isinstance(n, float) and n > 0 for n in norms) and len(set(norms)) == 10


@pytest.mark.slow
def test_first_step_is_timed_apart(run):
    """tokens/s counts the timed steps only: every step but the session's first."""
    out, stdout = run
    assert re.search(r'iter 0/10 \(10%\): loss [\d.]+, time \d+ms \(first step, not counted in tokens/s\)', stdout)
    steps = jsonl(out / 'train_log.jsonl')
    assert [s['iter'] for s in steps] == list(range(10))
    timed = sum(s['dt_s'] for s in steps[1:])
    final = jsonl(out / 'log.jsonl')[-1]
    assert final['tokens_per_s'] == pytest.approx(9 * 2 * 4 * 16 / timed, rel=0.01)


@pytest.mark.slow
def test_resumed_session_times_its_first_step_apart_too(runs):
    r, out = runs['two_resumed'], runs['dir'] / 'two'
    assert r.returncode == 0, r.stdout + r.stderr
    assert torch.load(out / 'ckpt.pt', weights_only=True)['untimed_iters'] == 2
    steps = jsonl(out / 'train_log.jsonl')
    timed = sum(s['dt_s'] for s in steps if s['iter'] not in (0, 4))
    assert jsonl(out / 'log.jsonl')[-1]['tokens_per_s'] == pytest.approx(6 * 2 * 4 * 16 / timed, rel=0.01)


@pytest.mark.slow
def test_compile_notice_comes_before_the_first_step(runs):
    r = runs['compile']
    assert r.returncode == 0, r.stdout + r.stderr
    notice = r.stdout.index('compiling the model: the first step takes a while (it is not counted in tokens/s)')
    assert notice < r.stdout.index('iter 0/2')


@pytest.mark.slow
def test_nonfinite_before_any_checkpoint_says_none_was_saved(runs):
    """From scratch, lr 1e30: non-finite at iteration 1, before any save. The message must not
    claim a good checkpoint, and an older ckpt.pt in out_dir (another run's, moved aside by
    overwrite=True) is left alone."""
    r, out = runs['nan'], runs['dir'] / 'nan'
    assert r.returncode == 2, r.stdout + r.stderr
    err = [l for l in r.stderr.splitlines() if l.startswith('error:')]
    assert len(err) == 1 and 'non-finite loss or gradient at iteration 1 ' in err[0], r.stderr
    assert 'no checkpoint of this run had been saved yet' in err[0] and 'untouched' not in err[0]
    assert 'Traceback' not in r.stderr
    aside, = out.glob('replaced-*')
    assert (aside / 'ckpt.pt').read_bytes() == b'an older run' and not (out / 'ckpt.pt').exists()
    assert [s['iter'] for s in jsonl(out / 'train_log.jsonl')] == [0]  # the steps before the bad one


def reads_in_steps(events):
    """{iteration: [train.py lines that read a tensor on the host]} from each step's first
    training forward to its optimizer step (tests/train_hooks.py's events)."""
    steps, current = {}, None
    for kind, it, where in events:
        if kind == 'forward' and current is None:
            current = steps.setdefault(it, [])
        elif kind == 'read' and current is not None:
            current.append(where)
        elif kind == 'optimizer_step':
            current = None
    return steps


@pytest.mark.slow
@pytest.mark.parametrize('run_name, per_step', [('reads', 0), ('reads_skip', 1)])
def test_step_code_reads_nothing_back_per_step(runs, run_name, per_step):
    """Inside an optimisation step train.py reads nothing back from a tensor, but the one read
    skip_nonfinite asks for (always the same line); numbers are read after the step, at log
    lines and evaluations (every step on CPU, where nothing runs ahead)."""
    r = runs[run_name]
    assert r.returncode == 0, r.stdout + r.stderr
    events = json.loads((runs['dir'] / f'{run_name}.json').read_text())
    steps = reads_in_steps(events)
    assert sorted(steps) == list(range(6))
    assert all(len(lines) == per_step for lines in steps.values()), steps
    assert len({line for lines in steps.values() for line in lines}) == per_step
    assert any(kind == 'read' for kind, _, _ in events)  # the hook sees train.py's reads at all


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_steps_do_not_sync_the_host(data, tmp_path):
    """Host-device syncs flagged by torch.cuda.set_sync_debug_mode: as many for 16 steps as
    for 6, with the same evaluations and log lines (at 0 and the end)."""
    from tools import train_smoke
    res = train_smoke.sync_counts(data, tmp_path)
    assert all(rc == 0 for _, rc, _ in res), res[0][2][-2000:] + res[1][2][-2000:]
    assert res[0][0] is not None and res[0][0] == res[1][0], [c for c, _, _ in res]


@pytest.mark.slow  # imports tools/train_smoke.py and writes its token files: seconds
def test_train_smoke_runs_what_is_asked_without_numpy(tmp_path):
    """tools/train_smoke.py (a GPU check): `--only sa` runs sa itself, not a merged twin; its
    schedule never divides by zero (--iters 2); it imports no numpy at the top (the GPU
    image may lack it) and writes valid uint16 token files."""
    import ast
    from tools import train_smoke
    assert [name for name, _, _ in train_smoke.runs_to_make({'sa'})][:1] == ['sa']
    for iters in (1, 2, 3, 20):
        kv = dict(a[2:].split('=') for a in train_smoke.schedule_args(iters))
        assert int(kv['warmup_iters']) < int(kv['lr_decay_iters']) == int(kv['max_iters']) == iters
    tops = [n for n in ast.parse((ROOT / 'tools' / 'train_smoke.py').read_text()).body
            if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n for n in tops for a in getattr(n, 'names', []) if a.name.split('.')[0] == 'numpy']
    folder = train_smoke.synthetic_data(tmp_path / 'd', n_train=1000, n_val=10)
    raw = (folder / 'train.bin').read_bytes()
    assert len(raw) == 2000
    ids = torch.frombuffer(bytearray(raw), dtype=torch.int16).to(torch.int32) & 0xFFFF
    assert 0 <= int(ids.min()) and int(ids.max()) < 50257 and len(set(ids.tolist())) > 900
