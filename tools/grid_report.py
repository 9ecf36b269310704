"""
RESULTS.md's tables and figures, regenerated from the committed grids/<grid>/results.json.

    python tools/grid_report.py                 # every table, as markdown, to stdout
    python tools/grid_report.py --figures       # also redraw assets/grid_*.png
    python tools/grid_report.py --write         # refresh RESULTS.md's tables in place

Nothing here trains or reads a run folder: the numbers come from the results.json files that
compare.py wrote (per-seed final losses and learning curves), so the tables can be checked
against RESULTS.md (tests/test_results.py does) without the runs. Statistics: mean ± sample
std over seeds, 95% t-interval, two-sided Welch t-test against SA (compare.py's functions).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nanohfa import grid as compare  # noqa: E402  (the statistics compare.py reports with)

GRIDS = ROOT / 'grids'
ASSETS = ROOT / 'assets'
REF = 'sa'
NAMES = {  # how each variant reads in a table
    'sa': 'SA', 'sa_w16': 'SA, window 16', 'hfa': 'HFA A=2 (dh 24, +16% params)',
    'hfa_w16': 'HFA A=2, window 16 (+16% params)', 'hfa2_pm': 'HFA A=2, params matched (dh 16)',
    'hfa4_pm': 'HFA A=4, params matched (dh 10)', 'ha_share_w': 'HA shared, windows 16 x 8',
    'ha_noshare_w': 'HA unshared, windows 16 x 8 (+16% params)', 'ha_full': 'HA shared, full (no window)',
    'hybrid': '2 SA + 2 HFA heads', 'sa_lr4e-3': 'SA at half its best rate (4e-3)',
    'ha_share_w_lr8e-3': 'HA shared, windows 16 x 8, at half its best rate (8e-3)',
    'sa_w16_lr4e-3': 'SA, window 16, at half its best rate (4e-3)',
    'hfa2_pm_lr2e-3': 'HFA A=2, params matched, at half its best rate (2e-3)',
}


def is_control(v):
    """A variant rerun at another learning rate than its best (named v_lr<rate>)."""
    return '_lr' in v


def load(grid, root=None):
    """{variant: row} of a grid's results.json (in grids/, or in root: a rerun's folder of grids);
    main also holds main_ha's rows (the HA variants, trained by the same command with the same
    seeds, compared with main's SA)."""
    path = (root or GRIDS) / grid / 'results.json'
    if not path.exists():
        return None
    rows = {r['variant']: r for r in json.loads(path.read_text()) if r['n_seeds']}
    if grid == 'main':
        for r in (load('main_seeds') or {}).values():  # more seeds of the same runs: pooled
            if r['variant'] in rows:
                rows[r['variant']] = pooled(rows[r['variant']], r)
        rows.update(load('main_ha') or {})
    if grid in ('milton', 'bpe'):  # controls added later, with the same settings and seeds
        rows.update(load(f'{grid}_more') or {})
    return rows


def pooled(a, b):
    """One row from two grids' rows of the same variant and settings, with different seeds."""
    same = ('params', 'flops_per_token', 'tokens', 'iters', 'tokens_per_iter', 'overrides')
    assert all(a[k] == b[k] for k in same), f"{a['variant']}: grids differ in {[k for k in same if a[k] != b[k]]}"
    assert not set(a['seeds']) & set(b['seeds']), f"{a['variant']}: a seed in both grids"
    return {**a, 'n_seeds': a['n_seeds'] + b['n_seeds'], 'seeds': a['seeds'] + b['seeds'],
            'runs': a['runs'] + b['runs'], 'curves': {**a['curves'], **b['curves']}}


def finals(row):
    return [r['val_loss'] for r in row['runs']]


def curves(row):
    """iterations (n_eval,), val loss (n_seeds, n_eval), train loss (n_seeds, n_eval)."""
    cs = list(row['curves'].values())
    n = min(len(c) for c in cs)
    iters = np.array([p[2] for p in cs[0][:n]])
    return iters, np.array([[p[1] for p in c[:n]] for c in cs]), np.array([[p[3] for p in c[:n]] for c in cs])


def fmt_p(p):
    return '-' if p is None or math.isnan(p) else f'{p:.3f}' if p >= 0.001 else f'{p:.0e}'


def cell(row, ref):
    """'mean ± std (Δ, p)' of final val loss."""
    x = finals(row)
    mean, std, _ = compare.mean_std_ci(x)
    if row['variant'] == REF or ref is None:
        return f'{mean:.3f} ± {std:.3f}'
    d = mean - np.mean(finals(ref))
    return f'{mean:.3f} ± {std:.3f} ({d:+.3f}, p {fmt_p(compare.welch_p(x, finals(ref)))})'


# -----------------------------------------------------------------------------
# tables

def grid_table(rows, iters_col=False):
    ref = rows.get(REF)
    head = ['variant', 'params', 'MFLOPs/tok', 'seeds'] + (['iterations'] if iters_col else []) + \
           ['val loss', '95% CI', 'Δ vs SA', 'p vs SA', 'val ppl']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for v, r in rows.items():
        x = finals(r)
        mean, std, ci = compare.mean_std_ci(x)
        d = mean - np.mean(finals(ref)) if ref and v != REF else float('nan')
        p = compare.welch_p(x, finals(ref)) if ref and v != REF else float('nan')
        ppl = compare.mean_std_ci(np.exp(x))
        cells = [f'`{v}`', f"{r['params']:,}", f"{r['flops_per_token'] / 1e6:.2f}", str(len(x))] + \
                ([str(r['iters'])] if iters_col else []) + \
                [f'{mean:.4f} ± {std:.4f}', f'[{mean - ci:.4f}, {mean + ci:.4f}]',
                 '-' if math.isnan(d) else f'{d:+.4f}', fmt_p(p), f'{ppl[0]:.3f} ± {ppl[1]:.3f}']
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def settle_table(rows, ref=REF):
    """When the ordering stopped changing: for the whole ranking of mean val loss, and for
    each variant against SA (the last evaluation at which the sign of the mean difference
    flipped, and the difference at a few points)."""
    data = {v: curves(r) for v, r in rows.items()}
    iters = data[ref][0]
    mean = {v: d[1].mean(0) for v, d in data.items()}
    order = [tuple(sorted(mean, key=lambda v: mean[v][e])) for e in range(len(iters))]
    changes = [iters[e] for e in range(2, len(iters)) if order[e] != order[e - 1]]  # from the 2nd eval on
    last_rank = changes[-1] if changes else iters[1]
    lines = [f"Ranking of all {len(rows)} means: last changed at iteration {last_rank} of {iters[-1]} "
             f"({len(changes)} changes after iteration {iters[1]}); final order: "
             + ' < '.join(f'`{v}`' for v in order[-1]) + '.', '',
             f'| variant | last sign flip of Δ vs {"SA" if ref == REF else f"`{ref}`"} (iteration) | ' +
             ' | '.join(f'Δ at {iters[e]}' for e in checkpoints(iters)) + ' |',
             '|---|---|' + '---|' * len(checkpoints(iters))]
    for v in rows:
        if v == ref:
            continue
        d = mean[v] - mean[ref]
        flips = [iters[e] for e in range(2, len(iters)) if np.sign(d[e]) != np.sign(d[e - 1])]
        lines.append(f'| `{v}` | {flips[-1] if flips else "never"} | ' +
                     ' | '.join(f'{d[e]:+.3f}' for e in checkpoints(iters)) + ' |')
    return '\n'.join(lines), last_rank


LOCALITY = [('sa_w16', 'sa'), ('hfa_w16', 'hfa'), ('ha_share_w', 'sa_w16'), ('ha_noshare_w', 'sa_w16'),
            ('ha_noshare_w', 'ha_share_w'), ('hfa_w16', 'sa_w16')]
RATES = [('sa_lr4e-3', 'sa'), ('ha_share_w_lr8e-3', 'ha_share_w'), ('sa_w16', 'sa_lr4e-3'),
         ('hfa2_pm', 'sa_lr4e-3'), ('ha_share_w', 'sa_lr4e-3'), ('ha_noshare_w', 'sa_lr4e-3'),
         ('ha_share_w_lr8e-3', 'sa_lr4e-3'), ('ha_share_w_lr8e-3', 'sa'),
         ('sa_w16_lr4e-3', 'sa_w16'), ('sa_w16_lr4e-3', 'sa_lr4e-3'), ('ha_share_w_lr8e-3', 'sa_w16_lr4e-3'),
         ('hfa2_pm', 'sa_w16_lr4e-3'), ('hfa2_pm_lr2e-3', 'hfa2_pm'), ('hfa2_pm_lr2e-3', 'sa_lr4e-3'),
         ('hfa2_pm_lr2e-3', 'sa_w16_lr4e-3'), ('ha_share_w_lr8e-3', 'hfa2_pm_lr2e-3')]  # the half-rate controls
HFA_ORDER = [('hfa2_pm', 'sa'), ('hfa4_pm', 'sa'), ('hfa4_pm', 'hfa2_pm'), ('hfa', 'hfa2_pm')]


def pairs_table(rows, pairs):
    """Final val loss of a against b: mean difference, its 95% Welch interval and p."""
    from scipy import stats
    lines = ['| a | b | seeds a, b | val loss a | val loss b | Δ (a - b) | 95% CI of Δ | p |', '|---|---|---|---|---|---|---|---|']
    for a, b in pairs:
        if a not in rows or b not in rows:
            continue
        x, y = np.array(finals(rows[a])), np.array(finals(rows[b]))
        d = x.mean() - y.mean()
        if min(len(x), len(y)) < 2:  # no spread on one side: the difference only
            lines.append(f'| `{a}` | `{b}` | {len(x)}, {len(y)} | {x.mean():.4f} | {y.mean():.4f} | {d:+.4f} | - | - |')
            continue
        va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
        dof = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))  # Welch-Satterthwaite
        half = stats.t.ppf(0.975, dof) * math.sqrt(va + vb)
        lines.append(f'| `{a}` | `{b}` | {len(x)}, {len(y)} | {x.mean():.4f} | {y.mean():.4f} | {d:+.4f} | '
                     f'[{d - half:+.4f}, {d + half:+.4f}] | {fmt_p(compare.welch_p(x, y))} |')
    return '\n'.join(lines)


