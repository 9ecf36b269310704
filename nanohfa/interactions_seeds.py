"""
What recurs across seeds: the interaction read-out of interactions.py for several checkpoints
of one variant (seeds), with heads matched across seeds and, per structure, the number of
seeds in which it appears. interactions.py reads each checkpoint (read_seeds) and hands its
heads here; this module matches them and reports, and imports nothing of interactions.py.

    python interactions.py --out_dir=out-a,out-b,out-c --layer=0
    python interactions.py --out_dir='grids/long12k/runs/sa_w16_lr4e-3/seed*' --top_k=20

One seed's read-out shows what one model learned; a structure that only one seed has says
nothing about the architecture. So:

Matching. Training permutes heads freely: head h of one seed has no reason to be head h of
another. Each seed's heads are matched to the first seed's (the reference) by the one-to-one
assignment that maximises the summed Spearman rank correlation of the heads' ranked
coefficients (the query-centred coefficient of a softmax head, the raw one of a linear head:
all N^2 pairs, or N^3 triples for HA, flattened; scipy's linear_sum_assignment). A head
group is a reference head with its match in every other seed.

Stability of a group: the rank correlation of the reference head with each of its matches,
beside the baseline of unrelated heads (the mean |rho| of every reference head against the
heads of another seed that the assignment did not match to it), and the top-k overlap (how
many of the reference head's k largest entries are among its match's k largest) beside its
chance level, k^2 / M for two random k-subsets of M entries.

The chance level understates what unrelated heads share when every head of a layer favours the
same few tokens, so the report also gives the overlap of the reference head with the heads the
assignment did not match to it (the unrelated-head overlap): a group is stable where its overlap
is well above that, not merely above chance.

Recurrence of a structure (a pair `a -> b`, a triple `a <- (b, c)`; an HA head with shared key
streams is symmetric in its keys, so each key pair is listed once): in how many seeds it is
among the group's matched head's top k (for HA also in its three-way part's top k). Coarser
structures per group: the head's type (token head where the read-out explains at least half its
score, token_share >= 0.5, positional otherwise), the correlation of its offset profile across
seeds, and the correlation of its class blocks, the coefficients averaged over blocks of token
classes (space, newline, lowercase, capital, punctuation), beside the same for unrelated heads.
The report lists first what a majority of seeds share, then each seed's own top list, labelled
as one seed's.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

from nanohfa.errors import UserError


def ranks(x, rel=1e-3):
    """Average ranks of the entries, on values rounded to rel x the largest magnitude: the
    read-out states coefficients to 3 significant digits, and an order below that (a trained
    zero's 1e-4 of noise) is not one a reader could see, so such values count as ties."""
    from scipy.stats import rankdata
    flat = x.reshape(-1).double().numpy()
    step = rel * max(np.abs(flat).max(), 1e-300)
    return torch.from_numpy(rankdata(np.round(flat / step)))


def spearman(x, y):
    """Rank correlation of two coefficient arrays of the same shape (Pearson's on average ranks)."""
    a, b = ranks(x), ranks(y)
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / (a.norm() * b.norm()))


def top_set(x, k):
    """The flat indices of the k largest entries."""
    return set(torch.topk(x.reshape(-1), k).indices.tolist())


def match_heads(ref, other, key='ranked'):
    """(assignment, rho): assignment[i] is the head of `other` matched to head i of `ref`, the
    one-to-one map with the largest summed Spearman correlation; rho[i, j] every correlation."""
    from scipy.optimize import linear_sum_assignment
    rho = np.array([[spearman(a[key], b[key]) for b in other] for a in ref])
    rows, cols = linear_sum_assignment(-rho)
    assignment = np.empty(len(ref), dtype=int)
    assignment[rows] = cols
    return assignment, rho


def structure_text(index, shape, labels):
    ix = np.unravel_index(index, shape)
    t = [labels[i] for i in ix]
    return f"{t[0]} -> {t[1]}" if len(t) == 2 else f"{t[0]} <- ({t[1]}, {t[2]})"


