"""
Compare attention variants by validation perplexity: a grid of variants x seeds, each
trained by train.py in its own folder, then mean +- std, 95% confidence intervals, a
Welch t-test against SA, a markdown table, results.json / results.csv and a plot.

    python compare.py --config config/compare_cpu.py --out out-compare-cpu --jobs 2 --threads 1
    python compare.py --config config/owt_gpt3small_sa.py --variants sa,hfa,hfa_v2 --gpus 0-7 --out out-owt
    python compare.py --config config/ia_table.py --gpus 0-7 --out out-ia-table   # [IA]'s table, 3 seeds
    python compare.py ... --dry_run               # every run, its command and its budget; runs nothing
    python compare.py ... --seeds 3               # seeds 0, 1, 2 (or a list: --seeds 0,4,7)
    python compare.py ... --match params          # resize every variant to SA's parameter count
    python compare.py ... --preset ha_w16 attention=ha ha_window1=16   # a variant of your own
    python compare.py ... --max_iters=500         # any --key=value goes to every train.py run

Runs live in OUT/runs/<variant>/seed<k>/ (train.py's out_dir). Running the same command
again skips finished runs (log.jsonl reaches max_iters), resumes interrupted ones from
their ckpt.pt, and starts the others from scratch; a failed run is listed in the summary
with the tail of its stderr and makes the exit status 1.

Fair budgets. Every run of the grid uses the same base config, so iterations x batch x
block (the tokens seen) are equal unless a variant changes them; --match_tokens then
rescales its max_iters to SA's token count. --match params|flops resizes each variant to
the SA reference: by n_embd (a multiple of n_head, the default) or by head_dim
(--match_by head_dim), whichever size is closest, measured with model.GPT itself
(--match_multiple 8 keeps the size a multiple of 8, as fast GPU kernels like it).

GPUs. --gpus 0-7 (or 0,1,2) runs the grid's runs concurrently, each on its own GPUs
(CUDA_VISIBLE_DEVICES): one GPU per run, or --nproc of them per run (DDP through torchrun).
Small models gain more from parallel runs than from DDP.

Budgets. --dry_run lists every run (variant x seed) with its command and its budget:
tokens, training + evaluation FLOPs and GPU-hours on --est_gpu at --est_mfu (an
assumption, printed with the numbers). A config file may carry its own compare.py
defaults in a dict `_compare` (train.py ignores names that start with '_'), e.g.
`_compare = dict(variants='sa,hfa2', seeds='3', match='params')`; the command line wins.
"""

import argparse
import ast
import csv
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path


ROOT = Path(__file__).resolve().parent
TRAIN = ROOT / 'train.py'

# named variants: a name and the train.py settings that make it
PRESETS = {
    'sa': {'attention': 'sa'},
    'linear': {'attention': 'linear'},
    'hfa': {'attention': 'hfa_v1'},
    'hfa_v2': {'attention': 'hfa_v2'},
    'hfa2': {'attention': 'hfa_v1', 'hfa_order': 2},  # A = 2 score factors
    'hfa4': {'attention': 'hfa_v1', 'hfa_order': 4},  # A = 4: our reading of [IA]'s "order 4"
    'hybrid': {'attention': 'hfa_v1', 'n_hfa_head': 2},  # 2 HFA heads, the rest SA
    'ha': {'attention': 'ha'},
    'ha_noshare': {'attention': 'ha', 'ha_share_kv': False},
    'ha_share': {'attention': 'ha', 'ha_share_kv': True},
}
REFERENCE = 'sa'


# -----------------------------------------------------------------------------
# configuration: train.py's defaults, then the config file, the extras, the variant

