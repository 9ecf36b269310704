"""bench.py's command line, its one table, its memory measurement and the GPT-2-small
training-step rows (at toy size on CPU; at full size on CUDA only)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bench
from model import GPT

ROOT = Path(__file__).resolve().parents[1]
TOY = dict(n_layer=4, n_head=2, n_embd=32, vocab=64, block_size=32)


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    path = tmp_path_factory.mktemp('bench') / 'bench.json'
    r = subprocess.run([sys.executable, 'bench.py', '--quick', '--block_sizes', '16', '--batch_size', '2',
                        '--n_layer', '1', '--out', str(path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    return r, json.loads(path.read_text())


def test_underscore_flags_are_taken(quick):
    _, records = quick
    assert {r['block_size'] for r in records if r['mode'] in ('attention', 'train_step')} == {16}
    assert {r['batch_size'] for r in records if r['mode'] == 'train_step'} == {2}


def test_table_is_printed_once(quick):
    r, records = quick
    lines = r.stdout.splitlines()
    assert sum(l.startswith('variant ') for l in lines) == 1
    rows = [l for l in lines if l.split() and l.split()[0] in {rec['variant'] for rec in records}]
    assert len(rows) == len(records)


def test_peak_memory_is_never_negative(quick):
    _, records = quick
    measured = [r['peak_mem_bytes'] for r in records if r['mode'] in ('attention', 'train_step')]
    assert measured and all(m is not None and m >= 0 for m in measured)


@pytest.mark.skipif(not os.path.exists('/proc/self/clear_refs'), reason='Linux /proc only')
def test_step_memory_sees_what_a_step_allocates():
    m = bench.StepMemory('cpu')
    x = torch.ones(16 * 2 ** 20)  # 64 MiB, written: resident
    used, _ = m.peak()
    del x
    assert 60 * 2 ** 20 <= used < 200 * 2 ** 20


@pytest.fixture
def keep_threads():
    """A bench case sets its own thread count (as it does in its own process); put it back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize('variant', bench.GPT2_VARIANTS)
def test_gpt2_step_row_at_toy_size(variant, keep_threads):
    rec = bench.run_gpt2_step(dict(variant=variant, mode='gpt2_step', shape=TOY, compile=False, dtype='float32',
                                   batch_size=2, device='cpu', threads=1, min_time=0.0, min_iters=1,
                                   peak_flops=1e9))
    ref = 'sa' if variant == 'sdpa_min' else variant
    assert rec['flops_per_token'] == GPT(bench.gpt2_config(ref, TOY)).flops_per_token(TOY['block_size'])
    assert rec['tokens_per_s'] > 0 and rec['peak_mem_bytes'] >= 0
    assert rec['mfu'] == pytest.approx(rec['tokens_per_s'] * rec['flops_per_token'] / 1e9)
    assert rec['mode'] == 'gpt2_step' and rec['peak_flops_source'] == 'given'


def test_gpt2_shapes_follow_the_configs():
    full = dict(n_layer=12, n_head=12, n_embd=768, vocab=50304, block_size=1024)
    ha = bench.gpt2_config('ha', full)
    assert ha.layer_attentions().count('ha') == 3 and (ha.ha_window1, ha.ha_window2) == (512, 32)
    r64 = bench.gpt2_config('ha_r64', full)
    assert set(r64.layer_attentions()) == {'ha'} and (r64.ha_window1, r64.ha_window2) == (64, 64)
    assert [c['compile'] for c in bench.gpt2_cases(type('A', (), {'device': 'cpu', 'gpt2_batch_size': 8,
                                                                   'peak_flops': 0.0})())][:2] == [False, True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_gpt2_step_compiled_on_cuda():
    rec = bench.run_gpt2_step(dict(variant='sa', mode='gpt2_step', shape=dict(TOY, block_size=128), compile=True,
                                   dtype='bfloat16', batch_size=4, device='cuda', threads=1, min_time=0.1,
                                   min_iters=3))
    assert rec['mode'] == 'gpt2_step_compiled' and 0 < rec['mfu'] < 1 and rec['peak_mem_total_bytes'] > 0
