"""
docs/performance.md's CPU table from several runs of `bench.py --out`: each row's median and range.

    for i in 1 2 3; do python bench.py --out results/bench_cpu_$i.json; done
    python tools/bench_table.py results/bench_cpu_*.json

One run's numbers move by about 10% with the machine's load, so the table gives the median over
the runs and their range (lowest to highest); ratios are taken within each run first (the two
rows of a ratio ran minutes apart in one run, under the same load), then summarised.
"""

import argparse
import json
import statistics
import sys


def record(records, variant, mode, block_size):
    for r in records:
        if (r['variant'], r['mode'], r.get('block_size')) == (variant, mode, block_size) and not r.get('error'):
            return r
    sys.exit(f"no {variant} {mode} L={block_size} record (failed or not run): run the full CPU sweep")


def rows_of(records):
    """{row name: value} of one bench run."""
    rec = lambda v, m, L: record(records, v, m, L)
    tps = lambda v, m, L: rec(v, m, L)['tokens_per_s']
    mem = lambda v, m, L: rec(v, m, L)['peak_mem_bytes']
    cache = {r['mode']: r for r in records if r['mode'].startswith('sample_')}
    out = {
        'HA attention L=256: tokens/s against the naive reference': tps('ha', 'attention', 256) / tps('ha_ref', 'attention', 256),
        'HA attention L=256: % of the measured fp32 matmul FLOP/s': 100 * rec('ha', 'attention', 256)['frac_of_matmul_peak'],
        'hfa_v1 train step L=256: tokens/s / SA\'s': tps('hfa_v1', 'train_step', 256) / tps('sa', 'train_step', 256),
        'hfa_v2 train step L=256: tokens/s / SA\'s': tps('hfa_v2', 'train_step', 256) / tps('sa', 'train_step', 256),
        'HA train step L=256: tokens/s / SA\'s': tps('ha', 'train_step', 256) / tps('sa', 'train_step', 256),
        'HA train step: peak memory L=1024 / L=256': mem('ha', 'train_step', 1024) / mem('ha', 'train_step', 256),
        'HA train step L=256: peak memory / SA\'s': mem('ha', 'train_step', 256) / mem('sa', 'train_step', 256),
    }
    if {'sample_cache', 'sample_nocache'} <= set(cache):
        out['KV-cache sampling: speed-up over no cache'] = \
            cache['sample_cache']['tokens_per_s'] / cache['sample_nocache']['tokens_per_s']
    return out


def table(runs):
    per_run = [rows_of(r) for r in runs]
    lines = [f'| row | median of {len(runs)} runs | range |', '|---|---|---|']
    for name in per_run[0]:
        vals = [r[name] for r in per_run if name in r]
        unit = '%' if '%' in name else 'x'
        lines.append(f'| {name} | {statistics.median(vals):.2f}{unit} | {min(vals):.2f} to {max(vals):.2f} |')
    return '\n'.join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help='JSON files written by bench.py --out (the default CPU sweep)')
    a = p.parse_args()
    print(table([json.load(open(f)) for f in a.runs]))


if __name__ == '__main__':
    main()
