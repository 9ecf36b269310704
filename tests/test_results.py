"""RESULTS.md says what the committed grid results say: every table and ranking sentence that
tools/grid_report.py regenerates from grids/*/results.json appears in RESULTS.md verbatim,
and the statistics in those tables are recomputed, not copied."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tools import grid_report

ROOT = Path(__file__).resolve().parents[1]

GRIDS = sorted(p.parent.name for p in (ROOT / 'grids').glob('*/results.json'))


def blocks(markdown):
    """Tables (runs of '|' lines) and ranking sentences of a report."""
    out, table = [], []
    for line in markdown.splitlines() + ['']:
        if line.startswith('|'):
            table.append(line)
            continue
        if table:
            out.append('\n'.join(table))
            table = []
        if line.startswith('Ranking of all'):
            out.append(line)
    return out


def test_results_md_matches_committed_results():
    assert GRIDS, 'no grids/*/results.json: RESULTS.md has nothing to come from'
    text = (ROOT / 'RESULTS.md').read_text()
    missing = [b.splitlines()[0][:100] for b in blocks(grid_report.report()) if b not in text]
    assert not missing, f'RESULTS.md is stale (rerun tools/grid_report.py): {missing}'


@pytest.mark.parametrize('grid', GRIDS)
def test_committed_statistics_follow_from_the_runs(grid):
    """mean, std, CI and Welch p of each row, recomputed from its per-seed final losses."""
    rows = json.loads((ROOT / 'grids' / grid / 'results.json').read_text())
    ref = next((r for r in rows if r['variant'] == 'sa'), None)
    for r in rows:
        x = np.array([run['val_loss'] for run in r['runs']])
        assert len(x) == r['n_seeds'] == len(r['seeds'])
        if not r['n_seeds']:  # planned, nothing finished: grid_report leaves it out of every table
            assert r['failed'] and r['variant'] not in (grid_report.load(grid) or {})
            continue
        assert not {f['seed'] for f in r['failed']} & set(r['seeds'])  # an unfinished seed is never counted
        assert r['val_loss_mean'] == pytest.approx(x.mean())
        assert [c[-1][1] for c in r['curves'].values()] == pytest.approx(list(x))  # final = last eval
        if len(x) > 1:
            assert r['val_loss_std'] == pytest.approx(x.std(ddof=1))
            assert r['val_loss_ci95'] == pytest.approx(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
        if ref and r is not ref and len(x) > 1:
            y = [run['val_loss'] for run in ref['runs']]
            assert r['p_vs_sa'] == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue)


def test_settle_point_is_the_last_change_of_ranking():
    """A crossing at the third evaluation is reported there; a later tie-free run is not."""
    def row(name, losses):
        curve = [(i * 10, l, i, l) for i, l in enumerate(losses)]
        return {'variant': name, 'runs': [{'val_loss': losses[-1]}], 'curves': {'0': curve}}
    rows = {'sa': row('sa', [5, 3.0, 2.5, 2.0, 1.8, 1.7]), 'ha': row('ha', [5, 2.8, 2.4, 2.1, 1.9, 1.8])}
    text, last = grid_report.settle_table(rows)
    assert last == 3
    assert '| `ha` | 3 |' in text


def _row(name, finals_, iters=1000, flops=1.0, seeds=None):
    seeds = list(range(len(finals_))) if seeds is None else seeds
    return {'variant': name, 'n_seeds': len(finals_), 'seeds': seeds, 'params': 10, 'flops_per_token': flops,
            'tokens': iters * 8, 'iters': iters, 'tokens_per_iter': 8, 'overrides': {'attention': name},
            'val_loss_mean': float(np.mean(finals_)), 'runs': [{'seed': s, 'val_loss': x} for s, x in zip(seeds, finals_)],
            'curves': {str(s): [(0, 5.0, 0, 5.0), (iters * 8, x, iters, x)] for s, x in zip(seeds, finals_)}}


def test_pooled_seeds_join_one_row_and_refuse_other_settings():
    a, b = _row('sa', [2.0, 2.2]), _row('sa', [2.1], seeds=[3])
    row = grid_report.pooled(a, b)
    assert row['n_seeds'] == 3 and row['seeds'] == [0, 1, 3] and grid_report.finals(row) == [2.0, 2.2, 2.1]
    assert set(row['curves']) == {'0', '1', '3'}
    with pytest.raises(AssertionError, match='iters'):
        grid_report.pooled(a, _row('sa', [2.1], iters=500, seeds=[3]))
    with pytest.raises(AssertionError, match='seed in both'):
        grid_report.pooled(a, _row('sa', [2.1], seeds=[1]))


def test_equal_compute_verdicts_follow_from_runs_with_their_own_schedules():
    """Costlier and worse at equal tokens: worse at equal FLOPs. Costlier and better: a verdict
    only if a run no longer than its budget is already better; otherwise 'needs a run'."""
    grids = {'main': {'sa': _row('sa', [2.0, 2.0]), 'slow_bad': _row('slow_bad', [2.2, 2.2], flops=2.0),
                      'cheap_good': _row('cheap_good', [1.9, 1.9], flops=0.5),
                      'slow_good': _row('slow_good', [1.9, 1.9], flops=2.0),
                      'slow_good_early': _row('slow_good_early', [1.8, 1.8], flops=2.0)},
             'lr_sweep': {'slow_good_early_lr1e-3': _row('slow_good_early_lr1e-3', [1.95], iters=400)}}
    v = grid_report.equal_compute(grids, None)
    assert v['slow_bad']['flops'][0].startswith('worse') and v['slow_bad']['flops'][1] == 500
    assert v['cheap_good']['flops'][0].startswith('better')
    assert v['slow_good']['flops'][0].startswith('needs a run')
    assert v['slow_good_early']['flops'][0].startswith('better (500 its; 1.950 at 400)')
    assert v['sa']['time'][0] == 'not measured'


def test_write_refreshes_marked_tables_only(tmp_path):
    doc = tmp_path / 'R.md'
    doc.write_text('prose\n<!-- table main -->\nold\n<!-- /table -->\nmore prose\n')
    assert grid_report.write_results(doc, {'main': '| new |'}) == ['main']
    assert doc.read_text() == 'prose\n<!-- table main -->\n| new |\n<!-- /table -->\nmore prose\n'
    assert grid_report.write_results(doc, {'main': '| new |'}) == []
    doc.write_text('<!-- table nope -->\nx\n<!-- /table -->\n')  # a grid not run: left as it is
    assert grid_report.write_results(doc, {'main': '| new |'}) == []
    assert doc.read_text() == '<!-- table nope -->\nx\n<!-- /table -->\n'


# -- the long study's statistics ------------------------------------------------------

def _long_row(name, finals_by_seed, gaps=None, iters=(0, 100, 200, 300, 400, 500, 600)):
    """A report_split row: report-half finals per seed, selection-half curves (loss = final + gap(t))."""
    gaps = gaps or {}
    curve = lambda s, x: [(i * 8, x + gaps.get(s, lambda t: 0.0)(i), i, x) for i in iters]
    return {'variant': f'{name}_lr8e-3', 'runs': [{'seed': s, 'report_loss': x} for s, x in finals_by_seed.items()],
            'curves': {str(s): curve(s, x) for s, x in finals_by_seed.items()}}


def test_holm_adjusts_step_down_and_keeps_the_order():
    assert grid_report.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert grid_report.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_paired_difference_is_seed_against_seed():
    a = _long_row('ha', {0: 1.70, 1: 1.72, 2: 1.71})
    b = _long_row('sa', {0: 1.75, 1: 1.74, 2: 1.77, 3: 1.9})  # seed 3 has no partner: left out
    seeds, d, mean, half, p = grid_report.paired(a, b)
    assert seeds == [0, 1, 2] and d == pytest.approx([-0.05, -0.02, -0.06])
    assert mean == pytest.approx(-0.13 / 3)
    assert p == pytest.approx(stats.ttest_rel([1.70, 1.72, 1.71], [1.75, 1.74, 1.77]).pvalue)


def test_settle_rule_sees_a_gap_that_is_still_closing():
    flat = {0: 1.0, 1: 1.1, 2: 1.2}
    a = _long_row('ha', flat, gaps={s: (lambda t, s=s: 0.001 * s * (t % 200 == 0)) for s in flat})
    b = _long_row('sa', {s: x - 0.02 for s, x in flat.items()})
    assert grid_report.settle(a, b)['settled']  # a constant gap of +0.02, a little noise
    closing = {s: (lambda t, s=s: 0.1 * (1 - t / 600) * (1 + 0.1 * s)) for s in flat}
    a = _long_row('ha', flat, gaps=closing)
    st = grid_report.settle(a, b)
    assert not st['settled'] and st['verdict'].startswith('not settled: gap closing at')
    assert st['slope'] == pytest.approx(-0.1 / 0.6 * 1.1, rel=1e-6)


def test_settle_rule_sees_an_order_change_in_the_last_half():
    flat = {0: 1.0, 1: 1.0, 2: 1.0}
    late = {s: (lambda t: -0.05 if t < 400 else 0.0) for s in flat}  # a behind b until iteration 400
    a = _long_row('ha', flat, gaps=late)
    b = _long_row('sa', {s: x - 0.01 for s, x in flat.items()})
    st = grid_report.settle(a, b)
    assert st['last_flip'] == 400 and st['verdict'] == 'not settled: order changed at iteration 400'


def test_a_stall_is_far_above_the_other_seeds_and_a_straggler_is_not():
    sa = {0: 1.803, 1: 1.970, 2: 1.805, 3: 1.796, 4: 1.811}  # the main grid's SA at 8e-3
    assert grid_report.stalled_seeds(sa) == [1]
    tight = {0: 1.790, 1: 1.792, 2: 1.791, 3: 1.815}  # 0.024 above: within the 0.05 floor
    assert grid_report.stalled_seeds(tight) == []
    assert grid_report.stalled_seeds({0: 1.8, 1: float('nan'), 2: 1.81}) == [1]


def test_long_grids_name_each_chosen_rate_by_its_variant(tmp_path, monkeypatch):
    """The chosen rate's row (several seeds) is keyed by its variant; a candidate rate run with
    seed 0 only is not part of the comparison."""
    rows = [{**_long_row('ha_share_w', {0: 1.5, 1: 1.6}), 'n_seeds': 2},
            {**_long_row('ha_share_w', {0: 1.55}), 'variant': 'ha_share_w_lr1.6e-2', 'n_seeds': 1},
            {**_long_row('sa_w16', {0: 1.52, 1: 1.58}), 'variant': 'sa_w16_lr4e-3', 'n_seeds': 2}]
    (tmp_path / 'long').mkdir()
    (tmp_path / 'long' / 'results.json').write_text(json.dumps(rows))
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    longs = grid_report.long_grids()
    assert list(longs) == [6000] and sorted(longs[6000]) == ['ha_share_w', 'sa_w16']
    assert longs[6000]['sa_w16']['variant'] == 'sa_w16_lr4e-3'


def test_long_grids_pool_the_later_seeds(tmp_path, monkeypatch):
    """Seeds 3 and 4, trained later into long_more, join the chosen rate's row of long; a
    row of long_more with other settings is refused, not pooled."""
    same = dict(params=1, flops_per_token=1.0, tokens=10, iters=6000, tokens_per_iter=2, overrides={'learning_rate': 8e-3})
    first = {**_long_row('ha_share_w', {0: 1.5, 1: 1.6, 2: 1.55}), **same, 'n_seeds': 3, 'seeds': [0, 1, 2]}
    later = {**_long_row('ha_share_w', {3: 1.52, 4: 1.58}), **same, 'n_seeds': 2, 'seeds': [3, 4]}
    for grid, rows in (('long', [first]), ('long_more', [later])):
        (tmp_path / grid).mkdir()
        (tmp_path / grid / 'results.json').write_text(json.dumps(rows))
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    row = grid_report.long_grids()[6000]['ha_share_w']
    assert row['seeds'] == [0, 1, 2, 3, 4] and sorted(grid_report.report_finals(row)) == [0, 1, 2, 3, 4]
    (tmp_path / 'long_more' / 'results.json').write_text(json.dumps([{**later, 'iters': 3000}]))
    with pytest.raises(AssertionError, match='iters'):
        grid_report.long_grids()


# the scale study: the key pair longer (12,000 iterations) and wider (widths 48, 96, 192)

def _scale_row(preset, finals_by_seed, iters=(0, 1000, 2000, 3000), params=1000, flops=1e6):
    row = _long_row(preset.rsplit('_lr', 1)[0], finals_by_seed, iters=iters)
    for run in row['runs']:
        run.update(val_loss=run['report_loss'] + 0.05, tokens=1)  # selection half: a little above the report half
    return {**row, 'variant': preset, 'n_seeds': len(finals_by_seed), 'seeds': sorted(finals_by_seed),
            'params': params, 'flops_per_token': flops, 'iters': iters[-1], 'tokens': 1, 'tokens_per_iter': 1,
            'overrides': {}}


def _write_grids(root, grids):
    for name, rows in grids.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / 'results.json').write_text(json.dumps(rows))


def test_width_slope_is_a_per_seed_fit_against_log_width(tmp_path, monkeypatch):
    """Seed s's gap grows by k_s per doubling of width: the slopes are k_s, their mean is tested."""
    k = {0: -0.010, 1: -0.012, 2: -0.008}
    widths = {}
    for i, w in enumerate((48, 96, 192)):
        widths[w] = {'ha_share_w': _scale_row('ha_share_w_lr8e-3', {s: 1.6 + 0.01 * s + k[s] * (i - 1) for s in k}),
                     'sa_w16': _scale_row('sa_w16_lr4e-3', {s: 1.6 for s in k})}
    seeds, slopes, mean, half, p = grid_report.width_slope(widths)
    assert seeds == [0, 1, 2] and slopes == pytest.approx([k[0], k[1], k[2]])
    assert mean == pytest.approx(-0.010) and p == pytest.approx(stats.ttest_1samp(list(k.values()), 0.0).pvalue)
    del widths[192]
    assert grid_report.width_slope(widths)[0] == []  # two widths: no slope is claimed


