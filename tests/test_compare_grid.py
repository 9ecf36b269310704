"""compare.py on a GPU node and before launch: --seeds / --gpus parsing, runs scheduled
concurrently on their own GPUs (CUDA_VISIBLE_DEVICES, --nproc per run), --dry_run with every
run's command and budget, a config file's own compare defaults, and the [IA]-table preset
(config/ia_table.py) run end to end at toy size on CPU."""

import json
import threading
import time
from pathlib import Path

import pytest

import tiny_grid

import compare
from nanohfa import grid
from nanohfa import hardware
from nanohfa.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TINY = """
device = 'cpu'
eval_interval = 2
eval_iters = 2
log_interval = 1
gradient_accumulation_steps = 1
batch_size = 4
block_size = 16
n_layer = 1
n_head = 4
n_embd = 16
learning_rate = 1e-2
max_iters = 4
lr_decay_iters = 4
warmup_iters = 1
"""


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return tiny_grid.write(tmp_path_factory.mktemp('grid'), TINY)


def args_of(tiny, *more):
    return grid.parse_args(['--config', str(tiny / 'tiny.py'), f'--data_dir={tiny / "data"}', *more])


@pytest.mark.parametrize('given, seeds', [('3', [0, 1, 2]), ('0,1,2', [0, 1, 2]), ('7,', [7]), ('2-4', [2, 3, 4]),
                                          ('0,5-6', [0, 5, 6])])
def test_seeds_are_a_count_or_a_list(tiny, tmp_path, given, seeds):
    assert args_of(tiny, '--out', str(tmp_path), '--seeds', given).seeds == seeds


@pytest.mark.parametrize('bad', [['--seeds', 'x'], ['--seeds', '0'], ['--seeds', '1,1'], ['--gpus', '3-1'],
                                 ['--gpus', '0,1,2', '--nproc', '2']])
def test_bad_seeds_and_gpus_are_refused(tiny, tmp_path, bad):
    with pytest.raises(UserError):
        args_of(tiny, '--out', str(tmp_path), *bad)


def test_gpus_are_cut_into_slots_of_nproc(tiny, tmp_path):
    assert grid.gpu_slots(args_of(tiny, '--out', str(tmp_path), '--gpus', '0-7')) == [str(i) for i in range(8)]
    assert grid.gpu_slots(args_of(tiny, '--out', str(tmp_path), '--gpus', '0-3,6,7', '--nproc', '2')) == \
        ['0,1', '2,3', '6,7']
    assert grid.gpu_slots(args_of(tiny, '--out', str(tmp_path), '--jobs', '3')) == [None] * 3


def test_runs_share_the_gpus_one_slot_each(tiny, tmp_path, monkeypatch):
    """6 runs on --gpus 0-3 --nproc 2: two at a time, each with CUDA_VISIBLE_DEVICES of its own
    slot, never two at once on one slot, each launched by torchrun with 2 processes."""
    calls, lock = [], threading.Lock()

    class FakeRun:  # a train.py that takes 0.3 s
        def __init__(self, cmd, cwd, env, stdout, stderr, **kw):
            self.cmd, self.env = cmd, env

        def wait(self):
            t0 = time.monotonic()
            time.sleep(0.3)
            with lock:
                calls.append((self.env['CUDA_VISIBLE_DEVICES'], t0, time.monotonic(), self.cmd))
            return 0

    monkeypatch.setattr(compare.subprocess, 'Popen', FakeRun)
    args = args_of(tiny, '--out', str(tmp_path), '--variants', 'sa,hfa,ha_share', '--seeds', '2',
                   '--gpus', '0-3', '--nproc', '2')
    outcomes = compare.run_grid(args, grid.plan(args), args.seeds)
    assert len(calls) == 6 and len(outcomes) == 6
    assert {c[0] for c in calls} == {'0,1', '2,3'}
    for i, (slot, a0, a1, _) in enumerate(calls):
        overlapping = [c for c in calls[i + 1:] if c[1] < a1 and a0 < c[2]]
        assert all(c[0] != slot for c in overlapping)
        assert len(overlapping) <= 1
    assert any(c[1] < calls[0][2] and calls[0][1] < c[2] for c in calls[1:])  # they did run concurrently
    for *_, cmd in calls:
        assert cmd[1:5] == ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    header = (tmp_path / 'runs' / 'sa' / 'seed0' / 'stdout.txt').read_text()
    assert 'CUDA_VISIBLE_DEVICES=' in header


