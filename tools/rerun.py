"""
Rerun one committed run of a CPU grid and print its committed final loss beside the rerun's.

    python tools/rerun.py wide sa_w16_d48_lr8e-3 0                  # as committed (1 thread)
    python tools/rerun.py wide sa_w16_d48_lr8e-3 0 --threads 2      # another thread count
    python tools/rerun.py long3k ha_share_w_lr8e-3 1 --cpu_capability avx2   # another ATen kernel path

The run is trained by compare.py exactly as tools/cpu_grids.py trains it (same config, preset,
seed and train.py arguments) into --runs_root (resumable: an interrupted rerun continues from
its checkpoint), then its final losses are compared with the grid's committed results.json:
the selection-half val loss and, for report_split grids, the report-half loss. On the machine
and settings that made the committed numbers a rerun is bit-identical; another thread count or
CPU kernel path (ATEN_CPU_CAPABILITY) rounds differently from the first step, and training
carries the difference to the end. --json FILE appends one line per rerun (RESULTS.md's
reproduction table is made from such a file).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / 'tools'))

import cpu_grids  # noqa: E402


def committed_run(grid_name, preset, seed):
    """The committed results.json record of one run (val_loss, report_loss, ...)."""
    path = cpu_grids.GRIDS / grid_name / 'results.json'
    if not path.exists():
        sys.exit(f"{path} not found: {grid_name!r} has no committed results")
    rows = {r['variant']: r for r in json.loads(path.read_text())}
    if preset not in rows:
        sys.exit(f"{grid_name} has no run of {preset!r}; its presets: {', '.join(rows)}")
    runs = {r['seed']: r for r in rows[preset]['runs']}
    if seed not in runs:
        sys.exit(f"{grid_name} {preset} has no committed seed {seed}; seeds: {', '.join(map(str, sorted(runs)))}")
    return runs[seed]


def rerun_command(grid_name, preset, seed, out, threads):
    """The compare.py command that trains this one run as its grid did (tools/cpu_grids.py)."""
    variants, _, extra = cpu_grids.grid(grid_name)
    over = {k: v for k, v in variants[preset].items() if k != 'seeds'}
    return ([sys.executable, 'compare.py', '--config', cpu_grids.CONFIG, '--out', str(out), '--seeds', f'{seed}-{seed}',
             '--jobs', '1', '--threads', str(threads), '--variants', preset, '--preset', preset]
            + [f'{k}={v}' for k, v in over.items()] + [f'--{k}={v}' for k, v in extra.items()])


def setting_name(threads, capability):
    return f"threads{threads}" + (f"_{capability}" if capability else '')


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('grid', help='a grid of tools/cpu_grids.py with committed results (wide, long3k, ...)')
    p.add_argument('preset', help="the run's variant, as in the grid's results.json (e.g. sa_w16_d48_lr8e-3)")
    p.add_argument('seed', type=int)
    p.add_argument('--threads', type=int, default=1, help='OMP threads of the rerun (the grids used 1)')
    p.add_argument('--cpu_capability', default='', help='ATEN_CPU_CAPABILITY for the rerun (default, avx2, '
                   'avx512): the CPU kernel path; empty = what torch picks for this CPU')
    p.add_argument('--runs_root', default=str(ROOT / 'reruns'), help='where the rerun folders live')
    p.add_argument('--json', default='', help='append the comparison as one JSON line to this file')
    a = p.parse_args()
    committed = committed_run(a.grid, a.preset, a.seed)
    # a folder of its own per run: compare.py's summary of a folder never drops another run's row
    out = Path(a.runs_root) / setting_name(a.threads, a.cpu_capability) / a.grid / f'{a.preset}_seed{a.seed}'
    env = dict(os.environ)
    env.pop('ATEN_CPU_CAPABILITY', None)
    if a.cpu_capability:
        env['ATEN_CPU_CAPABILITY'] = a.cpu_capability
    t0 = time.time()
    rc = subprocess.call(rerun_command(a.grid, a.preset, a.seed, out, a.threads), cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL)
    rows = json.loads((out / 'results.json').read_text()) if (out / 'results.json').exists() else []
    runs = [r for row in rows for r in row['runs'] if row['variant'] == a.preset and r['seed'] == a.seed]
    if rc or not runs:
        sys.exit(f"the rerun did not finish (exit {rc}); see {out / 'runs' / a.preset / f'seed{a.seed}' / 'stderr.txt'}")
    rerun = runs[0]
    record = {'grid': a.grid, 'preset': a.preset, 'seed': a.seed, 'threads': a.threads,
              'cpu_capability': a.cpu_capability or 'default', 'wall_s': round(time.time() - t0, 1)}
    print(f"{a.grid} {a.preset} seed {a.seed}, {setting_name(a.threads, a.cpu_capability)}:")
    for key in ('val_loss', 'report_loss'):
        if committed.get(key) is None:
            continue
        was, now = committed[key], rerun[key]
        record[key] = {'committed': was, 'rerun': now, 'diff': now - was}
        print(f"  {key:12s} committed {was:.6f}  rerun {now:.6f}  difference {now - was:+.6f}"
              + ('  (bit-identical)' if now == was else ''))
    if a.json:
        with open(a.json, 'a') as f:
            f.write(json.dumps(record) + '\n')


if __name__ == '__main__':
    main()