def test_gap_change_pairs_each_seeds_gap_across_schedule_lengths():
    """Seed s's gap is g6[s] at 6,000 iterations and g12[s] at 12,000: the change is g12 - g6 per
    seed (only seeds with both), tested against zero, and it joins the scale family."""
    g6, g12 = {0: -0.02, 1: -0.01, 2: -0.015}, {0: -0.005, 1: -0.004, 2: 0.001, 3: -0.03}
    lengths = {n: {'ha_share_w': _scale_row('ha_share_w_lr8e-3', {s: 1.5 + g[s] for s in g}),
                   'sa_w16': _scale_row('sa_w16_lr4e-3', {s: 1.5 for s in g})} for n, g in ((6000, g6), (12000, g12))}
    seeds, d, mean, half, p = grid_report.gap_change(lengths, 6000, 12000)
    expect = [g12[s] - g6[s] for s in (0, 1, 2)]
    assert seeds == [0, 1, 2] and d == pytest.approx(expect)
    assert mean == pytest.approx(np.mean(expect)) and p == pytest.approx(stats.ttest_1samp(expect, 0.0).pvalue)
    claims = [c[0] for c in grid_report.scale_family(lengths, {})]
    assert claims == ['gap at 12,000 iterations', 'change of the gap from 6,000 to 12,000 iterations']
    assert grid_report.gap_change({12000: lengths[12000]}, 6000, 12000)[0] == []


