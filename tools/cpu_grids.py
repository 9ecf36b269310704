"""
The CPU comparison grids behind RESULTS.md, as data: each grid is a compare.py command.

    python tools/cpu_grids.py lr_sweep            # then main, main_ha, early, milton, bpe
    python tools/cpu_grids.py main --dry_run      # print the compare.py command, run nothing
    python tools/cpu_grids.py all --jobs 2        # every grid in order (resumable: finished runs are kept)
    python tools/cpu_grids.py main --slurm="--slurm_partition=cpu"   # its runs as SLURM jobs (docs/cluster.md)

Every grid trains tiny GPTs (config/compare_cpu.py: 2 layers, 4 heads, width 96, context 64,
batch 32) through compare.py into grids/<grid>/ (runs/ stays out of git; results.json, .csv,
.md and the plot are committed). Grids that depend on others read their results:
- main, main_ha, main_seeds: each variant at the learning rate that was best for it in
  lr_sweep. main holds the variants whose runs are cheap here, main_ha the HA variants (4x
  SA's step time on this CPU) and SA at half its rate, main_seeds seeds 3 and 4 of SA and
  its closest cheap rivals; tools/grid_report.py pools them into one table.
- step_times: seconds per training step of every variant, measured in one process under one
  load (bench.py --step_times), for comparisons at equal time; wide_step_times: the same for
  the key pair at widths 48, 96 and 192 (grids/wide/step_times.json); form_step_times: the
  same with HA on each of its two PyTorch forms (grids/ha_form/step_times.json).
- main_flops / main_time: each variant trained for as many iterations as give SA's training
  FLOPs / SA's training seconds in main (1000 iterations), with its own cosine schedule;
  seconds per step come from bench.py --step_times (grids/main/step_times.json), measured
  with every variant under the same load.
- milton, bpe: main's learning rates, on a second corpus and on GPT-2 tokens.
- long, long3k, long1k (and *_more: seeds 3-4): the long study (below).
- long12k, wide: the scale study: the long study's key pair at 12,000 iterations, and at widths
  48 and 192 for 3,000 iterations. Hours of CPU: `--runs_root DIR` keeps the run folders outside
  the checkout, so a new checkout on the same machine resumes them; finished runs are also
  recorded in the committed results.json, which compare.py reads as finished on a fresh clone:
      nice -n 19 python tools/cpu_grids.py long12k,wide --jobs 2 --runs_root ~/nanohfa-runs
      python tools/cpu_grids.py long12k --collect_only    # the results so far (never fewer runs)
- wide_edge: seed 0 at half the chosen rate wherever the width grid chose the lower of its two;
  where half did better, seeds 0-4 at it and seed 0 at half of it again.
- wide_flops: windowed SA at each width for the iterations that cost shared HA's 3,000 in
  FLOPs, for the width study's equal-FLOPs reading (after wide).
- depth: the key pair at width 96, 3,000 iterations, at 2, 4 and 6 layers, HA on the gathered
  form (ha_form='windowed') at every depth; each depth's rate chosen on seed 0 as the width
  study's were, then seeds 0-4 (the grid runs twice, as wide does).
- readout: SA, linear and HFA at long12k's length, 5 seeds, for the read-out across seeds
  (interactions.py --out_dir='<runs>/seed*'; windowed SA and shared HA are long12k's runs).
`python tools/grid_report.py` turns the results into RESULTS.md's tables and figures.
"""

import argparse
import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / 'grids'
CONFIG = 'config/compare_cpu.py'

