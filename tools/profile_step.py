"""
Where a training step spends its time: the top ops of one train step (forward, backward,
AdamW) of each variant, at bench.py's CPU model (n_layer=2, n_head=2, n_embd=64, vocab 256,
batch 1, fp32, one thread), and each variant's speed against the first one's.

    python tools/profile_step.py                                   # sa, hfa_v1, hfa_v2 at L = 256
    python tools/profile_step.py --timer cpu --rounds 21           # on a shared machine (docs/performance.md)
    python tools/profile_step.py --variants sa,ha --block_size 1024 --rounds 5 --top 10

The speed ratios come from one process that visits the variants in turn, round after round,
and take the median over the rounds: on a shared machine a load that comes and goes hits
every variant alike, where separate runs would each see a different load. Times are the
thread's CPU time by default (--clock cpu: with one thread the step runs on it, backward
included, and a step that waits for a core taken by other work does not count the wait;
--clock wall for wall-clock time, as bench.py measures).

The per-op table is taken the same way (--profile_rounds rounds of --profile_steps steps of
each variant), per step, each op's median over the rounds: torch.profiler's self time
(--timer profiler, an op's own time without the ops it calls; the wall clock, so on a busy
machine it counts waits for a core), or each aten op timed by the thread's CPU time
(--timer cpu), whose column adds up to the measured step.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench  # noqa: E402
from model import GPT  # noqa: E402


def make_step(variant, args):
    """bench.py's train_step row: the model, AdamW, one random batch; returns step()."""
    torch.manual_seed(0)
    model_args = argparse.Namespace(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab=args.vocab,
                                    window1=128, window2=32)
    cfg = bench.bench_config(variant, args.block_size, model_args)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return bench.train_step(model, opt, *bench.random_batch(cfg.vocab_size, args.batch_size, args.block_size))


CLOCKS = {'cpu': time.thread_time, 'wall': time.perf_counter}


def seconds_per_step(step, n, clock=time.thread_time):
    t0 = clock()
    for _ in range(n):
        step()
    return (clock() - t0) / n


def interleaved_times(steps, rounds, n, clock=time.thread_time):
    """{variant: [seconds per step, one per round]}, the variants visited in turn each round."""
    times = {v: [] for v in steps}
    for _ in range(rounds):
        for v, step in steps.items():
            times[v].append(seconds_per_step(step, n, clock))
    return times


def speed_ratios(times, base):
    """{variant: median over rounds of base's step time / its step time} (> 1: faster than base)."""
    return {v: statistics.median(b / t for b, t in zip(times[base], ts)) for v, ts in times.items()}


def self_times(steps, rounds, n):
    """{variant: {op: self CPU ms per step}}: torch.profiler over n steps of each variant, the
    variants in turn, for `rounds` rounds; each op's median over the rounds (the profiler
    times ops by the wall clock: a round in which other work took the core is outvoted)."""
    found = {v: [] for v in steps}
    for _ in range(rounds):
        for v, step in steps.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(n):
                    step()
            found[v].append({e.key: e.self_cpu_time_total / 1e3 / n for e in prof.key_averages()})
    return {v: {op: statistics.median(r.get(op, 0.0) for r in runs) for op in set().union(*runs)}
            for v, runs in found.items()}


class OpCPUTime(TorchDispatchMode):
    """Every aten op a step runs (forward, backward and optimizer: what reaches the kernels),
    timed by this thread's CPU time: {op: seconds}. An op that runs others inside it counts
    their time as its own; a composite op is seen as the ops it decomposes into."""

    def __init__(self):
        super().__init__()
        self.seconds = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.thread_time()
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.seconds[name] = self.seconds.get(name, 0.0) + time.thread_time() - t0
        return out


def op_cpu_times(steps, rounds, n):
    """As self_times, timed by OpCPUTime instead of the profiler: {variant: {op: CPU ms per step}}."""
    found = {v: [] for v in steps}
    for _ in range(rounds):
        for v, step in steps.items():
            with OpCPUTime() as timer:
                for _ in range(n):
                    step()
            found[v].append({f"aten::{op}": s * 1e3 / n for op, s in timer.seconds.items()})
    return {v: {op: statistics.median(r.get(op, 0.0) for r in runs) for op in set().union(*runs)}
            for v, runs in found.items()}


def table(found, top):
    """Markdown: the ops that take the most self time in any variant, each variant's ms per
    step and share of its step's self time; the last row the totals."""
    totals = {v: sum(ops.values()) for v, ops in found.items()}
    share = {v: {op: ms / totals[v] for op, ms in ops.items()} for v, ops in found.items()}
    ops = sorted({op for s in share.values() for op in s}, key=lambda op: -max(s.get(op, 0) for s in share.values()))
    lines = ['| op (self CPU time) | ' + ' | '.join(found) + ' |', '|---|' + '---|' * len(found)]
    for op in ops[:top]:
        lines.append(f"| `{op}` | " + ' | '.join(f"{found[v].get(op, 0):.2f} ms ({100 * share[v].get(op, 0):.1f}%)"
                                                  for v in found) + ' |')
    lines.append('| all ops | ' + ' | '.join(f"{totals[v]:.2f} ms" for v in found) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--variants', default='sa,hfa_v1,hfa_v2', help='comma list; ratios are against the first')
    p.add_argument('--block_size', type=int, default=256)
    p.add_argument('--batch_size', type=int, default=1)
    p.add_argument('--n_layer', type=int, default=2)
    p.add_argument('--n_head', type=int, default=2)
    p.add_argument('--n_embd', type=int, default=64)
    p.add_argument('--vocab', type=int, default=256)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--clock', choices=tuple(CLOCKS), default='cpu', help="the step times' clock (see above)")
    p.add_argument('--rounds', type=int, default=9, help='rounds over the variants for the speed ratios')
    p.add_argument('--steps', type=int, default=10, help='steps per variant per round')
    p.add_argument('--profile_rounds', type=int, default=9, help='rounds over the variants for the profile')
    p.add_argument('--profile_steps', type=int, default=2, help='profiled steps per variant per round')
    p.add_argument('--top', type=int, default=12)
    p.add_argument('--timer', choices=('profiler', 'cpu'), default='profiler',
                   help="the per-op table: torch.profiler's self time, or each aten op's CPU time (see above)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    variants = args.variants.split(',')
    steps = {v: make_step(v, args) for v in variants}
    for step in steps.values():  # warm-up: allocator, AdamW's state
        step()
        step()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), L={args.block_size}, "
          f"batch {args.batch_size}, {args.n_layer} x {args.n_embd} ({args.n_head} heads)\n")
    ops = (self_times if args.timer == 'profiler' else op_cpu_times)(steps, args.profile_rounds, args.profile_steps)
    print(table(ops, args.top) + '\n')
    times = interleaved_times(steps, args.rounds, args.steps, CLOCKS[args.clock])
    ratios = speed_ratios(times, variants[0])
    for v in variants:
        ms = [1e3 * t for t in times[v]]
        print(f"{v}: {statistics.median(ms):.2f} ms/step ({args.clock} time, median of {args.rounds} rounds, range "
              f"{min(ms):.2f}-{max(ms):.2f}), speed {ratios[v]:.2f}x {variants[0]}'s")
    return ratios


if __name__ == '__main__':
    main()
