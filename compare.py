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
    python compare.py ... --launcher=slurm --slurm_partition=gpu   # one SLURM job per run (slurm.py, docs/cluster.md)

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

import csv
import io
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from nanohfa.data import write_atomic
from nanohfa.errors import UserError
from nanohfa.grid import (REFERENCE, as_args, cpu_grid, gpu_slots, grid_budget, grid_budget_line, gpu_time_text, mean_std_ci,
                  parse_args, plan, plural, resolve, seed_text, seeds_of, tokens_text, welch_ci, welch_p)  # noqa: F401 (resolve: for the GPU checks)
# a grid's runs on disk, shared with slurm.py (imported here by these names, as the tools and tests read them)
from nanohfa.grid_runs import (ROOT, RUN_KEYS, TRAIN, config_mismatch, grid_runs, read_jsonl, recorded_mismatch,  # noqa: F401
                       recorded_runs, run_env, run_state, stderr_tail, stop_report, stop_workers, train_command)
from nanohfa.run_folder import append_in_place


# -----------------------------------------------------------------------------
# running: one train.py per (variant, seed), resumably


class Children:
    """The train.py processes this grid is running. A SIGTERM or SIGINT to compare.py (a scheduler
    often signals only the parent) is passed on to them as SIGTERM (to torchrun's workers, not to
    torchrun), so each finishes its step, saves its checkpoint and exits; no new run starts, and
    compare.py exits once they have (a rerun resumes them). One that has not finished within
    grace_s (--stop_grace_s), or when a second Ctrl-C comes, is killed; its last good checkpoint
    stays (checkpoint.py). Each run has a session of its own, so a terminal's Ctrl-C reaches
    compare.py alone, which stops the runs as it does on SIGTERM (and torchrun exits 0 once its
    workers have saved)."""

    def __init__(self, grace_s=120):
        import threading
        self.procs, self.lock, self.grace_s = {}, threading.Lock(), grace_s
        self.stopping = None  # the signal's name once one has arrived
        self.stopped = []  # (variant, seed, run_dir, exit status) of each run the signal stopped
        self.timer = self.stopped_at = self.killed_s = None

    def start(self, cmd, **kw):
        with self.lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(cmd, start_new_session=True, **kw)
            self.procs[proc] = cmd
        return proc

    def wait(self, proc):
        try:
            return proc.wait()
        finally:
            with self.lock:
                self.procs.pop(proc, None)

    def on_signal(self, signum, frame):
        import signal
        import threading
        first = self.stopping is None
        if not first and signum == signal.SIGINT:  # a second Ctrl-C: at once, without saving
            return self.kill_rest()
        self.stopping = signal.Signals(signum).name
        self.stopped_at = self.stopped_at or time.time()
        with self.lock:
            live = list(self.procs.items())
        for proc, cmd in live:
            stop_workers(proc, cmd)
        if first:  # a child that has not saved within the grace period is killed
            self.timer = threading.Timer(self.grace_s, self.kill_rest)
            self.timer.daemon = True
            self.timer.start()

    def kill_rest(self):
        import signal
        self.killed_s = time.time() - (self.stopped_at or time.time())
        with self.lock:
            live = list(self.procs.items())
        for proc, cmd in live:
            stop_workers(proc, cmd, signal.SIGKILL)
            proc.kill()


CHILDREN = Children()


def run_one(args, variant, seed, run_dir, state, gpus=None):
    """Run train.py to the end on the given GPUs (a CUDA_VISIBLE_DEVICES value, or None for
    whatever is visible); stdout/stderr appended to files in run_dir. Returns rc, or None if
    the grid was stopped by a signal before this run started."""
    if CHILDREN.stopping:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = train_command(args, variant, seed, run_dir, state)
    with append_in_place(run_dir / 'stdout.txt') as out, append_in_place(run_dir / 'stderr.txt') as err:
        where = f" (CUDA_VISIBLE_DEVICES={gpus})" if gpus is not None else ''
        header = f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {state}{where}: {' '.join(cmd)}\n"
        out.write(header), err.write(header)
        out.flush(), err.flush()
        proc = CHILDREN.start(cmd, cwd=ROOT, env=run_env(args, gpus), stdout=out, stderr=err)
        return None if proc is None else CHILDREN.wait(proc)