# name: train.py overrides on config/compare_cpu.py (which windows HA 16 x 8 by default)
VARIANTS = {
    'sa': dict(attention='sa'),
    'sa_w16': dict(attention='sa', attn_window=16),                 # SA seeing the last 16, as HA's j1
    'hfa': dict(attention='hfa_v1', hfa_order=2),                   # dh 24: 16% more parameters than SA
    'hfa_w16': dict(attention='hfa_v1', hfa_order=2, attn_window=16),
    'hfa2_pm': dict(attention='hfa_v1', hfa_order=2, head_dim=16),  # parameters matched to SA (equal)
    'hfa4_pm': dict(attention='hfa_v1', hfa_order=4, head_dim=10),  # parameters matched to SA (+1.3%)
    'ha_share_w': dict(attention='ha', ha_share_kv=True, ha_window1=16, ha_window2=8),
    'ha_noshare_w': dict(attention='ha', ha_share_kv=False, ha_window1=16, ha_window2=8),
    'ha_full': dict(attention='ha', ha_share_kv=True, ha_window1=0, ha_window2=0),
}
LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3)
# the sweep goes one step higher for the variants whose best was its largest value (an optimum
# at the edge of a sweep is not one), as often as needed; HFA's loss had already risen at 8e-3
HIGHER = {'sa': (1.6e-2,), 'sa_w16': (1.6e-2,), 'ha_share_w': (1.6e-2, 3.2e-2), 'ha_noshare_w': (1.6e-2, 3.2e-2),
          'ha_full': (1.6e-2,)}


def sweep_lrs(v):
    return LEARNING_RATES + HIGHER.get(v, ())
MAIN_ITERS = 1000
SECOND = ['sa', 'sa_w16', 'hfa2_pm', 'ha_share_w']  # the variants rerun on milton
BPE = ['sa', 'ha_share_w']  # and on GPT-2 tokens
CHEAP = ['sa', 'sa_w16', 'hfa', 'hfa_w16', 'hfa2_pm', 'hfa4_pm']  # 1.0-1.5x SA's step time on this CPU
MORE_SEEDS = ['sa', 'sa_w16', 'hfa2_pm']  # main_seeds: SA and its closest rivals among the cheap variants
HA = ['ha_share_w', 'ha_noshare_w']  # ha_full (13x SA's step time here) is in lr_sweep only


def lr_tag(lr):
    """1e-3 -> '1e-3', 1.6e-2 -> '1.6e-2' (run folder names)."""
    return f'{lr:.1e}'.replace('.0e', 'e').replace('e-0', 'e-')


def with_lr(over, lr):
    return {**over, 'learning_rate': lr, 'min_lr': lr / 10}


def best_lrs(variants):
    """Each variant's learning rate with the lowest final val loss in lr_sweep (one seed)."""
    path = GRIDS / 'lr_sweep' / 'results.json'
    if not path.exists():
        sys.exit(f"{path} not found: run `python tools/cpu_grids.py lr_sweep` first")
    rows = {r['variant']: r for r in json.loads(path.read_text())}
    best = {}
    for v in variants:
        done = [(rows[f'{v}_lr{lr_tag(lr)}']['val_loss_mean'], lr) for lr in sweep_lrs(v)
                if rows.get(f'{v}_lr{lr_tag(lr)}', {}).get('n_seeds')]
        if len(done) < len(sweep_lrs(v)):
            sys.exit(f"lr_sweep is unfinished for {v}: finish it first")
        best[v] = min(done)[1]
    return best


def half_rate(tuned, names):
    """These variants at half their best rate (the sweep's next rate down), as controls: is a
    result the rate's? Every best rate sits one step below a rate at which the loss rises."""
    return {f'{v}_lr{lr_tag(tuned[v]["learning_rate"] / 2)}': with_lr(VARIANTS[v], tuned[v]['learning_rate'] / 2)
            for v in names if v in tuned}


def main_cost(kind):
    """SA's training budget in main, and each variant's cost per iteration in the same unit."""
    rows = {r['variant']: r for g in ('main', 'main_ha') if (GRIDS / g / 'results.json').exists()
            for r in json.loads((GRIDS / g / 'results.json').read_text())}
    if kind == 'flops':
        per_iter = {v: rows[v]['flops_per_token'] for v in VARIANTS if v in rows}
    else:
        path = GRIDS / 'main' / 'step_times.json'
        if not path.exists():
            sys.exit(f"{path} not found: run `python tools/cpu_grids.py step_times` first (see RESULTS.md)")
        per_iter = json.loads(path.read_text())['seconds_per_step']
    return per_iter