def test_width_table_gives_each_widths_cost_ratios_from_its_step_times(tmp_path, monkeypatch):
    """The width table's cost column: HA / SA in FLOPs per token (from the rows) and in seconds per
    step (grids/wide/step_times.json, keyed variant_d<width>); '-' where a width was not timed."""
    rows = {'ha_share_w': {**_scale_row('ha_share_w_lr8e-3', {0: 1.5, 1: 1.6}), 'flops_per_token': 1.3e6},
            'sa_w16': {**_scale_row('sa_w16_lr4e-3', {0: 1.6, 1: 1.7}), 'flops_per_token': 1.0e6}}
    _write_grids(tmp_path, {'wide': []})
    (tmp_path / 'wide' / 'step_times.json').write_text(json.dumps(
        {'seconds_per_step': {'ha_share_w_d48': 0.06, 'sa_w16_d48': 0.02}}))
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    table = grid_report.width_gap_table({48: rows, 192: rows}).splitlines()
    assert '| 1.30x, 3.0x |' in table[2] and '| 1.30x, - |' in table[3]


def test_width_flops_table_pairs_ha_with_sa_trained_to_the_same_flops(tmp_path, monkeypatch):
    """HA's row at each width against wide_flops' SA row of that width, paired by seed; with three
    widths, the per-seed slope of that gap against log2 width."""
    k = {0: -0.010, 1: -0.012, 2: -0.008}
    ha = {w: _scale_row('ha_share_w_lr8e-3', {s: 1.6 + k[s] * i for s in k}) for i, w in enumerate((48, 96, 192))}
    widths = {w: {'ha_share_w': ha[w], 'sa_w16': _scale_row('sa_w16_lr4e-3', {s: 9.0 for s in k})} for w in ha}
    _write_grids(tmp_path, {'wide_flops': [{**_scale_row(f'sa_w16_d{w}_its{its}', {s: 1.6 for s in k}), 'iters': its}
                                           for w, its in ((48, 3892), (96, 3479), (192, 3247))]})
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    pairs = grid_report.key_pair_widths_flops(widths)
    assert {w: r['sa_w16']['iters'] for w, r in pairs.items()} == {48: 3892, 96: 3479, 192: 3247}
    table = grid_report.width_flops_table(widths).splitlines()
    assert table[2].startswith('| 48 | 3,892 | 3 |') and '| +0.0000 ' in table[2]
    assert table[4].startswith('| 192 | 3,247 | 3 |') and '| -0.0200 [' in table[4]
    assert table[5].startswith('| slope per doubling of width | | 3 |') and '-0.0100 [' in table[5]


def test_length_table_gives_how_far_the_gap_moved_over_the_last_third():
    """HA's selection-half gap falls by 0.03 * t / 600 in seed 0 and 0.06 * t / 600 in seed 1:
    over the last third (200 of 600 iterations) the fitted move is -0.01 and -0.02, mean -0.015."""
    iters = tuple(range(0, 601, 50))
    ha = _long_row('ha_share_w', {0: 1.50, 1: 1.52}, gaps={0: lambda t: -0.03 * t / 600, 1: lambda t: -0.06 * t / 600},
                   iters=iters)
    sa = _long_row('sa_w16', {0: 1.51, 1: 1.53}, iters=iters)
    row = grid_report.length_gap_table({600: {'ha_share_w': ha, 'sa_w16': sa}}).splitlines()[2]
    assert row.startswith('| 600 | 2 |') and row.endswith('| -0.0150 [-0.0785, +0.0485] | -, - |')  # 2 seeds: no stall rule


def test_scale_tables_count_stalled_seeds_per_variant():
    """Five seeds of HA, one far above the others (a stall); SA's five all alike."""
    ha = _scale_row('ha_share_w_lr8e-3', {0: 1.50, 1: 1.51, 2: 1.52, 3: 1.50, 4: 2.40})
    sa = _scale_row('sa_w16_lr4e-3', {s: 1.55 + 0.001 * s for s in range(5)})
    assert grid_report.stalled_cell(ha, sa) == '1, 0'
    assert grid_report.length_gap_table({3000: {'ha_share_w': ha, 'sa_w16': sa}}).splitlines()[2].endswith('| 1, 0 |')
    assert grid_report.width_gap_table({96: {'ha_share_w': ha, 'sa_w16': sa}}).splitlines()[2].endswith('| 1, 0 |')


def test_equal_flops_table_counts_stalled_seeds_of_the_sa_runs_it_reads(tmp_path, monkeypatch):
    """Windowed SA at equal FLOPs: one of its five seeds far above the others."""
    ha = _scale_row('ha_share_w_lr8e-3', {s: 1.50 + 0.001 * s for s in range(5)})
    sa = {**_scale_row('sa_w16_d48_its3906', {0: 1.55, 1: 1.56, 2: 1.54, 3: 2.60, 4: 1.55}), 'iters': 3906}
    _write_grids(tmp_path, {'wide_flops': [sa]})
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    widths = {48: {'ha_share_w': ha, 'sa_w16': _scale_row('sa_w16_lr8e-3', {s: 1.6 for s in range(5)})}}
    assert grid_report.width_flops_table(widths).splitlines()[2].endswith('| 0, 1 |')


