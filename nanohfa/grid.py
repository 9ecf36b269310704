"""
A comparison grid as a library: variants (named presets of train.py settings) x seeds over one
base config; the config each run will see, its model's size (matched across variants if asked),
its budget (tokens, FLOPs, GPU time), and the statistics of the results. compare.py runs a grid
and reports it; tools/budgets.py, tools/grid_report.py and the GPU checks read the same plan.
"""

import argparse
import math
import shutil
from pathlib import Path

from nanohfa import configurator
from nanohfa import settings
from nanohfa.errors import ArgumentParser, UserError, folder_name

# numpy, torch and data.py (which needs numpy) are imported where used: the GPU checks
# (tools/train_smoke.py) plan a grid on an image that may lack numpy

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
# configuration: train.py's defaults (settings.py), then the config file, the extras, the variant

def as_args(overrides):
    return [f'--{k}={v}' for k, v in overrides.items()]


def resolve(config_file, extra, overrides):
    """The full train.py config a run will see (the same parser train.py uses)."""
    argv = ([config_file] if config_file else []) + list(extra) + as_args(overrides)
    return configurator.parse(settings.defaults(settings.TRAIN), argv)[0]  # silently: train.py echoes what it applies


def vocab_size(cfg):
    from nanohfa import data
    return data.model_vocab_size(data.read_meta(data.folder_of(cfg['data_dir'], cfg['dataset'])))


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


def plan(args):
    """One entry per variant: its overrides (preset + matching) and resolved config."""
    presets = {k: dict(v) for k, v in PRESETS.items()}
    for name, *pairs in args.preset or []:
        presets[name] = {k: configurator.literal(v) for k, v in (p.split('=', 1) for p in pairs)}
    own_seeds = {n: p.pop('seeds') for n, p in presets.items() if 'seeds' in p}  # not a train.py key
    for n, own in own_seeds.items():
        if own == 0 or own is False:  # a count of 0 plans nothing; a user who writes it means seed 0
            raise UserError(f"--preset {n}: seeds=0 is a count of no seeds (a count N runs seeds 0..N-1); for "
                            f"seed 0 alone give the count seeds=1 or the list seeds=0, or seeds=[0] (a list: "
                            f"seeds=0,2 runs seeds 0 and 2)")
    names = [folder_name(v.strip(), 'variant') for v in args.variants.split(',') if v.strip()]
    for n in presets:
        folder_name(n, '--preset')
    same = {}  # runs/<variant>/: a name given twice, or two that a case-blind filesystem (macOS) merges, share one
    for n in names:
        same.setdefault(n.casefold(), []).append(n)
    clash = [v for v in same.values() if len(v) > 1]
    if clash:
        raise UserError(f"--variants names one run folder twice ({'; '.join(' and '.join(v) for v in clash)}): "
                        f"give each variant once, under names that differ by more than case")
    unknown = [n for n in names if n not in presets]
    if unknown:
        raise UserError(f"unknown variant(s) {', '.join(unknown)}; presets: {', '.join(presets)} "
                        f"(or define one: --preset NAME key=value ...)")
    ref_cfg = resolve(args.config, args.extra, presets.get(REFERENCE, {'attention': 'sa'}))
    vocab = vocab_size(ref_cfg)
    try:
        ref_params, ref_flops = model_size(ref_cfg, vocab)
    except ValueError as e:
        raise UserError(f"the reference ({REFERENCE}) model of this config cannot be built: {e}")
    ref_tokens = ref_cfg['max_iters'] * tokens_per_iter(ref_cfg)
    variants = []
    for name in names:
        overrides = dict(presets[name])
        cfg = resolve(args.config, args.extra, overrides)
        if args.match != 'none' and name != REFERENCE:
            target = ref_params if args.match == 'params' else ref_flops
            overrides.update(match_size(cfg, vocab, target, args.match, args.match_by, args.match_multiple))
        cfg = resolve(args.config, args.extra, overrides)
        settings.check(settings.TRAIN, cfg)
        if args.match_tokens and cfg['max_iters'] * tokens_per_iter(cfg) != ref_tokens:
            iters = max(1, round(ref_tokens / tokens_per_iter(cfg)))
            overrides.update(max_iters=iters, lr_decay_iters=round(cfg['lr_decay_iters'] * iters / cfg['max_iters']))
            cfg = resolve(args.config, args.extra, overrides)
        try:  # before any run starts: train.py would fail on it after the grid's other runs
            params, flops = model_size(cfg, vocab)
        except ValueError as e:
            raise UserError(f"variant {name} cannot be built ({e}); fix its preset or the config")
        dh = cfg['head_dim'] or cfg['n_embd'] // max(1, cfg['n_head'])
        variants.append({'variant': name, 'overrides': overrides, 'cfg': cfg, 'seeds': own_seeds.get(name), 'params_planned': params,
                         'flops_planned': flops, 'shape': f"L{cfg['n_layer']} H{cfg['n_head']} "
                                                          f"d{cfg['n_embd']} dh{dh}"})
    return variants