def grid(name, only=None):
    """(variants {name: overrides}, seeds, extra train.py overrides) of one grid; `only`
    keeps some of its variants (to train them first; the full grid collects them all)."""
    variants, seeds, extra = _grid(name, only)
    return {v: o for v, o in variants.items() if not only or v.split('_lr')[0] in only}, seeds, extra


def _grid(name, only):
    if name == 'lr_sweep':
        variants = {f'{v}_lr{lr_tag(lr)}': with_lr(over, lr) for v, over in VARIANTS.items() for lr in sweep_lrs(v)}
        return variants, 1, dict(max_iters=400, lr_decay_iters=400)
    if name == 'early':  # the first comparison's budget: 200 iterations, one learning rate for all
        early = {'sa': VARIANTS['sa'], 'hfa': VARIANTS['hfa'], 'hybrid': dict(attention='hfa_v1', n_hfa_head=2),
                 'ha_noshare_w': VARIANTS['ha_noshare_w'], 'ha_share_w': VARIANTS['ha_share_w']}
        return early, 3, dict(max_iters=200, lr_decay_iters=200)
    if name == 'long':  # seed 0 of both rates first; once chosen, the chosen rate's other seeds
        chosen = long_choice() or {}
        variants = {p: {**o, 'seeds': LONG_SEEDS if p in chosen.values() else 1} for p, o in long_candidates().items()}
        return variants, 1, dict(max_iters=LONG_ITERS[name], lr_decay_iters=LONG_ITERS[name], **LONG_EXTRA)
    if name == 'long12k':  # issue: does the gap grow, hold or close? Five seeds of the key pair at twice
        # the long study's length, its chosen rates; seed 0 of each also at half its rate (an edge check)
        chosen = long_choice()
        if chosen is None:
            sys.exit("the long grid's rate choice is unfinished: run `python tools/cpu_grids.py long` first")
        cands = long_candidates()
        variants = {chosen[v]: {**cands[chosen[v]], 'seeds': LONG12K_SEEDS} for v in LONG_KEY}
        for v in LONG_KEY:
            lr = cands[chosen[v]]['learning_rate'] / 2
            variants[f'{v}_lr{lr_tag(lr)}'] = {**with_lr(VARIANTS[v], lr), 'seeds': 1}
        return variants, 1, dict(max_iters=LONG_ITERS[name], lr_decay_iters=LONG_ITERS[name], **LONG_EXTRA)
    if name == 'readout':
        return readout_grid(), 1, dict(max_iters=LONG_ITERS['long12k'], lr_decay_iters=LONG_ITERS['long12k'], **LONG_EXTRA)
    if name == 'depth':
        return depth_grid(), 1, dict(max_iters=LONG_ITERS['long3k'], lr_decay_iters=LONG_ITERS['long3k'], **LONG_EXTRA)
    if name == 'wide':
        return wide_grid(), 1, dict(max_iters=LONG_ITERS['long3k'], lr_decay_iters=LONG_ITERS['long3k'], **LONG_EXTRA)
    if name == 'wide_edge':
        variants = wide_edge_grid()
        if variants is None:
            sys.exit("the width grid's rate choice is unfinished: run `python tools/cpu_grids.py wide` first")
        return variants, 1, dict(max_iters=LONG_ITERS['long3k'], lr_decay_iters=LONG_ITERS['long3k'], **LONG_EXTRA)
    if name == 'wide_flops':
        variants = wide_flops_grid()
        if variants is None:
            sys.exit("the width grid's rate choice is unfinished: run `python tools/cpu_grids.py wide` first")
        return variants, 1, LONG_EXTRA
    if name in ('long3k', 'long1k', 'long_more', 'long3k_more', 'long1k_more'):
        # the key pair at the rate chosen at full length; *_more: seeds 3 and 4 of the same runs
        # (every LONG variant at full length), pooled into their grid by tools/grid_report.py
        chosen = long_choice()
        if chosen is None:
            sys.exit("the long grid's rate choice is unfinished: run `python tools/cpu_grids.py long` first")
        length = name.removesuffix('_more')
        names, seeds = (LONG if length == 'long' else LONG_KEY), (LONG_MORE_SEEDS if name.endswith('_more') else LONG_SEEDS)
        variants = {chosen[v]: {**long_candidates()[chosen[v]], 'seeds': seeds} for v in names}
        return variants, 1, dict(max_iters=LONG_ITERS[length], lr_decay_iters=LONG_ITERS[length], **LONG_EXTRA)
    names = [v for v in VARIANTS if not only or v in only]
    best = best_lrs(names)
    tuned = {v: with_lr(VARIANTS[v], best[v]) for v in names}
    if name == 'main':  # config/compare_cpu.py: MAIN_ITERS iterations
        return {v: over for v, over in tuned.items() if v in CHEAP}, 3, {}
    if name == 'main_ha':  # and SA at half its best rate: is SA's result the rate's?
        return {**{v: over for v, over in tuned.items() if v in HA}, **half_rate(tuned, ['sa'])}, 3, {}
    if name == 'main_seeds':  # seeds 3 and 4 where main's gaps are smallest (grid_report pools them with main's)
        return {v: {**over, 'seeds': '3,4'} for v, over in tuned.items() if v in MORE_SEEDS}, 3, {}
    if name == 'every_variant':  # for bench.py --step_times: one step of each, no training
        return tuned, 1, {}
    if name == 'every_width':  # for bench.py --step_times: the key pair at every width of the width study
        return {f'{v}_d{w}': {**tuned[v], **shape} for w, shape in {96: {}, **WIDTHS}.items() for v in LONG_KEY}, 1, {}
    if name == 'every_width_form':  # and HA on each of its two PyTorch forms (the grids' is blockwise)
        pairs, _, extra = grid('every_width')
        return {**pairs, **{f'ha_share_w_windowed_d{w}': {**pairs[f'ha_share_w_d{w}'], 'ha_form': 'windowed'}
                            for w in (48, 96, 192)}}, 1, extra
    if name in ('main_flops', 'main_time'):
        cost = main_cost(name.split('_')[1])
        variants = {}
        for v, over in tuned.items():
            iters = max(1, round(MAIN_ITERS * cost['sa'] / cost[v]))  # SA's budget, spent at v's cost
            variants[v] = {**over, 'max_iters': iters, 'lr_decay_iters': iters}
        return variants, 3, {}
    if name == 'milton_more':  # HFA's half-rate control on Milton, as SA, windowed SA and HA have (pooled into milton)
        return half_rate(tuned, ['hfa2_pm']), 3, dict(dataset='milton_char')
    if name == 'bpe_more':  # SA's half-rate control on GPT-2 tokens, one seed as HA's (pooled into bpe)
        return {v: {**o, 'seeds': 1} for v, o in half_rate(tuned, ['sa']).items()}, 3, \
            dict(dataset='shakespeare', batch_size=16, max_iters=500, lr_decay_iters=500)
    if name == 'milton':
        return {**{v: tuned[v] for v in SECOND if v in tuned}, **half_rate(tuned, ['sa', 'sa_w16', 'ha_share_w'])}, 3, dict(dataset='milton_char')
    if name == 'bpe':  # GPT-2 tokens: the 50,304-way output layer dominates, so half the batch and iterations
        control = {v: {**o, 'seeds': 1} for v, o in half_rate(tuned, ['ha_share_w']).items()}  # one seed: cost
        return {**{v: tuned[v] for v in BPE if v in tuned}, **control}, 3, dict(dataset='shakespeare', batch_size=16, max_iters=500,
                                                      lr_decay_iters=500)
    raise SystemExit(f"unknown grid {name!r}; grids: {', '.join(ORDER)}")