def test_equal_cost_reads_sa_between_its_own_schedules_in_log_iterations():
    """HA at 1000 iterations costs 2x SA per iteration: SA's equal-cost loss is interpolated at
    2000 iterations between its 1000- and 3000-iteration runs; past 3000 nothing is claimed."""
    lengths = {n: {'ha_share_w': _scale_row('ha_share_w_lr8e-3', {0: 1.70, 1: 1.72}),
                   'sa_w16': _scale_row('sa_w16_lr4e-3', sa)}
               for n, sa in ((1000, {0: 1.80, 1: 1.82}), (3000, {0: 1.60, 1: 1.64}))}
    (n1, m1, seeds, mean, half), (n3, m3, none, *_) = grid_report.equal_cost_gaps(lengths, {'ha_share_w': 2.0, 'sa_w16': 1.0})
    t = math.log(2) / math.log(3)
    expect = [1.70 - ((1 - t) * 1.80 + t * 1.60), 1.72 - ((1 - t) * 1.82 + t * 1.64)]
    assert (n1, m1, seeds) == (1000, 2000, [0, 1]) and mean == pytest.approx(np.mean(expect))
    assert (n3, m3, none) == (3000, 6000, [])


def test_scale_study_pairs_the_chosen_rates_and_leaves_the_edge_checks_out(tmp_path, monkeypatch):
    """long12k's half-rate runs (seed 0) and the width grid's unchosen rates are reported in the
    rate table only; the pair at 12,000 iterations and at each width is the chosen rates'."""
    five = {s: 1.5 + 0.01 * s for s in range(5)}
    _write_grids(tmp_path, {
        'long3k': [_scale_row('ha_share_w_lr8e-3', five), _scale_row('sa_w16_lr4e-3', {s: x + 0.02 for s, x in five.items()})],
        'long12k': [_scale_row('sa_w16_lr4e-3', {s: x + 0.03 for s, x in five.items()}),
                    _scale_row('ha_share_w_lr8e-3', five),
                    _scale_row('sa_w16_lr2e-3', {0: 1.60}), _scale_row('ha_share_w_lr4e-3', {0: 1.40})],
        'wide': [_scale_row('ha_share_w_d48_lr1.6e-2', {0: 1.70}), _scale_row('ha_share_w_d48_lr8e-3', five),
                 _scale_row('sa_w16_d48_lr8e-3', {s: x + 0.01 for s, x in five.items()}), _scale_row('sa_w16_d48_lr4e-3', {0: 1.9})]})
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    lengths, widths = grid_report.key_pair_lengths(), grid_report.key_pair_widths()
    assert sorted(lengths) == [3000, 12000]
    assert {v: r['variant'] for v, r in lengths[12000].items()} == {'ha_share_w': 'ha_share_w_lr8e-3', 'sa_w16': 'sa_w16_lr4e-3'}
    assert {w: sorted(r['variant'] for r in rows.values()) for w, rows in widths.items()} == {
        48: ['ha_share_w_d48_lr8e-3', 'sa_w16_d48_lr8e-3'], 96: ['ha_share_w_lr8e-3', 'sa_w16_lr4e-3']}
    rates = grid_report.scale_rates_table()
    assert '| 12,000 its | `ha_share_w` | 8e-3 | 1.5500 | 4e-3 | 1.4500 | 4e-3 (half: the chosen rate is at an edge' in rates
    assert '| width 48 | `sa_w16` | 8e-3 | 1.5600 | 4e-3 | 1.9500 | 8e-3 |' in rates
    assert '| width 48 | `ha_share_w` | 1.6e-2 | 1.7500 | 8e-3 | 1.5500 | 8e-3 (the lower: a lower rate was not tried) |' in rates
    family = grid_report.scale_family(lengths, widths)
    assert [c[0] for c in family] == ['gap at 12,000 iterations', 'gap at width 48 (3,000 its)']
    assert family[0][2] == pytest.approx(-0.03)


