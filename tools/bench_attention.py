"""Parameters, FLOPs per token and CPU training throughput of every attention variant at one
model size (the CPU configs' size). Same loop for all: forward + backward + AdamW step on
random tokens, a few warmup steps, then the fastest timed step (the machine is shared).

    python tools/bench_attention.py                 # all variants, markdown table to stdout
    python tools/bench_attention.py --only ha,ha_shared --steps 3
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPT, GPTConfig  # noqa: E402

SIZE = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=65, bias=False, dropout=0.0)

VARIANTS = {  # name -> GPTConfig overrides
    'sa': dict(attention='sa'),
    'linear': dict(attention='linear'),
    'linear (norm)': dict(attention='linear', linear_norm=True),
    'hfa_v1 A=2': dict(attention='hfa_v1', hfa_order=2),
    'hfa_v1 A=2, dh=d/(HA)': dict(attention='hfa_v1', hfa_order=2, head_dim=16),
    'hfa_v2 A=2': dict(attention='hfa_v2', hfa_order=2),
    'hfa_v2 A=3': dict(attention='hfa_v2', hfa_order=3),
    'hfa_v1 2 SA + 2 HFA': dict(attention='hfa_v1', n_hfa_head=2),
    'hfa_v1 no softmax': dict(attention='hfa_v1', softmax=False),
    'ha': dict(attention='ha'),
    'ha shared': dict(attention='ha', ha_share_kv=True),
    'ha w=32/8': dict(attention='ha', ha_window1=32, ha_window2=8),
    'ha no softmax': dict(attention='ha', softmax=False),
    'ha order 4': dict(attention='ha', ha_order=4),
    'sa sa sa ha': dict(attn_layers='sa,sa,sa,ha'),
}
NOT_RUN = {'ha order 4'}  # reference kernel materialises B*H*T^4 weights: not run at T = 128


def bench(over, batch, steps, warmup):
    torch.manual_seed(0)
    cfg = GPTConfig(**{**SIZE, **over})
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), 'cpu')
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    return model, batch * cfg.block_size / min(times)  # best step: robust to other jobs on the machine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--only', default='')
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--steps', type=int, default=5)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--threads', type=int, default=0, help='0: torch default')
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    names = a.only.split(',') if a.only else list(VARIANTS)
    print(f"size {SIZE}, batch {a.batch} x {SIZE['block_size']}, fp32, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    print('| variant | params (non-emb.) | train MFLOPs/token | CPU tokens/s |')
    print('|---|---:|---:|---:|')
    for name in names:
        over = VARIANTS[name]
        if name in NOT_RUN:
            model, tps = GPT(GPTConfig(**{**SIZE, **over})), None
        else:
            model, tps = bench(over, a.batch, a.steps, a.warmup)
        fpt = model.flops_per_token() / 1e6
        print(f"| {name} | {model.get_num_params():,} | {fpt:.2f} | "
              f"{'n/a' if tps is None else f'{tps:,.0f}'} |", flush=True)


if __name__ == '__main__':
    main()