def checkpoints(iters):
    """A handful of evaluation indices spread over the run."""
    n = len(iters)
    return sorted({1, n // 8, n // 4, n // 2, (3 * n) // 4, n - 1} - {0})


def sweep_table(rows, variants, lrs, tag):
    """Final val loss per (variant, learning rate); '-' where that rate was not run."""
    head = ['variant'] + [f'lr {lr:g}' for lr in lrs] + ['best']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for v in variants:
        losses = [rows[f'{v}_lr{tag(lr)}']['val_loss_mean'] if f'{v}_lr{tag(lr)}' in rows else None for lr in lrs]
        best = min((x, i) for i, x in enumerate(losses) if x is not None)[1]
        lines.append(f'| `{v}` | ' + ' | '.join('-' if x is None else f'**{x:.4f}**' if i == best else f'{x:.4f}'
                                                for i, x in enumerate(losses)) + f' | {lrs[best]:g} |')
    return '\n'.join(lines)


def summary_table(grids, variants, verdicts=None):
    cols = [(g, title) for g, title in [('main', 'Shakespeare chars, equal tokens (2.05M)'),
                                         ('milton', 'Milton chars, equal tokens'), ('bpe', 'GPT-2 tokens, equal tokens')]
            if grids.get(g)]
    extra = ['at equal FLOPs', 'at equal CPU time'] if verdicts else []
    lines = ['| variant | ' + ' | '.join([t for _, t in cols] + extra) + ' |', '|---|' + '---|' * (len(cols) + len(extra))]
    for v in variants:
        cells = [cell(grids[g][v], grids[g].get(REF)) if v in grids[g] else 'not run' for g, _ in cols]
        if verdicts:
            cells += [verdicts[v][k][0] if v in verdicts else '-' for k in ('flops', 'time')]
        lines.append(f'| {NAMES.get(v, v)} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def shorter_runs(grids, v):
    """(iterations, mean final val loss, seeds, grid) of v's runs with their own, shorter
    schedule at its tuned learning rate: lr_sweep's best (400 iterations, one seed) and
    main_flops / main_time (SA's budget at v's cost). The early grid (one rate for all) is
    left out: a worse loss there may be the rate's."""
    out = []
    sweep = grids.get('lr_sweep') or {}
    mine = [r for name, r in sweep.items() if name.rsplit('_lr', 1)[0] == v]
    if mine:
        best = min(mine, key=lambda r: r['val_loss_mean'])
        out.append((best['iters'], best['val_loss_mean'], best['n_seeds'], 'lr_sweep'))
    for g in ('main_flops', 'main_time'):
        if v in (grids.get(g) or {}):
            r = grids[g][v]
            out.append((r['iters'], float(np.mean(finals(r))), len(finals(r)), g))
    return out


def own_schedule_runs(grids, v):
    """v's main run (1000 iterations) and its shorter runs, each with its own schedule."""
    r = grids['main'][v]
    return [(r['iters'], float(np.mean(finals(r))), len(finals(r)), 'main')] + shorter_runs(grids, v)


def equal_compute(grids, step_times):
    """Each variant against SA at SA's training FLOPs and at SA's training seconds in main.

    A variant that costs c_v per iteration gets n_v = N * c_SA / c_v iterations of SA's
    budget. The verdict uses only runs trained with their own cosine schedule and assumes
    that a longer schedule does not end at a higher loss (true of every pair of budgets
    measured here): worse at N with n_v <= N, or worse at some n >= n_v, means worse; better
    at N with n_v >= N, or better at some n <= n_v, means better; anything else needs a run."""
    main = grids['main']
    ref_loss, n_ref = float(np.mean(finals(main[REF]))), main[REF]['iters']
    cost = {'flops': {v: r['flops_per_token'] for v, r in main.items()}}
    if step_times:
        cost['time'] = step_times
    out = {}
    for v, r in main.items():
        if is_control(v):
            continue
        runs = own_schedule_runs(grids, v)
        out[v] = {}
        for kind in ('flops', 'time'):
            if kind not in cost or v not in cost[kind]:
                out[v][kind] = ('not measured', None)
                continue
            n_v = n_ref * cost[kind][REF] / cost[kind][v]
            if v == REF:
                out[v][kind] = ('-', n_v)
                continue
            worse = [(n, x) for n, x, _, _ in runs if x > ref_loss and n >= n_v - 0.5]
            better = [(n, x) for n, x, _, _ in runs if x < ref_loss and n <= n_v + 0.5]
            if worse:
                n, x = min(worse)
                out[v][kind] = (f'worse ({n_v:.0f} its; {x:.3f} at {n})', n_v)
            elif better:
                n, x = max(better)
                out[v][kind] = (f'better ({n_v:.0f} its; {x:.3f} at {n})', n_v)
            else:
                out[v][kind] = (f'needs a run ({n_v:.0f} its)', n_v)
    return out


def equal_compute_table(grids, verdicts, step_times):
    main = grids['main']
    lines = ['| variant | MFLOPs/tok | × SA | s/step (1 thread) | × SA | runs with own schedule (its: val loss) '
             '| at SA\'s FLOPs | at SA\'s time |', '|---|---|---|---|---|---|---|---|']
    for v, r in main.items():
        if v not in verdicts:
            continue
        runs = own_schedule_runs(grids, v)
        st = step_times.get(v) if step_times else None
        lines.append(f"| `{v}` | {r['flops_per_token'] / 1e6:.2f} | {r['flops_per_token'] / main[REF]['flops_per_token']:.2f} | "
                     + (f"{st:.3f} | {st / step_times[REF]:.2f}" if st else '- | -') + ' | '
                     + ', '.join(f'{n}: {x:.3f} ({g}, {k} seed{"s" * (k > 1)})' for n, x, k, g in sorted(runs)) + ' | '
                     + ' | '.join(verdicts[v][k][0] for k in ('flops', 'time')) + ' |')
    return '\n'.join(lines)


def document_tests(grids):
    """Every Welch test this file reports for the 1000-iteration grids (each table's p vs SA
    and each pair table's p), once each: [(grid, a, b, p)]."""
    tests, seen = [], set()

    def add(g, rows, a, b):
        if a in rows and b in rows and (g, a, b) not in seen and min(len(finals(rows[a])), len(finals(rows[b]))) >= 2:
            seen.add((g, a, b))
            tests.append((g, a, b, compare.welch_p(finals(rows[a]), finals(rows[b]))))
    for g in ('main', 'main_flops', 'early', 'milton', 'bpe'):
        rows = grids.get(g)
        if not rows:
            continue
        if g == 'main_flops':
            rows = {REF: grids['main'][REF], **rows}
        for v in rows:
            add(g, rows, v, REF)
        for a, b in (LOCALITY + HFA_ORDER + RATES if g == 'main' else RATES):
            add(g, rows, a, b)
    return tests


def stall_table(rows):
    """Per variant: the seeds the stall rule flags (final val loss), and the mean and median
    with and without them."""
    lines = ['| variant | seeds | final val loss per seed | stalled | mean | median | mean without stalled |',
             '|---|---|---|---|---|---|---|']
    for v, r in rows.items():
        f = {x['seed']: x['val_loss'] for x in r['runs']}
        st = stalled_seeds(f) if len(f) >= 3 else []
        kept = [x for s, x in f.items() if s not in st]
        lines.append(f"| `{v}` | {len(f)} | {', '.join(f'{x:.3f}' for x in f.values())} | {', '.join(map(str, st)) or 'none'} "
                     f"| {np.mean(list(f.values())):.4f} | {np.median(list(f.values())):.4f} | "
                     + (f'{np.mean(kept):.4f}' if st else '-') + ' |')
    return '\n'.join(lines)


def without_stalls(rows):
    """The rows with every stalled seed left out (the rule of stalled_seeds, on final val loss)."""
    out = {}
    for v, r in rows.items():
        f = {x['seed']: x['val_loss'] for x in r['runs']}
        st = set(stalled_seeds(f)) if len(f) >= 3 else set()
        out[v] = {**r, 'runs': [x for x in r['runs'] if x['seed'] not in st],
                  'curves': {s: c for s, c in r['curves'].items() if int(s) not in st},
                  'seeds': [s for s in r['seeds'] if s not in st], 'n_seeds': r['n_seeds'] - len(st)}
    return out


def corrections_table(grids):
    """The tests of document_tests with p < 0.05, and what is left of each after Holm's
    correction over all of them."""
    tests = document_tests(grids)
    adjusted = holm([p for *_, p in tests])
    lines = [f'{len(tests)} Welch tests in the tables of the 1000-iteration grids; {sum(p < 0.05 for *_, p in tests)} '
             f'have p < 0.05 on their own, {sum(q < 0.05 for q in adjusted)} after Holm\'s correction over all {len(tests)}.',
             '', '| grid | a | b | p | p, Holm over the file | survives |', '|---|---|---|---|---|---|']
    for (g, a, b, p), q in sorted(zip(tests, adjusted), key=lambda t: t[0][3]):
        if p < 0.05:
            lines.append(f'| {g} | `{a}` | `{b}` | {fmt_p(p)} | {fmt_p(q)} | {"yes" if q < 0.05 else "no"} |')
    return '\n'.join(lines)


# -----------------------------------------------------------------------------
# the long study: report-half losses, paired seeds, a settle rule that sees gaps, stalls, Holm

def report_finals(row):
    """{seed: final loss on the report half} of a report_split row."""
    return {r['seed']: r['report_loss'] for r in row['runs']}


def paired(a, b):
    """Seed k of a against seed k of b (the same data order): (seeds, differences a - b,
    mean, 95% t-interval half-width, two-sided paired t-test p)."""
    fa, fb = report_finals(a), report_finals(b)
    seeds = sorted(set(fa) & set(fb))
    return (seeds, *mean_interval(np.array([fa[s] - fb[s] for s in seeds])))


def mean_interval(d):
    """(d, mean, 95% t-interval half-width, one-sample t-test p against zero) of per-seed values."""
    from scipy import stats
    if len(d) < 2:
        return d, float(d.mean()) if len(d) else float('nan'), float('nan'), float('nan')
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return d, float(d.mean()), float(half), float(stats.ttest_1samp(d, 0.0).pvalue)


def welch_interval(x, y):
    """Mean difference x - y, the half-width of its 95% Welch interval, and Welch's p."""
    from scipy import stats
    x, y = np.asarray(x, float), np.asarray(y, float)
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    dof = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))
    return float(x.mean() - y.mean()), float(stats.t.ppf(0.975, dof) * math.sqrt(va + vb)), compare.welch_p(x, y)


def holm(pvalues):
    """Holm's step-down adjustment of a family of p-values (same order as given): the k-th
    smallest is multiplied by (m - k + 1), and adjusted values never decrease with rank."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def gap_curves(a, b):
    """Evaluation iterations and the per-seed gap a - b of the selection-half loss at each."""
    seeds = sorted(set(a['curves']) & set(b['curves']), key=int)
    n = min(len(row['curves'][s]) for s in seeds for row in (a, b))
    iters = np.array([p[2] for p in a['curves'][seeds[0]][:n]])
    gap = np.array([[pa[1] - pb[1] for pa, pb in zip(a['curves'][s][:n], b['curves'][s][:n])] for s in seeds])
    return iters, gap


SETTLE_ALPHA = 0.05


def settle(a, b):
    """The settle rule of RESULTS.md for a pair: settled when (1) the sign of the mean gap
    (over seeds, selection half) has not changed over the last half of training, and (2) the
    gap's slope over the last third is not distinguishable from zero: each seed's gap is fitted
    by least squares against iteration over the last third, and the seeds' slopes are tested
    against zero with a one-sample t-test (seeds are independent; evaluations within a run are
    not), two-sided, at SETTLE_ALPHA. Returns a dict: settled, the last sign change of the
    mean gap, the mean slope per 1000 iterations with its 95% interval and p, and a verdict."""
    from scipy import stats
    iters, gap = gap_curves(a, b)
    mean = gap.mean(0)
    flips = [int(iters[e]) for e in range(1, len(iters)) if np.sign(mean[e]) != np.sign(mean[e - 1])]
    last_flip = flips[-1] if flips else None
    end = iters[-1]
    order_stable = last_flip is None or last_flip <= end / 2
    tail = iters >= end * 2 / 3
    slopes = np.array([np.polyfit(iters[tail], g[tail], 1)[0] * 1000 for g in gap])
    slopes[np.abs(slopes) < 1e-9] = 0.0  # a fit's rounding noise (1e-17) is no slope, and no t-test of it
    if len(slopes) > 1 and not slopes.any():
        p, half = 1.0, 0.0
    elif len(slopes) > 1:
        p = float(stats.ttest_1samp(slopes, 0.0).pvalue)
        half = float(stats.t.ppf(0.975, len(slopes) - 1) * slopes.std(ddof=1) / math.sqrt(len(slopes)))
    else:
        p, half = float('nan'), float('nan')
    slope = float(slopes.mean())
    flat = not (p < SETTLE_ALPHA)
    closing = np.sign(slope) != np.sign(mean[-1])
    if order_stable and flat:
        verdict = 'settled'
    elif not order_stable:
        verdict = f'not settled: order changed at iteration {last_flip}'
    else:
        verdict = f"not settled: gap {'closing' if closing else 'opening'} at {abs(slope):.3f} per 1000 its"
    return {'settled': order_stable and flat, 'last_flip': last_flip, 'slope': slope, 'slope_half': half,
            'slope_p': p, 'verdict': verdict, 'end': int(end)}


STALL_STDS, STALL_FLOOR = 5.0, 0.01


def stalled_seeds(finals_by_seed):
    """Seeds whose final loss sits more than STALL_STDS standard deviations of the other seeds
    above the other seeds' median (the std floored at STALL_FLOOR, so that a gap below 0.05
    nats is never called a stall), or is not finite. Needs 3 or more seeds."""
    out = []
    for s, x in finals_by_seed.items():
        others = np.array([y for t, y in finals_by_seed.items() if t != s and np.isfinite(y)])
        if not np.isfinite(x):
            out.append(s)
        elif len(others) >= 2 and x - np.median(others) > STALL_STDS * max(others.std(ddof=1), STALL_FLOOR):
            out.append(s)
    return sorted(out)


def long_grids(root=None):
    """{length: {variant: row}} of the long study's grids (each run at its variant's chosen
    rate), with the seeds of their *_more grids pooled in; from grids/, or from root."""
    out = {}
    for grid, iters in (('long1k', 1000), ('long3k', 3000), ('long', LONG_ITERS)):
        path = (root or GRIDS) / grid / 'results.json'
        if not path.exists():
            continue
        rows = {r['variant']: r for r in json.loads(path.read_text()) if r['n_seeds'] >= 2}
        more = (root or GRIDS) / f'{grid}_more' / 'results.json'  # seeds 3 and 4 of the same runs, trained later
        for r in (json.loads(more.read_text()) if more.exists() else []):
            if r['n_seeds'] and r['variant'] in rows:
                rows[r['variant']] = pooled(rows[r['variant']], r)
        out[iters] = {v.rsplit('_lr', 1)[0]: r for v, r in rows.items()}
    return out


LONG_ITERS = 6000


def plot_long(longs):
    """Selection-half loss of the long study's variants against iteration, at each length
    (mean over seeds, band: min..max), one panel per length and a zoom on the last half."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    lengths = sorted(longs)
    names = sorted({v for rows in longs.values() for v in rows})
    colour = {v: f'C{i}' for i, v in enumerate(names)}  # one colour per variant in every panel
    fig, axes = plt.subplots(1, len(lengths) + 1, figsize=(5.5 * (len(lengths) + 1), 4.3), squeeze=False)
    for ax, length in zip(axes[0], lengths + [max(lengths)]):
        zoom = ax is axes[0][-1]
        for v, r in longs[length].items():
            iters, val, _ = curves(r)
            keep = iters >= (length / 2 if zoom else 100)
            ax.plot(iters[keep], val.mean(0)[keep], label=f'{v} (n={len(val)})', lw=1.3, color=colour[v])
            ax.fill_between(iters[keep], val.min(0)[keep], val.max(0)[keep], color=colour[v], alpha=0.15)
        ax.set_title(f'{length} iterations' + (': last half' if zoom else ''))
        ax.set_xlabel('iteration')
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel('selection-half loss (nats/char)')
    for ax in axes[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ASSETS / 'grid_long.png', dpi=100)
    plt.close(fig)