def test_scale_grids_train_the_chosen_rates_five_seeds_and_check_the_edges(tmp_path, monkeypatch):
    """long12k: the 6,000-iteration study's chosen rates on seeds 0-4, and seed 0 at half of each;
    wide: seed 0 at two rates per width (head size 24), then the lower one's five seeds."""
    from tools import cpu_grids
    for name in ('lr_sweep', 'long'):
        _write_grids(tmp_path, {name: json.loads((ROOT / 'grids' / name / 'results.json').read_text())})
    monkeypatch.setattr(cpu_grids, 'GRIDS', tmp_path)
    variants, seeds, extra = cpu_grids.grid('long12k')
    chosen = cpu_grids.long_choice()
    assert {p: o['seeds'] for p, o in variants.items()} == {
        chosen['sa_w16']: '0,1,2,3,4', chosen['ha_share_w']: '0,1,2,3,4', 'sa_w16_lr2e-3': 1, 'ha_share_w_lr4e-3': 1}
    assert variants[chosen['ha_share_w']]['learning_rate'] == 2 * variants['ha_share_w_lr4e-3']['learning_rate']
    assert extra['max_iters'] == extra['lr_decay_iters'] == 12000 and extra['report_split']
    wide, _, extra = cpu_grids.grid('wide')
    assert len(wide) == 8 and all(o['seeds'] == 1 for o in wide.values()) and extra['max_iters'] == 3000
    assert {(o['n_embd'], o['n_head']) for o in wide.values()} == {(48, 2), (192, 8)}
    assert all(o['n_embd'] // o['n_head'] == 24 for o in wide.values())
    rows = [_scale_row(p, {0: 1.5 + 0.1 * ('lr1.6e-2' in p or 'sa_w16_d' in p and 'lr8e-3' in p)}) for p in wide]
    _write_grids(tmp_path, {'wide': rows})
    wide, _, _ = cpu_grids.grid('wide')
    assert sorted(p for p, o in wide.items() if o['seeds'] == '0,1,2,3,4') == [
        'ha_share_w_d192_lr8e-3', 'ha_share_w_d48_lr8e-3', 'sa_w16_d192_lr4e-3', 'sa_w16_d48_lr4e-3']


def test_wide_step_times_time_the_key_pair_at_every_width(tmp_path, monkeypatch):
    from tools import cpu_grids
    _write_grids(tmp_path, {'lr_sweep': json.loads((ROOT / 'grids' / 'lr_sweep' / 'results.json').read_text())})
    monkeypatch.setattr(cpu_grids, 'GRIDS', tmp_path)
    variants, _, _ = cpu_grids.grid('every_width')
    assert sorted(variants) == sorted(f'{v}_d{w}' for v in ('sa_w16', 'ha_share_w') for w in (48, 96, 192))
    assert variants['ha_share_w_d192']['n_embd'] == 192 and variants['ha_share_w_d192']['n_head'] == 8
    assert 'n_embd' not in variants['sa_w16_d96']  # width 96 is config/compare_cpu.py's own


def test_wide_flops_trains_sa_for_has_flops_at_each_width_at_the_chosen_rate(tmp_path, monkeypatch):
    """Windowed SA at widths 48, 96, 192, for 3,000 x (HA's FLOPs per token / SA's) iterations
    with its own schedule, at the width's chosen rate (96: the long study's), seeds 0-4; refused
    until the width grid has chosen its rates."""
    from tools import cpu_grids
    for name in ('lr_sweep', 'long', 'long3k'):
        _write_grids(tmp_path, {name: json.loads((ROOT / 'grids' / name / 'results.json').read_text())})
    monkeypatch.setattr(cpu_grids, 'GRIDS', tmp_path)
    assert cpu_grids.wide_flops_grid() is None
    with pytest.raises(SystemExit, match='run `python tools/cpu_grids.py wide` first'):
        cpu_grids.grid('wide_flops')
    wide, _, _ = cpu_grids.grid('wide')
    ratio = {48: 0.48 / 0.37, 96: 1.63 / 1.41, 192: 5.92 / 5.47}  # RESULTS.md's MFLOPs per token
    width = lambda p: int(p.split('_d')[1].split('_')[0])
    _write_grids(tmp_path, {'wide': [_scale_row(p, {0: 1.5 + 0.1 * ('sa_w16_d' in p and 'lr8e-3' in p)},
                                                flops=1e6 * (ratio[width(p)] if p.startswith('ha') else 1.0))
                                     for p in wide]})
    variants, seeds, extra = cpu_grids.grid('wide_flops')
    assert [p.split('_its')[0] for p in variants] == ['sa_w16_d48', 'sa_w16_d96', 'sa_w16_d192']
    for p, o in variants.items():
        w = width(p)
        assert o['max_iters'] == o['lr_decay_iters'] == int(p.split('_its')[1])
        assert o['max_iters'] == pytest.approx(3000 * ratio[w], rel=0.01) and o['seeds'] == '0,1,2,3,4'
        assert o['learning_rate'] == 4e-3 and o.get('n_embd', 96) == w and o['attn_window'] == 16
    assert extra['report_split'] and 'max_iters' not in extra


def test_wide_edge_checks_half_the_rate_where_the_lower_rate_won(tmp_path, monkeypatch):
    """Where the width grid chose the lower of its two rates, seed 0 also runs at half of it; the
    rate table reports it, and flags an edge when half did better."""
    from tools import cpu_grids
    for name in ('lr_sweep', 'long'):
        _write_grids(tmp_path, {name: json.loads((ROOT / 'grids' / name / 'results.json').read_text())})
    monkeypatch.setattr(cpu_grids, 'GRIDS', tmp_path)
    assert cpu_grids.wide_edge_grid() is None
    wide, _, _ = cpu_grids.grid('wide')
    lower = {p: o['learning_rate'] == min(q['learning_rate'] for n, q in wide.items() if n.split('_lr')[0] == p.split('_lr')[0])
             for p, o in wide.items()}
    # the lower rate wins for shared HA at both widths, the higher for windowed SA
    losses = {p: 1.5 + 0.1 * (lower[p] != p.startswith('ha')) for p in wide}
    _write_grids(tmp_path, {'wide': [_scale_row(p, {0: losses[p]}) for p in wide]})
    variants, _, extra = cpu_grids.grid('wide_edge')
    assert sorted(variants) == ['ha_share_w_d192_lr4e-3', 'ha_share_w_d48_lr4e-3']
    assert variants['ha_share_w_d192_lr4e-3']['learning_rate'] == 4e-3 and variants['ha_share_w_d192_lr4e-3']['n_embd'] == 192
    assert extra['max_iters'] == 3000
    _write_grids(tmp_path, {'wide_edge': [_scale_row('ha_share_w_d48_lr4e-3', {0: 1.40}),
                                          _scale_row('ha_share_w_d192_lr4e-3', {0: 1.60})]})
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    rates = grid_report.scale_rates_table()
    assert ('| width 48, edge check | `ha_share_w` | 8e-3 | 1.5500 | 4e-3 | 1.4500 | 4e-3 (half: the chosen rate is at '
            'an edge at this width) |') in rates
    assert '| width 192, edge check | `ha_share_w` | 8e-3 | 1.5500 | 4e-3 | 1.6500 | 8e-3 |' in rates


def test_wide_edge_runs_five_seeds_where_half_won_and_checks_half_again(tmp_path, monkeypatch):
    """Where the edge check's half rate beat the chosen one, that rate gets seeds 0-4 and seed 0
    runs at half of it again; the rate table calls that the second edge check, and the width is
    re-read at the better rate beside the study's own row."""
    from tools import cpu_grids
    for name in ('lr_sweep', 'long'):
        _write_grids(tmp_path, {name: json.loads((ROOT / 'grids' / name / 'results.json').read_text())})
    monkeypatch.setattr(cpu_grids, 'GRIDS', tmp_path)
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    # seed-0 selection loss by rate: at width 192 the best rate is a quarter of the lr_sweep best's
    # half (so halving wins once, then loses); at width 48 the lr_sweep best's half is best
    best = {(v, w): cpu_grids.best_lrs(cpu_grids.LONG_KEY)[v] / (4 if w == 192 else 2) for v in cpu_grids.LONG_KEY for w in (48, 192)}
    loss = lambda p: 1.5 + abs(math.log2(float(p.rsplit('_lr', 1)[1]) / best[p.split('_d')[0], int(p.split('_d')[1].split('_')[0])])) / 10

    def write(grid):
        variants, _, _ = cpu_grids.grid(grid)
        _write_grids(tmp_path, {grid: [_scale_row(p, {s: loss(p) - 0.05 + 0.01 * s for s in
                                                    (range(5) if o['seeds'] != 1 else [0])}) for p, o in variants.items()]})
        return variants
    write('wide')
    write('wide')  # the chosen rates' seeds
    assert cpu_grids.wide_edge_pending()
    first = write('wide_edge')
    assert all(o['seeds'] == 1 for o in first.values())
    variants = write('wide_edge')
    assert sorted(p for p, o in variants.items() if o['seeds'] == '0,1,2,3,4') == ['ha_share_w_d192_lr4e-3', 'sa_w16_d192_lr2e-3']
    assert variants['sa_w16_d192_lr1e-3']['seeds'] == 1  # the second check
    assert variants['ha_share_w_d48_lr4e-3']['seeds'] == 1 and 'ha_share_w_d48_lr2e-3' not in variants  # half lost
    assert not cpu_grids.wide_edge_pending()
    rates = grid_report.scale_rates_table()
    assert '| width 192, edge check | `sa_w16` | 4e-3 | 1.6000 | 2e-3 | 1.5000 | 2e-3 (half: the chosen rate is at an edge at this width) |' in rates
    assert '| width 192, second edge check | `sa_w16` | 2e-3 | 1.5000 | 1e-3 | 1.6000 | 2e-3 |' in rates
    widths = grid_report.key_pair_widths()
    better = grid_report.key_pair_widths_edge(widths)
    assert list(better) == [192] and {v: r['variant'] for v, r in better[192].items()} == \
        {'ha_share_w': 'ha_share_w_d192_lr4e-3', 'sa_w16': 'sa_w16_d192_lr2e-3'}
    table = grid_report.width_edge_table(widths)
    assert '| 192 | 8 |' in table and '| 4e-3, 2e-3 | 5 |' in table and '| 48 |' not in table


def test_readout_grid_trains_sa_linear_and_hfa_at_two_rates_then_five_seeds(tmp_path, monkeypatch):
    from tools import cpu_grids
    _write_grids(tmp_path, {'lr_sweep': json.loads((ROOT / 'grids' / 'lr_sweep' / 'results.json').read_text())})
    monkeypatch.setattr(cpu_grids, 'GRIDS', tmp_path)
    variants, _, extra = cpu_grids.grid('readout')
    assert sorted(variants) == ['hfa_lr2e-3', 'hfa_lr4e-3', 'linear_lr1e-3', 'linear_lr2e-3', 'sa_lr4e-3', 'sa_lr8e-3']
    assert all(o['seeds'] == 1 for o in variants.values()) and extra['max_iters'] == 12000
    winners = ['hfa_lr2e-3', 'linear_lr1e-3', 'sa_lr8e-3']
    _write_grids(tmp_path, {'readout': [_scale_row(p, {0: 1.5 if p in winners else 1.6}) for p in variants]})
    variants, _, _ = cpu_grids.grid('readout')
    assert sorted(p for p, o in variants.items() if o['seeds'] == '0,1,2,3,4') == winners


def test_reproduction_table_pairs_each_reruns_ha_with_the_same_seeds_sa_under_the_same_setting():
    rec = lambda preset, seed, threads, cap, was, now: {
        'grid': 'wide', 'preset': preset, 'seed': seed, 'threads': threads, 'cpu_capability': cap,
        'report_loss': {'committed': was, 'rerun': now, 'diff': now - was}}
    table = grid_report.reproduction_table([
        rec('sa_w16_d48_lr8e-3', 0, 1, 'avx2', 1.75, 1.76), rec('ha_share_w_d48_lr8e-3', 0, 1, 'avx2', 1.73, 1.70),
        rec('ha_share_w_d48_lr8e-3', 1, 2, 'default', 1.71, 1.71)])  # no SA of seed 1 at 2 threads: no pair
    assert '| wide | 0 | ATEN_CPU_CAPABILITY=avx2 | -0.0200 | -0.0600 | -0.0400 |' in table
    assert '| 2 threads | 1 | 0.0000 | 0.0000 | - |' in table
    assert '| ATEN_CPU_CAPABILITY=avx2 | 2 | 0.0300 | 0.0200 | 0.0400 (1 pairs) |' in table
    assert '(bit-identical)' in table


# the scale study on a second kernel path (tools/rerun.py --family scale)

def test_pooling_over_paths_averages_each_seed_then_tests_across_seeds():
    """Seed k's gap on each path, averaged: a one-sample t-test over the 5 seeds (4 degrees of freedom)."""
    seeds = [0, 1, 2, 3, 4]
    d1, d2 = np.array([-0.02, -0.01, -0.03, -0.02, -0.015]), np.array([-0.01, 0.0, -0.02, -0.012, -0.008])
    got, d, mean, half, p = grid_report.pooled_over_runs([(seeds, d1), (seeds, d2)])
    per_seed = (d1 + d2) / 2
    assert got == seeds and d == pytest.approx(per_seed) and mean == pytest.approx(per_seed.mean())
    assert half == pytest.approx(stats.t.ppf(0.975, 4) * per_seed.std(ddof=1) / math.sqrt(5))
    assert p == pytest.approx(stats.ttest_1samp(per_seed, 0.0).pvalue)


def test_correlated_gaps_on_two_paths_do_not_shrink_the_interval_below_one_paths():
    """A second path that repeats each seed's gap (shifted by a constant: correlation 1) adds no
    seed: the pooled interval is the one path's, not the sqrt(2) narrower one of ten draws."""
    seeds = [0, 1, 2, 3, 4]
    d1 = np.array([-0.02, -0.01, -0.03, -0.02, -0.015])
    _, _, one, _ = grid_report.mean_interval(d1)
    _, d, mean, half, _ = grid_report.pooled_over_runs([(seeds, d1), (seeds, d1 + 0.004)])
    assert len(d) == 5 and half == pytest.approx(one) and mean == pytest.approx(d1.mean() + 0.002)


def test_a_seed_rerun_on_one_path_only_counts_once_with_its_one_run():
    _, d, mean, _, _ = grid_report.pooled_over_runs([([0, 1, 2], np.array([-0.01, -0.02, -0.03])),
                                                     ([0, 1], np.array([-0.03, -0.04]))])
    assert d == pytest.approx([-0.02, -0.03, -0.03]) and mean == pytest.approx(-0.08 / 3)


def test_a_rerun_claim_is_adjusted_within_its_first_path_family():
    """Holm over the claim's own family, the claims that were not rerun keeping their p."""
    first = {('scale', 'a'): 0.001, ('scale', 'b'): 0.04, ('scale', 'c'): 0.5, ('long', 1): 0.01, ('long', 2): 0.2}
    adj = grid_report.holm_in_family(first, {('scale', 'b'): 0.02, ('long', 1): 0.3})
    assert adj[('scale', 'b')] == pytest.approx(grid_report.holm([0.001, 0.02, 0.5])[1])
    assert adj[('long', 1)] == pytest.approx(grid_report.holm([0.3, 0.2])[0])
    assert set(adj) == {('scale', 'b'), ('long', 1)}


def _path_grids(root, widths, shift=0.0, stall=None):
    """A rerun folder holding the same presets as `widths` (long3k's at 96, wide's otherwise)."""
    grids = {'long3k': [], 'wide': []}
    for w, pair in widths.items():
        for v, row in pair.items():
            finals = {s: x + (shift if v == 'ha_share_w' else 0.0) for s, x in grid_report.report_finals(row).items()}
            if stall and (w, v) == stall[:2]:
                finals[stall[2]] += 0.2
            grids['long3k' if w == 96 else 'wide'].append(_scale_row(row['variant'], finals))
    _write_grids(root, grids)
    (root / 'path.json').write_text(json.dumps({'family': 'scale', 'cpu_capability': 'avx2', 'threads': 1}))


def _widths(gaps):
    """{width: pair} whose paired gaps are gaps[width][seed], at the presets the first path chose."""
    out = {}
    for w, g in gaps.items():
        tag = '' if w == 96 else f'_d{w}'
        out[w] = {'ha_share_w': _scale_row(f'ha_share_w{tag}_lr8e-3', {s: 1.6 + 0.001 * s + d for s, d in g.items()}),
                  'sa_w16': _scale_row(f'sa_w16{tag}_lr4e-3', {s: 1.6 + 0.001 * s for s in g})}
    return out


def test_the_second_path_reads_the_first_paths_presets_and_says_whether_each_verdict_holds(tmp_path, monkeypatch):
    """The rerun's rows are found by the preset the first path chose; a clear lead at width 48 that
    vanishes on the second path does not hold there, a lead that stays does."""
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    widths = _widths({48: {s: -0.03 - 0.002 * s for s in range(5)}, 96: {s: -0.02 - 0.001 * s for s in range(5)},
                      192: {s: -0.01 + 0.004 * (s % 2) for s in range(5)}})
    _path_grids(tmp_path / 'rerun_avx2_threads1', {w: p for w, p in widths.items() if w != 48})
    rows48 = _widths({48: {s: 0.001 * (-1) ** s for s in range(5)}})[48]  # the lead gone on the second path
    _write_grids(tmp_path / 'rerun_avx2_threads1', {'wide': json.loads(
        (tmp_path / 'rerun_avx2_threads1' / 'wide' / 'results.json').read_text()) + list(rows48.values())})
    monkeypatch.setattr(grid_report, 'scale_family', lambda lengths, widths: [
        ('gap at width 48 (3,000 its)', [], 0, 0, 0.001, 0.003), ('gap at width 192 (3,000 its)', [], 0, 0, 0.2, 0.4),
        ('slope of the gap per doubling of width', [], 0, 0, 0.01, 0.02)])
    monkeypatch.setattr(grid_report, 'long_family', lambda longs: [(3000, 'ha_share_w', 'sa_w16', (0, 0, 0, 0, 0.001), 0.001)])
    study = grid_report.path_study({}, {}, widths, 'rerun_avx2_threads1')
    assert study['width 48']['first']['verdict'] == 'HA lower' and study['width 48']['second']['verdict'] == 'no difference shown'
    assert not study['width 48']['holds'] and study['width 96']['holds']
    assert study['width 96']['second']['mean'] == pytest.approx(study['width 96']['first']['mean'])
    assert len(study['width 96']['pooled']['d']) == 5  # the seed is the unit: 5 seeds, not 10 runs
    assert grid_report.holds_cell(study['width 48']).startswith('verdict changed: no difference shown there (')
    assert grid_report.holds_cell(study['width 96']).startswith('same verdict, HA lower (')
    table = grid_report.answer_table({3000: widths[96]}, {3000: widths[96]}, widths,
                                     {'AVX2 path, 1 thread': study})
    assert '| on the AVX2 path, 1 thread |' in table.splitlines()[0]
    assert '| verdict changed: no difference shown there' in [l for l in table.splitlines() if 'width 48 (equal tokens)' in l][0]


def test_a_null_verdict_kept_on_the_second_path_says_what_the_second_path_shows():
    """'No difference shown' on both paths, while the second path's interval clears zero in 5 of 5
    seeds: the cell keeps the verdict and states the interval, the seed count and Holm beside it."""
    d = np.array([-0.01, -0.008, -0.006, -0.007, -0.005])
    r = lambda mean, half: dict(d=d, mean=mean, half=half, p_holm=0.3, settle='no: order changed at iteration 2500',
                                verdict='no difference shown')
    cell = grid_report.holds_cell({'first': r(-0.004, 0.01), 'second': r(-0.0072, 0.006), 'holds': True})
    assert cell.startswith('same verdict, no difference shown (-0.0072 [')
    assert 'HA lower in 5 of 5; interval clear of zero; Holm 0.300; settled: no: order changed' in cell


def test_a_verdict_whose_significance_hangs_on_a_stalled_seed_says_so(tmp_path, monkeypatch):
    """On the second path SA w16's seed 1 stalls at width 96: with it the interval of HA's small
    steady lead crosses zero, without it not, and the claims table says which seed and both readings."""
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    widths = _widths({96: {s: [-0.010, -0.012, -0.011, -0.009, -0.010][s] for s in range(5)}})
    _path_grids(tmp_path / 'rerun_avx2_threads1', widths, stall=(96, 'sa_w16', 1))
    monkeypatch.setattr(grid_report, 'long_family', lambda longs: [(3000, 'ha_share_w', 'sa_w16', (0, 0, 0, 0, 0.5), 0.5)])
    monkeypatch.setattr(grid_report, 'scale_family', lambda lengths, widths: [])
    study = grid_report.path_study({}, {}, widths, 'rerun_avx2_threads1')
    second = study['width 96']['second']
    assert second['stalls'] == {'ha_share_w': [], 'sa_w16': [1]} and second['dropped'] == [1]
    table = grid_report.path_claims_table(study, {'cpu_capability': 'avx2', 'threads': 1})
    line = [l for l in table.splitlines() if 'AVX2 path' in l][0]
    assert 'without stalled seed 1: -0.0100 [' in line and 'the interval clears zero' in line and '| none, 1 |' in line
    first = [l for l in table.splitlines() if 'committed' in l][0]
    assert 'without stalled' not in first  # no stall on the first path: nothing to say


def test_rerun_family_trains_the_claim_runs_with_the_grids_own_command():
    """tools/rerun.py --family scale: per grid, the presets with several committed seeds at those
    seeds, with the grid's own overrides and train.py arguments, into grids/rerun_<path>/<grid>."""
    import importlib.util
    import sys
    sys.path.insert(0, str(ROOT / 'tools'))
    spec = importlib.util.spec_from_file_location('rerun', ROOT / 'tools' / 'rerun.py')
    rerun = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rerun)
    from tools import cpu_grids
    cmd = rerun.family_command('wide', 'grids/rerun_avx2_threads1/wide', 2, 1)
    grid_cmd = cpu_grids.command('wide', 2)
    presets = cmd[cmd.index('--variants') + 1].split(',')
    committed = {r['variant']: r for r in json.loads((ROOT / 'grids' / 'wide' / 'results.json').read_text())}
    assert sorted(presets) == sorted(v for v, r in committed.items() if r['n_seeds'] >= 2)
    assert cmd[cmd.index('--out') + 1] == 'grids/rerun_avx2_threads1/wide'
    for p in presets:  # the same overrides as the grid's own command, at the committed seeds
        ours = cmd[cmd.index(p, cmd.index('--preset')) + 1:]
        ours = ours[:next((i for i, a in enumerate(ours) if a.startswith('--')), len(ours))]
        theirs = grid_cmd[grid_cmd.index(p, grid_cmd.index('--preset')) + 1:]
        theirs = theirs[:next((i for i, a in enumerate(theirs) if a.startswith('--')), len(theirs))]
        assert [a for a in ours if not a.startswith('seeds=')] == [a for a in theirs if not a.startswith('seeds=')]
        assert f"seeds={','.join(map(str, sorted(x['seed'] for x in committed[p]['runs'])))}" in ours
    assert [a for a in cmd if a.startswith('--max_iters')] == [a for a in grid_cmd if a.startswith('--max_iters')] == ['--max_iters=3000']
    assert rerun.path_name(1, 'avx2') == 'avx2_threads1' and rerun.FAMILIES['scale'][0] == 'wide'