# The long study (RESULTS.md, "Long training"): SA, windowed SA and both windowed HA forms at
# LONG_ITERS iterations, each run with its own cosine schedule, on report_split data: every
# evaluation during training reads the selection half of the held-out plays, and each run ends
# with the loss on every window of the report half, which no choice sees. Each variant's rate is
# the better (selection half, seed 0, full length) of its lr_sweep best and half of it; the
# chosen rate then runs LONG_SEEDS, the same seeds for every variant (seed k: the same data order).
LONG = ['ha_share_w', 'sa_w16', 'ha_noshare_w', 'sa']  # the key pair first, then the other pair
LONG_KEY = ['sa_w16', 'ha_share_w']  # the pair also trained at the shorter lengths
LONG_ITERS = {'long': 6000, 'long3k': 3000, 'long1k': 1000, 'long12k': 12000}
LONG_SEEDS = 3  # seeds 0-2 (compare.py: a count), trained first
LONG_MORE_SEEDS = '3,4'  # the *_more grids: seeds 3 and 4, trained later (five seeds in all)
LONG_EXTRA = dict(report_split=True, eval_interval=100)
LONG12K_SEEDS = '0,1,2,3,4'

# The width study: the key pair at 3000 iterations (long3k's length and split) at widths 48 and
# 192 beside long3k's 96, head size fixed at 24 (2 / 4 / 8 heads), so a head computes the same
# thing at every width and only their number and the residual width grow. Each width's rate is
# the better (selection half, seed 0) of the lr_sweep best and half of it, as the long study
# chose; the chosen rate then runs seeds 0-4 (the grid runs twice, as long does).
WIDTHS = {48: dict(n_embd=48, n_head=2), 192: dict(n_embd=192, n_head=8)}