def long_rates_table(path=None):
    """The rate choice: each variant's two candidate rates, seed 0 at full length, final loss
    on the selection half; the lower is chosen (the report half plays no part)."""
    rows = json.loads((path or GRIDS / 'long' / 'results.json').read_text())
    by_variant = {}
    for r in rows:
        v, lr = r['variant'].rsplit('_lr', 1)
        seed0 = next((x for x in r['runs'] if x['seed'] == 0), None)
        if seed0 is not None:
            by_variant.setdefault(v, []).append((lr, seed0['val_loss'], r['n_seeds']))
    lines = ['| variant | rate | selection-half loss, seed 0 | rate | selection-half loss, seed 0 | chosen |',
             '|---|---|---|---|---|---|']
    for v, cands in by_variant.items():
        cands.sort(key=lambda c: -float(c[0]))  # the higher rate first
        best = min(cands, key=lambda c: c[1])
        cells = [x for lr, loss, _ in cands for x in (lr, f'{loss:.4f}')]
        lines.append(f'| `{v}` | ' + ' | '.join(cells) + f' | {best[0]} |')
    return '\n'.join(lines)


def long_variant_table(rows):
    """Per variant: the report-half loss over its seeds, with and without stalled seeds."""
    lines = ['| variant | params | MFLOPs/tok | rate | seeds | report loss | 95% CI | median | stalled seeds '
             '| mean without stalls |', '|---|---|---|---|---|---|---|---|---|---|']
    for v, r in rows.items():
        f = report_finals(r)
        x = np.array(list(f.values()))
        mean, std, ci = compare.mean_std_ci(x)
        st = stalled_seeds(f)
        kept = [y for s, y in f.items() if s not in st]
        lines.append(f"| `{v}` | {r['params']:,} | {r['flops_per_token'] / 1e6:.2f} | {r['variant'].rsplit('_lr', 1)[1]} "
                     f"| {len(x)} | {mean:.4f} ± {std:.4f} | [{mean - ci:.4f}, {mean + ci:.4f}] | {np.median(x):.4f} "
                     f"| {', '.join(map(str, st)) or 'none'} | " + (f'{np.mean(kept):.4f}' if st else '-') + ' |')
    return '\n'.join(lines)


LONG_PAIRS = [('ha_share_w', 'sa_w16'), ('ha_noshare_w', 'sa_w16'), ('ha_share_w', 'sa'), ('ha_noshare_w', 'sa'),
              ('sa_w16', 'sa'), ('ha_noshare_w', 'ha_share_w')]
KEY_PAIR = ('ha_share_w', 'sa_w16')


def long_family(grids):
    """The summary's family of claims: every LONG_PAIRS pair at the full length and the key pair
    at each shorter length, as (length, a, b, paired result); Holm-adjusted over the family."""
    family = []
    for length, rows in sorted(grids.items()):
        pairs = LONG_PAIRS if length == max(grids) else [KEY_PAIR]
        for a, b in pairs:
            if a in rows and b in rows:
                family.append((length, a, b, paired(rows[a], rows[b])))
    adjusted = holm([res[4] for *_, res in family])
    return [(length, a, b, res, adj) for (length, a, b, res), adj in zip(family, adjusted)]


def long_pairs_table(grids):
    """Each claim of the family: paired difference (report half), its interval and p, Holm's p,
    Welch's beside it, and the settle verdict (selection-half curves)."""
    lines = ['| iterations | a | b | seeds | Δ (a - b), paired | 95% CI | p | p, Holm | Welch Δ [95% CI], p '
             '| a better in | settle (selection half) |', '|---|---|---|---|---|---|---|---|---|---|---|']
    for length, a, b, (seeds, d, mean, half, p), adj in long_family(grids):
        rows = grids[length]
        wd, wh, wp = welch_interval(list(report_finals(rows[a]).values()), list(report_finals(rows[b]).values()))
        st = settle(rows[a], rows[b])
        lines.append(f'| {length} | `{a}` | `{b}` | {len(seeds)} | {mean:+.4f} | [{mean - half:+.4f}, {mean + half:+.4f}] '
                     f'| {fmt_p(p)} | {fmt_p(adj)}{" *" if adj < 0.05 else ""} | {wd:+.4f} [{wd - wh:+.4f}, {wd + wh:+.4f}], '
                     f'{fmt_p(wp)} | {int((d < 0).sum())} of {len(d)} | {st["verdict"]} |')
    return '\n'.join(lines)


def long_settle_table(grids):
    """The settle rule's numbers for every pair of the family at its length."""
    lines = ['| iterations | a | b | last sign change of the mean gap | gap at the end (selection half) '
             '| slope over the last third, per 1000 its [95% CI] | p | settled |', '|---|---|---|---|---|---|---|---|']
    for length, a, b, *_ in long_family(grids):
        rows = grids[length]
        st = settle(rows[a], rows[b])
        _, gap = gap_curves(rows[a], rows[b])
        lines.append(f"| {length} | `{a}` | `{b}` | {st['last_flip'] or 'never'} | {gap.mean(0)[-1]:+.4f} "
                     f"| {st['slope']:+.4f} [{st['slope'] - st['slope_half']:+.4f}, {st['slope'] + st['slope_half']:+.4f}] "
                     f"| {fmt_p(st['slope_p'])} | {'yes' if st['settled'] else 'no'} |")
    return '\n'.join(lines)


def long_trend_table(grids):
    """The key pair at every length: each variant's report-half loss and the paired gap."""
    a, b = KEY_PAIR
    lines = [f'| iterations | `{a}` | `{b}` | Δ, paired [95% CI] | seeds with `{a}` better |', '|---|---|---|---|---|']
    for length, rows in sorted(grids.items()):
        if a in rows and b in rows:
            seeds, d, mean, half, p = paired(rows[a], rows[b])
            fa, fb = (np.array(list(report_finals(rows[v]).values())) for v in (a, b))
            lines.append(f'| {length} | {fa.mean():.4f} ± {fa.std(ddof=1):.4f} | {fb.mean():.4f} ± {fb.std(ddof=1):.4f} '
                         f'| {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}] | {int((d < 0).sum())} of {len(d)} |')
    return '\n'.join(lines)