def test_rerun_family_collects_only_the_runs_that_finished(tmp_path):
    """--collect_only on a family stopped part-way: each preset is summarised on its finished seeds
    (a run that logged its last iteration), a run stopped mid-way is left out rather than counted
    failed, and a grid with no finished run is skipped."""
    import importlib.util
    import sys
    sys.path.insert(0, str(ROOT / 'tools'))
    spec = importlib.util.spec_from_file_location('rerun', ROOT / 'tools' / 'rerun.py')
    rerun = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rerun)
    out = tmp_path / 'wide'
    assert rerun.family_command('wide', out, 1, 1, collect_only=True) is None

    def log(preset, seed, last):
        d = out / 'runs' / preset / f'seed{seed}'
        d.mkdir(parents=True)
        (d / 'log.jsonl').write_text(''.join(json.dumps({'iter': i, 'val_loss': 2.0}) + '\n' for i in (0, last)))
    log('sa_w16_d48_lr8e-3', 0, 3000)
    log('sa_w16_d48_lr8e-3', 3, 3000)
    log('sa_w16_d48_lr8e-3', 1, 1500)   # stopped half-way
    log('ha_share_w_d48_lr8e-3', 0, 3000)
    cmd = rerun.family_command('wide', out, 1, 1, collect_only=True)
    assert cmd[cmd.index('--variants') + 1].split(',') == ['sa_w16_d48_lr8e-3', 'ha_share_w_d48_lr8e-3']
    assert 'seeds=0,3' in cmd[cmd.index('sa_w16_d48_lr8e-3', cmd.index('--preset')):]
    assert 'seeds=[0]' in cmd[cmd.index('ha_share_w_d48_lr8e-3', cmd.index('--preset')):]  # seed 0, not a count of 0
    assert '--collect_only' in cmd