def run_grid(args, variants, seeds):
    import queue
    from tqdm import tqdm
    todo, outcomes = [], {}
    kept = recorded_runs(args.out, variants)
    for v, s, run_dir, state in grid_runs(args, variants, seeds):
        if state == 'done':
            outcomes[v['variant'], s] = 'skipped (finished before)'
        elif state == 'scratch' and (v['variant'], s) in kept and not (run_dir / 'log.jsonl').exists():
            outcomes[v['variant'], s] = 'kept (results.json)'
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
            if rc is None or CHILDREN.stopping:  # stopped by a signal: saved (or not: stop_report says), to be resumed
                if rc is not None:
                    CHILDREN.stopped.append((v, s, run_dir, rc))
                continue
            ok = rc == 0 and run_state(run_dir, v['cfg']['max_iters']) == 'done'
            outcomes[v['variant'], s] = f'{state}: ' + ('ok' if ok else f'FAILED (exit {rc})')
            bar.set_postfix_str(f"{v['variant']}/seed{s} {'ok' if ok else 'FAILED'}")
            bar.update(1)
    bar.close()
    return outcomes


# -----------------------------------------------------------------------------
# what the grid will cost, before it is launched (grid.budget)

def dry_run(args, variants, seeds):
    """Print every run with its command and budget, and the grid's totals; run nothing."""
    per_variant, total = grid_budget(args, variants, seeds)
    slots = gpu_slots(args)
    runs = grid_runs(args, variants, seeds)
    cpu = cpu_grid(args, variants)  # on CPU cores: tokens and FLOPs, no GPU time
    print(f"\n{plural(len(runs), 'run')} ({plural(len(variants), 'variant')} x {seed_text(variants, seeds)}); "
          + ("a CPU grid (device='cpu'): tokens and FLOPs, no GPU time" if cpu else
             f"budgets at an assumed {args.est_mfu:.0%} MFU of {args.est_gpu}'s dense bf16 peak (--est_mfu, --est_gpu)"))
    for i, (v, s, run_dir, state) in enumerate(runs):
        b = per_variant[v['variant']]
        gpus = f"CUDA_VISIBLE_DEVICES={slots[i]} " if args.gpus and i < len(slots) else \
            'CUDA_VISIBLE_DEVICES=<next free> ' if args.gpus else ''
        print(f"\n{v['variant']} seed {s} [{state}]: {tokens_text(b['tokens'])} tokens, {b['flops']:.2e} FLOPs"
              f"{'' if cpu else ', ' + gpu_time_text(b['gpu_hours'])}\n"
              f"  {gpus}{' '.join(train_command(args, v, s, run_dir, state))}")
    print(f"\ntotal: {tokens_text(total['tokens'])} tokens, {total['flops']:.2e} FLOPs"
          + (f"; {plural(total['slots'], 'run')} at a time on CPU cores (--jobs)" if cpu else
             f", {gpu_time_text(total['gpu_hours'])}; {gpu_time_text(total['wall_hours'], unit='')} of wall time "
             f"with {plural(total['slots'], 'run')} at a time"
             + (f" on {plural(args.nproc, 'GPU')} each" if args.gpus else '')))
    print(grid_budget_line(args, variants, seeds))


# -----------------------------------------------------------------------------
# collecting, and statistics over seeds (grid.mean_std_ci, grid.welch_p)

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
        # the form that computed each attention family, and the preflight's verdict where there was one
        'kernels': {f: {x: k[x] for x in ('form', 'path') if x in k} for f, k in (info.get('kernels') or {}).items()},
    }