def test_budget_arithmetic(tiny):
    cfg = grid.resolve(str(tiny / 'tiny.py'), [f'--data_dir={tiny / "data"}'], {})
    b = grid.budget(cfg, 20, 'H100', 0.25)
    params, fpt = grid.model_size(cfg, 20)
    assert b['tokens'] == 4 * 4 * 16 and b['flops_per_token'] == fpt and b['params'] == params
    evals = 3 * 2 * 2 * 4 * 16  # at 0, 2, 4; train and val; eval_iters x batch x block
    assert b['flops'] == pytest.approx(b['tokens'] * fpt + evals * fpt / 3)
    assert b['gpu_hours'] == pytest.approx(b['flops'] / (hardware.cuda_peak('H100') * 0.25) / 3600)


def test_makespan_puts_each_run_on_the_first_free_slot():
    assert grid.makespan([3, 3, 3], 2) == 6
    assert grid.makespan([5, 1, 1, 1, 1, 1], 2) == 5
    assert grid.makespan([2, 2], 8) == 2


def test_dry_run_lists_every_run_with_command_and_budget(tiny, tmp_path, capsys):
    out = tmp_path / 'dry'
    rc = compare.main(['--config', str(tiny / 'tiny.py'), f'--data_dir={tiny / "data"}', '--out', str(out),
                       '--variants', 'sa,hfa', '--seeds', '0,1,2', '--gpus', '0-1', '--dry_run', '--est_mfu', '0.5'])
    text = capsys.readouterr().out
    assert rc == 0 and not out.exists()  # nothing trained, nothing written
    runs = [l for l in text.splitlines() if ' seed ' in l and '[scratch]' in l]
    assert [l.split(' [')[0] for l in runs] == [f'{v} seed {s}' for s in (0, 1, 2) for v in ('sa', 'hfa')]  # seed by seed
    args = args_of(tiny, '--out', str(out), '--variants', 'sa,hfa', '--seeds', '0,1,2', '--est_mfu', '0.5')
    per_variant, total = grid.grid_budget(args, grid.plan(args), args.seeds)
    commands = [l for l in text.splitlines() if 'train.py' in l]
    assert len(commands) == 6 and commands[0].strip().startswith('CUDA_VISIBLE_DEVICES=0 ')
    for v in ('sa', 'hfa'):
        for s in (0, 1, 2):
            assert any(f'--seed={s}' in c and f'runs/{v}/seed{s}' in c for c in commands)
    assert grid.gpu_time_text(per_variant['hfa']['gpu_hours']) + '\n' in runs[3] + '\n'
    assert f"total: {total['tokens']:,} tokens" in text  # a CPU-sized grid: not '7.68e-06B tokens'
    assert 'GPU-seconds' in runs[3]  # not '0.0 GPU-hours'
    assert total['gpu_hours'] == pytest.approx(3 * sum(b['gpu_hours'] for b in per_variant.values()))


def test_dry_run_of_a_cpu_grid_gives_no_gpu_time(tiny, tmp_path, capsys):
    """device='cpu' and no --gpus: tokens and FLOPs, runs at a time on CPU cores; no H100 estimate."""
    rc = compare.main(['--config', str(tiny / 'tiny.py'), f'--data_dir={tiny / "data"}', '--out', str(tmp_path / 'd'),
                       '--variants', 'sa', '--seeds', '2', '--jobs', '2', '--dry_run'])
    text = capsys.readouterr().out
    assert rc == 0 and 'GPU' not in text.replace('no GPU time', '')
    assert '2 runs (1 variant x 2 seeds); a CPU grid' in text and '2 runs at a time on CPU cores (--jobs)' in text
    assert "# Grid budget: 2 runs (1 variant x 2 seeds), " in text and "a CPU grid (device='cpu')" in text


