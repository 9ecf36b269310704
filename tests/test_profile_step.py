"""tools/profile_step.py: where a train step spends its time, per variant, and the variants'
speed against the first from interleaved rounds."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tools'))

import profile_step  # noqa: E402


def test_speed_ratios_are_the_median_over_rounds_of_the_base_time_over_the_variant_time():
    times = {'sa': [1.0, 2.0, 1.0], 'hfa_v1': [2.0, 2.0, 4.0]}
    assert profile_step.speed_ratios(times, 'sa') == {'sa': 1.0, 'hfa_v1': 0.5}  # rounds: 0.5, 1.0, 0.25


def test_the_table_ranks_ops_by_their_largest_share_and_totals_each_variant():
    text = profile_step.table({'sa': {'aten::mm': 3.0, 'aten::add': 1.0},
                               'hfa': {'aten::mm': 3.0, 'aten::bmm': 5.0, 'aten::add': 2.0}}, top=2)
    rows = text.splitlines()
    assert rows[2].startswith('| `aten::mm` | 3.00 ms (75.0%) | 3.00 ms (30.0%)')  # 75% of sa beats bmm's 50%
    assert rows[3].startswith('| `aten::bmm` | 0.00 ms (0.0%) | 5.00 ms (50.0%)')
    assert rows[-1] == '| all ops | 4.00 ms | 10.00 ms |' and len(rows) == 5


@pytest.mark.parametrize('timer', ['cpu', 'profiler'])
def test_a_tiny_run_profiles_every_variant_and_its_op_times_add_up(timer, capsys):
    ratios = profile_step.main(['--variants', 'sa,hfa_v1', '--block_size', '16', '--n_layer', '1', '--rounds', '2',
                                '--steps', '1', '--profile_rounds', '1', '--profile_steps', '1', '--timer', timer, '--top', '100',
                                '--threads', str(torch.get_num_threads())])  # the tests' own thread count
    out = capsys.readouterr().out
    assert set(ratios) == {'sa', 'hfa_v1'} and ratios['sa'] == 1.0 and ratios['hfa_v1'] > 0
    assert '| op (self CPU time) | sa | hfa_v1 |' in out and '`aten::bmm` | 0.00 ms (0.0%) |' in out  # HFA's scores
    assert "hfa_v1: " in out and "x sa's" in out
