"""config/scaling_xl.py: the ~3B preset (SA and its twin with HA in every 4th layer, Roy et al.'s
windows), trained under FSDP on one 8-GPU node. Its header states the parameters, the tokens (20
per SA parameter), the GPU-hours (tests/test_budgets.py checks those lines) and the per-GPU
memory table, which is recomputed here from the models (built on the meta device) with
hardware.training_memory."""

from pathlib import Path

import pytest

from nanohfa import grid
from nanohfa import hardware

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'config' / 'scaling_xl.py'
SETUPS = [('DDP', 'ddp', False), ('DDP + checkpointing', 'ddp', True), ('FSDP', 'fsdp', False),
          ('FSDP + checkpointing', 'fsdp', True)]
PARTS = ['parameters', 'gradients', 'optimizer', 'bf16 weights', 'activations', 'logits', 'total']
GPUS, GPU_GB = 8, 80


def memory_rows(variant):
    """{setup: bytes by part} per GPU of one variant of the plan, on 8 GPUs."""
    cfg = variant['cfg']
    params = grid.model_size(cfg, grid.vocab_size(cfg))[0] + cfg['block_size'] * cfg['n_embd']  # wpe too
    ha_layers = cfg['attn_layers'].split(',').count('ha') if cfg['attn_layers'] else 0
    return {name: hardware.training_memory(params, cfg['n_layer'], cfg['n_embd'], grid.vocab_size(cfg),
                                           cfg['block_size'], cfg['batch_size'], GPUS, parallel, ac,
                                           cfg['gradient_accumulation_steps'] // GPUS, ha_layers)
            for name, parallel, ac in SETUPS}


def table_lines(variant):
    """The header's rows: '#   <variant> <setup>  <GB by part>'."""
    return [f"#   {variant['variant']:<6} {name:<21}" + ''.join(f"{m[p] / 1e9:>7.1f}" for p in PARTS)
            for name, m in memory_rows(variant).items()]


@pytest.fixture(scope='module')
def plan(tmp_path_factory):
    args = grid.parse_args(['--config', str(CONFIG), '--gpus', '0-7', '--out', str(tmp_path_factory.mktemp('xl'))])
    return args, {v['variant']: v for v in grid.plan(args)}


def test_the_variants_are_sa_and_its_ha_twin(plan):
    args, v = plan
    assert list(v) == ['sa', 'ha4_w'] and args.nproc == 8 and args.seeds == [0]
    sa, ha4 = v['sa']['cfg'], v['ha4_w']['cfg']
    assert sa['attention'] == 'sa' and sa['attn_layers'] == '' and sa['n_embd'] // sa['n_head'] == 64
    assert ha4['attn_layers'].split(',') == ['ha' if (i + 1) % 4 == 0 else 'sa' for i in range(ha4['n_layer'])]
    assert (ha4['ha_window1'], ha4['ha_window2'], ha4['ha_order'], ha4['ha_share_kv']) == (512, 32, 3, False)
    for c in (sa, ha4):
        assert c['parallel'] == 'fsdp' and c['compile'] and c['block_size'] == 1024
        assert c['gradient_accumulation_steps'] % 8 == 0


def test_about_3b_parameters_and_20_tokens_per_parameter(plan):
    _, v = plan
    sa = v['sa']
    assert 2.8e9 < sa['params_planned'] < 3.2e9
    assert 1.0 < v['ha4_w']['params_planned'] / sa['params_planned'] < 1.05
    tpi = grid.tokens_per_iter(sa['cfg'])
    assert round(20 * sa['params_planned'] / tpi) == sa['cfg']['max_iters'] == v['ha4_w']['cfg']['max_iters']
    assert all(x['cfg']['lr_decay_iters'] == x['cfg']['max_iters'] for x in v.values())
    assert all(x['cfg']['warmup_iters'] == round(0.05 * x['cfg']['max_iters']) for x in v.values())
    header = CONFIG.read_text()
    assert f"{sa['params_planned'] / 1e9:.2f}B parameters" in header
    assert f"{v['ha4_w']['params_planned'] / 1e9:.2f}B" in header


def test_header_states_the_memory_table(plan):
    _, v = plan
    header = CONFIG.read_text()
    for variant in v.values():
        for line in table_lines(variant):
            assert line in header, f"stale memory table; expected:\n" + '\n'.join(table_lines(variant))


def test_fsdp_fits_80gb_and_ddp_does_not(plan):
    """The reason for the preset's parallel='fsdp': DDP holds 20 bytes per parameter (22 with
    autocast's bf16 copies) on every GPU, 60+ GB before activations; FSDP leaves room to spare."""
    _, v = plan
    for variant in v.values():
        m = memory_rows(variant)
        assert m['DDP']['total'] > GPU_GB * 1e9
        assert m['DDP + checkpointing']['total'] > 0.9 * GPU_GB * 1e9  # no room for CUDA and NCCL buffers
        assert m['FSDP']['total'] < 0.7 * GPU_GB * 1e9
        assert m['FSDP + checkpointing']['activations'] < m['FSDP']['activations'] / 5
        states = sum(m['FSDP'][p] for p in ('parameters', 'optimizer'))
        assert states == pytest.approx(12 * (m['DDP']['parameters'] / 4) / GPUS)  # 12 bytes per parameter / 8
