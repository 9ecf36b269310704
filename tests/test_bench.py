"""bench.py's command line, its one table, its memory measurement, the GPT-2-small
training-step rows (at toy size on CPU; at full size on CUDA only), the table of every
variant and a grid's seconds per step."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bench
from model import GPT, GPTConfig

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


@pytest.mark.slow
def test_underscore_flags_are_taken(quick):
    _, records = quick
    assert {r['block_size'] for r in records if r['mode'] in ('attention', 'train_step')} == {16}
    assert {r['batch_size'] for r in records if r['mode'] == 'train_step'} == {2}


@pytest.mark.slow
def test_table_is_printed_once(quick):
    r, records = quick
    lines = r.stdout.splitlines()
    assert sum(l.startswith('variant ') for l in lines) == 1
    rows = [l for l in lines if l.split() and l.split()[0] in {rec['variant'] for rec in records}]
    assert len(rows) == len(records)


@pytest.mark.slow
def test_quick_covers_every_variant_and_mode(quick):
    _, records = quick
    keys = {'variant', 'mode', 'block_size', 'batch_size', 'tokens_per_s', 'peak_mem_bytes',
            'flops_per_token', 'frac_of_matmul_peak'}
    assert all(keys <= set(rec) for rec in records)
    assert {'sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha', 'ha_win', 'ha_ref', 'sdpa_min'} <= {r['variant'] for r in records}
    assert {'attention', 'train_step', 'sample_cache', 'sample_nocache'} <= {r['mode'] for r in records}
    assert not any(rec.get('error') for rec in records)


@pytest.mark.slow
def test_train_rows_rate_is_tokens_over_measured_time(quick):
    _, records = quick
    train = [rec for rec in records if rec['mode'] == 'train_step']
    assert train and all(rec['flops_per_token'] > 0 and 0 < rec['frac_of_matmul_peak'] for rec in train)
    for rec in train:  # the rate is the step's tokens over its measured time, not a constant
        assert rec['tokens_per_s'] * rec['seconds_per_step'] == pytest.approx(rec['batch_size'] * rec['block_size'])


@pytest.mark.slow
def test_flops_are_the_models_own(quick):
    _, records = quick
    ha = next(r for r in records if r['variant'] == 'ha_ref' and r['mode'] == 'train_step')
    cfg = bench.bench_config('ha', 16, argparse.Namespace(n_layer=1, n_head=2, n_embd=64, vocab=256, window1=128,
                                                          window2=32))
    assert ha['flops_per_token'] == GPT(cfg).flops_per_token(16)


@pytest.mark.slow
def test_sampling_rows_sample_the_same_tokens_with_and_without_cache(quick):
    _, records = quick
    sample = [rec for rec in records if rec['mode'].startswith('sample')]
    assert len(sample) == 2 and all(rec['identical_tokens'] for rec in sample)


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
    assert rec['tokens_per_s'] > 0
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


def test_ha_ref_row_runs_the_reference_kernel():
    """ha_ref: the same HA model on its materialising definition (kernel='reference')."""
    args = argparse.Namespace(n_layer=1, n_head=2, n_embd=16, vocab=32, window1=4, window2=2)
    ref, ha = bench.bench_config('ha_ref', 8, args), bench.bench_config('ha', 8, args)
    assert ref.kernel == 'reference' and ha.kernel == 'auto'
    assert {k: v for k, v in vars(ref).items() if k != 'kernel'} == {k: v for k, v in vars(ha).items() if k != 'kernel'}


def test_kernel_row_flops_are_the_models_own():
    _, _, flops = bench.kernel_call('ha_win', 2, 3, 64, 16, torch.float32, 'cpu', window=(8, 4))
    tuples = sum(min(i + 1, 8) * min(i + 1, 4) for i in range(64))
    assert flops == pytest.approx(4 * 16 * 2 * 3 * tuples)


def test_table_rows(keep_threads):
    torch.set_num_threads(1)  # as bench.py --table does by default (--threads 1)
    args = argparse.Namespace(table_only='sa,ha order 4', batch_size=2, device='cpu', table_steps=1)
    records = bench.variant_table(args)
    assert [r['variant'] for r in records] == ['sa', 'ha order 4']
    for r in records:
        model = GPT(GPTConfig(**{**bench.TABLE_SIZE, **bench.TABLE_VARIANTS[r['variant']]}))
        assert (r['params'], r['flops_per_token']) == (model.get_num_params(), model.flops_per_token())
    assert records[0]['tokens_per_s'] > 0 and records[1]['tokens_per_s'] is None  # order 4: not run


def char_data(folder):
    folder.mkdir()
    np.random.default_rng(0).integers(0, 16, 3000).astype(np.uint16).tofile(folder / 'train.bin')
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16, 'itos': list('abcdefghijklmnop')}))
    return folder


def test_step_times_of_a_grid(tmp_path, keep_threads):
    """--step_times takes a compare.py grid's arguments and writes OUT/step_times.json:
    the median seconds per step of each variant, and every round's."""
    out = tmp_path / 'grid'
    bench.grid_step_times(['--config', 'config/compare_cpu.py', '--out', str(out), '--variants', 'sa,hfa',
                           '--seeds', '1', '--n_layer=1', '--batch_size=2', '--block_size=16',
                           f"--data_dir={char_data(tmp_path / 'data')}"], rounds=2)
    result = json.loads((out / 'step_times.json').read_text())
    assert set(result['seconds_per_step']) == {'sa', 'hfa'} and result['rounds'] == 2
    for v, t in result['seconds_per_step'].items():
        assert len(result['all_seconds'][v]) == 2 and min(result['all_seconds'][v]) <= t > 0