def wide_candidates():
    """{preset: overrides}: each key-pair variant at each new width, at two rates."""
    best = best_lrs(LONG_KEY)
    return {f'{v}_d{w}_lr{lr_tag(lr)}': {**with_lr(VARIANTS[v], lr), **shape}
            for w, shape in WIDTHS.items() for v in LONG_KEY for lr in (best[v], best[v] / 2)}


def wide_choice():
    """{(variant, width): preset} of the rate chosen at each width; None until all have finished."""
    return seed0_choice('wide', wide_candidates(), LONG_ITERS['long3k'],
                        lambda p: (p.split('_d')[0], int(p.split('_d')[1].split('_lr')[0])))


def seed0_final(grid_name, preset, iters):
    """The final selection-half val loss of preset's seed-0 run at full length, or None if it has
    not finished. Read from the run folder or, on a fresh clone, from the grid's committed
    results.json (runs/ is not in git)."""
    log = GRIDS / grid_name / 'runs' / preset / 'seed0' / 'log.jsonl'
    rows = [json.loads(l) for l in log.read_text().splitlines() if l.strip()] if log.exists() else []
    if rows and rows[-1]['iter'] >= iters:
        return rows[-1]['val_loss']
    path = GRIDS / grid_name / 'results.json'
    committed = {r['variant']: r for r in json.loads(path.read_text())} if path.exists() else {}
    seed0 = [r for r in committed.get(preset, {}).get('runs', []) if r['seed'] == 0 and r['tokens']]
    return seed0[0]['val_loss'] if seed0 else None


def seed0_choice(grid_name, candidates, iters, group=lambda p: p.split('_lr')[0]):
    """{group: preset} of the candidate with the lower final selection-half loss of its seed-0
    run at full length, within each group of candidates (a variant's rates); None until every
    seed-0 run has finished."""
    finals = {p: seed0_final(grid_name, p, iters) for p in candidates}
    if None in finals.values():
        return None
    return {k: min((p for p in finals if group(p) == k), key=finals.get) for k in {group(p) for p in finals}}


def wide_grid():
    """Seed 0 of both rates at every new width; once chosen, the chosen rates' seeds 0-4."""
    chosen = (wide_choice() or {}).values()
    return {p: {**o, 'seeds': LONG12K_SEEDS if p in chosen else 1} for p, o in wide_candidates().items()}


