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

A whole family of claims is retrained the same way, every run of it, into a grid of its own:

    nice -n 19 python tools/rerun.py --family scale --cpu_capability avx2 --jobs 2 --runs_root ~/nanohfa-runs
    python tools/rerun.py --family scale --cpu_capability avx2 --collect_only   # the runs finished so far

--family scale retrains the runs behind the scale study's 3,000-iteration claims (the key pair at
widths 48, 96 and 192 at the chosen rates, and width 192 at the edge check's better rates): in
each grid of the family, the presets with two or more committed seeds (the claims' runs; the
seed-0 rate checks are choices, not rerun: rates stay as chosen on the first path), with the
grid's own compare.py command into grids/rerun_<path>/<grid>/ (e.g. grids/rerun_avx2_threads1/wide),
which tools/grid_report.py reads as it reads grids/. Interrupted, the same command resumes;
--collect_only summarises the runs finished so far (a family stopped part-way is reported on the
seeds that finished, and the report says how many).
grids/rerun_<path>/path.json records the path (CPU, kernel path, threads, torch) and the core-hours.
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

# family: the grids whose multi-seed runs make its claims, in the order they are retrained
FAMILIES = {'scale': ('wide', 'long3k', 'long3k_more', 'wide_edge')}


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


def path_name(threads, capability):
    """The folder name of a kernel path: 'avx2_threads1', 'default_threads2'."""
    return f"{capability or 'default'}_threads{threads}"


def claim_presets(grid_name):
    """{preset: [seeds]} of the committed runs behind a grid's claims: every preset with two or
    more seeds (a single seed-0 run is a rate check, a choice made once on the first path)."""
    path = cpu_grids.GRIDS / grid_name / 'results.json'
    if not path.exists():
        sys.exit(f"{path} not found: {grid_name!r} has no committed results to rerun")
    return {r['variant']: sorted(x['seed'] for x in r['runs']) for r in json.loads(path.read_text()) if r['n_seeds'] >= 2}


def finished_seeds(out, preset, seeds, max_iters):
    """The seeds of a preset whose runs under out/runs/ have finished (logged their last iteration)."""
    from nanohfa import grid_runs
    return [s for s in seeds if grid_runs.run_state(Path(out) / 'runs' / preset / f'seed{s}', max_iters) == 'done']


def family_command(grid_name, out, jobs, threads, collect_only=False):
    """compare.py's command for the claim runs of one grid, as tools/cpu_grids.py trains them;
    collect_only: the command that summarises the runs finished so far (None if none has), so a
    family stopped part-way is reported on the seeds it finished, never with the rest as failures."""
    variants, _, extra = cpu_grids.grid(grid_name)
    claims = claim_presets(grid_name)
    missing = set(claims) - set(variants)
    if missing:
        sys.exit(f"{grid_name}: committed presets {sorted(missing)} are not in tools/cpu_grids.py's grid any more")
    if collect_only:
        claims = {p: finished_seeds(ROOT / out, p, seeds, int(extra['max_iters'])) for p, seeds in claims.items()}
        claims = {p: seeds for p, seeds in claims.items() if seeds}
        if not claims:
            return None
    seeds = lambda ss: ','.join(map(str, ss)) if len(ss) > 1 else f'[{ss[0]}]'  # one number alone is a count
    keep = {p: {**o, 'seeds': seeds(claims[p])} for p, o in variants.items() if p in claims}
    return (cpu_grids.compare_command(keep, 1, out, jobs, threads) + (['--collect_only'] if collect_only else [])
            + [f'--{k}={v}' for k, v in extra.items()])


