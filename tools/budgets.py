"""
The budget of every GPU config: tokens, FLOPs per token and estimated GPU-hours, computed
from model.GPT itself (through grid.py, compare.py's plan) so that the numbers in the config
headers cannot go stale: tests/test_budgets.py checks each header against this.

    python -m tools.budgets            # the table (markdown)
    python -m tools.budgets --write    # rewrite the '# Budget:' / '# Grid budget:' header lines

A config's budget is one run on 8 GPUs (torchrun); a config with compare.py defaults
(`_compare`) also states its grid's total with --gpus 0-7. The GPU and MFU are assumptions
(--est_gpu, --est_mfu of compare.py), not measurements.
"""

import argparse
import re
import sys
import tempfile
from pathlib import Path

from nanohfa import grid

ROOT = Path(__file__).resolve().parents[1]

GPU, MFU, N_GPUS = 'H100', 0.30, 8


def gpu_configs():
    """config/*.py files that train a model from scratch on a GPU (not pinned to device='cpu').
    nanoGPT's own finetune and eval configs (init_from a GPT-2) stay as nanoGPT has them."""
    cfgs = {p: grid.resolve(str(p), [], {}) for p in sorted((ROOT / 'config').glob('*.py'))}
    return [p for p, c in cfgs.items() if c['device'] != 'cpu' and c['init_from'] == 'scratch' and not c['eval_only']]


def expected_lines(path):
    """{prefix: line} of what the header of `path` must say."""
    lines = {'# Budget:': grid.config_budget_line(path, GPU, MFU, N_GPUS)}
    if grid.config_compare_defaults(path):
        with tempfile.TemporaryDirectory() as out:
            args = grid.parse_args(['--config', str(path), '--gpus', f'0-{N_GPUS - 1}', '--out', out,
                                       '--est_gpu', GPU, '--est_mfu', str(MFU)])
            lines['# Grid budget:'] = grid.grid_budget_line(args, grid.plan(args), args.seeds)
    return lines


def write(path, lines):
    text = path.read_text()
    for prefix, line in lines.items():
        text, n = re.subn(rf'^{re.escape(prefix)}.*$', lambda m: line, text, count=1, flags=re.M)
        if not n:
            sys.exit(f"{path} has no '{prefix}' header line to rewrite; add one")
    path.write_text(text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--write', action='store_true', help='rewrite the budget lines of the config headers')
    args = p.parse_args()
    print(f"| config | budget (at {MFU:.0%} MFU of {GPU}'s dense bf16 peak) |\n|---|---|")
    for path in gpu_configs():
        lines = expected_lines(path)
        if args.write:
            write(path, lines)
        for line in lines.values():
            print(f"| {path.name} | {line[2:]} |")


if __name__ == '__main__':
    main()