# The depth study: the key pair at width 96, 3000 iterations (long3k's length and split) at 2, 4
# and 6 layers. HA runs on the windowed form (ha/windowed.py), depth 2 included, so that every
# cell of the study shares one form and depth 2 doubles as a rerun of long3k's pair on it. Each
# depth's rate is chosen as the width study's were: the better (selection half, seed 0) of the
# lr_sweep best and half of it; the chosen rates then run seeds 0-4.
DEPTHS = (2, 4, 6)
DEPTH_FORM = {'ha_share_w': dict(ha_form='windowed'), 'sa_w16': {}}


def depth_candidates():
    """{preset: overrides}: each key-pair variant at each depth, at two rates."""
    best = best_lrs(LONG_KEY)
    return {f'{v}_L{d}_lr{lr_tag(lr)}': {**with_lr(VARIANTS[v], lr), **DEPTH_FORM[v], 'n_layer': d}
            for d in DEPTHS for v in LONG_KEY for lr in (best[v], best[v] / 2)}


def depth_choice():
    """{(variant, depth): preset} of the rate chosen at each depth; None until all have finished."""
    return seed0_choice('depth', depth_candidates(), LONG_ITERS['long3k'],
                        lambda p: (p.split('_L')[0], int(p.split('_L')[1].split('_lr')[0])))


def depth_grid():
    """Seed 0 of both rates at every depth; once chosen, the chosen rates' seeds 0-4."""
    chosen = (depth_choice() or {}).values()
    return {p: {**o, 'seeds': LONG12K_SEEDS if p in chosen else 1} for p, o in depth_candidates().items()}