def token_class(label):
    """The coarse class of a token's display text: the blocks the read-out is summarised in."""
    if label in ('\u2423', '\\n'):
        return 'space' if label == '\u2423' else 'newline'
    if len(label) == 1 and label.isalpha():
        return 'capital' if label.isupper() else 'lowercase'
    if len(label) == 1 and not label.isalnum():
        return 'punctuation'
    return 'other'


def class_blocks(x, labels):
    """(classes, means): the mean of x over each block of token classes (one class per axis),
    the coarse structure that a seed's particular tokens do not decide."""
    cls = [token_class(t) for t in labels]
    classes = [c for c in ('space', 'newline', 'lowercase', 'capital', 'punctuation', 'other') if c in cls]
    members = [torch.tensor([i for i, c in enumerate(cls) if c == k]) for k in classes]
    out = x
    for axis in range(x.dim()):
        out = torch.stack([out.index_select(axis, m).mean(axis) for m in members], axis)
    return classes, out


def pearson(x, y):
    a, b = x.reshape(-1).double(), y.reshape(-1).double()
    a, b = a - a.mean(), b - b.mean()
    return float((a @ b) / (a.norm() * b.norm()).clamp(min=1e-300))


def one_order(x):
    """A triple tensor symmetric in its two keys (HA with shared key streams) lists each key
    pair once (key 1 <= key 2): its other order is the same structure, not a second one."""
    if x.dim() == 3 and (x - x.transpose(1, 2)).abs().max() <= 1e-9 * x.abs().max():  # equal up to rounding
        b = torch.arange(x.size(1))
        return x.masked_fill((b[:, None] > b[None, :])[None], float('-inf'))
    return x


def recurrence(values, k, shape, labels):
    """values[s]: seed s's coefficients of one head group (flat). Returns the structures among
    the top k of a majority of seeds (most seeds first, then by mean value) and each seed's own
    top list."""
    n_seeds = len(values)
    tops = [top_set(one_order(v), k) for v in values]
    counts = {}
    for t in tops:
        for j in t:
            counts[j] = counts.get(j, 0) + 1
    mean = lambda j: float(np.mean([v.reshape(-1)[j] for v in values]))
    majority = sorted((j for j, c in counts.items() if c > n_seeds / 2), key=lambda j: (-counts[j], -mean(j)))
    return ([dict(text=structure_text(j, shape, labels), seeds=counts[j], mean=mean(j)) for j in majority],
            [[structure_text(j, shape, labels) for j in sorted(t, key=lambda j: -float(values[s].reshape(-1)[j]))]
             for s, t in enumerate(tops)], tops)