def summarize(args, variants, seeds, outcomes):
    import numpy as np  # not at the top: tools/train_smoke.py imports this module (numpy may be missing)
    runs_by_variant = {}
    kept = recorded_runs(args.out, variants)
    for v in variants:
        runs_by_variant[v['variant']] = []
        for s in seeds_of(v, seeds):
            run_dir = Path(args.out) / 'runs' / v['variant'] / f'seed{s}'
            r = collect_run(run_dir, v['cfg']['max_iters'])
            status = outcomes.get((v['variant'], s), 'collected' if r and r['finished'] else 'not run')
            if (r is None or not r['finished']) and (v['variant'], s) in kept:
                r, status = kept[v['variant'], s], 'kept (results.json)'  # trained before; its folder is gone
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
               'config': {k: val for k, val in v['cfg'].items() if k not in RUN_KEYS},
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
        row['delta_ci95'] = welch_ci(loss, ref) if v['variant'] != REFERENCE else float('nan')
        row['p_vs_sa'] = welch_p(loss, ref) if v['variant'] != REFERENCE else float('nan')
        row['failed'] = [{'seed': r['seed'], 'status': r['status'], 'iter': r.get('iter'),
                          'stderr_tail': r['stderr_tail']} for r in runs_by_variant[v['variant']] if r['failed']]
        row['runs'] = [{k: r.get(k) for k in ('seed', 'val_loss', 'val_ppl', 'best_val_loss', 'tokens', 'wall_s',
                                                 'tokens_per_s', 'status', 'kernels')
                        + ('report_loss',) * ('report_loss_mean' in row)}
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


def ci_text(delta, half):
    if half is None or math.isnan(half) or math.isnan(delta):
        return '-'
    return f"[{delta - half:+.4f}, {delta + half:+.4f}]"


def pfmt(p):
    return '-' if math.isnan(p) else f'{p:.3f}' if p >= 0.001 else f'{p:.1e}'


def markdown_table(args, rows, variants, seeds):
    asked = {v['variant']: seeds_of(v, seeds) for v in variants}  # a preset's own seeds= over the grid's
    seed_line = (f"seeds {next(iter(asked.values()))}" if len({tuple(a) for a in asked.values()}) == 1
                 else 'seeds ' + ', '.join(f'{v} {a}' for v, a in asked.items()))
    matched = {'none': 'nothing (every variant at the base config size)',
               'params': f'non-embedding parameters (by {args.match_by})',
               'flops': f'training FLOPs per token (by {args.match_by})'}[args.match]
    tokens = sorted({r['tokens'] for r in rows if r['tokens'] is not None})
    lines = [f"Matched: {matched}; tokens seen per run: "
             f"{', '.join(f'{t:,}' for t in tokens)}{' (matched)' if args.match_tokens else ''}; "
             f"{seed_line}; final val loss at the last iteration, mean ± std over seeds, "
             f"95% CI from the t distribution; Δ vs {REFERENCE} with its 95% CI and p from Welch's t-test "
             f"(unequal variances).", '',
             '| variant | shape | seeds | params | MFLOPs/tok | val loss | 95% CI | val ppl | best val loss '
             '| Δ loss vs SA | Δ 95% CI | p vs SA | tokens/s | wall s |',
             '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['shape']} | {r['n_seeds']} | {fmt(r['params'], 0)} "
            f"| {fmt(r['flops_per_token'] and r['flops_per_token'] / 1e6, 2)} "
            f"| {fmt(r['val_loss_mean'], 4)} ± {fmt(r['val_loss_std'], 4)} "
            f"| [{fmt(r['val_loss_mean'] - r['val_loss_ci95'], 4)}, {fmt(r['val_loss_mean'] + r['val_loss_ci95'], 4)}] "
            f"| {fmt(r['val_ppl_mean'], 3)} ± {fmt(r['val_ppl_std'], 3)} "
            f"| {fmt(r['best_val_loss_mean'], 4)} | {'+' if r['delta_val_loss_vs_sa'] > 0 else ''}"
            f"{fmt(r['delta_val_loss_vs_sa'], 4)} | {ci_text(r['delta_val_loss_vs_sa'], r.get('delta_ci95'))} "
            f"| {pfmt(r['p_vs_sa'])} "
            f"| {fmt(r['tokens_per_s_mean'], 0)} | {fmt(r['wall_s_mean'], 0)} |")
    few = [r['variant'] for r in rows if 0 < r['n_seeds'] < 3]
    if few:
        lines += ['', f"Fewer than 3 seeds ({', '.join(few)}): one seed gives no interval, two give a t "
                      "interval of one degree of freedom (±12.7 standard errors) and a p-value that rests on two numbers; such a row can "
                      "show that runs finished and roughly where they ended, not that two variants differ. "
                      "Run more seeds before reading a difference."]
    fell_back = [f"{r['variant']} seed {run['seed']} ({', '.join(f for f, k in run['kernels'].items() if k.get('path') == 'pytorch')})"
                 for r in rows for run in r['runs'] if any(k.get('path') == 'pytorch' for k in (run.get('kernels') or {}).values())]
    if fell_back:
        lines += ['', f"Runs whose Triton kernel failed its preflight and ran on PyTorch ({len(fell_back)}): "
                      f"{'; '.join(fell_back)}. Their speeds and budgets are not the kernels'; their losses stand."]
    failed = [(r['variant'], f) for r in rows for f in r['failed']]
    if failed:
        lines += ['', f'FAILED or unfinished runs ({len(failed)}), left out of the statistics:']
        for name, f in failed:
            lines.append(f"- {name} seed {f['seed']} ({f['status']}, last logged iter {f['iter']}):")
            lines += ['      ' + l for l in (f['stderr_tail'] or '(no stderr)').splitlines()]
    return '\n'.join(lines)


def dropped_runs(out, rows, variants):
    """The finished runs an existing OUT/results.json holds that `rows` would drop, as
    ['variant seed k (why)', ...]: a summary is never replaced by one with less in it."""
    path = Path(out) / 'results.json'
    try:
        old = json.loads(path.read_text()) if path.exists() else []
    except json.JSONDecodeError:
        return []
    new = {(r['variant'], run['seed']) for r in rows for run in r['runs']}
    asked = {v['variant']: v for v in variants}
    lost = []
    for row in old:
        why = 'not in this grid' if row['variant'] not in asked else recorded_mismatch(row, asked[row['variant']])
        lost += [f"{row['variant']} seed {run['seed']}" + (f" ({why})" if why else '')
                 for run in row.get('runs', []) if (row['variant'], run['seed']) not in new]
    return lost


def write_outputs(out, rows, table):
    out.mkdir(parents=True, exist_ok=True)
    # renamed into place: a link planted in the grid folder is replaced, never written through
    write_atomic(out / 'results.json', json.dumps(rows, indent=1).encode(), durable=False)
    write_atomic(out / 'results.md', (table + '\n').encode(), durable=False)
    flat = [k for k in rows[0] if k not in ('overrides', 'failed', 'runs', 'curves', 'seeds', 'config', 'eval_failed')] \
        if rows else []
    f = io.StringIO(newline='')
    w = csv.DictWriter(f, fieldnames=flat + ['n_failed'], extrasaction='ignore')
    w.writeheader()
    for r in rows:
        w.writerow({**r, 'n_failed': len(r['failed'])})
    write_atomic(out / 'results.csv', f.getvalue().encode(), durable=False)


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

def run_grid_until_signalled(args, variants, seeds):
    """run_grid, with SIGTERM / SIGINT passed on to the runs (Children) while it lasts."""
    import signal
    import threading
    global CHILDREN
    CHILDREN = Children(args.stop_grace_s)
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        return run_grid(args, variants, seeds)
    before = {sig: signal.signal(sig, CHILDREN.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return run_grid(args, variants, seeds)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if CHILDREN.timer:
            CHILDREN.timer.cancel()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    seeds = args.seeds
    variants = plan(args)
    for v in variants:
        print(f"{v['variant']:>12}: {v['shape']}, {fmt(v['params_planned'])} params, "
              f"{fmt(v['flops_planned'] and v['flops_planned'] / 1e6, 2)} MFLOPs/token, overrides {v['overrides']}")
    slurm = None
    if args.launcher == 'slurm':
        from nanohfa import slurm  # slurm.py: one SLURM job per run (submitit)
    if args.dry_run:
        (slurm.dry_run if slurm else dry_run)(args, variants, seeds)
        return 0
    if slurm and args.status:
        slurm.print_status(args, variants, seeds)
        return 0
    if args.eval_tasks:  # task names and model arguments checked before any run trains
        from nanohfa import lm_eval_tasks
        lm_eval_tasks.check_request(args)
    t0 = time.time()
    if slurm and not args.collect_only:
        outcomes = slurm.launch(args, variants, seeds, sys.argv[1:] if argv is None else argv)
        if outcomes is None:  # submitted; --status watches, --collect_only (or --wait) summarises
            return 0
    else:
        outcomes = {} if args.collect_only else run_grid_until_signalled(args, variants, seeds)
    if not args.collect_only and not slurm and CHILDREN.stopping:
        print(f"stopped by {CHILDREN.stopping}; rerun the same command to continue (nothing summarised):")
        for v, s, run_dir, rc in CHILDREN.stopped:
            print(f"  {v['variant']} seed {s}: {stop_report(run_dir, rc, v['cfg']['max_iters'], CHILDREN.killed_s)}")
        return 0
    rows = summarize(args, variants, seeds, outcomes)
    table = markdown_table(args, rows, variants, seeds)
    out = Path(args.out)
    lost = dropped_runs(out, rows, variants)
    if lost and not args.overwrite:
        raise UserError(f"{out / 'results.json'} holds {len(lost)} finished run(s) this summary would drop "
                        f"({'; '.join(lost[:3])}{'; ...' if len(lost) > 3 else ''}); nothing written: rerun with "
                        f"the grid's own arguments, or add --overwrite to replace it")
    write_outputs(out, rows, table)  # the grid's summary first: an evaluation that fails cannot take it with it
    title = f"validation loss, mean over {len(seeds)} seeds (band: min..max); matched: {args.match}"
    for path in [out / 'compare.png'] + ([args.plot] if args.plot else []):
        plot(rows, path, title)
    if args.eval_tasks:  # lm-eval's tasks on every finished run: a second table, its numbers added to rows
        from nanohfa import lm_eval_tasks
        table += '\n\n' + lm_eval_tasks.grid_table(args, rows)
        write_outputs(out, rows, table)
    print(table)
    print(f"\nwrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'compare.png'}; "
          f"grid wall time {time.time() - t0:.0f} s")
    return 1 if any(r['failed'] or r.get('eval_failed') for r in rows) else 0


if __name__ == '__main__':
    sys.exit(main())