def wide_edge_grid():
    """{preset: overrides}: seed 0 at half the chosen rate wherever the width grid chose the lower
    of its two rates, so that a choice at the edge of the two shows (read on the selection half
    only). Where half did better, that rate runs seeds 0-4 (the width at the better rates, read
    beside the width study's own row) and seed 0 runs at half of it again, the next edge check.
    None until the width grid has chosen."""
    chosen = wide_choice()
    if not chosen:
        return None
    cands, out = wide_candidates(), {}
    for (v, w), preset in sorted(chosen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lr = cands[preset]['learning_rate']
        if lr != min(o['learning_rate'] for p, o in cands.items() if p.startswith(f'{v}_d{w}_lr')):
            continue
        half = f'{v}_d{w}_lr{lr_tag(lr / 2)}'
        out[half] = {**with_lr(VARIANTS[v], lr / 2), **WIDTHS[w], 'seeds': 1}
        base, edge = seed0_final('wide', preset, LONG_ITERS['long3k']), seed0_final('wide_edge', half, LONG_ITERS['long3k'])
        if base is not None and edge is not None and edge < base:
            out[half]['seeds'] = LONG12K_SEEDS
            out[f'{v}_d{w}_lr{lr_tag(lr / 4)}'] = {**with_lr(VARIANTS[v], lr / 4), **WIDTHS[w], 'seeds': 1}
    return out


def wide_edge_pending():
    """True while some edge check's seed-0 run has not finished (its outcome decides the rest)."""
    return any(seed0_final('wide_edge', p, LONG_ITERS['long3k']) is None for p in wide_edge_grid() or {})


def wide_flops_grid():
    """{preset: overrides}: windowed SA at every width of the width study, trained (its own cosine
    schedule) for the iterations whose training FLOPs equal shared HA's 3,000 at that width, at
    the width's chosen rate, seeds 0-4; None until the width grid has chosen its rates."""
    chosen, long_chosen = wide_choice(), long_choice()
    paths = [GRIDS / g / 'results.json' for g in ('wide', 'long3k')]
    if not chosen or not long_chosen or not all(p.exists() for p in paths):
        return None
    # the FLOPs per token the trained runs recorded (they depend on the corpus's vocabulary)
    rows = {r['variant']: r for p in paths for r in json.loads(p.read_text())}
    preset = lambda v, w: chosen[v, w] if w in WIDTHS else long_chosen[v]
    rate = {w: (wide_candidates() if w in WIDTHS else long_candidates())[preset('sa_w16', w)] for w in (48, 96, 192)}
    out = {}
    for w in (48, 96, 192):
        ratio = rows[preset('ha_share_w', w)]['flops_per_token'] / rows[preset('sa_w16', w)]['flops_per_token']
        iters = round(LONG_ITERS['long3k'] * ratio)
        out[f'sa_w16_d{w}_its{iters}'] = {**rate[w], 'max_iters': iters, 'lr_decay_iters': iters,
                                          'seeds': LONG12K_SEEDS}
    return out


def long_candidates():
    """{preset: overrides}: each LONG variant at its lr_sweep best and at half of it."""
    best = best_lrs(LONG)
    return {f'{v}_lr{lr_tag(lr)}': with_lr(VARIANTS[v], lr) for v in LONG for lr in (best[v], best[v] / 2)}


def long_choice():
    """{variant: preset} of the rate chosen for each LONG variant: the lower final selection-half
    val loss of its two seed-0 runs at full length; None until all of them have finished."""
    chosen = seed0_choice('long', long_candidates(), LONG_ITERS['long'])
    return chosen and {v: chosen[v] for v in LONG}


# The read-out seeds (docs/interactions.md, section 4): checkpoints of 5 seeds of each variant,
# read across seeds by interactions.py. Windowed SA and shared HA are long12k's runs; SA, linear
# and HFA train here at the same length and split, each at the better (seed 0, selection half)
# of two rates: lr_sweep's best and half of it (linear, not in the sweep: config/compare_cpu.py's
# 2e-3 and half of it).
READOUT = {'sa': VARIANTS['sa'], 'linear': dict(attention='linear'), 'hfa': VARIANTS['hfa']}


def readout_candidates():
    best = {**best_lrs(['sa', 'hfa']), 'linear': 2e-3}
    return {f'{v}_lr{lr_tag(lr)}': with_lr(o, lr) for v, o in READOUT.items() for lr in (best[v], best[v] / 2)}


def readout_grid():
    chosen = (seed0_choice('readout', readout_candidates(), LONG_ITERS['long12k']) or {}).values()
    return {p: {**o, 'seeds': LONG12K_SEEDS if p in chosen else 1} for p, o in readout_candidates().items()}


ORDER = ['lr_sweep', 'main', 'main_ha', 'main_seeds', 'early', 'milton', 'milton_more', 'bpe', 'bpe_more',
         'main_flops', 'main_time', 'long', 'long3k', 'long1k', 'long_more', 'long3k_more', 'long1k_more',
         'long12k', 'wide', 'readout', 'wide_edge', 'wide_flops', 'depth']


def command(name, jobs, only=None, collect_only=False, slurm=''):
    variants, seeds, extra = grid(name, only)
    cmd = compare_command(variants, seeds, f'grids/{name}', jobs)
    if slurm:  # one CPU job per run; --wait: the next grid may read this one's results
        cmd += ['--launcher=slurm', '--slurm_gpus_per_node=0'] + (['--wait'] * (not collect_only)) + shlex.split(slurm)
    return cmd + (['--collect_only'] if collect_only else []) + [f'--{k}={v}' for k, v in extra.items()]


def compare_command(variants, seeds, out, jobs, threads=1):
    """compare.py's command line for these presets ({name: overrides}) into the folder out,
    before its --launcher and the grid's extra train.py arguments."""
    cmd = [sys.executable, 'compare.py', '--config', CONFIG, '--out', str(out), '--seeds', str(seeds),
           '--jobs', str(jobs), '--threads', str(threads), '--variants', ','.join(variants)]
    for v, over in variants.items():
        cmd += ['--preset', v] + [f'{k}={val}' for k, val in over.items()]
    return cmd


def link_runs(name, root):
    """grids/<name>/runs -> root/<name>: run folders that outlive a checkout (runs/ is not in git)."""
    link, target = GRIDS / name / 'runs', (root / name).resolve()
    target.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() and link.resolve() == target:
        return
    if link.exists() or link.is_symlink():
        sys.exit(f"{link} already exists; move its runs into {target} and remove it, or drop --runs_root")
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)


