"""
A grid's runs on disk, for both launchers (compare.py's own, and slurm.py's SLURM jobs): each run's
folder and state (done, resume or scratch), the train.py command and environment it runs with,
stopping its train.py processes and saying what the stop saved, its stderr (every node's), and
the finished runs an existing results.json keeps. compare.py and slurm.py import this module;
neither imports the other's launcher at its top (compare.py imports slurm.py where it submits).
"""

import json
import math
import os
import signal
import sys
from pathlib import Path

from nanohfa.errors import UserError
from nanohfa.grid import as_args, seeds_of

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the scripts, data/ and cache/ beside this package
TRAIN = ROOT / 'train.py'
RUN_KEYS = ('out_dir', 'seed', 'init_from', 'always_save_checkpoint')  # set per run by the launcher


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


def saved_iteration(run_dir):
    """The iteration run_dir/ckpt.pt holds (None: no readable checkpoint), read without its tensors."""
    if not (Path(run_dir) / 'ckpt.pt').exists():
        return None
    from nanohfa import checkpoint  # torch: imported where a checkpoint is read (tools/train_smoke.py imports compare.py)
    return checkpoint.saved_iteration(Path(run_dir) / 'ckpt.pt')


def config_mismatch(run_dir, cfg):
    """Settings where an existing run differs from what this grid asks for (run.json)."""
    path = run_dir / 'run.json'
    if not path.exists():
        return {}
    had = json.loads(path.read_text())['config']
    return {k: (had.get(k), v) for k, v in cfg.items() if k not in RUN_KEYS and had.get(k, v) != v}


def stop_budget_s(args):
    """Seconds a stopped train.py has to finish its step and save: the SLURM warning's lead
    (--slurm_signal_s), or the local launcher's --stop_grace_s."""
    return args.slurm_signal_s if args.launcher == 'slurm' else args.stop_grace_s


def train_command(args, variant, seed, run_dir, state):
    """One run's command. Under torchrun, --shutdown_timeout is the whole stop budget: torchrun
    SIGKILLs its workers that long after it passes a signal on (30 s by default), and a large
    checkpoint takes longer than that to write."""
    launcher = [sys.executable] if args.nproc <= 1 else \
        [sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={args.nproc}',
         f'--shutdown_timeout={stop_budget_s(args)}']
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


# -----------------------------------------------------------------------------
# stopping a run: its train.py processes are told themselves, and what they saved is read back

def children(pid):
    """The pids whose parent is pid (Linux: /proc)."""
    found = []
    for d in Path('/proc').iterdir():
        if d.name.isdigit():
            try:  # the fields after the command name, which is in parentheses and may hold spaces
                if int((d / 'stat').read_text().rsplit(')', 1)[1].split()[1]) == pid:
                    found.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass  # it ended while we looked
    return found


def stop_workers(proc, cmd, sig=signal.SIGTERM):
    """Send sig to the train.py processes of a launched command: the command itself, or torchrun's
    workers (its child processes) and not torchrun, which would kill them after its own timeout.
    torchrun without workers yet (starting, or in its rendezvous) gets the signal itself."""
    workers = children(proc.pid) if 'torch.distributed.run' in cmd else []
    for pid in workers or [proc.pid]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def stop_report(run_dir, rc, max_iters, killed_s=None):
    """What a stop left in run_dir, for the line the launcher prints: train.py exits 0 only once its
    save has finished, so anything else means the save did not, and ckpt.pt is the last good one.
    killed_s: when the launcher killed what was left, that many seconds after the stop."""
    if run_state(run_dir, max_iters) == 'done':
        return 'finished'
    it = saved_iteration(run_dir)
    if rc == 0:
        return f"saved at iteration {it} ({run_dir / 'ckpt.pt'})" if it is not None else \
            'stopped before its first step: nothing to save'
    how = f"killed {killed_s:.0f} s after the stop" if killed_s is not None and rc in (-signal.SIGKILL, 128 + signal.SIGKILL) \
        else f"exited with {rc}"
    return f"NOT saved: {how}, before its save finished; " + (
        f"its last good checkpoint is iteration {it} ({run_dir / 'ckpt.pt'})" if it is not None else
        "it had no checkpoint yet")