def seed_stability(seeds_heads, labels, k=20, key='ranked', measures=None):
    """The cross-seed report of one layer: seeds_heads[s] is seed s's list of per-head read-outs
    (interactions.read_attention), seed 0 the reference. measures[s] (optional): seed s's
    per-head token shares and offset profiles. Returns a dict: one entry per head group
    (stability beside its baselines, recurring structures, coarse class blocks, each seed's own
    top list) and the matching's method and baselines."""
    ref = seeds_heads[0]
    n_seeds = len(seeds_heads)
    assignments, matched_rho, unrelated = [list(range(len(ref)))], [], []
    for other in seeds_heads[1:]:
        if len(other) != len(ref):
            raise UserError(f"the seeds' layers have {len(ref)} and {len(other)} heads: not one variant")
        a, rho = match_heads(ref, other, key)
        assignments.append(a.tolist())
        matched_rho.append([rho[i, a[i]] for i in range(len(ref))])
        unrelated += [abs(rho[i, j]) for i in range(len(ref)) for j in range(len(other)) if j != a[i]]
    head = lambda s, i: seeds_heads[s][assignments[s][i]]
    baseline = float(np.mean(unrelated)) if unrelated else float('nan')
    groups, block_unrelated = [], []
    for i, r in enumerate(ref):
        shape, size = tuple(r[key].shape), int(one_order(r[key]).isfinite().sum())
        kk = min(k, size)
        recurring, per_seed, tops = recurrence([head(s, i)[key] for s in range(n_seeds)], kk, shape, labels)
        # the overlap two heads of the same layer reach without being the same head: the baseline
        # that k^2 / M (two random k-subsets) understates when every head favours the same tokens
        others = [len(tops[0] & top_set(one_order(seeds_heads[s][j][key]), kk))
                  for s in range(1, n_seeds) for j in range(len(ref)) if j != assignments[s][i]]
        classes, blocks0 = class_blocks(r[key], labels)
        block_rho = [pearson(blocks0, class_blocks(head(s, i)[key], labels)[1]) for s in range(1, n_seeds)]
        block_unrelated += [abs(pearson(blocks0, class_blocks(seeds_heads[s][j][key], labels)[1]))
                            for s in range(1, n_seeds) for j in range(len(ref)) if j != assignments[s][i]]
        g = dict(
            heads=[assignments[s][i] for s in range(n_seeds)],
            rho=[float(x[i]) for x in matched_rho],
            overlap=[len(tops[0] & t) for t in tops[1:]],
            chance=kk * kk / size,
            unrelated_overlap=float(np.mean(others)) if others else float('nan'),
            recurring=recurring, per_seed=per_seed,
            classes=classes, class_blocks=[rounded(class_blocks(head(s, i)[key], labels)[1]) for s in range(n_seeds)],
            class_block_rho=block_rho,
        )
        if 'T3' in r:  # HA: the three-way part's own recurrence, and its share of each seed's head
            g['recurring_three_way'], g['per_seed_three_way'], _ = recurrence(
                [head(s, i)['T3'] for s in range(n_seeds)], kk, shape, labels)
            g['three_way_share'] = [head(s, i)['three_way_share'] for s in range(n_seeds)]
        if measures:
            prof = [measures[s]['offset_profile'][assignments[s][i]] for s in range(n_seeds)]
            g['offset_rho'] = [pearson(prof[0], p) for p in prof[1:]]
        if measures and measures[0]['token_share'] is not None:
            g['token_share'] = [measures[s]['token_share'][assignments[s][i]] for s in range(n_seeds)]
            g['head_type'] = ['token' if t >= 0.5 else 'positional' for t in g['token_share']]
        groups.append(g)
    return dict(method='heads matched to seed 0 by the assignment maximising summed Spearman correlation '
                       f'of the {key} coefficients (scipy linear_sum_assignment)',
                top_k=k, seeds=n_seeds, unrelated_rho=baseline,
                unrelated_class_block_rho=float(np.mean(block_unrelated)) if block_unrelated else float('nan'),
                groups=groups)


CLASS_TEXT = dict(space='\u2423', newline='\\n', lowercase='a-z', capital='A-Z', punctuation='.,;', other='other')