def test_step_times_of_a_grid_whose_data_is_missing_is_one_line(tmp_path):
    """Without the dataset the vocabulary would fall back to GPT-2's, and the output layer,
    not the attention, would be timed."""
    with pytest.raises(SystemExit, match=r"train.bin not found: prepare the grid's dataset first"):
        bench.grid_step_times(['--config', 'config/compare_cpu.py', '--out', str(tmp_path / 'grid'), '--variants',
                               'sa', '--seeds', '1', f"--data_dir={tmp_path / 'none'}"], rounds=1)
    assert not (tmp_path / 'grid').exists()


def test_ha_fallback_counts_ops_and_bytes_of_both_forms():
    """Counted on meta tensors. The windowed form launches the same ops whatever T is (one
    chunk); the blockwise form's grow with the number of blocks."""
    def rows(T):
        args = argparse.Namespace(ha_fallback_shape=f'4,{T},8,16,8', ha_fallback_dtype='bfloat16',
                                  ha_fallback_bandwidth=1e12)
        return {r['form']: r for r in bench.ha_fallback_rows(args)}
    short, long = rows(64), rows(256)
    assert short['windowed']['fwd_ops'] == long['windowed']['fwd_ops']
    assert short['windowed']['bwd_ops'] == long['windowed']['bwd_ops']
    assert long['blockwise']['fwd_ops'] > 3 * short['blockwise']['fwd_ops'] > 3 * short['windowed']['fwd_ops']
    assert long['windowed']['fwd_bytes'] > short['windowed']['fwd_bytes'] > 4 * 64 * 16 * 8 * 4  # the logits, at least
    assert all(r['seconds_estimate'] == 2 * (r['fwd_bytes'] + r['bwd_bytes']) / 1e12 for r in long.values())