def train_defaults():
    """train.py's default config: its top-level `name = literal` assignments before `config_keys`."""
    defaults = {}
    for node in ast.parse(TRAIN.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == 'config_keys' for t in node.targets):
            break  # the end of the configuration block
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                defaults[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass  # computed values (e.g. 5 * 8) are resolved below
    defaults['gradient_accumulation_steps'] = 5 * 8
    return defaults


def as_args(overrides):
    return [f'--{k}={v}' for k, v in overrides.items()]


def resolve(config_file, extra, overrides):
    """The full train.py config a run will see (the same parser train.py uses)."""
    sys.path.insert(0, str(ROOT))
    import configurator
    argv = ([config_file] if config_file else []) + list(extra) + as_args(overrides)
    return configurator.parse(train_defaults(), argv)[0]  # silently: train.py echoes what it applies


def vocab_size(cfg):
    import data
    path = Path(cfg['data_dir']) if cfg['data_dir'] else ROOT / 'data' / cfg['dataset']
    meta = data.read_meta(path) or {'tokenizer': 'gpt2', 'vocab_size': 50257}
    v = meta.get('vocab_size', 50304)
    return 50304 if meta.get('tokenizer') == 'gpt2' and v == 50257 else v  # as train.py


def model_size(cfg, vocab):
    """(non-embedding params, training FLOPs/token) of the model train.py would build."""
    import torch
    from model import GPT, GPTConfig
    args = {k: cfg[k] for k in GPTConfig.__dataclass_fields__ if k in cfg}
    args['vocab_size'] = vocab
    with torch.device('meta'):  # shapes only: no memory, no time
        model = GPT(GPTConfig(**args))
    return model.get_num_params(), model.flops_per_token(cfg['block_size'])


def tokens_per_iter(cfg):
    return cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size']


def match_size(cfg, vocab, target, measure, knob, multiple=1):
    """The n_embd (a multiple of n_head and of `multiple`) or head_dim (a multiple of
    `multiple`) whose size is closest to target. Sizes grow with either knob, so a bisection
    finds the two candidates around the target and the closer one wins."""
    index = 0 if measure == 'params' else 1
    if knob == 'n_embd':
        step = math.lcm(cfg['n_head'], multiple)
        top = 4 * cfg['n_embd']
    else:
        step = multiple
        top = 4 * (cfg['head_dim'] or cfg['n_embd'] // cfg['n_head'])
    values = list(range(step, max(step, top) + 1, step))
    size = lambda v: model_size({**cfg, knob: v}, vocab)[index]
    lo, hi = 0, len(values) - 1  # the first value whose size reaches the target
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if size(values[mid]) < target else (lo, mid)
    around = values[max(0, lo - 1):lo + 1]
    return {knob: min(around, key=lambda v: abs(size(v) - target))}


def literal(text):
    """A Python literal if it is one (2, 1e-3, True), else the string itself, as configurator."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def plan(args):
    """One entry per variant: its overrides (preset + matching) and resolved config."""
    presets = {k: dict(v) for k, v in PRESETS.items()}
    for name, *pairs in args.preset or []:
        presets[name] = {k: literal(v) for k, v in (p.split('=', 1) for p in pairs)}
    own_seeds = {n: p.pop('seeds') for n, p in presets.items() if 'seeds' in p}  # not a train.py key
    names = [v.strip() for v in args.variants.split(',') if v.strip()]
    unknown = [n for n in names if n not in presets]
    if unknown:
        sys.exit(f"unknown variant(s) {', '.join(unknown)}; presets: {', '.join(presets)} "
                 f"(or define one: --preset NAME key=value ...)")
    ref_cfg = resolve(args.config, args.extra, presets.get(REFERENCE, {'attention': 'sa'}))
    vocab = vocab_size(ref_cfg)
    try:
        ref_params, ref_flops = model_size(ref_cfg, vocab)
    except Exception as e:
        sys.exit(f"the reference ({REFERENCE}) model of this config cannot be built: {e}")
    ref_tokens = ref_cfg['max_iters'] * tokens_per_iter(ref_cfg)
    variants = []
    for name in names:
        overrides = dict(presets[name])
        cfg = resolve(args.config, args.extra, overrides)
        if args.match != 'none' and name != REFERENCE:
            target = ref_params if args.match == 'params' else ref_flops
            overrides.update(match_size(cfg, vocab, target, args.match, args.match_by, args.match_multiple))
        cfg = resolve(args.config, args.extra, overrides)
        if args.match_tokens and cfg['max_iters'] * tokens_per_iter(cfg) != ref_tokens:
            iters = max(1, round(ref_tokens / tokens_per_iter(cfg)))
            overrides.update(max_iters=iters, lr_decay_iters=round(cfg['lr_decay_iters'] * iters / cfg['max_iters']))
            cfg = resolve(args.config, args.extra, overrides)
        try:
            params, flops = model_size(cfg, vocab)
        except Exception as e:  # train.py will fail on it too; that failure gets reported
            print(f"warning: variant {name}: cannot build its model ({e})")
            params, flops = None, None
        dh = cfg['head_dim'] or cfg['n_embd'] // max(1, cfg['n_head'])
        variants.append({'variant': name, 'overrides': overrides, 'cfg': cfg, 'seeds': own_seeds.get(name), 'params_planned': params,
                         'flops_planned': flops, 'shape': f"L{cfg['n_layer']} H{cfg['n_head']} "
                                                          f"d{cfg['n_embd']} dh{dh}"})
    return variants


# -----------------------------------------------------------------------------
# running: one train.py per (variant, seed), resumable

def read_jsonl(path):
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut short by a crash
    return rows


def run_state(run_dir, max_iters):
    """'done' (final evaluation logged), 'resume' (a checkpoint to continue) or 'scratch'."""
    log = read_jsonl(run_dir / 'log.jsonl')
    if log and log[-1]['iter'] >= max_iters:
        return 'done'
    return 'resume' if (run_dir / 'ckpt.pt').exists() else 'scratch'


RUN_KEYS = ('out_dir', 'seed', 'init_from', 'always_save_checkpoint')  # set per run by this script


def config_mismatch(run_dir, cfg):
    """Settings where an existing run differs from what this grid asks for (run.json)."""
    path = run_dir / 'run.json'
    if not path.exists():
        return {}
    had = json.loads(path.read_text())['config']
    return {k: (had.get(k), v) for k, v in cfg.items() if k not in RUN_KEYS and had.get(k, v) != v}


def train_command(args, variant, seed, run_dir, state):
    launcher = [sys.executable] if args.nproc <= 1 else \
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={args.nproc}']
    return (launcher + [str(TRAIN)] + ([args.config] if args.config else []) + list(args.extra)
            + as_args(variant['overrides'])
            + [f'--seed={seed}', f'--out_dir={run_dir}', '--always_save_checkpoint=True',
               f"--init_from={'resume' if state == 'resume' else 'scratch'}"])


def run_env(args, gpus):
    env = dict(os.environ)
    if args.threads:
        env['OMP_NUM_THREADS'] = str(args.threads)
    if gpus is not None:
        env['CUDA_VISIBLE_DEVICES'] = gpus
    return env


def run_one(args, variant, seed, run_dir, state, gpus=None):
    """Run train.py to the end on the given GPUs (a CUDA_VISIBLE_DEVICES value, or None for
    whatever is visible); stdout/stderr appended to files in run_dir. Returns rc."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = train_command(args, variant, seed, run_dir, state)
    with open(run_dir / 'stdout.txt', 'a') as out, open(run_dir / 'stderr.txt', 'a') as err:
        where = f" (CUDA_VISIBLE_DEVICES={gpus})" if gpus is not None else ''
        header = f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {state}{where}: {' '.join(cmd)}\n"
        out.write(header), err.write(header)
        out.flush(), err.flush()
        return subprocess.run(cmd, cwd=ROOT, env=run_env(args, gpus), stdout=out, stderr=err).returncode


def stderr_tail(run_dir, n=15):
    text = (run_dir / 'stderr.txt').read_text() if (run_dir / 'stderr.txt').exists() else ''
    last = text.rsplit('\n=== ', 1)[-1]  # this attempt only
    return '\n'.join(last.strip().splitlines()[-n:])


def seeds_of(v, seeds):
    """A variant's seeds: its preset's `seeds=` (a count or a list) if it has one, else the grid's."""
    own = v.get('seeds')
    if own is None:
        return seeds
    if isinstance(own, int):
        return list(range(own))
    return parse_list(','.join(map(str, own)) if isinstance(own, (list, tuple)) else str(own), 'seeds=')


def seed_text(variants, seeds):
    if any(v.get('seeds') is not None for v in variants):
        return 'their own seeds'
    return f'{len(seeds)} seeds'


def grid_runs(args, variants, seeds):
    """Every (variant, seed, run_dir, state) of the grid, in the order they are started."""
    runs = []
    for v in variants:
        for s in seeds_of(v, seeds):
            run_dir = Path(args.out) / 'runs' / v['variant'] / f'seed{s}'
            diff = config_mismatch(run_dir, v['cfg'])
            if diff:  # never reuse or resume a run made with other settings
                sys.exit(f"{run_dir} was trained with other settings ({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in diff.items())}); "
                         f"use another --out, or delete that run")
            runs.append((v, s, run_dir, run_state(run_dir, v['cfg']['max_iters'])))
    return runs


def gpu_slots(args):
    """CUDA_VISIBLE_DEVICES of each concurrent run: --gpus cut into groups of --nproc."""
    if not args.gpus:
        return [None] * max(1, args.jobs)
    return [','.join(map(str, args.gpus[i:i + args.nproc])) for i in range(0, len(args.gpus), args.nproc)]


def run_grid(args, variants, seeds):
    import queue
    from tqdm import tqdm
    todo, outcomes = [], {}
    for v, s, run_dir, state in grid_runs(args, variants, seeds):
        if state == 'done':
            outcomes[v['variant'], s] = 'skipped (finished before)'
        else:
            todo.append((v, s, run_dir, state))
    slots = gpu_slots(args)
    n_runs = len(todo) + len(outcomes)
    print(f"{n_runs} runs: {len(todo)} to train "
          f"({sum(t[3] == 'resume' for t in todo)} resumed), {len(outcomes)} already finished"
          + (f"; {len(slots)} at a time on GPUs {' | '.join(slots)}" if args.gpus else ''))
    free = queue.Queue()
    for slot in slots:
        free.put(slot)

    def on_free_slot(*run):  # each run takes a free slot of GPUs and gives it back when it ends
        slot = free.get()
        try:
            return run_one(args, *run, gpus=slot)
        finally:
            free.put(slot)

    bar = tqdm(total=n_runs, initial=len(outcomes), desc='runs', unit='run')
    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        futures = {pool.submit(on_free_slot, *t): t for t in todo}
        for f in as_completed(futures):
            v, s, run_dir, state = futures[f]
            rc = f.result()
            ok = rc == 0 and run_state(run_dir, v['cfg']['max_iters']) == 'done'
            outcomes[v['variant'], s] = f'{state}: ' + ('ok' if ok else f'FAILED (exit {rc})')
            bar.set_postfix_str(f"{v['variant']}/seed{s} {'ok' if ok else 'FAILED'}")
            bar.update(1)
    bar.close()
    return outcomes


# -----------------------------------------------------------------------------
# budgets: what a run will cost, before it is launched

def budget(cfg, vocab, gpu='H100', mfu=0.30):
    """Tokens, FLOPs (training, plus the evaluations' forward passes) and the GPU-hours
    they take on `gpu` (its dense bf16 peak, hardware.py) at the assumed `mfu`."""
    import hardware
    params, fpt = model_size(cfg, vocab)
    iters, tpi = cfg['max_iters'], tokens_per_iter(cfg)
    n_evals = iters // cfg['eval_interval'] + 1 + (iters % cfg['eval_interval'] != 0)
    eval_tokens = n_evals * 2 * cfg['eval_iters'] * cfg['batch_size'] * cfg['block_size']
    flops = iters * tpi * fpt + eval_tokens * fpt / 3  # an evaluation is a forward: a third of a step
    peak = hardware.cuda_peak(gpu)
    if peak is None:
        sys.exit(f"--est_gpu {gpu!r} is not in hardware.py's table; use one of "
                 f"{', '.join(k for k, _ in hardware.PEAK_BF16_FLOPS)}")
    return {'params': params, 'iters': iters, 'tokens_per_iter': tpi, 'tokens': iters * tpi,
            'flops_per_token': fpt, 'flops': flops, 'gpu': gpu, 'mfu': mfu,
            'gpu_hours': flops / (peak * mfu) / 3600}


def budget_text(b):
    return (f"{b['tokens'] / 1e9:.2f}B tokens ({b['iters']:,} iterations x {b['tokens_per_iter']:,}), "
            f"{b['flops_per_token'] / 1e9:.2f} GFLOPs/token, {b['flops']:.2e} FLOPs, "
            f"{b['gpu_hours']:,.1f} GPU-hours on {b['gpu']} at {b['mfu']:.0%} MFU")


def config_budget_line(config_file, gpu='H100', mfu=0.30, n_gpus=8):
    """The budget line a config file's header carries (tests/test_budgets.py checks it)."""
    cfg = resolve(str(config_file), [], {})
    b = budget(cfg, vocab_size(cfg), gpu, mfu)
    return f"# Budget: {budget_text(b)} = {b['gpu_hours'] / n_gpus:,.1f} h on {n_gpus} x {gpu}"


def makespan(hours, n_slots):
    """Wall hours of runs started in this order on n_slots slots, each run on the first free one."""
    ends = [0.0] * max(1, n_slots)
    for h in hours:
        i = ends.index(min(ends))
        ends[i] += h
    return max(ends)


def grid_budget(args, variants, seeds):
    """One budget per run (variant-major order, as run_grid starts them) and the totals."""
    per_variant = {v['variant']: budget(v['cfg'], vocab_size(v['cfg']), args.est_gpu, args.est_mfu) for v in variants}
    runs = [per_variant[v['variant']] for v in variants for _ in seeds_of(v, seeds)]
    n_slots = len(gpu_slots(args)) if args.gpus else max(1, args.jobs)
    total = {'runs': len(runs), 'tokens': sum(b['tokens'] for b in runs), 'flops': sum(b['flops'] for b in runs),
             'gpu_hours': sum(b['gpu_hours'] for b in runs), 'slots': n_slots,
             'wall_hours': makespan([b['gpu_hours'] / args.nproc for b in runs], n_slots)}
    return per_variant, total


def grid_budget_line(args, variants, seeds):
    per_variant, t = grid_budget(args, variants, seeds)
    gpus = len(args.gpus) if args.gpus else args.nproc * t['slots']
    return (f"# Grid budget: {t['runs']} runs ({len(variants)} variants x {seed_text(variants, seeds)}), "
            f"{t['tokens'] / 1e9:.1f}B tokens, {t['flops']:.2e} FLOPs, {t['gpu_hours']:,.0f} GPU-hours on "
            f"{args.est_gpu} at {args.est_mfu:.0%} MFU = {t['wall_hours']:,.1f} h on {gpus} GPUs")


def dry_run(args, variants, seeds):
    """Print every run with its command and budget, and the grid's totals; run nothing."""
    per_variant, total = grid_budget(args, variants, seeds)
    slots = gpu_slots(args)
    runs = grid_runs(args, variants, seeds)
    print(f"\n{len(runs)} runs ({len(variants)} variants x {seed_text(variants, seeds)}); budgets at an assumed "
          f"{args.est_mfu:.0%} MFU of {args.est_gpu}'s dense bf16 peak (--est_mfu, --est_gpu)")
    for i, (v, s, run_dir, state) in enumerate(runs):
        b = per_variant[v['variant']]
        gpus = f"CUDA_VISIBLE_DEVICES={slots[i]} " if args.gpus and i < len(slots) else \
            'CUDA_VISIBLE_DEVICES=<next free> ' if args.gpus else ''
        print(f"\n{v['variant']} seed {s} [{state}]: {b['tokens'] / 1e9:.3g}B tokens, {b['flops']:.2e} FLOPs, "
              f"{b['gpu_hours']:,.1f} GPU-hours\n  {gpus}{' '.join(train_command(args, v, s, run_dir, state))}")
    print(f"\ntotal: {total['tokens'] / 1e9:.3g}B tokens, {total['flops']:.2e} FLOPs, "
          f"{total['gpu_hours']:,.1f} GPU-hours; {total['wall_hours']:,.1f} h of wall time with "
          f"{total['slots']} run{'s' * (total['slots'] > 1)} at a time"
          + (f" on {args.nproc} GPU{'s' * (args.nproc > 1)} each" if args.gpus else ''))
    print(grid_budget_line(args, variants, seeds))


# -----------------------------------------------------------------------------
# collecting and statistics

def collect_run(run_dir, max_iters):
    """One run's numbers, or None if it never logged an evaluation."""
    log = read_jsonl(run_dir / 'log.jsonl')
    if not log:
        return None
    info = json.loads((run_dir / 'run.json').read_text()) if (run_dir / 'run.json').exists() else {}
    final, best = log[-1], min(log, key=lambda r: r['val_loss'])
    steps = read_jsonl(run_dir / 'train_log.jsonl')
    train_s = sum(r['dt_s'] for r in steps)
    return {
        'finished': final['iter'] >= max_iters, 'iter': final['iter'],
        'val_loss': final['val_loss'], 'val_ppl': math.exp(final['val_loss']),
        'best_val_loss': best['val_loss'], 'best_val_ppl': math.exp(best['val_loss']),
        'train_loss': final['train_loss'], 'tokens': final['tokens'], 'wall_s': final['elapsed_s'],
        # report_split runs: the loss on every window of the report half, read once at the end
        'report_loss': final.get('report_loss'), 'report_ppl': final.get('report_ppl'),
        # from the per-step times in train_log.jsonl (pure training time, across resumes)
        'tokens_per_s': final['tokens'] / train_s if train_s else final.get('tokens_per_s'),
        'params': info.get('params', final.get('params')),
        'flops_per_token': info.get('flops_per_token', final.get('flops_per_token')),
        # one point per evaluation: (tokens, val loss, iteration, train loss)
        'curve': [(r['tokens'], r['val_loss'], r['iter'], r['train_loss']) for r in log],
        'tokens_per_iter': final['tokens'] // final['iter'] if final['iter'] else None,
    }


def mean_std_ci(x):
    """Mean, sample std (ddof=1) and the 95% t-interval half-width (nan below 2 values)."""
    import numpy as np  # not at the top: tools/train_smoke.py imports this module (numpy may be missing)
    from scipy import stats
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return float('nan'), float('nan'), float('nan')
    if len(x) < 2:
        return float(x[0]), float('nan'), float('nan')
    std = float(x.std(ddof=1))
    return float(x.mean()), std, float(stats.t.ppf(0.975, len(x) - 1) * std / math.sqrt(len(x)))


def welch_p(a, b):
    """Two-sided Welch t-test p-value (unequal variances); nan with fewer than 2 per side."""
    from scipy import stats
    if len(a) < 2 or len(b) < 2:
        return float('nan')
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def summarize(args, variants, seeds, outcomes):
    import numpy as np  # not at the top: tools/train_smoke.py imports this module (numpy may be missing)
    runs_by_variant = {}
    for v in variants:
        runs_by_variant[v['variant']] = []
        for s in seeds_of(v, seeds):
            run_dir = Path(args.out) / 'runs' / v['variant'] / f'seed{s}'
            r = collect_run(run_dir, v['cfg']['max_iters'])
            status = outcomes.get((v['variant'], s), 'not run')
            failed = r is None or not r['finished']
            runs_by_variant[v['variant']].append({'seed': s, 'status': status, 'failed': failed,
                                                  'run_dir': str(run_dir), **(r or {}),
                                                  'stderr_tail': stderr_tail(run_dir) if failed else ''})
    ref = [r['val_loss'] for r in runs_by_variant.get(REFERENCE, []) if not r['failed']]
    rows = []
    for v in variants:
        done = [r for r in runs_by_variant[v['variant']] if not r['failed']]
        loss = [r['val_loss'] for r in done]
        row = {'variant': v['variant'], 'n_seeds': len(done), 'seeds': [r['seed'] for r in done],
               'shape': v['shape'], 'overrides': v['overrides'], 'match': args.match,
               'params': done[0]['params'] if done else v['params_planned'],
               'flops_per_token': done[0]['flops_per_token'] if done else v['flops_planned'],
               'tokens': done[0]['tokens'] if done else None,
               'iters': done[0]['iter'] if done else None,
               'tokens_per_iter': done[0]['tokens_per_iter'] if done else None}
        for key in ('val_loss', 'val_ppl', 'best_val_loss', 'best_val_ppl', 'tokens_per_s', 'wall_s'):
            row[f'{key}_mean'], row[f'{key}_std'], row[f'{key}_ci95'] = mean_std_ci([r[key] for r in done])
        if done and all(r.get('report_loss') is not None for r in done):
            row['report_loss_mean'], row['report_loss_std'], row['report_loss_ci95'] = \
                mean_std_ci([r['report_loss'] for r in done])
        row['delta_val_loss_vs_sa'] = row['val_loss_mean'] - float(np.mean(ref)) if ref and loss else float('nan')
        row['p_vs_sa'] = welch_p(loss, ref) if v['variant'] != REFERENCE else float('nan')
        row['failed'] = [{'seed': r['seed'], 'status': r['status'], 'iter': r.get('iter'),
                          'stderr_tail': r['stderr_tail']} for r in runs_by_variant[v['variant']] if r['failed']]
        row['runs'] = [{k: r.get(k) for k in ('seed', 'val_loss', 'val_ppl', 'best_val_loss', 'tokens', 'wall_s',
                                                 'tokens_per_s', 'status') + ('report_loss',) * ('report_loss_mean' in row)}
                       for r in done]
        row['curves'] = {r['seed']: r['curve'] for r in done}
        rows.append(row)
    return rows


# -----------------------------------------------------------------------------
# reporting

def fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return '-'
    return f'{x:,}' if isinstance(x, int) else f'{x:.{digits}f}'


def pfmt(p):
    return '-' if math.isnan(p) else f'{p:.3f}' if p >= 0.001 else f'{p:.1e}'


def markdown_table(args, rows, seeds):
    matched = {'none': 'nothing (every variant at the base config size)',
               'params': f'non-embedding parameters (by {args.match_by})',
               'flops': f'training FLOPs per token (by {args.match_by})'}[args.match]
    tokens = sorted({r['tokens'] for r in rows if r['tokens'] is not None})
    lines = [f"Matched: {matched}; tokens seen per run: "
             f"{', '.join(f'{t:,}' for t in tokens)}{' (matched)' if args.match_tokens else ''}; "
             f"seeds {seeds}; final val loss at the last iteration, mean ± std over seeds, "
             f"95% CI from the t distribution, p from Welch's t-test of val loss vs {REFERENCE}.", '',
             '| variant | shape | seeds | params | MFLOPs/tok | val loss | 95% CI | val ppl | best val loss '
             '| Δ loss vs SA | p vs SA | tokens/s | wall s |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['shape']} | {r['n_seeds']} | {fmt(r['params'], 0)} "
            f"| {fmt(r['flops_per_token'] and r['flops_per_token'] / 1e6, 2)} "
            f"| {fmt(r['val_loss_mean'], 4)} ± {fmt(r['val_loss_std'], 4)} "
            f"| [{fmt(r['val_loss_mean'] - r['val_loss_ci95'], 4)}, {fmt(r['val_loss_mean'] + r['val_loss_ci95'], 4)}] "
            f"| {fmt(r['val_ppl_mean'], 3)} ± {fmt(r['val_ppl_std'], 3)} "
            f"| {fmt(r['best_val_loss_mean'], 4)} | {'+' if r['delta_val_loss_vs_sa'] > 0 else ''}"
            f"{fmt(r['delta_val_loss_vs_sa'], 4)} | {pfmt(r['p_vs_sa'])} "
            f"| {fmt(r['tokens_per_s_mean'], 0)} | {fmt(r['wall_s_mean'], 0)} |")
    failed = [(r['variant'], f) for r in rows for f in r['failed']]
    if failed:
        lines += ['', f'FAILED or unfinished runs ({len(failed)}), left out of the statistics:']
        for name, f in failed:
            lines.append(f"- {name} seed {f['seed']} ({f['status']}, last logged iter {f['iter']}):")
            lines += ['      ' + l for l in (f['stderr_tail'] or '(no stderr)').splitlines()]
    return '\n'.join(lines)


def write_outputs(out, rows, table):
    out.mkdir(parents=True, exist_ok=True)
    (out / 'results.json').write_text(json.dumps(rows, indent=1))
    (out / 'results.md').write_text(table + '\n')
    flat = [k for k in rows[0] if k not in ('overrides', 'failed', 'runs', 'curves', 'seeds')] if rows else []
    with open(out / 'results.csv', 'w', newline='') as f:
        w = csv.DictWriter(f, fieldnames=flat + ['n_failed'], extrasaction='ignore')
        w.writeheader()
        for r in rows:
            w.writerow({**r, 'n_failed': len(r['failed'])})


def plot(rows, path, title=''):
    """Validation loss against tokens: the mean over seeds and a min-max band."""
    import numpy as np  # not at the top: tools/train_smoke.py imports this module (numpy may be missing)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        curves = list(r['curves'].values())
        if not curves:
            continue
        n = min(len(c) for c in curves)  # seeds share the evaluation schedule
        tokens = np.array([p[0] for p in curves[0][:n]], dtype=float)
        loss = np.array([[p[1] for p in c[:n]] for c in curves])
        keep = tokens > 0  # the untrained model's loss would squash the interesting part
        line, = ax.plot(tokens[keep], loss.mean(0)[keep],
                        label=f"{r['variant']} ({r['params'] / 1e6:.2f}M, n={len(curves)})")
        ax.fill_between(tokens[keep], loss.min(0)[keep], loss.max(0)[keep], color=line.get_color(), alpha=0.2)
    ax.set_xlabel('tokens seen')
    ax.set_ylabel('validation loss (nats/token)')
    ax.set_title(title or 'validation loss: mean over seeds, band = min..max')
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -----------------------------------------------------------------------------

def parse_list(text, what):
    """'3' -> [3]; '0,1,2' -> [0, 1, 2]; '0-3,6' -> [0, 1, 2, 3, 6]."""
    out = []
    for part in filter(None, (t.strip() for t in text.split(','))):
        a, dash, b = part.partition('-')
        if not (a.isdigit() and (not dash or b.isdigit())) or (dash and int(b) < int(a)):
            raise ValueError(f"{what} {text!r}: {part!r} is not a number or a range a-b")
        out += list(range(int(a), int(b) + 1)) if dash else [int(a)]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"{what} {text!r} is empty or repeats a value")
    return out


def config_compare_defaults(config_file):
    """The `_compare` dict of a config file: its own compare.py defaults (or {})."""
    if not config_file or not Path(config_file).is_file():
        return {}
    sys.path.insert(0, str(ROOT))  # config files import their baseline recipe (config.sa, ...)
    scope = {}
    exec(compile(Path(config_file).read_text(), str(config_file), 'exec'), scope)
    return dict(scope.get('_compare') or {})


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--config', default='', help='base train.py config file shared by every run')
    p.add_argument('--variants', default='sa,hfa,hybrid,ha_noshare,ha_share',
                   help=f'comma-separated preset names; presets: {", ".join(PRESETS)}')
    p.add_argument('--preset', nargs='+', action='append', metavar=('NAME', 'KEY=VALUE'),
                   help='define or redefine a variant: --preset NAME key=value ...')
    p.add_argument('--seeds', default='3', help="a count N (seeds 0..N-1) or a list: 0,1,2 or 0-4")
    p.add_argument('--seed_list', default='', help=argparse.SUPPRESS)  # the old spelling of --seeds 0,1,2
    p.add_argument('--out', required=True, help='output folder: runs/, results.json, results.csv, plot')
    p.add_argument('--match', choices=('none', 'params', 'flops'), default='none')
    p.add_argument('--match_by', choices=('n_embd', 'head_dim'), default='n_embd')
    p.add_argument('--match_multiple', type=int, default=1, help='matched n_embd / head_dim a multiple of this')
    p.add_argument('--match_tokens', action='store_true',
                   help="rescale a variant's max_iters so it sees as many tokens as SA")
    p.add_argument('--gpus', default='', help='run concurrently on these GPUs, --nproc per run: 0-7 or 0,1,2')
    p.add_argument('--nproc', type=int, default=1, help='processes (GPUs) per run, DDP through torchrun')
    p.add_argument('--jobs', type=int, default=1, help='runs trained at the same time (without --gpus)')
    p.add_argument('--threads', type=int, default=0, help='OMP_NUM_THREADS per run (0: leave as is)')
    p.add_argument('--collect_only', action='store_true', help='train nothing; summarise what exists')
    p.add_argument('--dry_run', action='store_true', help='print every run, its command and budget; run nothing')
    p.add_argument('--est_gpu', default='H100', help="GPU of the --dry_run estimates (hardware.py's table)")
    p.add_argument('--est_mfu', type=float, default=0.30, help='MFU assumed by the --dry_run estimates')
    p.add_argument('--plot', default='', help='also save the plot here (always OUT/compare.png)')
    config = p.parse_known_args(argv)[0].config
    try:
        defaults = config_compare_defaults(config)
    except Exception as e:
        p.error(f"config file {config} failed: {type(e).__name__}: {e}")
    known = {a.dest for a in p._actions}
    if set(defaults) - known:
        p.error(f"_compare in {config} has unknown key(s) {', '.join(sorted(set(defaults) - known))}")
    p.set_defaults(**{k: str(v) if k in ('seeds', 'gpus') else v for k, v in defaults.items()})
    args, extra = p.parse_known_args(argv)
    bad = [e for e in extra if not (e.startswith('--') and '=' in e)]
    if bad:
        p.error(f"unrecognised argument(s) {' '.join(bad)}; train.py settings are given as --key=value")
    args.extra = extra
    try:
        seeds = parse_list(args.seed_list or args.seeds, '--seeds')
        args.seeds = seeds if args.seed_list or ',' in args.seeds or '-' in args.seeds else list(range(seeds[0]))
        args.gpus = parse_list(args.gpus, '--gpus') if args.gpus else []
    except ValueError as e:
        p.error(str(e))
    if not args.seeds:
        p.error('--seeds 0 gives no runs; give a count >= 1 or a list of seeds')
    if args.nproc < 1 or args.match_multiple < 1:
        p.error('--nproc and --match_multiple must be >= 1')
    if args.gpus and len(args.gpus) % args.nproc:
        p.error(f"--gpus names {len(args.gpus)} GPUs, not a multiple of --nproc {args.nproc}")
    if args.config:  # train.py runs from the repository root
        args.config = str(Path(args.config).resolve())
    args.out = str(Path(args.out).resolve())
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    seeds = args.seeds
    variants = plan(args)
    for v in variants:
        print(f"{v['variant']:>12}: {v['shape']}, {fmt(v['params_planned'])} params, "
              f"{fmt(v['flops_planned'] and v['flops_planned'] / 1e6, 2)} MFLOPs/token, overrides {v['overrides']}")
    if args.dry_run:
        dry_run(args, variants, seeds)
        return 0
    t0 = time.time()
    outcomes = {} if args.collect_only else run_grid(args, variants, seeds)
    rows = summarize(args, variants, seeds, outcomes)
    table = markdown_table(args, rows, seeds)
    out = Path(args.out)
    write_outputs(out, rows, table)
    title = f"validation loss, mean over {len(seeds)} seeds (band: min..max); matched: {args.match}"
    for path in [out / 'compare.png'] + ([args.plot] if args.plot else []):
        plot(rows, path, title)
    print(table)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'compare.png'}; "
          f"grid wall time {time.time() - t0:.0f} s")
    return 1 if any(r['failed'] for r in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