def test_a_second_path_on_part_of_the_seeds_is_set_beside_the_same_seeds_of_the_first(tmp_path, monkeypatch):
    """Seeds 0 and 1 rerun of five: the claims table adds the committed runs of those two seeds
    (like for like), and the answer's cell names how many seeds the second path holds."""
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    widths = _widths({96: {s: -0.02 - 0.001 * s for s in range(5)}})
    _path_grids(tmp_path / 'rerun_avx2_threads1', _widths({96: {0: -0.03, 1: -0.026}}))
    monkeypatch.setattr(grid_report, 'long_family', lambda longs: [(3000, 'ha_share_w', 'sa_w16', (0, 0, 0, 0, 0.001), 0.001)])
    monkeypatch.setattr(grid_report, 'scale_family', lambda lengths, widths: [])
    study = grid_report.path_study({}, {}, widths, 'rerun_avx2_threads1')
    same = study['width 96']['first_same']
    assert same['seeds'] == [0, 1] and same['mean'] == pytest.approx(-0.0205)
    assert study['width 96']['second']['mean'] == pytest.approx(-0.028)
    table = grid_report.path_claims_table(study, {'cpu_capability': 'avx2', 'threads': 1})
    assert "| width 96 | committed, the rerun's seeds (0, 1) | 2 | -0.0205 [" in table
    assert 'HA lower in 2 of 2 (2 of 5 seeds rerun)' in grid_report.holds_cell(study['width 96'])