# -----------------------------------------------------------------------------
# the grid's options: compare.py's command line, and a config file's own defaults

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
    scope = {}
    exec(compile(Path(config_file).read_text(), str(config_file), 'exec'), scope)
    return dict(scope.get('_compare') or {})


def parse_args(argv, description=''):
    """compare.py's options, checked: seeds and GPUs as lists, the config file's path absolute."""
    p = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--config', default='', help='base train.py config file shared by every run')
    p.add_argument('--variants', default='sa,hfa,hybrid,ha_noshare,ha_share',
                   help=f'comma-separated preset names; presets: {", ".join(PRESETS)}')
    p.add_argument('--preset', nargs='+', action='append', metavar=('NAME', 'KEY=VALUE'),
                   help='define or redefine a variant: --preset NAME key=value ...')
    p.add_argument('--seeds', default='3', help="a count N (seeds 0..N-1) or a list: 0,1,2 or 0-4")
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
    p.add_argument('--stop_grace_s', type=int, default=120,
                   help='a SIGTERM/SIGINT to compare.py stops its runs: seconds each has to finish its step and save '
                        'before it is killed (its last good checkpoint kept)')
    p.add_argument('--collect_only', action='store_true', help='train nothing; summarise what exists')
    p.add_argument('--overwrite', action='store_true',
                   help='write the summary even if OUT/results.json holds finished runs it would drop')
    p.add_argument('--dry_run', action='store_true', help='print every run, its command and budget; run nothing')
    p.add_argument('--est_gpu', default='H100', help="GPU of the --dry_run estimates (hardware.py's table)")
    p.add_argument('--est_mfu', type=float, default=0.30, help='MFU assumed by the --dry_run estimates')
    p.add_argument('--plot', default='', help='also save the plot here (always OUT/compare.png)')
    p.add_argument('--eval_tasks', default='', help='lm-eval tasks, tags or groups run on every finished run, a '
                                                     'table of their metrics over seeds (lm_eval_tasks.py, '
                                                     'docs/evaluation.md)')
    p.add_argument('--eval_include_path', default='', help='a folder of extra lm-eval task YAMLs')
    p.add_argument('--eval_limit', type=int, default=None, help='documents per lm-eval task (default: all)')
    p.add_argument('--eval_model_args', default='',
                   help="the model's settings for --eval_tasks, KEY=VALUE,...: eval.py's batch_size, device, dtype, "
                        "kernel, meta, max_gen_toks, unknown_chars (e.g. batch_size=32,unknown_chars=drop)")
    # on a SLURM cluster (slurm.py): one job per run, submitted through submitit
    p.add_argument('--launcher', choices=('local', 'slurm'), default='local',
                   help='local: train here; slurm: submit every unfinished run as a SLURM job and return')
    p.add_argument('--wait', action='store_true', help='slurm: watch the jobs to the end, then summarise')
    p.add_argument('--status', action='store_true', help="slurm: print the grid's runs (pending/running/done/failed)")
    p.add_argument('--slurm_partition', default='', help='sbatch --partition')
    p.add_argument('--slurm_time', default='60', help='time limit per job: minutes, HH:MM:SS or D-HH:MM:SS '
                                                     '(a run longer than this is requeued and resumed)')
    p.add_argument('--slurm_nodes', type=int, default=1, help='nodes per run (--nproc processes on each)')
    p.add_argument('--slurm_gpus_per_node', type=int, default=-1, help='GPUs per node (default: --nproc)')
    p.add_argument('--slurm_cpus_per_task', type=int, default=0, help='CPUs per node (default: --threads x --nproc)')
    p.add_argument('--slurm_mem', default='', help='sbatch --mem per node, e.g. 200G')
    p.add_argument('--slurm_account', default='', help='sbatch --account')
    p.add_argument('--slurm_qos', default='', help='sbatch --qos')
    p.add_argument('--slurm_sbatch', action='append', metavar='KEY=VALUE',
                   help='any other sbatch option, repeatable: --slurm_sbatch constraint=h100 --slurm_sbatch exclusive')
    p.add_argument('--slurm_max_running', type=int, default=0, help='jobs running at a time (0: no limit)')
    p.add_argument('--slurm_max_requeue', type=int, default=20,
                   help='requeues for the time limit per run (preemptions are not counted; failures never requeue)')
    p.add_argument('--slurm_signal_s', type=int, default=120,
                   help='seconds before the time limit when train.py is told to save (SIGUSR2 to the job)')
    p.add_argument('--slurm_poll_s', type=float, default=30, help='--wait: seconds between looks at squeue')
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
        seeds = parse_list(args.seeds, '--seeds')
        args.seeds = seeds if ',' in args.seeds or '-' in args.seeds else list(range(seeds[0]))
        args.gpus = parse_list(args.gpus, '--gpus') if args.gpus else []
    except ValueError as e:
        p.error(str(e))
    if not args.seeds:
        p.error('--seeds 0 gives no runs; give a count >= 1 or a list of seeds')
    if args.nproc < 1 or args.match_multiple < 1 or args.stop_grace_s < 1:
        p.error('--nproc, --match_multiple and --stop_grace_s must be >= 1')
    if args.gpus and len(args.gpus) % args.nproc:
        p.error(f"--gpus names {len(args.gpus)} GPUs, not a multiple of --nproc {args.nproc}")
    if (args.eval_include_path or args.eval_limit or args.eval_model_args) and not args.eval_tasks:
        p.error('--eval_include_path, --eval_limit and --eval_model_args need --eval_tasks')
    slurm_set = [a.dest for a in p._actions if a.dest.startswith('slurm_') or a.dest in ('wait', 'status')
                 if getattr(args, a.dest) != a.default]
    if args.launcher != 'slurm' and slurm_set:
        p.error(f"--{' --'.join(slurm_set)} need --launcher=slurm")
    if args.slurm_nodes < 1 or args.slurm_max_running < 0 or args.slurm_max_requeue < 0 or args.slurm_signal_s < 1:
        p.error('--slurm_nodes and --slurm_signal_s must be >= 1, --slurm_max_running and --slurm_max_requeue >= 0')
    if args.launcher == 'slurm' and args.gpus:
        p.error('--gpus picks GPUs on this machine; on SLURM a run gets --nproc GPUs per node from the scheduler '
                '(--slurm_gpus_per_node): drop --gpus')
    if args.launcher == 'slurm' and not (args.dry_run or args.collect_only) and not shutil.which('sbatch'):
        p.error("--launcher=slurm: sbatch is not on PATH; run compare.py on the cluster's login node "
                "(or leave out --launcher=slurm to train here)")
    if args.config:  # train.py runs from the repository root
        args.config = str(Path(args.config).resolve())
    args.out = str(Path(args.out).resolve())
    return args