# the scale study: the key pair trained longer (12,000 iterations) and wider (widths 48 and 192
# beside long3k's 96, head size 24), same split, seeds paired as in the long study

LENGTHS = {'long1k': 1000, 'long3k': 3000, 'long': 6000, 'long12k': 12000}
WIDTHS = (48, 96, 192)


def interval(mean, half):
    """'[lo, hi]' of a 95% interval, or why there is none (one seed)."""
    return '(one seed: no interval)' if math.isnan(half) else f'[{mean - half:+.4f}, {mean + half:+.4f}]'


def key_pair_lengths():
    """{iterations: {variant: row}} of the key pair at every schedule length (chosen rates)."""
    out = {n: {v: r for v, r in rows.items() if v in KEY_PAIR} for n, rows in long_grids().items()}
    rows = load('long12k') or {}
    chosen = {v.rsplit('_lr', 1)[0]: r for v, r in rows.items() if r['runs'] and r.get('n_seeds', 0) and
              not is_half_rate(v, rows)}
    if chosen:
        out[12000] = chosen
    return {n: rows for n, rows in out.items() if rows}


def is_half_rate(preset, rows):
    """A long12k preset at half the rate of another preset of the same variant (the edge check)."""
    v, lr = preset.rsplit('_lr', 1)
    return any(p.rsplit('_lr', 1)[0] == v and math.isclose(float(p.rsplit('_lr', 1)[1]), 2 * float(lr)) for p in rows)


def key_pair_widths():
    """{width: {variant: row}}: long3k's pair at width 96, the width grid's chosen rates at 48 and 192
    (the rate with the lower seed-0 selection-half loss; the other rate's row is left out)."""
    out = {}
    longs = long_grids()
    if 3000 in longs:
        out[96] = {v: r for v, r in longs[3000].items() if v in KEY_PAIR}
    for (v, w), preset in (wide_chosen() or {}).items():
        out.setdefault(w, {})[v] = load('wide')[preset]
    return {w: out[w] for w in sorted(out)}


def wide_presets():
    """{(variant, width): [(rate, row)]} of the width grid."""
    out = {}
    for p, r in (load('wide') or {}).items():
        v, rest = p.split('_d', 1)
        w, lr = rest.split('_lr')
        out.setdefault((v, int(w)), []).append((lr, r))
    return out


def seed0_loss(row):
    run = next((x for x in row['runs'] if x['seed'] == 0), None)
    return None if run is None else run['val_loss']


def wide_chosen():
    """{(variant, width): preset} once both rates' seed-0 runs have finished."""
    chosen = {}
    for key, cands in wide_presets().items():
        if len(cands) < 2 or any(seed0_loss(r) is None for _, r in cands):
            continue
        chosen[key] = min(cands, key=lambda c: seed0_loss(c[1]))[1]['variant']
    return chosen


def scale_rates_table():
    """The rate checks of the scale study (seed 0, selection half only): at 12,000 iterations each
    variant's chosen rate (from the 6,000-iteration study) against half of it; at each new width,
    the lr_sweep best against half of it, the lower chosen."""
    lines = ['| study | variant | rate | selection-half loss, seed 0 | rate | selection-half loss, seed 0 | lower |',
             '|---|---|---|---|---|---|---|']
    rows12 = load('long12k') or {}
    for v in KEY_PAIR[::-1]:
        cands = sorted(((p.rsplit('_lr', 1)[1], seed0_loss(r)) for p, r in rows12.items() if p.rsplit('_lr', 1)[0] == v),
                       key=lambda c: -float(c[0]))
        if len(cands) == 2 and None not in (cands[0][1], cands[1][1]):
            low = min(cands, key=lambda c: c[1])[0]
            lines.append(f"| 12,000 its | `{v}` | {cands[0][0]} | {cands[0][1]:.4f} | {cands[1][0]} | {cands[1][1]:.4f} "
                         f"| {low}{' (half: the chosen rate is at an edge at this length)' if low == cands[1][0] else ''} |")
    for (v, w), cands in sorted(wide_presets().items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cands = sorted(cands, key=lambda c: -float(c[0]))
        if len(cands) == 2 and all(seed0_loss(r) is not None for _, r in cands):
            low = min(cands, key=lambda c: seed0_loss(c[1]))[0]
            lines.append(f"| width {w} | `{v}` | {cands[0][0]} | {seed0_loss(cands[0][1]):.4f} | {cands[1][0]} "
                         f"| {seed0_loss(cands[1][1]):.4f} | {low}"
                         f"{' (the lower: a lower rate was not tried)' if low == cands[1][0] else ''} |")
    tried = {wide_key(p): r for g in ('wide', 'wide_edge') for p, r in (load(g) or {}).items()}
    checks = {wide_key(p) for p in load('wide_edge') or {}}
    for (v, w, lr), r in sorted(((k, r) for k, r in tried.items() if k in checks), key=lambda kr: (kr[0][1], kr[0][0], -kr[0][2])):
        base = tried.get((v, w, 2 * lr))  # the rate it halves: the width grid's chosen, or the edge check's
        if base is None or seed0_loss(r) is None or seed0_loss(base) is None:
            continue
        edge = seed0_loss(r) < seed0_loss(base)
        check = 'edge check' if (v, w, 2 * lr) not in checks else 'second edge check'
        lines.append(f"| width {w}, {check} | `{v}` | {base['variant'].rsplit('_lr', 1)[1]} | {seed0_loss(base):.4f} "
                     f"| {r['variant'].rsplit('_lr', 1)[1]} | {seed0_loss(r):.4f} "
                     f"| {r['variant'].rsplit('_lr', 1)[1] if edge else base['variant'].rsplit('_lr', 1)[1]}"
                     f"{' (half: the chosen rate is at an edge at this width)' if edge else ''} |")
    return '\n'.join(lines)


def preset_width(preset):
    """The width of a width-study preset such as 'sa_w16_d192_lr4e-3' or 'sa_w16_d48_its3906'."""
    return int(preset.split('_d', 1)[1].split('_')[0])


def wide_key(preset):
    """(variant, width, rate) of a width-study preset such as 'sa_w16_d192_lr4e-3'."""
    return preset.split('_d', 1)[0], preset_width(preset), float(preset.rsplit('_lr', 1)[1])


def key_pair_widths_edge(widths):
    """{width: {variant: row}} at the widths where an edge check's half rate beat the chosen one:
    that rate's row (seeds 0-4 from the wide_edge grid) for that variant, the chosen rate's row
    for the other. Widths whose rates held are left out."""
    edge, out = load('wide_edge') or {}, {}
    for w, rows in widths.items():
        better = {}
        for v, r in rows.items():
            lr = float(r['variant'].rsplit('_lr', 1)[1])
            half = next((p for p in edge if wide_key(p)[:2] == (v, w) and math.isclose(wide_key(p)[2], lr / 2)), None)
            if half in edge and None not in (seed0_loss(edge[half]), seed0_loss(r)) and seed0_loss(edge[half]) < seed0_loss(r):
                better[v] = edge[half]
        if better:
            out[w] = {**rows, **better}
    return out


def width_slope(widths):
    """The key pair's paired gap (report half) against log2 width, seed by seed: each seed with a
    run at every width gets a least-squares slope; the seeds' slopes are tested against zero.
    Returns (seeds, slopes per doubling of width, mean, 95% half-width, p)."""
    from scipy import stats
    a, b = KEY_PAIR
    per_width = {w: dict(zip(*paired(rows[a], rows[b])[:2])) for w, rows in widths.items() if a in rows and b in rows}
    if len(per_width) < 3:
        return [], np.array([]), float('nan'), float('nan'), float('nan')
    seeds = sorted(set.intersection(*(set(d) for d in per_width.values())))
    x = np.log2(list(per_width))
    slopes = np.array([np.polyfit(x, [per_width[w][s] for w in per_width], 1)[0] for s in seeds])
    if len(slopes) < 2:
        return seeds, slopes, float(slopes.mean()) if len(slopes) else float('nan'), float('nan'), float('nan')
    half = stats.t.ppf(0.975, len(slopes) - 1) * slopes.std(ddof=1) / math.sqrt(len(slopes))
    return seeds, slopes, float(slopes.mean()), float(half), float(stats.ttest_1samp(slopes, 0.0).pvalue)


def gap_change(lengths, n0, n1):
    """How the key pair's paired gap moves from the n0- to the n1-iteration schedule, seed by seed
    (seed k has the same data order at every length): (seeds, changes, mean, 95% half-width, p)."""
    a, b = KEY_PAIR
    if not all(n in lengths and a in lengths[n] and b in lengths[n] for n in (n0, n1)):
        return [], np.array([]), float('nan'), float('nan'), float('nan')
    g0, g1 = (dict(zip(*paired(lengths[n][a], lengths[n][b])[:2])) for n in (n0, n1))
    seeds = sorted(set(g0) & set(g1))
    return (seeds, *mean_interval(np.array([g1[s] - g0[s] for s in seeds])))


def scale_family(lengths, widths):
    """The scale study's family of claims, Holm-adjusted together: the key pair at 12,000
    iterations, how its gap moved from 6,000 to 12,000 (grows, holds or closes), the pair at
    widths 48 and 192, and the slope of its gap against log width.
    [(claim, seeds, mean, half, p, p_holm)]"""
    a, b = KEY_PAIR
    family = []
    if 12000 in lengths and a in lengths[12000] and b in lengths[12000]:
        seeds, _, mean, half, p = paired(lengths[12000][a], lengths[12000][b])
        family.append(('gap at 12,000 iterations', seeds, mean, half, p))
    seeds, _, mean, half, p = gap_change(lengths, 6000, 12000)
    if seeds:
        family.append(('change of the gap from 6,000 to 12,000 iterations', seeds, mean, half, p))
    for w in (48, 192):
        if w in widths and a in widths[w] and b in widths[w]:
            seeds, _, mean, half, p = paired(widths[w][a], widths[w][b])
            family.append((f'gap at width {w} (3,000 its)', seeds, mean, half, p))
    seeds, _, mean, half, p = width_slope(widths)
    if seeds:
        family.append(('slope of the gap per doubling of width', seeds, mean, half, p))
    usable = [i for i, c in enumerate(family) if not math.isnan(c[4])]
    adjusted = holm([family[i][4] for i in usable])
    adj = {i: a for i, a in zip(usable, adjusted)}
    return [(*c, adj.get(i, float('nan'))) for i, c in enumerate(family)]


def scale_family_table(lengths, widths):
    lines = ['| claim | seeds | Δ (HA - SA w16), paired | 95% CI | p | p, Holm (this family) |', '|---|---|---|---|---|---|']
    for claim, seeds, mean, half, p, adj in scale_family(lengths, widths):
        lines.append(f'| {claim} | {len(seeds)} | {mean:+.4f} | {interval(mean, half)} | {fmt_p(p)} '
                     f'| {fmt_p(adj)}{" *" if adj < 0.05 else ""} |')
    return '\n'.join(lines)


def length_gap_table(lengths):
    """The key pair's final gap (report half) at every schedule length, with the settle rule."""
    a, b = KEY_PAIR
    lines = [f'| iterations | seeds | `{a}` | `{b}` | Δ, paired [95% CI] | `{a}` better in | settle (selection half) '
             '| gap\'s move over the last third (selection half) [95% CI] | stalled seeds HA, SA |',
             '|---|---|---|---|---|---|---|---|---|']
    for n, rows in sorted(lengths.items()):
        if a not in rows or b not in rows:
            continue
        seeds, d, mean, half, _ = paired(rows[a], rows[b])
        fa, fb = (np.array([report_finals(rows[v])[s] for s in seeds]) for v in (a, b))
        rule = settle(rows[a], rows[b]) if len(seeds) >= 2 else None
        # the fitted slope times the last third's length: how far the gap moved as the rate decayed
        move = (f"{rule['slope'] * rule['end'] / 3000:+.4f} {interval(*(x * rule['end'] / 3000 for x in (rule['slope'], rule['slope_half'])))}"
                if rule else '-')
        lines.append(f'| {n:,} | {len(seeds)} | {fa.mean():.4f} | {fb.mean():.4f} | {mean:+.4f} '
                     f'{interval(mean, half)} | {int((d < 0).sum())} of {len(d)} | {rule["verdict"] if rule else "one seed: no rule"} '
                     f'| {move} | {stalled_cell(rows[a], rows[b])} |')
    return '\n'.join(lines)


def stalled_cell(a, b):
    """'n, m': how many seeds of each row stall by the rule of stalled_seeds (report half)."""
    return ', '.join(str(len(stalled_seeds(report_finals(r)))) if len(r['runs']) >= 3 else '-' for r in (a, b))


def width_gap_table(widths):
    """The key pair at every width after 3,000 iterations: size, cost (FLOPs per token, and CPU
    seconds per step measured under one load, grids/wide/step_times.json), rate and final gap."""
    a, b = KEY_PAIR
    st = GRIDS / 'wide' / 'step_times.json'
    secs = json.loads(st.read_text())['seconds_per_step'] if st.exists() else {}
    lines = ['| width | heads | params (HA = SA w16) | MFLOPs/tok HA, SA | HA / SA: FLOPs, CPU time | rates HA, SA | seeds '
             '| HA loss | SA w16 loss | Δ, paired [95% CI] | HA better in | settle (selection half) | stalled seeds HA, SA |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for w, rows in widths.items():
        if a not in rows or b not in rows:
            continue
        seeds, d, mean, half, _ = paired(rows[a], rows[b])
        fa, fb = (np.array([report_finals(rows[v])[s] for s in seeds]) for v in (a, b))
        verdict = settle(rows[a], rows[b])['verdict'] if len(seeds) >= 2 else 'one seed: no rule'
        time = f"{secs[f'{a}_d{w}'] / secs[f'{b}_d{w}']:.1f}x" if f'{a}_d{w}' in secs and f'{b}_d{w}' in secs else '-'
        lines.append(f"| {w} | {w // 24} | {rows[a]['params']:,} | {rows[a]['flops_per_token'] / 1e6:.2f}, "
                     f"{rows[b]['flops_per_token'] / 1e6:.2f} | {rows[a]['flops_per_token'] / rows[b]['flops_per_token']:.2f}x, "
                     f"{time} | {rows[a]['variant'].rsplit('_lr', 1)[1]}, "
                     f"{rows[b]['variant'].rsplit('_lr', 1)[1]} | {len(seeds)} | {fa.mean():.4f} | {fb.mean():.4f} "
                     f"| {mean:+.4f} {interval(mean, half)} | {int((d < 0).sum())} of {len(d)} | {verdict} "
                     f"| {stalled_cell(rows[a], rows[b])} |")
    return '\n'.join(lines)


def width_edge_table(widths):
    """The width table's rows again where an edge check moved a rate, at the better rate, and the
    slope of the gap against log width with those rows in place (uncorrected: not in the family)."""
    better = key_pair_widths_edge(widths)
    table = width_gap_table(better)
    seeds, _, mean, half, p = width_slope({**widths, **better})
    if better and len(seeds) >= 2:
        table += (f"\n\nWith {', '.join(f'width {w}' for w in better)} at these rates, the slope of the gap per "
                  f"doubling of width is {mean:+.4f} {interval(mean, half)}, p {fmt_p(p)} ({len(seeds)} seeds; uncorrected).")
    return table


def key_pair_widths_flops(widths):
    """{width: {variant: row}}: HA at 3,000 iterations (as in key_pair_widths) against the
    wide_flops grid's windowed SA, trained for the iterations that cost as many FLOPs."""
    a, b = KEY_PAIR
    sa = {preset_width(p): r for p, r in (load('wide_flops') or {}).items() if r['n_seeds']}
    return {w: {a: widths[w][a], b: sa[w]} for w in widths if w in sa and a in widths[w]}


def width_flops_table(widths):
    """The key pair at every width at equal training FLOPs: HA's 3,000 iterations against SA's own
    schedule of as many FLOPs, and the slope of that gap against log width (uncorrected)."""
    a, b = KEY_PAIR
    pairs = key_pair_widths_flops(widths)
    lines = ['| width | SA w16 iterations | seeds | HA loss (3,000 its) | SA w16 loss | Δ at equal FLOPs, paired [95% CI] '
             '| HA better in | stalled seeds HA, SA |', '|---|---|---|---|---|---|---|---|']
    for w, rows in pairs.items():
        seeds, d, mean, half, _ = paired(rows[a], rows[b])
        if not seeds:
            continue
        fa, fb = (np.array([report_finals(rows[v])[s] for s in seeds]) for v in (a, b))
        lines.append(f"| {w} | {rows[b]['iters']:,} | {len(seeds)} | {fa.mean():.4f} | {fb.mean():.4f} "
                     f"| {mean:+.4f} {interval(mean, half)} | {int((d < 0).sum())} of {len(d)} "
                     f"| {stalled_cell(rows[a], rows[b])} |")
    seeds, _, mean, half, p = width_slope(pairs)
    if len(seeds) >= 2:
        lines.append(f'| slope per doubling of width | | {len(seeds)} | | | {mean:+.4f} {interval(mean, half)}, '
                     f'p {fmt_p(p)} (uncorrected) | | |')
    return '\n'.join(lines)


def equal_cost_gaps(lengths, cost):
    """HA at N iterations against SA at N * cost[HA] / cost[SA] iterations (equal FLOPs or equal
    CPU time), SA's report-half loss interpolated seed by seed, linearly in log iterations,
    between its own-schedule runs; None where that length lies outside SA's measured lengths.
    [(N, SA's equal-cost iterations, seeds, mean gap, half-width)]"""
    from scipy import stats
    a, b = KEY_PAIR
    sa_lengths = sorted(n for n, rows in lengths.items() if b in rows)
    out = []
    for n, rows in sorted(lengths.items()):
        if a not in rows:
            continue
        m = n * cost[a] / cost[b]
        if not sa_lengths or not sa_lengths[0] <= m <= sa_lengths[-1]:
            out.append((n, m, [], float('nan'), float('nan')))
            continue
        hi = next(k for k in sa_lengths if k >= m)
        lo = max(k for k in sa_lengths if k <= m)
        fa, flo, fhi = report_finals(rows[a]), report_finals(lengths[lo][b]), report_finals(lengths[hi][b])
        seeds = sorted(set(fa) & set(flo) & set(fhi))
        t = 0.0 if hi == lo else (math.log(m) - math.log(lo)) / (math.log(hi) - math.log(lo))
        d = np.array([fa[s] - ((1 - t) * flo[s] + t * fhi[s]) for s in seeds])
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)) if len(d) >= 2 else float('nan')
        out.append((n, m, seeds, float(d.mean()) if len(d) else float('nan'), float(half)))
    return out