def test_a_verdict_the_rerun_seeds_cannot_show_on_either_path_is_too_few_seeds_not_a_flip(tmp_path, monkeypatch):
    """Two seeds of five rerun: a lead the committed five show but the committed two do not is not
    a verdict that failed on the second path; the answer's cell says too few seeds yet."""
    monkeypatch.setattr(grid_report, 'GRIDS', tmp_path)
    widths = _widths({96: {s: [-0.01, -0.03, -0.02, -0.025, -0.015][s] for s in range(5)}})
    _path_grids(tmp_path / 'rerun_avx2_threads1', _widths({96: {0: -0.012, 1: -0.028}}))
    monkeypatch.setattr(grid_report, 'long_family', lambda longs: [(3000, 'ha_share_w', 'sa_w16', (0, 0, 0, 0, 0.001), 0.001)])
    monkeypatch.setattr(grid_report, 'scale_family', lambda lengths, widths: [])
    study = grid_report.path_study({}, {}, widths, 'rerun_avx2_threads1')
    assert study['width 96']['first']['verdict'] == 'HA lower' and not study['width 96']['holds']
    assert grid_report.holds_cell(study['width 96']).startswith('too few seeds yet (-0.0200 [')


def test_the_first_screen_states_the_pooled_and_second_path_numbers_the_json_gives():
    """RESULTS.md's "What it means" quotes the pooled 3,000-iteration lead and the pooled width
    trend (seed as the unit), width 192 on the second path and the 6,000 -> 12,000 change as
    grid_report computes them from the committed grids."""
    folder = next(iter(grid_report.second_paths()), None)
    if folder is None:
        pytest.skip('no second-path rerun committed')
    lengths, widths = grid_report.key_pair_lengths(), grid_report.key_pair_widths()
    study = grid_report.path_study(grid_report.long_grids(), lengths, widths, folder)
    text = (ROOT / 'RESULTS.md').read_text()
    means = ' '.join(text[text.index('**What it means.**'):text.index('**What it does not say.**')].split())
    lead = study['width 96']['pooled']
    assert (f"pooled over both with the seed as the unit ({lead['mean']:+.4f} {grid_report.interval(lead['mean'], lead['half'])}, "
            f"raw p {grid_report.fmt_p(lead['p'])}, Holm {grid_report.fmt_p(lead['p_holm'])})") in means
    assert f"with the seed as the unit ({grid_report.fmt_p(study['slope per doubling of width']['pooled']['p_holm'])})" in means
    w192 = study['width 192']['second']
    assert (f"{w192['mean']:+.3f}, {int((w192['d'] < 0).sum())} of {len(w192['d'])}, Holm "
            f"{grid_report.fmt_p(w192['p_holm'])} on the second") in means
    _, _, mean, half, _ = grid_report.gap_change(lengths, 6000, 12000)
    assert f"change {mean:+.4f} {grid_report.interval(mean, half)}" in means