# step-time measurements (bench.py --step_times): name -> (the grid it times, where it writes)
STEP_TIMES = {'step_times': ('every_variant', 'grids/main'), 'wide_step_times': ('every_width', 'grids/wide'),
              'form_step_times': ('every_width_form', 'grids/ha_form')}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('grid', help=f"one of {', '.join(ORDER)}, step_times (seconds per step of every variant "
                                "under one load, into grids/main/step_times.json), wide_step_times (the key "
                                "pair at every width, into grids/wide/step_times.json), form_step_times (the same "
                                "with HA on each of its PyTorch forms, into grids/ha_form/step_times.json), a "
                                "comma list of them "
                                "(run in that order), or all")
    p.add_argument('--jobs', type=int, default=2, help='runs trained at the same time (one thread each)')
    p.add_argument('--dry_run', action='store_true', help='print the compare.py command only')
    p.add_argument('--collect_only', action='store_true', help='train nothing; summarise the finished runs')
    p.add_argument('--only', default='', help='comma list of variants to train first (the full grid collects all)')
    p.add_argument('--runs_root', default='', help='keep the run folders in ROOT/<grid> (linked from grids/<grid>/runs), '
                   'outside the checkout, so that a fresh checkout on the same machine resumes them')
    p.add_argument('--slurm', default='', metavar='OPTIONS',
                   help='run the grids\' compare.py steps on a SLURM cluster with these compare.py --slurm_* '
                        'options (docs/cluster.md), e.g. --slurm="--slurm_partition=cpu --slurm_time=4:00:00"')
    a = p.parse_args()
    only = [v for v in a.only.split(',') if v]
    names = ORDER if a.grid == 'all' else a.grid.split(',')
    for name in names:
        if a.runs_root and not a.dry_run:
            link_runs(name, Path(a.runs_root))
        if name in STEP_TIMES or (name == 'main_time' and not (GRIDS / 'main' / 'step_times.json').exists()):
            which, out = STEP_TIMES[name if name in STEP_TIMES else 'step_times']
            grid_args = command(which, a.jobs)[2:]  # compare.py's arguments, without the script
            grid_args[grid_args.index('--out') + 1] = out
            step_cmd = [sys.executable, 'bench.py', '--rounds', '7', '--step_times'] + grid_args
            print('+', ' '.join(step_cmd), flush=True)
            if not a.dry_run and run_step(step_cmd):
                sys.exit(f"{name} failed; rerun the same command to measure again")
            if name in STEP_TIMES:
                continue
        # the long and wide grids run twice: the rate choice (seed 0 of each rate), then the chosen rates' seeds
        unchosen = (name == 'long' and not long_choice()) or (name == 'wide' and not wide_choice()) or \
            (name == 'depth' and not depth_choice()) or \
            (name == 'readout' and not seed0_choice('readout', readout_candidates(), LONG_ITERS['long12k'])) or \
            (name == 'wide_edge' and wide_edge_pending())
        for _ in range(2 if unchosen and not a.dry_run else 1):
            cmd = command(name, a.jobs, only, a.collect_only, a.slurm)
            print('+', ' '.join(cmd), flush=True)
            if not a.dry_run:
                rc = run_step(cmd)
                if rc:
                    sys.exit(f"grid {name} failed (exit {rc}); rerun the same command to resume")


def run_step(cmd, env=None):
    """Run one step of a grid (compare.py or bench.py) and return its exit code. A SIGTERM sent to
    this driver alone, as a scheduler sends it, goes on to the step (compare.py then has every
    train.py save its checkpoint) and the driver exits once the step has, starting nothing more."""
    child, stopped = subprocess.Popen(cmd, cwd=ROOT, env=env), []

    def stop(signum, frame):  # forward only: the wait below is still under way (it holds Popen's lock)
        stopped.append(signal.Signals(signum).name)
        child.send_signal(signum)
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        rc = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped:
        sys.exit(f"stopped by {stopped[0]}: rerun the same command to resume")
    return rc


if __name__ == '__main__':
    main()
