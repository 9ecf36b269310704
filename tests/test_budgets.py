"""The GPU configs: each header states its budget as computed from the model itself
(tools/budgets.py), every one turns torch.compile on (whether the models compile:
tests/test_kernels_compile.py), and every budget fits a day on one 8-GPU node at the
stated MFU, except the one labelled LONG (nanoGPT's full recipe)."""

import re
from pathlib import Path

import pytest

from nanohfa import grid
from tools import budgets

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = budgets.gpu_configs()


def test_the_gpu_configs_are_found():
    names = {p.stem for p in CONFIGS}
    assert {'sa', 'hfa', 'hfa_v2', 'linear', 'ha', 'ia_table', 'sa_nanogpt', 'owt_gpt3small_sa'} <= names
    assert not names & {'cpu_sa', 'compare_cpu', 'quickstart', 'eval_gpt2', 'finetune_shakespeare'}


@pytest.mark.slow  # sizes every run of a grid (ia_table: seconds)
@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.stem)
def test_header_states_the_computed_budget(path):
    text = path.read_text()
    for prefix, line in budgets.expected_lines(path).items():
        assert line in text, f"{path.name}: header line '{prefix}' is stale; run python -m tools.budgets --write"


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.stem)
def test_gpu_config_turns_compile_on(path):
    assert grid.resolve(str(path), [], {})['compile'] is True


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.stem)
def test_budget_fits_a_day_on_8_gpus_unless_labelled_long(path):
    header = ''.join(l for l in path.read_text().splitlines(keepends=True) if l.startswith('#'))
    hours = [float(h.replace(',', '')) / (60 if unit == 'min' else 1)
             for h, unit in re.findall(r'= ([\d,.]+) (h|min) on \d+ (?:x \w+|GPUs)', header)]
    assert hours, path.name
    assert max(hours) <= 24 or 'LONG' in header, f"{path.name}: {max(hours)} h on one node and not labelled LONG"


def test_a_stale_header_is_caught(tmp_path):
    cfg = tmp_path / 'stale.py'
    cfg.write_text((ROOT / 'config' / 'owt_gpt3small_sa.py').read_text() + 'max_iters = 20000\n')
    line = budgets.expected_lines(cfg)['# Budget:']
    assert line not in cfg.read_text() and '9.83B tokens (20,000 iterations' in line