def cpu_model():
    try:
        return next(l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name'))
    except (OSError, StopIteration):
        import platform
        return platform.processor() or 'unknown'


def write_path_record(root, family, threads, capability):
    """root/path.json: the machine and path the family was retrained on, and the core-hours its runs
    held so far (threads x wall time: on a shared machine more than the CPU time they used)."""
    import torch
    grids = {}
    for g in FAMILIES[family]:
        path = root / g / 'results.json'
        rows = json.loads(path.read_text()) if path.exists() else []
        grids[g] = {'runs': sum(len(r['runs']) for r in rows),
                    'seeds': {r['variant']: sorted(x['seed'] for x in r['runs']) for r in rows},
                    'core_hours': round(threads * sum(x['wall_s'] or 0 for r in rows for x in r['runs']) / 3600, 3)}
    record = {'family': family, 'cpu_capability': capability or 'default', 'threads': threads, 'cpu': cpu_model(),
              'torch': torch.__version__, 'grids': grids,
              'core_hours': round(sum(g['core_hours'] for g in grids.values()), 2)}
    (root / 'path.json').write_text(json.dumps(record, indent=1) + '\n')
    return record


def rerun_family(a):
    """Every claim run of a family on one path, grid by grid, resumable."""
    name = path_name(a.threads, a.cpu_capability)
    root = cpu_grids.GRIDS / f'rerun_{name}'
    env = dict(os.environ)
    env.pop('ATEN_CPU_CAPABILITY', None)
    if a.cpu_capability:
        env['ATEN_CPU_CAPABILITY'] = a.cpu_capability
    for g in FAMILIES[a.family]:
        if a.runs_root:  # collecting in another checkout links the same run folders
            cpu_grids.link_runs(f'rerun_{name}/{g}', Path(a.runs_root))
        cmd = family_command(g, root.relative_to(ROOT) / g, a.jobs, a.threads, a.collect_only)
        if cmd is None:
            print(f"{g}: no run finished on this path yet")
            continue
        print('+', ' '.join(cmd), flush=True)
        rc = cpu_grids.run_step(cmd, env=env)
        if rc:
            sys.exit(f"{a.family} on {name}: grid {g} failed (exit {rc}); rerun the same command to resume")
    record = write_path_record(root, a.family, a.threads, a.cpu_capability)
    print(f"{a.family} on {name}: {sum(g['runs'] for g in record['grids'].values())} runs, "
          f"{record['core_hours']} core-hours of training (threads x wall time); {root / 'path.json'}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('grid', nargs='?', help='a grid of tools/cpu_grids.py with committed results (wide, long3k, ...)')
    p.add_argument('preset', nargs='?', help="the run's variant, as in the grid's results.json (e.g. sa_w16_d48_lr8e-3)")
    p.add_argument('seed', nargs='?', type=int)
    p.add_argument('--family', choices=sorted(FAMILIES), help='retrain every claim run of this family instead of one run')
    p.add_argument('--jobs', type=int, default=2, help='--family: runs trained at the same time')
    p.add_argument('--collect_only', action='store_true', help='--family: train nothing; summarise the finished runs')
    p.add_argument('--threads', type=int, default=1, help='OMP threads of the rerun (the grids used 1)')
    p.add_argument('--cpu_capability', default='', help='ATEN_CPU_CAPABILITY for the rerun (default, avx2, '
                   'avx512): the CPU kernel path; empty = what torch picks for this CPU')
    p.add_argument('--runs_root', default='', help='where the run folders live (one run: default reruns/; --family: '
                   'default grids/rerun_<path>/<grid>/runs, or linked from there into this folder)')
    p.add_argument('--json', default='', help='append the comparison as one JSON line to this file')
    a = p.parse_args()
    if a.family:
        if a.grid is not None:
            p.error('give either --family or a grid, preset and seed, not both')
        return rerun_family(a)
    if a.grid is None or a.preset is None or a.seed is None:
        p.error('give a grid, a preset and a seed (one run), or --family (every run of a family)')
    rerun_one(a)


def rerun_one(a):
    committed = committed_run(a.grid, a.preset, a.seed)
    # a folder of its own per run: compare.py's summary of a folder never drops another run's row
    out = Path(a.runs_root or ROOT / 'reruns') / setting_name(a.threads, a.cpu_capability) / a.grid / f'{a.preset}_seed{a.seed}'
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
              'cpu_capability': a.cpu_capability or 'default', 'cpu': cpu_model(), 'wall_s': round(time.time() - t0, 1)}
    print(f"{a.grid} {a.preset} seed {a.seed}, {setting_name(a.threads, a.cpu_capability)}:")
    for key in ('val_loss', 'report_loss'):
        if committed.get(key) is None:
            continue
        was, now = committed[key], rerun[key]
        record[key] = {'committed': was, 'rerun': now, 'diff': now - was}
        print(f"  {key:12s} committed {was:.6f}  rerun {now:.6f}  difference {now - was:+.2e}"
              + ('  (bit-identical)' if now == was else ''))
    if a.json:
        with open(a.json, 'a') as f:
            f.write(json.dumps(record) + '\n')


if __name__ == '__main__':
    main()
