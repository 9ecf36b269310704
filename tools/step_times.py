"""
Seconds per training step of every variant of a compare.py grid, measured under one fixed
load, for comparisons at equal training time.

    python tools/step_times.py --config config/compare_cpu.py --out out-grid --variants sa,hfa,ha_share
    (any compare.py argument: --preset, --match, --key=value overrides; the same plan)

Wall times logged by runs that overlapped with other work are not comparable across runs, so
this measures each variant's step (forward + backward + AdamW on the grid's batch, one
thread, the data loading left out) in one process, in rounds that visit the variants in turn:
a load that comes and goes hits every variant alike. The median over rounds is written to
OUT/step_times.json, which compare.py reads to put every run on a common time axis.
"""

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import compare  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


def make_step(cfg, vocab):
    args = {k: cfg[k] for k in GPTConfig.__dataclass_fields__ if k in cfg}
    args['vocab_size'] = vocab
    torch.manual_seed(0)
    model = GPT(GPTConfig(**args))
    opt = model.configure_optimizers(cfg['weight_decay'], cfg['learning_rate'], (cfg['beta1'], cfg['beta2']), 'cpu')
    B, T, accum = cfg['batch_size'], cfg['block_size'], cfg['gradient_accumulation_steps']
    idx = torch.randint(vocab, (B, T + 1))
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

    def step():
        for _ in range(accum):
            _, loss = model(x, y)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg['grad_clip'] or float('inf'))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    rounds = 5
    for a in list(argv):
        if a.startswith('--rounds='):
            rounds = int(a.split('=', 1)[1])
            argv.remove(a)
    args = compare.parse_args(argv)
    torch.set_num_threads(1)
    variants = compare.plan(args)
    vocab = compare.vocab_size(variants[0]['cfg'])
    steps = {v['variant']: make_step(v['cfg'], vocab) for v in variants}
    for step in steps.values():  # warm-up: allocator, first-call overheads
        step()
        step()
    times = {name: [] for name in steps}
    for r in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(3):
                step()
            times[name].append((time.perf_counter() - t0) / 3)
        print(f"round {r + 1}/{rounds}: " + ', '.join(f"{n} {t[-1] * 1000:.0f} ms" for n, t in times.items()), flush=True)
    result = {'threads': 1, 'rounds': rounds, 'load_average': os.getloadavg()[0],
              'seconds_per_step': {n: statistics.median(t) for n, t in times.items()},
              'all_seconds': times}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'step_times.json').write_text(json.dumps(result, indent=1))
    ref = result['seconds_per_step'].get(compare.REFERENCE)
    for n, t in result['seconds_per_step'].items():
        print(f"{n:>14}: {t * 1000:8.1f} ms/step" + (f"  ({t / ref:.2f}x {compare.REFERENCE})" if ref else ''))
    print(f"wrote {out / 'step_times.json'}")


if __name__ == '__main__':
    main()
