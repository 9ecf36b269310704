"""The scaling study's presets (config/scaling_s.py, scaling_m.py, scaling_l.py): each size's dry run
lists its 12 runs (SA, windowed SA, HA in every layer, HA in every 4th layer; 3 seeds) with their
budgets, every variant of a size sees 20 tokens per SA parameter, every-layer HA is matched to SA's
parameter count by head width, and docs/comparing.md states each size's grid and their total. Nothing is
trained: the models are built on the meta device."""

from pathlib import Path

import pytest

import compare
from nanohfa import grid

ROOT = Path(__file__).resolve().parents[1]
SIZES = {'scaling_s': (8, 512), 'scaling_m': (12, 768), 'scaling_l': (24, 1024)}
VARIANTS = ['sa', 'sa_w512', 'ha_w', 'ha4_w']


def args_of(name, out, *more):
    return grid.parse_args(['--config', str(ROOT / 'config' / f'{name}.py'), '--gpus', '0-7', '--out', str(out), *more])


@pytest.fixture(scope='module', params=list(SIZES))
def size(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    args = args_of(request.param, out)
    return request.param, args, {v['variant']: v for v in grid.plan(args)}


def test_dry_run_lists_every_run_with_its_budget(size, capsys):
    name, args, variants = size
    rc = compare.main(['--config', args.config, '--gpus', '0-7', '--out', args.out, '--dry_run'])
    text = capsys.readouterr().out
    assert rc == 0 and not Path(args.out).joinpath('runs').exists()
    runs = [l for l in text.splitlines() if ' seed ' in l and '[scratch]' in l]
    assert [l.split(' [')[0] for l in runs] == [f'{v} seed {s}' for s in (0, 1, 2) for v in VARIANTS]  # seed by seed
    per_variant, total = grid.grid_budget(args, list(variants.values()), args.seeds)
    for line in runs:
        assert grid.gpu_time_text(per_variant[line.split(' seed ')[0]]['gpu_hours']) in line
    commands = [l for l in text.splitlines() if 'train.py' in l]
    assert len(commands) == 12 and all(f'config/{name}.py' in c for c in commands)
    assert f"total: {grid.tokens_text(total['tokens'])} tokens" in text
    assert grid.grid_budget_line(args, list(variants.values()), args.seeds) in text


def test_the_variants_are_the_study(size):
    name, args, v = size
    n_layer, n_embd = SIZES[name]
    cfgs = {k: x['cfg'] for k, x in v.items()}
    assert list(v) == VARIANTS and args.seeds == [0, 1, 2] and args.match == 'none'
    assert all(c['n_layer'] == n_layer and c['n_embd'] == n_embd and c['block_size'] == 1024 for c in cfgs.values())
    assert all(c['dataset'] == 'openwebtext' and c['report_split'] and c['compile'] for c in cfgs.values())
    assert cfgs['sa']['attention'] == 'sa' and cfgs['sa']['attn_window'] == 0 and cfgs['sa']['attn_layers'] == ''
    assert cfgs['sa_w512']['attention'] == 'sa' and cfgs['sa_w512']['attn_window'] == 512
    ha, ha4 = cfgs['ha_w'], cfgs['ha4_w']
    assert ha['attention'] == 'ha' and ha['attn_layers'] == ''
    layers = ha4['attn_layers'].split(',')  # HA in layers 4, 8, ... (1-based), SA elsewhere
    assert layers == ['ha' if (i + 1) % 4 == 0 else 'sa' for i in range(n_layer)]
    for c in (ha, ha4):  # Roy et al.'s windows, inside the context; no weight sharing
        assert (c['ha_window1'], c['ha_window2'], c['ha_order'], c['ha_share_kv']) == (512, 32, 3, False)
        assert c['ha_window1'] < c['block_size']
    assert ha4['head_dim'] in (0, 64) and cfgs['sa']['n_embd'] // cfgs['sa']['n_head'] == 64


def test_tokens_are_20_per_parameter_and_the_same_for_every_variant(size):
    _, _, v = size
    sa = v['sa']
    tokens = {k: x['cfg']['max_iters'] * grid.tokens_per_iter(x['cfg']) for k, x in v.items()}
    assert len(set(tokens.values())) == 1
    iters = sa['cfg']['max_iters']
    assert abs(tokens['sa'] / sa['params_planned'] - 20) <= 0.5 * grid.tokens_per_iter(sa['cfg']) / sa['params_planned']
    assert round(20 * sa['params_planned'] / grid.tokens_per_iter(sa['cfg'])) == iters
    assert all(x['cfg']['lr_decay_iters'] == iters and x['cfg']['warmup_iters'] == round(0.05 * iters) for x in v.values())


def test_every_layer_ha_is_matched_to_sa_by_head_width(size):
    _, _, v = size
    target = v['sa']['params_planned']
    ha = v['ha_w']
    unmatched = {**ha['cfg'], 'head_dim': 0}
    assert {'head_dim': ha['cfg']['head_dim']} == grid.match_size(unmatched, 50304, target, 'params', 'head_dim', 8)
    assert abs(ha['params_planned'] / target - 1) < 0.02
    assert 1.0 < v['ha4_w']['params_planned'] / target < 1.04  # Roy et al.'s placement, unmatched: +2-4%


def test_the_largest_size_fits_in_openwebtext_once():
    cfg = grid.resolve(str(ROOT / 'config' / 'scaling_l.py'), [], {})
    assert cfg['max_iters'] * grid.tokens_per_iter(cfg) < 9.0e9  # OpenWebText's training split, GPT-2 tokens


def test_readme_states_the_gpu_hours_of_each_size_and_their_total(tmp_path):
    hours = []
    for name in SIZES:
        args = args_of(name, tmp_path / name)
        hours.append(grid.grid_budget(args, grid.plan(args), args.seeds)[1]['gpu_hours'])
    section = ' '.join((ROOT / 'docs' / 'comparing.md').read_text().split())
    assert 'config/scaling_s.py' in section
    stated = ', '.join(f'{h:.1f}' for h in hours[:-1]) + f' and {hours[-1]:.1f} GPU-hours ({sum(hours):.1f} in all'
    assert stated in section, f"docs/comparing.md should state {stated}"