def seeds_of(v, seeds):
    """A variant's seeds: its preset's `seeds=` (a count or a list) if it has one, else the grid's."""
    own = v.get('seeds')
    if own is None:
        return seeds
    if isinstance(own, int):
        return list(range(own))
    return parse_list(','.join(map(str, own)) if isinstance(own, (list, tuple)) else str(own), 'seeds=')


def plural(n, word):
    return f"{n} {word}{'s' * (n != 1)}"


def seed_text(variants, seeds):
    if any(v.get('seeds') is not None for v in variants):
        return 'their own seeds'
    return plural(len(seeds), 'seed')


def cpu_grid(args, variants):
    """Every run on this machine's CPU (device='cpu', no --gpus, not on SLURM): no GPU time to estimate."""
    return not args.gpus and args.launcher == 'local' and all(v['cfg']['device'] == 'cpu' for v in variants)


def gpu_slots(args):
    """CUDA_VISIBLE_DEVICES of each concurrent run: --gpus cut into groups of --nproc."""
    if not args.gpus:
        return [None] * max(1, args.jobs)
    return [','.join(map(str, args.gpus[i:i + args.nproc])) for i in range(0, len(args.gpus), args.nproc)]



# -----------------------------------------------------------------------------
# budgets: what a run will cost, before it is launched