def class_block_figure(report, path):
    """Each head group's class blocks, seed by seed (rows: groups, columns: seeds), each panel on
    its own symmetric colour scale (a seed's head may be scaled differently from another's; the
    pattern is what is compared). Triples: rows the query class, columns the key pair's classes."""
    from experiments.common import plt
    groups, n = report['groups'], report['seeds']
    classes = [CLASS_TEXT[c] for c in groups[0]['classes']]
    triples = np.asarray(groups[0]['class_blocks'][0]).ndim == 3
    cols_text = [f"{b} {c}" for b in classes for c in classes] if triples else classes
    width = 0.9 + 0.32 * len(cols_text)
    fig, axes = plt.subplots(len(groups), n, figsize=(width * n + 0.4, (0.9 + 0.32 * len(classes)) * len(groups) + 0.6),
                             squeeze=False, layout='constrained')
    for g, group in enumerate(groups):
        for s in range(n):
            x = np.asarray(group['class_blocks'][s], dtype=float).reshape(len(classes), -1)
            v = np.abs(x).max() or 1.0
            ax = axes[g, s]
            ax.imshow(x, cmap='RdBu_r', vmin=-v, vmax=v, interpolation='nearest', aspect='auto')
            ax.set_title(f"group {g}, seed {s} (head {group['heads'][s]})", fontsize=9)
            ax.set_yticks(range(len(classes)), classes, fontsize=9)
            ax.set_xticks(range(len(cols_text)), cols_text, fontsize=8, rotation=90 if triples else 0)
            if s == 0:
                ax.set_ylabel('query class')
            if g == len(groups) - 1:
                ax.set_xlabel('key classes (1, 2)' if triples else 'key class')
    fig.suptitle(f"{report['attention']}: layer {report['layer']}, coefficients averaged over token classes,\n"
                 f"matched heads by seed (each panel its own scale: red high, blue low)", fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def rounded(x, digits=4):
    return [rounded(v, digits) for v in x] if isinstance(x, (list, torch.Tensor)) and (
        not torch.is_tensor(x) or x.dim() > 0) else float(f"{float(x):.{digits}g}")


def stability_lines(report, names):
    """The printed summary: majority-recurring structure first, then each seed's own lists."""
    n, k = report['seeds'], report['top_k']
    lines = [f"{n} seeds ({', '.join(names)}); heads matched to the first by rank correlation; "
             f"unrelated head pairs: |rho| {report['unrelated_rho']:.2f}, class blocks "
             f"|r| {report['unrelated_class_block_rho']:.2f} on average"]
    for g, group in enumerate(report['groups']):
        heads = ' = '.join(f"seed{s}:h{h}" for s, h in enumerate(group['heads']))
        lines.append(f"group {g} ({heads}): rho {np.mean(group['rho']):.2f} [{min(group['rho']):.2f}, "
                     f"{max(group['rho']):.2f}], top-{k} overlap {np.mean(group['overlap']):.1f} of {k} "
                     f"(unrelated heads {group['unrelated_overlap']:.1f}, chance {group['chance']:.2g}), "
                     f"class blocks r {np.mean(group['class_block_rho']):.2f}")
        if 'token_share' in group:
            types = group['head_type']
            lines.append(f"  token share {', '.join(f'{t:.2f}' for t in group['token_share'])} "
                         f"({max(set(types), key=types.count)} head in {max(types.count(t) for t in types)}/{n})")
        if 'offset_rho' in group:
            lines.append(f"  offset profile r {np.mean(group['offset_rho']):.2f} [{min(group['offset_rho']):.2f}, "
                         f"{max(group['offset_rho']):.2f}]")
        if 'three_way_share' in group:
            lines.append(f"  three-way share {', '.join(f'{t:.2f}' for t in group['three_way_share'])}")
        rec = group['recurring']
        lines.append(f"  in a majority of seeds ({len(rec)}): "
                     + (';  '.join(f"{r['text']} ({r['seeds']}/{n})" for r in rec[:10]) or 'nothing'))
        if 'recurring_three_way' in group:
            rec = group['recurring_three_way']
            lines.append(f"  three-way part, in a majority of seeds ({len(rec)}): "
                         + (';  '.join(f"{r['text']} ({r['seeds']}/{n})" for r in rec[:10]) or 'nothing'))
    lines.append('each seed alone (one model each, not the architecture):')
    for g, group in enumerate(report['groups']):
        for s, top in enumerate(group['per_seed']):
            lines.append(f"  group {g} seed {s}: " + ';  '.join(top[:5]))
    return lines


def tables(report):
    """The markdown tables docs/interactions.md shows for one seeds.json: per head group its
    stability beside the baselines, and what a majority of seeds share."""
    n, k = report['seeds'], report['top_k']
    f2 = lambda xs: f"{np.mean(xs):.2f} [{min(xs):.2f}, {max(xs):.2f}]"
    ha = 'three_way_share' in report['groups'][0]
    head = ['group', 'heads (seed 0..)', 'rank corr.', f'top-{k} overlap', 'class blocks r', 'token share',
            'offset r'] + (['three-way share'] if ha else [])
    rows = [head, ['---'] * len(head)]
    for g, group in enumerate(report['groups']):
        row = [str(g), ' '.join(str(h) for h in group['heads']), f2(group['rho']),
               f"{np.mean(group['overlap']):.1f}", f2(group['class_block_rho']),
               ', '.join(f'{t:.2f}' for t in group['token_share']) if 'token_share' in group else '-',
               f2(group['offset_rho']) if 'offset_rho' in group else '-']
        if ha:
            row.append(', '.join(f'{t:.2f}' for t in group['three_way_share']))
        rows.append(row)
    rows.append(['unrelated heads', '', f"{report['unrelated_rho']:.2f}",
                 f"{np.mean([g['unrelated_overlap'] for g in report['groups']]):.1f} "
                 f"(chance {report['groups'][0]['chance']:.2g})",
                 f"{report['unrelated_class_block_rho']:.2f}", '', ''] + ([''] if ha else []))
    stability = '\n'.join('| ' + ' | '.join(r) + ' |' for r in rows)
    rows = [['group', f'in the top {k} of a majority of seeds (seeds of {n})'] + (['three-way part'] if ha else []),
            ['---', '---'] + (['---'] if ha else [])]
    cell = lambda rec: ', '.join(f"`{r['text']}` {r['seeds']}" for r in rec[:8]) + (
        f" (+{len(rec) - 8} more)" if len(rec) > 8 else '') if rec else 'nothing'
    for g, group in enumerate(report['groups']):
        rows.append([str(g), cell(group['recurring'])] + ([cell(group['recurring_three_way'])] if ha else []))
    recurring = '\n'.join('| ' + ' | '.join(r) + ' |' for r in rows)
    return dict(stability=stability, recurring=recurring)


def summary(reports):
    """One row per variant ({name: seeds.json report}): how much of each head is token structure,
    how far matched heads agree beside unrelated ones, and how many structures recur."""
    head = ['variant', 'seeds', 'token share, all heads', 'rank corr. matched / unrelated',
            'class blocks r matched / unrelated', 'top-20 overlap matched / unrelated', 'offset r matched',
            'in every seed', 'in a majority', 'groups with any']
    rows = [head, ['---'] * len(head)]
    for name, r in reports.items():
        groups, n = r['groups'], r['seeds']
        shares = [t for g in groups for t in g['token_share']]
        mean = lambda key: np.mean([np.mean(g[key]) for g in groups])
        rec = [x for g in groups for x in g['recurring'] + g.get('recurring_three_way', [])]
        rows.append([f'`{name}`', str(n), f'{min(shares):.2f}-{max(shares):.2f}',
                     f"{mean('rho'):.2f} / {r['unrelated_rho']:.2f}",
                     f"{mean('class_block_rho'):.2f} / {r['unrelated_class_block_rho']:.2f}",
                     f"{mean('overlap'):.1f} / {np.mean([g['unrelated_overlap'] for g in groups]):.1f}",
                     f"{mean('offset_rho'):.2f}", str(sum(x['seeds'] == n for x in rec)), str(len(rec)),
                     f"{sum(bool(g['recurring'] or g.get('recurring_three_way')) for g in groups)} of {len(groups)}"])
    return '\n'.join('| ' + ' | '.join(r) + ' |' for r in rows)


if __name__ == '__main__':  # python -m nanohfa.interactions_seeds results/readout_seeds/*/seeds.json: the docs' tables
    for path in sys.argv[1:]:
        print(f"{path}\n")
        for table in tables(json.loads(Path(path).read_text())).values():
            print(table + '\n')
    if len(sys.argv) > 2:  # every variant side by side
        print(summary({Path(p).parent.name: json.loads(Path(p).read_text()) for p in sys.argv[1:]}))
