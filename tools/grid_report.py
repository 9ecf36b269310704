"""
RESULTS.md's tables and figures, regenerated from the committed grids/<grid>/results.json.

    python tools/grid_report.py                 # every table, as markdown, to stdout
    python tools/grid_report.py --figures       # also redraw assets/grid_*.png

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
import compare  # noqa: E402

GRIDS = ROOT / 'grids'
ASSETS = ROOT / 'assets'
REF = 'sa'
NAMES = {  # how each variant reads in a table
    'sa': 'SA', 'sa_w16': 'SA, window 16', 'hfa': 'HFA A=2 (dh 24, +16% params)',
    'hfa_w16': 'HFA A=2, window 16 (+16% params)', 'hfa2_pm': 'HFA A=2, params matched (dh 16)',
    'hfa4_pm': 'HFA A=4, params matched (dh 10)', 'ha_share_w': 'HA shared, windows 16 x 8',
    'ha_noshare_w': 'HA unshared, windows 16 x 8 (+16% params)', 'ha_full': 'HA shared, full (no window)',
    'hybrid': '2 SA + 2 HFA heads',
}


def load(grid):
    path = GRIDS / grid / 'results.json'
    return {r['variant']: r for r in json.loads(path.read_text())} if path.exists() else None


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


def settle_table(rows):
    """When the ordering stopped changing: for the whole ranking of mean val loss, and for
    each variant against SA (the last evaluation at which the sign of the mean difference
    flipped, and the difference at a few points)."""
    data = {v: curves(r) for v, r in rows.items()}
    iters = data[REF][0]
    mean = {v: d[1].mean(0) for v, d in data.items()}
    order = [tuple(sorted(mean, key=lambda v: mean[v][e])) for e in range(len(iters))]
    changes = [iters[e] for e in range(2, len(iters)) if order[e] != order[e - 1]]  # from the 2nd eval on
    last_rank = changes[-1] if changes else iters[1]
    lines = [f"Ranking of all {len(rows)} means: last changed at iteration {last_rank} of {iters[-1]} "
             f"({len(changes)} changes after iteration {iters[1]}); final order: "
             + ' < '.join(f'`{v}`' for v in order[-1]) + '.', '',
             '| variant | last sign flip of Δ vs SA (iteration) | ' +
             ' | '.join(f'Δ at {iters[e]}' for e in checkpoints(iters)) + ' |',
             '|---|---|' + '---|' * len(checkpoints(iters))]
    for v in rows:
        if v == REF:
            continue
        d = mean[v] - mean[REF]
        flips = [iters[e] for e in range(2, len(iters)) if np.sign(d[e]) != np.sign(d[e - 1])]
        lines.append(f'| `{v}` | {flips[-1] if flips else "never"} | ' +
                     ' | '.join(f'{d[e]:+.3f}' for e in checkpoints(iters)) + ' |')
    return '\n'.join(lines), last_rank


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


def summary_table(grids, variants):
    cols = [(g, title) for g, title in [('main', 'equal tokens (2.05M)'), ('main_flops', "equal FLOPs (SA's 1000 its)"),
                                         ('main_time', "equal CPU seconds (SA's 1000 its)"),
                                         ('milton', 'Milton, equal tokens'), ('bpe', 'GPT-2 tokens, equal tokens')]
            if grids.get(g)]
    lines = ['| variant | ' + ' | '.join(t for _, t in cols) + ' |', '|---|' + '---|' * len(cols)]
    for v in variants:
        cells = [cell(grids[g][v], grids[g].get(REF)) if v in grids[g] else 'not run' for g, _ in cols]
        lines.append(f'| {NAMES.get(v, v)} | ' + ' | '.join(cells) + ' |')
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
            plot_curves(main, ASSETS / 'grid_main_time.png',
                        'the same runs against CPU seconds (1 thread, measured step time)',
                        x_of=lambda v, r, it: it * times[v], xlabel='training seconds (one CPU thread)')
    for g, title in [('milton', 'Milton chars'), ('bpe', 'Shakespeare, GPT-2 tokens'), ('early', 'early training (200 its)')]:
        if grids.get(g):
            plot_curves(grids[g], ASSETS / f'grid_{g}.png', f'{title}: val loss, mean over seeds')


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--figures', action='store_true')
    a = p.parse_args()
    print(report(a.figures))


def report(draw=False):
    sys.path.insert(0, str(ROOT / 'tools'))
    import cpu_grids
    grids = {g: load(g) for g in cpu_grids.ORDER}
    out = []
    if grids['lr_sweep']:
        lrs = sorted({lr for v in cpu_grids.VARIANTS for lr in cpu_grids.sweep_lrs(v)})
        out += ['### lr_sweep', sweep_table(grids['lr_sweep'], list(cpu_grids.VARIANTS), lrs, cpu_grids.lr_tag), '']
    if grids['main']:
        out += ['### summary', summary_table(grids, list(cpu_grids.VARIANTS)), '']
    for g in ['main', 'main_flops', 'main_time', 'early', 'milton', 'bpe']:
        if grids[g]:
            out += [f'### {g}', grid_table(grids[g], iters_col=g in ('main_flops', 'main_time')), '']
            if g in ('main', 'milton', 'bpe', 'early'):
                out += [settle_table(grids[g])[0], '']
    if draw:
        figures(grids)
    return '\n'.join(out)


if __name__ == '__main__':
    main()