def memory_case(case):
    """One --memory case in a fresh process, as bench.py --memory runs it: a process's RSS
    high-water mark also holds what earlier work in it left to the allocator."""
    r = subprocess.run([sys.executable, 'bench.py', '--case', json.dumps(case)], cwd=Path(bench.__file__).parent,
                       capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    line = [x for x in r.stdout.splitlines() if x.startswith('RESULT ')]
    assert line, r.stderr[-2000:]
    result = json.loads(line[0][len('RESULT '):])
    return result[0] if isinstance(result, list) else result


def test_memory_rows_see_activation_checkpointing():
    """bench.py --memory: checkpointing keeps a fraction of the activations a step needs
    (8 layers x 64 wide, 16 x 128 tokens: ~90 MB a step). Each case in its own process: in one
    shared with earlier tests the allocator's leftovers blur the difference (0.68x seen once)."""
    case = dict(mode='memory', variant='sa', parallel='ddp', threads=1, memory_model=[8, 64, 64, 128, 16], nproc=1,
                steps=1)
    ac, plain = (memory_case(dict(case, activation_checkpointing=a)) for a in (True, False))
    assert plain['parallel'] == 'one process' and plain['processes'] == 1
    assert plain['params'] == GPT(GPTConfig(n_layer=8, n_head=1, n_embd=64, vocab_size=64, block_size=128,
                                            bias=False)).get_num_params(non_embedding=False)
    assert plain['step_bytes'] > 50 * 2 ** 20 and ac['step_bytes'] < 0.6 * plain['step_bytes'], (plain['step_bytes'], ac['step_bytes'])
    assert plain['peak_bytes'] == plain['held_bytes'] + plain['step_bytes']


def bench_run(scale):
    """The records bench.py's CPU sweep writes, for the rows docs/performance.md's table reads;
    every speed of a run scaled alike (a run under more load), except sa's train step."""
    rec = lambda v, m, L, tps, mem=None, frac=None: dict(variant=v, mode=m, block_size=L, tokens_per_s=tps,
                                                          peak_mem_bytes=mem, frac_of_matmul_peak=frac)
    return [rec('ha', 'attention', 256, 1000 * scale, frac=0.25), rec('ha_ref', 'attention', 256, 100 * scale),
            rec('sa', 'train_step', 256, 2000, mem=10), rec('hfa_v1', 'train_step', 256, 1200 * scale),
            rec('hfa_v2', 'train_step', 256, 1000 * scale), rec('ha', 'train_step', 256, 500 * scale, mem=12),
            rec('ha', 'train_step', 1024, 50, mem=24),
            rec('sa', 'sample_cache', 65, 500), rec('sa', 'sample_nocache', 65, 100)]


def test_cpu_table_gives_median_and_range_of_ratios_taken_within_each_run():
    sys.path.insert(0, str(ROOT / 'tools'))
    import bench_table
    text = bench_table.table([bench_run(1.0), bench_run(0.8), bench_run(1.1)])
    row = lambda name: next(l for l in text.splitlines() if l.startswith(f'| {name}'))
    assert row('HA attention L=256: tokens/s against') == \
        '| HA attention L=256: tokens/s against the naive reference | 10.00x | 10.00 to 10.00 |'
    assert row('hfa_v1 train step') == "| hfa_v1 train step L=256: tokens/s / SA's | 0.60x | 0.48 to 0.66 |"
    assert row('HA train step: peak memory') .endswith('| 2.00x | 2.00 to 2.00 |')
    assert row('KV-cache') .endswith('| 5.00x | 5.00 to 5.00 |')
    assert 'median of 3 runs' in text.splitlines()[0]


@pytest.mark.slow
def test_lm_eval_rows_measure_requests_and_scoring_memory(tmp_path):
    """bench.py --lm_eval --quick: requests/s of loglikelihood and generate_until (now, as before, and
    batched against one at a time) and the peak memory of scoring, before and now, each a record."""
    path = tmp_path / 'lm_eval.json'
    r = subprocess.run([sys.executable, 'bench.py', '--lm_eval', '--quick', '--out', str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {(x['mode'], x['variant']): x for x in json.loads(path.read_text())}
    assert set(rows) == {('lm_eval_loglikelihood', 'now'), ('lm_eval_loglikelihood', 'before'),
                         ('lm_eval_generate_until', 'now, batches of 4'), ('lm_eval_generate_until', 'now, one at a time'),
                         ('lm_eval_generate_until', 'before'), ('lm_eval_log_probs_memory', 'before'),
                         ('lm_eval_log_probs_memory', 'now')}
    assert all(x['requests_per_s'] > 0 for (m, _), x in rows.items() if m != 'lm_eval_log_probs_memory')
    assert all(x['peak_mem_bytes'] > 0 for (m, _), x in rows.items() if m == 'lm_eval_log_probs_memory')


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without CUDA')
def test_a_device_this_machine_lacks_is_one_line():
    r = subprocess.run([sys.executable, 'bench.py', '--device', 'cuda', '--quick'], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr == "error: device='cuda' but CUDA is not available here; use --device=cpu " \
                                             "(or auto)\n"


def test_stop_save_rows_time_a_stop_to_a_finished_save(tmp_path):
    """--stop_save: a 2-process torchrun run stopped through the local launcher (and through SLURM where
    one answers), the seconds to its saved checkpoint, which holds the iteration the row says."""
    path = tmp_path / 'stop.json'
    r = subprocess.run([sys.executable, 'bench.py', '--stop_save', '--stop_sizes', '1x64', '--out', str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(path.read_text())
    assert [row['launcher'] for row in rows][0] == 'local' and all(row['nproc'] == 2 for row in rows)
    for row in rows:
        assert row['saved_iter'] >= 3 and row['ckpt_bytes'] > 0  # stopped after 3 logged steps, and saved
        assert 0 <= row['stop_to_save_s'] <= row['stop_to_exit_s']