def test_config_file_carries_compare_defaults_the_command_line_wins(tiny, tmp_path):
    cfg = tiny / 'with_defaults.py'
    cfg.write_text(TINY + "_compare = dict(variants='sa,hfa4', seeds='2', match='params', match_by='head_dim')\n")
    a = grid.parse_args(['--config', str(cfg), '--out', str(tmp_path)])
    assert (a.variants, a.seeds, a.match, a.match_by) == ('sa,hfa4', [0, 1], 'params', 'head_dim')
    b = grid.parse_args(['--config', str(cfg), '--out', str(tmp_path), '--seeds', '5', '--match', 'none'])
    assert (b.seeds, b.match) == (list(range(5)), 'none')
    cfg.write_text(TINY + "_compare = dict(sedes='2')\n")
    with pytest.raises(UserError, match='sedes'):
        grid.parse_args(['--config', str(cfg), '--out', str(tmp_path)])


# -----------------------------------------------------------------------------
# config/ia_table.py: the preset's whole grid (5 variants x 3 seeds) at toy size on CPU

TOY = ['--device=cpu', '--compile=False', '--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16',
       '--batch_size=4', '--gradient_accumulation_steps=1', '--max_iters=2', '--lr_decay_iters=2',
       '--warmup_iters=1', '--eval_interval=2', '--eval_iters=1', '--log_interval=1']


@pytest.fixture(scope='module')
def ia_grid(tiny):
    out = tiny / 'ia_table'
    argv = ['--config', str(ROOT / 'config' / 'ia_table.py'), '--out', str(out), '--jobs', '2', '--threads', '1',
            f'--data_dir={tiny / "data"}', *TOY]
    return out, compare.main(argv), grid.parse_args(argv)


@pytest.mark.slow
def test_ia_table_grid_runs_every_variant_and_seed(ia_grid):
    out, rc, _ = ia_grid
    assert rc == 0
    rows = json.loads((out / 'results.json').read_text())
    assert [r['variant'] for r in rows] == ['sa', 'hfa2', 'hfa4', 'ha_share', 'ha_noshare']
    assert all(r['n_seeds'] == 3 and r['seeds'] == [0, 1, 2] and not r['failed'] for r in rows)
    configs = {r['variant']: json.loads((out / 'runs' / r['variant'] / 'seed0' / 'run.json').read_text())['config']
               for r in rows}
    assert configs['hfa2']['attention'] == configs['hfa4']['attention'] == 'hfa_v1'
    assert (configs['hfa2']['hfa_order'], configs['hfa4']['hfa_order']) == (2, 4)
    assert [configs[v]['ha_share_kv'] for v in ('ha_share', 'ha_noshare')] == [True, False]
    assert all(configs[v]['attention'] == 'ha' and configs[v]['attn_layers'] == '' and
               configs[v]['ha_window1'] == configs[v]['ha_window2'] == 64 for v in ('ha_share', 'ha_noshare'))


@pytest.mark.slow
def test_ia_table_grid_is_parameter_matched(ia_grid):
    """Variants that add weights get the head width (a multiple of 8) whose size is closest to
    SA's; ha_share has SA's count already."""
    out, _, args = ia_grid
    rows = {r['variant']: r for r in json.loads((out / 'results.json').read_text())}
    assert rows['ha_share']['params'] == rows['sa']['params']
    target = rows['sa']['params']
    for v in ('hfa2', 'hfa4', 'ha_noshare'):
        dh = rows[v]['overrides']['head_dim']
        assert dh % 8 == 0
        cfg = grid.resolve(args.config, args.extra, rows[v]['overrides'])
        for other in (dh - 8, dh + 8):
            if other > 0:
                size = grid.model_size({**cfg, 'head_dim': other}, 20)[0]
                assert abs(size - target) >= abs(rows[v]['params'] - target)
