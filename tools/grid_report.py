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
import grid as compare  # noqa: E402  (the statistics compare.py reports with)

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
}


def is_control(v):
    """A variant rerun at another learning rate than its best (named v_lr<rate>)."""
    return '_lr' in v


def load(grid):
    """{variant: row} of a grid's results.json; main also holds main_ha's rows (the HA variants,
    trained by the same command with the same seeds, compared with main's SA)."""
    path = GRIDS / grid / 'results.json'
    if not path.exists():
        return None
    rows = {r['variant']: r for r in json.loads(path.read_text()) if r['n_seeds']}
    if grid == 'main':
        for r in (load('main_seeds') or {}).values():  # more seeds of the same runs: pooled
            if r['variant'] in rows:
                rows[r['variant']] = pooled(rows[r['variant']], r)
        rows.update(load('main_ha') or {})
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
         ('hfa2_pm', 'sa_w16_lr4e-3')]  # the half-rate controls
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
    if draw:
        figures(grids)
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