def equal_cost_table(lengths):
    """The key pair at equal tokens, equal training FLOPs and equal CPU seconds."""
    a, b = KEY_PAIR
    any_row = lambda v: next(rows[v] for rows in lengths.values() if v in rows)
    costs = {'FLOPs': {v: any_row(v)['flops_per_token'] for v in KEY_PAIR}}
    st = GRIDS / 'main' / 'step_times.json'
    if st.exists():
        costs['CPU time'] = json.loads(st.read_text())['seconds_per_step']
    lines = ['| HA iterations | Δ at equal tokens [95% CI] | ' + ' | '.join(f'SA its at equal {k} | Δ at equal {k} [95% CI]'
                                                                          for k in costs) + ' |',
             '|---|---|' + '---|---|' * len(costs)]
    tables = {k: {n: (m, s, mean, half) for n, m, s, mean, half in equal_cost_gaps(lengths, c)} for k, c in costs.items()}
    for n, rows in sorted(lengths.items()):
        if a not in rows or b not in rows:
            continue
        _, _, mean, half, _ = paired(rows[a], rows[b])
        cells = []
        for k in costs:
            m, seeds, dm, dh = tables[k][n]
            cells += [f'{m:,.0f}', f'{dm:+.4f} {interval(dm, dh)} ({len(seeds)} seed{"s" * (len(seeds) > 1)})' if seeds
                      else 'outside the measured lengths']
        lines.append(f'| {n:,} | {mean:+.4f} {interval(mean, half)} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def verdict_cell(a, b):
    """The settle rule's verdict, short: 'yes', or 'no: ...' (why not)."""
    v = settle(a, b)['verdict']
    return 'yes' if v == 'settled' else 'no: ' + v.removeprefix('not settled: ')


def answer_table(longs, lengths, widths, studies=None):
    """RESULTS.md's first table: every finding about the key pair (shared HA against SA with the
    same 16-position window, report half, paired by seed), one row each, with the Holm-adjusted
    p of the family it was tested in (the long study's or the scale study's); the equal-FLOPs
    rows are descriptive (no family). studies ({label: path_study}): one more column per second
    kernel path, giving the row's verdict there and what it rests on (rows not rerun say so)."""
    a, b = KEY_PAIR
    studies = studies or {}
    long_holm = {n: adj for n, x, y, _, adj in long_family(longs) if (x, y) == KEY_PAIR}
    scale = {claim: adj for claim, *_, adj in scale_family(lengths, widths)}
    lines = ['| finding | condition (width 96, 3,000 its unless named) | seeds | Δ HA - SA w16, nats/char [95% CI] '
             '| HA lower in | p, Holm (family) | settled |' + ''.join(f' on the {label} |' for label in studies),
             '|---|---|---|---|---|---|---|' + '---|' * len(studies)]

    def holds(claim):
        return ''.join(f' {holds_cell(st[claim]) if claim in st else "not rerun"} |' for st in studies.values())

    def row(finding, condition, pair, holm_p, family, settled=True, claim=None):
        seeds, d, mean, half, _ = paired(*pair)
        p = f'{fmt_p(holm_p)}{" *" if holm_p < 0.05 else ""} ({family})' if holm_p is not None else 'descriptive'
        lines.append(f'| {finding} | {condition} | {len(seeds)} | {mean:+.4f} {interval(mean, half)} '
                     f'| {int((d < 0).sum())} of {len(d)} | {p} | {verdict_cell(*pair) if settled else "-"} |' + holds(claim))
    for n in sorted(lengths):
        if a in lengths[n] and b in lengths[n]:
            holm_p = scale.get('gap at 12,000 iterations') if n == 12000 else long_holm.get(n)
            row('schedule length', f'{n:,} iterations (equal tokens)', (lengths[n][a], lengths[n][b]), holm_p,
                'scale' if n == 12000 else 'long', claim='width 96' if n == 3000 else None)
    seeds, d, mean, half, _ = gap_change(lengths, 6000, 12000)
    if seeds:
        lines.append(f'| longer training | change of the gap from 6,000 to 12,000 its | {len(seeds)} '
                     f'| {mean:+.4f} {interval(mean, half)} | lead grew in {int((d < 0).sum())} of {len(d)} '
                     f'| {fmt_p(scale["change of the gap from 6,000 to 12,000 iterations"])} (scale) | - |' + holds(None))
    for w in (48, 192):
        if w in widths and a in widths[w] and b in widths[w]:
            holm_p = scale.get(f'gap at width {w} (3,000 its)')
            row('width', f'width {w} (equal tokens)', (widths[w][a], widths[w][b]), holm_p, 'scale', claim=f'width {w}')
    seeds, slopes, mean, half, _ = width_slope(widths)
    if len(seeds) >= 2:
        lines.append(f'| width | slope of the gap per doubling of width (48, 96, 192) | {len(seeds)} '
                     f'| {mean:+.4f} {interval(mean, half)} | lead grew in {int((slopes < 0).sum())} of {len(slopes)} '
                     f'| {fmt_p(scale["slope of the gap per doubling of width"])}'
                     f'{" *" if scale["slope of the gap per doubling of width"] < 0.05 else ""} (scale) | - |'
                     + holds('slope per doubling of width'))
    for w, rows in key_pair_widths_edge(widths).items():
        row('width', f'width {w} at the edge check\'s better rates (HA {rows[a]["variant"].rsplit("_lr", 1)[1]}, '
                     f'SA {rows[b]["variant"].rsplit("_lr", 1)[1]})', (rows[a], rows[b]), None, '',
            claim=f'width {w} at the better rates')
    for w, rows in key_pair_widths_flops(widths).items():
        row('equal FLOPs', f'width {w}, SA w16 trained {rows[b]["iters"]:,} its', (rows[a], rows[b]), None, '', settled=False)
    return '\n'.join(lines)


# -----------------------------------------------------------------------------
# the scale study retrained on a second CPU kernel path (tools/rerun.py --family scale): the same
# presets, seeds and rates (chosen once, on the first path's selection half), each claim read on
# each path, and pooled over both paths with the seed as the unit

def second_paths():
    """{folder: path.json} of every family rerun committed as grids/rerun_<path>/."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(GRIDS.glob('rerun_*/path.json'))}


def path_label(record):
    """'AVX2 path, 1 thread (Intel Xeon)' from a path.json."""
    t = record['threads']
    cpu = record.get('cpu') and GRID_CPU not in record['cpu'] and short_cpu(record['cpu'])
    return f"{record['cpu_capability'].upper()} path, {t} thread{'s' * (t != 1)}" + (f' ({cpu})' if cpu else '')


def on_path(root, cells):
    """cells ({key: {variant: row}}) with every row replaced by the same preset's row in the rerun
    folder root (long3k pooled with long3k_more, wide, wide_edge); cells it lacks are left out."""
    rows = {**{r['variant']: r for r in (long_grids(root).get(3000) or {}).values()},
            **(load('wide', root) or {}), **(load('wide_edge', root) or {})}
    return {key: {v: rows[r['variant']] for v, r in pair.items()} for key, pair in cells.items()
            if all(r['variant'] in rows for r in pair.values())}


def path_claims(widths):
    """The scale study's claims a rerun checks: {claim: (cells, family key)}; cells is the pair
    {variant: row} or, for the slope, {width: pair}; the family key names the claim in the family
    it was tested in on the first path (None: descriptive, read after the families were fixed)."""
    a, b = KEY_PAIR
    claims = {}
    for w in WIDTHS:
        if w in widths and a in widths[w] and b in widths[w]:
            claims[f'width {w}'] = (widths[w], ('long', 3000) if w == 96 else ('scale', f'gap at width {w} (3,000 its)'))
    if len(widths) >= 3:
        claims['slope per doubling of width'] = (widths, ('scale', 'slope of the gap per doubling of width'))
    for w, rows in key_pair_widths_edge(widths).items():
        claims[f'width {w} at the better rates'] = (rows, None)
    return claims


def claim_draws(cells, slope):
    """(seeds, per-seed values, mean, 95% half-width, p) of a claim on one path: the paired gap
    HA - SA w16 (report half), or each seed's slope of that gap against log2 width."""
    return width_slope(cells) if slope else paired(cells[KEY_PAIR[0]], cells[KEY_PAIR[1]])


def claim_stalls(cells, slope):
    """{variant: stalled seeds} of a claim's rows (every width's, for the slope)."""
    pairs = cells.values() if slope else [cells]
    out = {}
    for pair in pairs:
        for v, r in pair.items():
            if len(r['runs']) >= 3:
                out.setdefault(v, set()).update(stalled_seeds(report_finals(r)))
    return {v: sorted(s) for v, s in out.items()}


def without_seeds(cells, slope, seeds):
    """The claim's rows with these seeds left out."""
    drop = lambda r: {**r, 'runs': [x for x in r['runs'] if x['seed'] not in seeds]}
    if slope:
        return {w: {v: drop(r) for v, r in pair.items()} for w, pair in cells.items()}
    return {v: drop(r) for v, r in cells.items()}


def pooled_over_runs(draws):
    """Per-seed values of reruns of the same seeds (one (seeds, values) per path) pooled with the
    seed as the unit: each seed's value averaged over the runs it has, then a one-sample t-test
    over the seeds (n_seeds - 1 degrees of freedom). Seed k's runs share its initialisation and
    data order, so they are not independent draws: counting each run as one would shrink the
    interval by up to sqrt(runs) with nothing learnt. (seeds, per-seed means, mean, 95% half-width, p)."""
    runs = {}
    for seeds, d in draws:
        for k, x in zip(seeds, d):
            runs.setdefault(k, []).append(float(x))
    seeds = sorted(runs)
    return (seeds, *mean_interval(np.array([np.mean(runs[k]) for k in seeds])))


def family_pvalues(longs, lengths, widths):
    """{(family, key): first-path p} of the scale family's and the long family's claims."""
    out = {('scale', claim): p for claim, _, _, _, p, _ in scale_family(lengths, widths)}
    out.update({('long', n): res[4] for n, x, y, res, _ in long_family(longs) if (x, y) == KEY_PAIR})
    out.update({('long', (n, x, y)): res[4] for n, x, y, res, _ in long_family(longs) if (x, y) != KEY_PAIR})
    return out


def holm_in_family(first_p, replaced):
    """Holm's p of the replaced claims ({(family, key): p}) within their first-path families, every
    claim not rerun keeping its first-path p."""
    out = {}
    for fam in {f for f, _ in replaced}:
        keys = [k for k in first_p if k[0] == fam]
        adj = holm([replaced.get(k, first_p[k]) for k in keys])
        out.update({k: q for k, q in zip(keys, adj) if k in replaced})
    return out


def verdict_of(mean, half, p_holm, slope=False):
    """A claim's verdict: which way, and whether it is shown (Holm's p below 0.05, or for a
    descriptive claim the 95% interval clear of zero)."""
    shown = p_holm < 0.05 if p_holm is not None else abs(mean) > half
    if not shown:
        return 'no trend shown' if slope else 'no difference shown'
    if slope:
        return "HA's lead shrinks with width" if mean > 0 else "HA's lead grows with width"
    return 'HA lower' if mean < 0 else 'HA higher'


def path_study(longs, lengths, widths, folder):
    """Every claim of path_claims on the first path, on the rerun in grids/<folder>, and pooled
    over both: {claim: {'first': r, 'second': r, 'pooled': r, ...}}, r a dict of the numbers."""
    first_p = family_pvalues(longs, lengths, widths)
    claims = path_claims(widths)
    root = GRIDS / folder
    second_cells = {}
    for name, (cells, _) in claims.items():
        slope = name.startswith('slope')
        moved = {w: on_path(root, {0: pair}).get(0) for w, pair in cells.items()} if slope else \
            on_path(root, {0: cells}).get(0)
        if moved and (not slope or all(moved.values())):
            second_cells[name] = moved
    raw = {}
    for name, (cells, fam) in claims.items():
        if name not in second_cells:
            continue
        slope = name.startswith('slope')
        raw[name] = {}
        for where, c in (('first', cells), ('second', second_cells[name])):
            seeds, d, mean, half, p = claim_draws(c, slope)
            stalls = claim_stalls(c, slope)
            dropped = sorted(set().union(*stalls.values())) if stalls else []
            alt = claim_draws(without_seeds(c, slope, set(dropped)), slope) if dropped else None
            raw[name][where] = dict(seeds=seeds, d=d, mean=mean, half=half, p=p, stalls=stalls, dropped=dropped, alt=alt,
                                    settle=None if slope else verdict_cell(c[KEY_PAIR[0]], c[KEY_PAIR[1]]))
        f_seeds, s_seeds = list(raw[name]['first']['seeds']), list(raw[name]['second']['seeds'])
        if set(s_seeds) < set(f_seeds):  # a part of the seeds rerun: the first path on those seeds alone, like for like
            _, d, mean, half, p = claim_draws(without_seeds(cells, slope, set(f_seeds) - set(s_seeds)), slope)
            raw[name]['first_same'] = dict(seeds=s_seeds, d=d, mean=mean, half=half, p=p)
        seeds, d, mean, half, p = pooled_over_runs([(raw[name][w]['seeds'], raw[name][w]['d']) for w in ('first', 'second')])
        raw[name]['pooled'] = dict(seeds=seeds, d=d, mean=mean, half=half, p=p, stalls={}, dropped=[], alt=None, settle=None)
        raw[name]['family'] = fam
    for where in ('first', 'second', 'pooled'):
        replaced = {raw[n]['family']: raw[n][where]['p'] for n in raw if raw[n]['family']}
        adj = holm_in_family(first_p, replaced)
        for n in raw:
            r = raw[n][where]
            r['p_holm'] = adj[raw[n]['family']] if raw[n]['family'] else None
            r['verdict'] = verdict_of(r['mean'], r['half'], r['p_holm'], n.startswith('slope'))
            if r['alt'] is not None:  # the same claim without the stalled seeds: does its significance hang on them?
                _, _, am, ah, ap = r['alt']
                r['alt_crosses'] = math.isnan(ah) or abs(am) <= ah
    for n in raw:
        f, s = raw[n]['first'], raw[n]['second']
        raw[n]['holds'] = s['verdict'] == f['verdict']
    return raw


def hangs_note(r):
    """Where a claim's significance on a path hangs on its stalled seeds, say so."""
    if r['alt'] is None:
        return ''
    crosses = math.isnan(r['half']) or abs(r['mean']) <= r['half']
    if crosses == r['alt_crosses']:
        return ''
    _, _, am, ah, _ = r['alt']
    return (f"; without stalled seed{'s' * (len(r['dropped']) > 1)} {', '.join(map(str, r['dropped']))}: "
            f"{am:+.4f} {interval(am, ah)}, the interval {'crosses' if r['alt_crosses'] else 'clears'} zero")


def path_claims_table(study, record):
    """Each claim on the first path, on the second and pooled over both (the seed as the unit)."""
    second = path_label(record)
    lines = ['| claim | path | seeds | Δ HA - SA w16 [95% CI] | HA lower in | stalled seeds HA, SA | p, Holm (family) '
             '| settled | verdict |', '|---|---|---|---|---|---|---|---|---|']
    for name, res in study.items():
        fam = res['family'][0] if res['family'] else None
        slope = name.startswith('slope')
        for where, label in (('first', f'committed ({GRID_CPU}, AVX512 path, 1 thread)'), ('second', second),
                             ('pooled', 'both, seed as the unit (its gap averaged over the paths)')):
            r = res[where]
            lower = int((r['d'] < 0).sum())
            lower = f"lead grew in {lower} of {len(r['d'])}" if slope else f"{lower} of {len(r['d'])}"
            stalls = ', '.join(','.join(map(str, r['stalls'].get(v, []))) or 'none' for v in KEY_PAIR) if where != 'pooled' else '-'
            p = 'descriptive' if fam is None else f"{fmt_p(r['p_holm'])}{' *' if r['p_holm'] < 0.05 else ''} ({fam})"
            lines.append(f"| {name} | {label} | {len(r['d'])} | {r['mean']:+.4f} {interval(r['mean'], r['half'])}"
                         f"{hangs_note(r)} | {lower} | {stalls} | {p} | {r['settle'] or '-'} | {r['verdict']} |")
            if where == 'first' and 'first_same' in res:  # like for like: the committed runs of the rerun's seeds
                r = res['first_same']
                lower = int((r['d'] < 0).sum())
                lower = f"lead grew in {lower} of {len(r['d'])}" if slope else f"{lower} of {len(r['d'])}"
                lines.append(f"| {name} | committed, the rerun's seeds ({', '.join(map(str, r['seeds']))}) | {len(r['d'])} "
                             f"| {r['mean']:+.4f} {interval(r['mean'], r['half'])} | {lower} | - | - | - | - |")
    return '\n'.join(lines)


def holds_cell(res):
    """The answer table's cell: the row's verdict on the second path, and what it rests on there
    (the gap, how many of the seeds rerun favour HA, whether the interval clears zero, Holm, the
    settle verdict), so that a verdict kept is never read as an effect kept."""
    f, s = res['first'], res['second']
    slope = 'trend' in s['verdict'] or 'lead' in s['verdict']  # the slope claim's verdicts
    lower = int((s['d'] < 0).sum())
    clear = not math.isnan(s['half']) and abs(s['mean']) > s['half']
    of = f" ({len(s['d'])} of {len(f['d'])} seeds rerun)" if len(s['d']) != len(f['d']) else ''
    facts = [f"{s['mean']:+.4f} {interval(s['mean'], s['half'])}",
             f"{'lead grew' if slope else 'HA lower'} in {lower} of {len(s['d'])}{of}",
             f"interval {'clear of' if clear else 'across'} zero"]
    if s['p_holm'] is not None:
        facts.append(f"Holm {fmt_p(s['p_holm'])}")
    if s['settle']:
        facts.append(f"settled: {s['settle']}")
    facts = '; '.join(facts)
    if res['holds']:
        return f"same verdict, {s['verdict']} ({facts})"
    same = res.get('first_same')
    if same and (math.isnan(same['half']) or abs(same['mean']) <= same['half']):  # the seeds rerun so far show it on neither path
        return (f"too few seeds yet ({facts}; the committed runs of those seeds show "
                f"{'no trend' if slope else 'no difference'} either)")
    return f"verdict changed: {s['verdict']} there ({facts})"


def path_means_table(widths, folder, record):
    """How far each family's five-seed mean (report half) moved between the paths, beside the
    seed-to-seed spread, the largest move of one seed and the move of the paired gap's mean."""
    root = GRIDS / folder
    lines = ['| width | variant | rate | seeds | committed mean ± std | ' + path_label(record) + ' mean ± std '
             '| move of the mean | largest move of one seed | move of the mean gap HA - SA w16 |',
             '|---|---|---|---|---|---|---|---|---|']
    cells = dict(widths)
    for w, rows in key_pair_widths_edge(widths).items():
        cells[f'{w}, better rates'] = rows
    for w, pair in cells.items():
        moved = on_path(root, {0: pair}).get(0)
        if not moved:
            continue
        finals = {v: (report_finals(pair[v]), report_finals(moved[v])) for v in KEY_PAIR}
        seeds = sorted(set.intersection(*(set(f) for both in finals.values() for f in both)))
        x = {v: [np.array([f[s] for s in seeds]) for f in finals[v]] for v in KEY_PAIR}
        (h1, h2), (s1, s2) = x[KEY_PAIR[0]], x[KEY_PAIR[1]]
        sd = lambda a: f'{a.std(ddof=1):.4f}' if len(a) > 1 else '-'
        for v in KEY_PAIR[::-1]:
            x1, x2 = x[v]
            gap = f"{((h2 - s2) - (h1 - s1)).mean():+.4f}" if v == KEY_PAIR[0] else ''
            lines.append(f"| {w} | `{v}` | {pair[v]['variant'].rsplit('_lr', 1)[1]} | {len(seeds)} "
                         f"| {x1.mean():.4f} ± {sd(x1)} | {x2.mean():.4f} ± {sd(x2)} "
                         f"| {x2.mean() - x1.mean():+.4f} | {np.abs(x2 - x1).max():.4f} | {gap} |")
    return '\n'.join(lines)


def reruns():
    """The committed reruns (tools/rerun.py --json): one record per rerun of a committed run."""
    path = GRIDS / 'reproduction' / 'reruns.jsonl'
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


GRID_CPU = 'AMD EPYC'  # the CPU every committed grid was trained on (1 thread, torch 2.13.0 CPU: AVX512 path)


def short_cpu(name):
    """'Intel(R) Xeon(R) Processor' -> 'Intel Xeon'."""
    return ' '.join(w for w in name.replace('(R)', '').replace('(TM)', '').split() if w not in ('Processor', 'CPU'))


def rerun_setting(r):
    """How a rerun differs from the grid's machine and settings (records without 'cpu' ran there)."""
    cpu = r.get('cpu') and GRID_CPU not in r['cpu'] and short_cpu(r['cpu'])
    if r['threads'] == 1 and r['cpu_capability'] == 'default':
        return f'{cpu}, default path (1 thread)' if cpu else 'as committed (1 thread)'
    return ', '.join(([cpu] if cpu else []) + ([f"{r['threads']} threads"] if r['threads'] != 1 else []) +
                     ([f"ATEN_CPU_CAPABILITY={r['cpu_capability']}"] if r['cpu_capability'] != 'default' else []))


def reproduction_table(records):
    """Each rerun's final report-half loss beside the committed one; then, per setting, the
    largest move of a loss and of the key pair's paired gap (HA - SA w16, the same seed and
    setting), beside the seed-to-seed spread of those variants and the smallest gap claimed."""
    order = list(dict.fromkeys(rerun_setting(r) for r in records))
    records = sorted(records, key=lambda r: (order.index(rerun_setting(r)), r['grid'] != 'wide', r['seed'], r['preset']))
    lines = ['| grid | run | seed | setting | committed | rerun | difference |', '|---|---|---|---|---|---|---|']
    for r in records:
        c = r['report_loss']
        lines.append(f"| {r['grid']} | `{r['preset']}` | {r['seed']} | {rerun_setting(r)} | {c['committed']:.6f} "
                     f"| {c['rerun']:.6f} | {c['diff']:+.6f}{' (bit-identical)' if c['diff'] == 0 else ''} |")
    a, b = KEY_PAIR
    variant = lambda r: r['preset'].split('_d')[0].rsplit('_lr', 1)[0]
    by = {(r['grid'], variant(r), r['seed'], rerun_setting(r)): r['report_loss'] for r in records}
    lines += ['', '| grid | seed | setting | paired gap HA - SA w16, committed | rerun | move |', '|---|---|---|---|---|---|']
    moves = {}
    for (g, v, seed, setting), ha in by.items():
        sa = by.get((g, b, seed, setting))
        if v != a or sa is None:
            continue
        was, now = ha['committed'] - sa['committed'], ha['rerun'] - sa['rerun']
        moves.setdefault(setting, []).append(abs(now - was))
        lines.append(f"| {g} | {seed} | {setting} | {was:+.4f} | {now:+.4f} | {now - was:+.4f} |")
    lines += ['', '| setting | reruns | largest loss move | median loss move | largest move of a paired gap |',
              '|---|---|---|---|---|']
    for setting in dict.fromkeys(rerun_setting(r) for r in records):
        loss = [abs(r['report_loss']['diff']) for r in records if rerun_setting(r) == setting]
        gap = f"{max(moves[setting]):.4f} ({len(moves[setting])} pairs)" if setting in moves else '-'
        lines.append(f"| {setting} | {len(loss)} | {max(loss):.4f} | {float(np.median(loss)):.4f} | {gap} |")
    spread = {}
    for r in records:
        row = (load(r['grid']) or {}).get(r['preset'])
        if row and len(row['runs']) >= 2:
            spread[r['preset']] = float(np.std([x['report_loss'] for x in row['runs']], ddof=1))
    if spread:
        lines += ['', f"Seed-to-seed std of these runs' report losses (their committed seeds): "
                      f"{min(spread.values()):.4f} to {max(spread.values()):.4f}."]
    return '\n'.join(lines)


def plot_scale(lengths, widths):
    """Two figures: the key pair's selection-half gap against iteration for every schedule length
    (mean and 95% t-interval over seeds), and the final report-half gap against width."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from scipy import stats
    a, b = KEY_PAIR
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (n, rows) in enumerate(sorted(lengths.items())):
        if a not in rows or b not in rows:
            continue
        iters, gap = gap_curves(rows[a], rows[b])
        mean = gap.mean(0)
        ax.plot(iters, mean, color=f'C{i}', lw=1.4, label=f'{n:,}-iteration schedule (n={len(gap)})')
        if len(gap) >= 2:
            half = stats.t.ppf(0.975, len(gap) - 1) * gap.std(0, ddof=1) / math.sqrt(len(gap))
            ax.fill_between(iters, mean - half, mean + half, color=f'C{i}', alpha=0.15)
    ax.set_xscale('log')
    ax.set_ylim(-0.06, 0.06)
    save_gap_figure(fig, ax, 'iteration (log scale)', 'HA shared - SA window 16 (nats/char)',
                    'gap on the selection half, mean and 95% CI over seeds; below 0: HA lower', 'grid_gap_lengths.png')
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ws, means, halves, ns = [], [], [], []
    for w, rows in widths.items():
        if a in rows and b in rows:
            seeds, d, mean, half, _ = paired(rows[a], rows[b])
            ws.append(w), means.append(mean), halves.append(0 if math.isnan(half) else half), ns.append(len(seeds))
            ax.scatter([w] * len(d), d, color='C0', alpha=0.35, s=14)
    ax.errorbar(ws, means, yerr=halves, fmt='o-', color='C3', capsize=4, label='equal tokens: mean, 95% CI (paired by seed)')
    for w, m, n in zip(ws, means, ns):
        ax.annotate(f'n={n}', (w, m), textcoords='offset points', xytext=(6, 6), fontsize=8)
    flops = [(w, *paired(rows[a], rows[b])[2:4]) for w, rows in key_pair_widths_flops(widths).items()]
    flops = [(w, m, 0 if math.isnan(h) else h) for w, m, h in flops if not math.isnan(m)]
    if flops:
        fw, fm, fh = zip(*flops)
        ax.errorbar([w * 1.04 for w in fw], fm, yerr=fh, fmt='s--', color='C2', capsize=4,
                    label='equal FLOPs (SA trained longer): mean, 95% CI')
    for w, rows in key_pair_widths_edge(widths).items():  # read beside the study's row, not in its place
        seeds, _, m, h, _ = paired(rows[a], rows[b])
        ax.errorbar([w * 0.96], [m], yerr=[0 if math.isnan(h) else h], fmt='o', mfc='white', color='C3', capsize=4,
                    label=f'width {w} at the edge check\'s better rates (n={len(seeds)})')
    for i, (folder, record) in enumerate(second_paths().items()):  # the same runs retrained on another kernel path
        moved = on_path(GRIDS / folder, widths)
        pts = [(w, len(paired(p[a], p[b])[0]), *paired(p[a], p[b])[2:4]) for w, p in sorted(moved.items())]
        if pts:
            pw, pn, pm, ph = zip(*pts)
            ax.errorbar([w * (1.08 + 0.04 * i) for w in pw], pm, yerr=[0 if math.isnan(h) else h for h in ph], fmt='D:',
                        color=f'C{4 + i}', capsize=4,
                        label=f"equal tokens, rerun on the {path_label(record)} (n={', '.join(map(str, pn))})")
    ax.set_xscale('log', base=2)
    ax.set_xticks(ws, [str(w) for w in ws])
    save_gap_figure(fig, ax, 'width (head size 24; heads = width / 24)', 'HA shared - SA window 16, report half',
                    'final gap after 3,000 iterations against width', 'grid_gap_width.png')


def save_gap_figure(fig, ax, xlabel, ylabel, title, name):
    """The scale study's figures: a zero line, labels, grid and legend, saved to assets/."""
    import matplotlib.pyplot as plt
    ax.axhline(0, color='k', lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ASSETS / name, dpi=100)
    plt.close(fig)


# -----------------------------------------------------------------------------
# figures

def plot_curves(rows, path, title, x_of=None, xlabel='iteration', zoom_from=None):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    panels = 2 if zoom_from is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    for ax_i, ax in enumerate(axes[0]):
        for v, r in rows.items():
            iters, val, _ = curves(r)
            x = x_of(v, r, iters) if x_of else iters
            keep = iters > 0 if ax_i == 0 else iters >= zoom_from
            line, = ax.plot(x[keep], val.mean(0)[keep], label=f'{v} (n={len(val)})', lw=1.4)
            ax.fill_between(x[keep], val.min(0)[keep], val.max(0)[keep], color=line.get_color(), alpha=0.15)
        ax.set_xlabel(xlabel)
        ax.set_ylabel('validation loss (nats/char)')
        ax.grid(alpha=0.3)
        ax.set_title(title if ax_i == 0 else f'zoom: iteration >= {zoom_from}')
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figures(grids):
    ASSETS.mkdir(exist_ok=True)
    main, times = grids.get('main'), None
    if main:
        plot_curves(main, ASSETS / 'grid_main.png', 'Shakespeare chars: val loss, mean over seeds (band: min..max)',
                    zoom_from=300)
        plot_curves(main, ASSETS / 'grid_main_flops.png', 'the same runs against training FLOPs',
                    x_of=lambda v, r, it: it * r['tokens_per_iter'] * r['flops_per_token'], xlabel='training FLOPs')
        st = GRIDS / 'main' / 'step_times.json'
        if st.exists():
            times = json.loads(st.read_text())['seconds_per_step']
            plot_curves({v: r for v, r in main.items() if v in times}, ASSETS / 'grid_main_time.png',
                        'the same runs against CPU seconds (1 thread, measured step time)',
                        x_of=lambda v, r, it: it * times[v], xlabel='training seconds (one CPU thread)')
    for g, title in [('milton', 'Milton chars'), ('bpe', 'Shakespeare, GPT-2 tokens'), ('early', 'early training (200 its)')]:
        if grids.get(g):
            plot_curves(grids[g], ASSETS / f'grid_{g}.png', f'{title}: val loss, mean over seeds')


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--figures', action='store_true', help='also redraw assets/grid_*.png')
    p.add_argument('--write', action='store_true',
                   help="refresh RESULTS.md's tables in place (between <!-- table NAME --> and <!-- /table -->)")
    a = p.parse_args()
    if a.write:
        changed = write_results(ROOT / 'RESULTS.md', sections(a.figures))
        print(f"RESULTS.md: {len(changed)} table{'s' * (len(changed) != 1)} refreshed ({', '.join(changed) or 'none'})")
    else:
        print(report(a.figures))


def sections(draw=False):
    """{name: markdown} of every table and ranking sentence the committed results give."""
    sys.path.insert(0, str(ROOT / 'tools'))
    import cpu_grids
    grids = {g: load(g) for g in cpu_grids.ORDER}
    out = {}
    if grids['lr_sweep']:
        lrs = sorted({lr for v in cpu_grids.VARIANTS for lr in cpu_grids.sweep_lrs(v)})
        out['lr_sweep'] = sweep_table(grids['lr_sweep'], list(cpu_grids.VARIANTS), lrs, cpu_grids.lr_tag)
    st_path = GRIDS / 'main' / 'step_times.json'
    step_times = json.loads(st_path.read_text())['seconds_per_step'] if st_path.exists() else None
    if grids['main']:
        verdicts = equal_compute(grids, step_times)
        controls = sorted({v for g in ('main', 'milton', 'bpe') for v in (grids[g] or {}) if is_control(v)})
        out['summary'] = summary_table(grids, [v for v in cpu_grids.VARIANTS if v in grids['main']] + controls, verdicts)
        out['equal_compute'] = equal_compute_table(grids, verdicts, step_times)
        out['locality'] = pairs_table(grids['main'], LOCALITY)
        out['hfa_order'] = pairs_table(grids['main'], HFA_ORDER)
    if grids['main']:
        out['corrections'] = corrections_table(grids)
        out['main_stalls'] = stall_table(grids['main'])
        out['main_nostall'] = grid_table(without_stalls(grids['main']))
        out['locality_nostall'] = pairs_table(without_stalls(grids['main']), LOCALITY)
    if grids['milton']:
        out['milton_stalls'] = stall_table(grids['milton'])
    for g in ['main', 'main_flops', 'main_time', 'early', 'milton', 'bpe']:
        if grids[g] and g in ('main_flops', 'main_time'):  # against SA's own budget: main's 1000 iterations
            out[g] = grid_table({REF: grids['main'][REF], **grids[g]}, iters_col=True)
        elif grids[g]:
            out[g] = grid_table(grids[g])
            if g in ('main', 'milton', 'bpe', 'early'):
                out[f'{g}_settle'] = settle_table({v: r for v, r in grids[g].items() if not is_control(v)})[0]
            half = {v: r for v, r in grids[g].items() if is_control(v) or v == 'hfa2_pm'}  # hfa2_pm's rate is 4e-3
            if g == 'milton' and 'sa_lr4e-3' in half:  # the same, among the half-rate runs, against SA at 4e-3
                out[f'{g}_half_settle'] = settle_table(half, ref='sa_lr4e-3')[0]
            if any(a in grids[g] and b in grids[g] for a, b in RATES):
                out[f'{g}_rates'] = pairs_table(grids[g], RATES)
    if (GRIDS / 'long' / 'results.json').exists():
        out['long_rates'] = long_rates_table()
    longs = long_grids()
    if longs.get(LONG_ITERS):
        out['long_variants'] = long_variant_table(longs[LONG_ITERS])
        out['long_pairs'] = long_pairs_table(longs)
        out['long_settle'] = long_settle_table(longs)
        out['long_trend'] = long_trend_table(longs)
    lengths, widths = key_pair_lengths(), key_pair_widths()
    if 12000 in lengths or len(widths) > 1:
        out['scale_rates'] = scale_rates_table()
        out['scale_family'] = scale_family_table(lengths, widths)
        out['scale_lengths'] = length_gap_table(lengths)
        out['scale_widths'] = width_gap_table(widths)
        out['scale_widths_edge'] = width_edge_table(widths)
        out['scale_cost'] = equal_cost_table(lengths)
        out['scale_widths_flops'] = width_flops_table(widths)
        studies = {}
        for folder, record in second_paths().items():
            studies[path_label(record)] = path_study(longs, lengths, widths, folder)
            out[f'{folder}_claims'] = path_claims_table(studies[path_label(record)], record)
            out[f'{folder}_means'] = path_means_table(widths, folder, record)
        out['answer'] = answer_table(longs, lengths, widths, studies)
    if reruns():
        out['reproduction'] = reproduction_table(reruns())
    if draw:
        figures(grids)
        if longs.get(LONG_ITERS):
            plot_long(longs)
        if 12000 in lengths or len(widths) > 1:
            plot_scale(lengths, widths)
    return out


def report(draw=False):
    return '\n'.join(f'### {name}\n{text}\n' for name, text in sections(draw).items())


def write_results(path, tables):
    """Replace each <!-- table NAME --> ... <!-- /table --> block of `path` with tables[NAME]."""
    import re
    text = path.read_text()
    changed = []

    def fill(m):
        name = m.group(1)
        if name not in tables:  # a grid not run (yet): its block is left as it is
            print(f"warning: no results for table {name!r} (tables: {', '.join(tables)}); left unchanged")
            return m.group(0)
        new = f'<!-- table {name} -->\n{tables[name]}\n<!-- /table -->'
        if new != m.group(0):
            changed.append(name)
        return new
    text = re.sub(r'<!-- table (\S+) -->\n.*?<!-- /table -->', fill, text, flags=re.S)
    path.write_text(text)
    return changed


if __name__ == '__main__':
    main()