def stderr_tail(run_dir, n=15):
    """The last lines of the last attempt's stderr, and of every other node's that printed anything
    after its header (node k of a multi-node SLURM job writes stderr.node<k>.txt): a failure on any
    node reaches the summary."""
    def last_attempt(path):
        text = path.read_text(errors='replace') if path.exists() else ''
        return text.rsplit('\n=== ', 1)[-1].strip().splitlines()  # its header line first
    out = last_attempt(run_dir / 'stderr.txt')[-n:]
    for path in sorted(run_dir.glob('stderr.node*.txt'), key=lambda p: (len(p.name), p.name)):
        body = last_attempt(path)[1:]
        if body:
            out += [f"[node {path.name[len('stderr.node'):-len('.txt')]}: {path.name}]"] + body[-n:]
    return '\n'.join(out)


# -----------------------------------------------------------------------------
# the grid's runs

def grid_runs(args, variants, seeds):
    """Every (variant, seed, run_dir, state) of the grid, in the order they are started: seed by
    seed (every variant's seed 0 first), so that paired results arrive early."""
    runs = []
    for i, v in enumerate(variants):
        for k, s in enumerate(seeds_of(v, seeds)):
            run_dir = Path(args.out) / 'runs' / v['variant'] / f'seed{s}'
            diff = config_mismatch(run_dir, v['cfg'])
            if diff:  # never reuse or resume a run made with other settings
                raise UserError(f"{run_dir} was trained with other settings ({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in diff.items())}); "
                                f"use another --out, or delete that run")
            runs.append(((k, i), (v, s, run_dir, run_state(run_dir, v['cfg']['max_iters']))))
    return [run for _, run in sorted(runs, key=lambda r: r[0])]


def recorded_runs(out, variants):
    """{(variant, seed): run} of the finished runs an existing OUT/results.json records, where
    its row was trained as this grid asks (same settings, same length). A run whose folder is
    gone (a fresh clone: runs/ is not in git) is then finished, not trained again."""
    path = Path(out) / 'results.json'
    if not path.exists():
        return {}
    try:
        rows = {r['variant']: r for r in json.loads(path.read_text())}
    except (json.JSONDecodeError, KeyError, TypeError):
        return {}
    kept = {}
    for v in variants:
        row = rows.get(v['variant'])
        if not row or recorded_mismatch(row, v):
            continue
        for run in row.get('runs', []):
            kept[v['variant'], run['seed']] = {
                **run, 'finished': True, 'iter': row['iters'], 'params': row['params'],
                'best_val_ppl': math.exp(run['best_val_loss']),
                'flops_per_token': row['flops_per_token'], 'tokens_per_iter': row['tokens_per_iter'],
                'curve': row.get('curves', {}).get(str(run['seed'])) or row.get('curves', {}).get(run['seed'])}
    return kept


def recorded_mismatch(row, v):
    """What differs between a results.json row and the variant this grid asks for ('' if nothing):
    the whole train.py config where the row records it, else its overrides and length."""
    if row.get('config') is not None:
        diff = [k for k, val in v['cfg'].items() if k not in RUN_KEYS and row['config'].get(k, val) != val]
        return ', '.join(f"{k} {row['config'][k]!r} there, {v['cfg'][k]!r} asked" for k in diff)
    if row.get('iters') is not None and row['iters'] != v['cfg']['max_iters']:
        return f"max_iters {row['iters']} there, {v['cfg']['max_iters']} asked"
    if row.get('overrides') != json.loads(json.dumps(v['overrides'])):
        return f"overrides {row.get('overrides')} there, {v['overrides']} asked"
    return ''