def budget(cfg, vocab, gpu='H100', mfu=0.30):
    """Tokens, FLOPs (training, plus the evaluations' forward passes) and the GPU-hours
    they take on `gpu` (its dense bf16 peak, hardware.py) at the assumed `mfu`."""
    from nanohfa import hardware
    params, fpt = model_size(cfg, vocab)
    iters, tpi = cfg['max_iters'], tokens_per_iter(cfg)
    n_evals = iters // cfg['eval_interval'] + 1 + (iters % cfg['eval_interval'] != 0)
    eval_tokens = n_evals * 2 * cfg['eval_iters'] * cfg['batch_size'] * cfg['block_size']
    flops = iters * tpi * fpt + eval_tokens * fpt / 3  # an evaluation is a forward: a third of a step
    peak = hardware.cuda_peak(gpu)
    if peak is None:
        raise UserError(f"--est_gpu {gpu!r} is not in hardware.py's table; use one of "
                        f"{', '.join(k for k, _ in hardware.PEAK_BF16_FLOPS)}")
    return {'params': params, 'iters': iters, 'tokens_per_iter': tpi, 'tokens': iters * tpi,
            'flops_per_token': fpt, 'flops': flops, 'gpu': gpu, 'mfu': mfu,
            'gpu_hours': flops / (peak * mfu) / 3600}


def tokens_text(n, digits=2):
    """Tokens in billions (as the config headers state them), or millions or units for small runs."""
    return f"{n / 1e9:.{digits}f}B" if n >= 1e8 else f"{n / 1e6:.{digits}f}M" if n >= 1e5 else f"{n:,}"


def gpu_time_text(hours, digits=1, unit='GPU-'):
    """GPU-hours, or GPU-minutes / GPU-seconds below an hour (a CPU-sized run is seconds)."""
    return f"{hours:,.{digits}f} {unit}hours" if hours >= 1 else f"{hours * 60:.1f} {unit}minutes" \
        if hours >= 1 / 60 else f"{hours * 3600:.2g} {unit}seconds"


def budget_text(b):
    return (f"{tokens_text(b['tokens'])} tokens ({b['iters']:,} iterations x {b['tokens_per_iter']:,}), "
            f"{b['flops_per_token'] / 1e9:.2f} GFLOPs/token, {b['flops']:.2e} FLOPs, "
            f"{gpu_time_text(b['gpu_hours'])} on {b['gpu']} at {b['mfu']:.0%} MFU")


def config_budget_line(config_file, gpu='H100', mfu=0.30, n_gpus=8):
    """The budget line a config file's header carries (tests/test_budgets.py checks it)."""
    cfg = resolve(str(config_file), [], {})
    b = budget(cfg, vocab_size(cfg), gpu, mfu)
    wall = b['gpu_hours'] / n_gpus
    wall_text = f"{wall:,.1f} h" if wall >= 1 else f"{wall * 60:.0f} min"
    return f"# Budget: {budget_text(b)} = {wall_text} on {n_gpus} x {gpu}"


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
    what = (f"# Grid budget: {plural(t['runs'], 'run')} ({plural(len(variants), 'variant')} x "
            f"{seed_text(variants, seeds)}), {tokens_text(t['tokens'], 1)} tokens, {t['flops']:.2e} FLOPs")
    if cpu_grid(args, variants):
        return (f"{what}; a CPU grid (device='cpu'), {plural(t['slots'], 'run')} at a time (--jobs): no GPU time "
                f"to estimate (bench.py --step_times measures its seconds per step)")
    gpus = len(args.gpus) if args.gpus else args.nproc * t['slots']
    wall = f"{t['wall_hours']:,.1f} h" if t['wall_hours'] >= 0.1 else gpu_time_text(t['wall_hours'], unit='')
    return (f"{what}, {gpu_time_text(t['gpu_hours'], 0)} on {args.est_gpu} at {args.est_mfu:.0%} MFU = {wall} on "
            f"{plural(gpus, 'GPU')}")



# -----------------------------------------------------------------------------
# statistics over seeds

def mean_std_ci(x):
    """Mean, sample std (ddof=1) and the 95% t-interval half-width (nan below 2 values)."""
    import numpy as np
    from scipy import stats
    x = np.asarray(x, dtype=float)
    if len(x) == 0:
        return float('nan'), float('nan'), float('nan')
    if len(x) < 2:
        return float(x[0]), float('nan'), float('nan')
    std = float(x.std(ddof=1))
    return float(x.mean()), std, float(stats.t.ppf(0.975, len(x) - 1) * std / math.sqrt(len(x)))


def welch_ci(a, b):
    """Half-width of the 95% interval of mean(a) - mean(b), Welch-Satterthwaite degrees of
    freedom (unequal variances); nan with fewer than 2 per side."""
    import numpy as np
    from scipy import stats
    if len(a) < 2 or len(b) < 2:
        return float('nan')
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    if va + vb == 0:
        return 0.0
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(stats.t.ppf(0.975, df) * math.sqrt(va + vb))


def welch_p(a, b):
    """Two-sided Welch t-test p-value (unequal variances); nan with fewer than 2 per side."""
    from scipy import stats
    if len(a) < 2 or len(b) < 2:
        return float('nan')
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)
