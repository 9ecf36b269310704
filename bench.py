"""
Benchmark the attention variants: speed, peak memory and achieved FLOP/s.

    python bench.py                          # default sweep, CPU: a few minutes
    python bench.py --quick                  # seconds, for a test
    python bench.py --block-sizes 128,512 --device cuda --out results/bench.json
    python bench.py --device cuda --kernels_only --out results/kernels.json   # the kernel rows alone

Rows (variant):
    sa, linear, hfa_v1, hfa_v2, ha, ha_win    the model's variants (ha_win: windows w1, w2)
    ha_ref                                    HA through the materialising reference (O(L^3) memory)
    hfa_v1_kron, hfa_v1_explicit              HFA forced onto either path (the model picks one)
    sdpa_min                                  a minimal self-contained SDPA GPT of the same size
Modes:
    attention    forward + backward of one attention layer (projections included)
    train_step   forward + backward + AdamW step of the whole GPT
    sample       tokens/s generating 512 new tokens with and without the KV cache
    kernel_fwd, kernel_bwd, kernel_fwd_bwd
                 one attention kernel alone (kernels/, on CUDA by default): bf16, batch x heads
                 x T x dh at T in --kernel_seq_lens, dh in --kernel_head_dims, beside SDPA
                 (flash) at the same shape; TFLOP/s and the fraction of the device's dense bf16
                 peak (hardware.py). Rows: sdpa, linear, linear_norm, hfa_A1..A3, ha_win (windows
                 512, 32), ha_win_shared, ha (full; T <= 1024 only, O(T^3)).

Every (variant, mode, block size) runs in a fresh Python process, so that on CPU its peak
memory is that process's peak RSS (getrusage); `peak_mem_bytes` is that peak minus the RSS
just before the first step (model, optimizer shell and inputs already built), i.e. the
memory the step itself needs: activations, gradients, optimizer state. On CUDA it is
torch.cuda.max_memory_allocated. FLOPs are counted analytically (GPT.flops_per_token,
Attention.mix_flops) and `frac_of_matmul_peak` = achieved FLOP/s / FLOP/s of a large fp32
matmul measured in the same run, on the same device and thread count.

On CPU the default is ONE thread (--threads): on a shared machine, two OpenMP threads
competing with other work run many small kernels 10-30x slower, and ratios stop meaning
anything.
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import hardware
from kernels.masks import mean_visible
from model import GPT, GPTConfig, make_attention

VARIANTS = ['sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha', 'ha_win']
REFERENCES = ['ha_ref', 'hfa_v1_kron', 'hfa_v1_explicit']


def bench_config(variant, T, args):
    """The GPT config of a row; all rows share the width, depth and vocabulary."""
    base = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab_size=args.vocab,
                block_size=T, bias=True, dropout=0.0)
    if variant in ('sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha', 'sdpa_min'):
        return GPTConfig(**base, attention='sa' if variant == 'sdpa_min' else variant)
    if variant == 'ha_win':  # Roy et al. use (512, 32) at long context; scaled to our lengths
        return GPTConfig(**base, attention='ha', ha_window1=min(args.window1, T), ha_window2=min(args.window2, T))
    if variant == 'ha_ref':
        return GPTConfig(**base, attention='ha')
    if variant in ('hfa_v1_kron', 'hfa_v1_explicit'):
        return GPTConfig(**base, attention='hfa_v1', hfa_kron='on' if variant.endswith('kron') else 'off')
    raise ValueError(variant)


# -----------------------------------------------------------------------------
# the minimal baseline: nanoGPT with SDPA and nothing else

class MinimalGPT(nn.Module):
    """Token + position embeddings, n_layer pre-LN blocks of causal SDPA and a GELU MLP,
    tied lm_head: the SA model of model.py without its variant machinery."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.block_size, c.n_embd)
        self.blocks = nn.ModuleList([nn.ModuleDict(dict(
            ln1=nn.LayerNorm(c.n_embd), qkv=nn.Linear(c.n_embd, 3 * c.n_embd), proj=nn.Linear(c.n_embd, c.n_embd),
            ln2=nn.LayerNorm(c.n_embd), fc=nn.Linear(c.n_embd, 4 * c.n_embd), fc2=nn.Linear(4 * c.n_embd, c.n_embd),
        )) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            q, k, v = b.qkv(b.ln1(x)).view(B, T, 3, self.c.n_head, -1).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + b.proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + b.fc2(F.gelu(b.fc(b.ln2(x))))
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# -----------------------------------------------------------------------------
# one case, in its own process

def rss_now():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def sync(device):
    if device == 'cuda':
        torch.cuda.synchronize()


def timed(step, device, min_time, min_iters):
    """Seconds per call of step(): one warm-up call, then at least min_iters calls and min_time s."""
    step()
    sync(device)
    n, t0 = 0, time.perf_counter()
    while n < min_iters or time.perf_counter() - t0 < min_time:
        step()
        sync(device)
        n += 1
    return (time.perf_counter() - t0) / n


def matmul_flops(device, n=1024, seconds=0.5):
    """FLOP/s of an n x n fp32 matmul: the peak the other rows are compared with."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    dt = timed(lambda: a @ b, device, seconds, 3)
    return 2 * n ** 3 / dt


def run_case(case):
    torch.set_num_threads(case['threads'])
    torch.manual_seed(0)
    dev, T, B, variant, mode = case['device'], case['block_size'], case['batch_size'], case['variant'], case['mode']
    args = argparse.Namespace(**case['model'])
    cfg = bench_config(variant, T, args)
    rec = dict(variant=variant, mode=mode, block_size=T, batch_size=B, device=dev, threads=case['threads'])
    if mode == 'attention':
        layer = make_attention(cfg).to(dev)
        if variant == 'ha_ref':  # route the layer through the materialising reference
            _use_reference(layer)
        x = torch.randn(B, T, cfg.n_embd, device=dev, requires_grad=True)
        n_w = sum(m.weight.numel() for m in layer.modules() if isinstance(m, nn.Linear))
        flops_per_token = 3 * (2 * n_w + layer.mix_flops(T))

        def step():
            layer(x).sum().backward()
    else:
        model = (MinimalGPT(cfg) if variant == 'sdpa_min' else GPT(cfg)).to(dev)
        if variant == 'ha_ref':
            for blk in model.transformer.h:
                _use_reference(blk.attn)
        ref_model = GPT(bench_config('sa' if variant == 'sdpa_min' else variant, T, args))
        flops_per_token = ref_model.flops_per_token(T)
        del ref_model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        idx = torch.randint(cfg.vocab_size, (B, T + 1), device=dev)
        xb, yb = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

        def step():
            _, loss = model(xb, yb)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    if dev == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    rss0 = rss_now()
    dt = timed(step, dev, case['min_time'], case['min_iters'])
    peak = torch.cuda.max_memory_allocated() if dev == 'cuda' else peak_rss() - rss0
    rec.update(seconds_per_step=dt, tokens_per_s=B * T / dt, peak_mem_bytes=int(peak),
               flops_per_token=float(flops_per_token), flops_per_s=B * T * flops_per_token / dt)
    return rec


def _use_reference(attn):
    """Make an HA layer compute with hyper_attention_reference (every tuple materialised)."""
    from kernels.hyperattention import hyper_attention_reference, pair_masks
    for g in attn.groups:
        c = g.cfg

        def mix(q, k, v, offset, c=c):
            masks = pair_masks(q.size(-2), k.size(-2), offset, c.causal, c.ha_window1, c.ha_window2, q.device)
            return hyper_attention_reference(q[0], list(k), list(v), masks, softmax=c.softmax)
        g.mix = mix


def run_sample(case):
    """Tokens/s of GPT.generate for n_new tokens from a 1-token prompt, with and without the
    KV cache, same seed; also whether both sampled the same tokens."""
    torch.set_num_threads(case['threads'])
    dev, n_new = case['device'], case['n_new']
    args = argparse.Namespace(**case['model'])
    cfg = bench_config(case['variant'], n_new + 1, args)
    torch.manual_seed(0)
    model = GPT(cfg).to(dev).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long, device=dev)
    out, rec = {}, []
    for use_cache in (True, False):
        torch.manual_seed(1)
        sync(dev)
        t0 = time.perf_counter()
        out[use_cache] = model.generate(prompt, n_new, use_cache=use_cache)
        sync(dev)
        dt = time.perf_counter() - t0
        rec.append(dict(variant=case['variant'], mode='sample_cache' if use_cache else 'sample_nocache',
                        block_size=cfg.block_size, batch_size=1, device=dev, threads=case['threads'],
                        new_tokens=n_new, seconds=dt, tokens_per_s=n_new / dt, peak_mem_bytes=None,
                        flops_per_token=None, frac_of_matmul_peak=None))
    same = bool(torch.equal(out[True], out[False]))
    for r in rec:
        r['identical_tokens'] = same
    return rec


# -----------------------------------------------------------------------------
# kernel rows: one attention kernel alone, forward / backward / both, beside SDPA

KERNEL_ROWS = ['sdpa', 'linear', 'linear_norm', 'hfa_A1', 'hfa_A2', 'hfa_A3', 'ha_win', 'ha_win_shared', 'ha']


def kernel_call(name, B, H, T, dh, dtype, device, window=(512, 32)):
    """(inputs, f, forward FLOPs) of one kernel row: f(*inputs) -> out (B, H, T, dh).
    FLOPs count the visible pairs only (causal, windows), 2 per multiply-add, as
    Attention.mix_flops does: sdpa / linear 4 dh per (query, key); HFA (2 A dh + A - 1 + 2 dh);
    HA 4 dh per (query, key pair)."""
    from kernels import ops
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).requires_grad_()
    scale = dh ** -0.5
    pairs = B * H * T * mean_visible(T, True)
    if name == 'sdpa':
        x = [rand(B, H, T, dh) for _ in range(3)]
        return x, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), 4 * dh * pairs
    if name.startswith('linear'):
        x = [rand(B, H, T, dh) for _ in range(3)]
        norm = name == 'linear_norm'
        return x, lambda q, k, v: ops.linear_attention(q, k, v, 0, True, 0, norm, scale), 4 * dh * pairs
    if name.startswith('hfa'):
        A = int(name[-1])
        x = [rand(A, B, H, T, dh), rand(A, B, H, T, dh), rand(B, H, T, dh)]
        return x, lambda q, k, v: ops.hfa_attention(q, k, v, 0, True, 0, scale), (2 * A * dh + A - 1 + 2 * dh) * pairs
    if name.startswith('ha'):
        w1, w2 = window if name.startswith('ha_win') else (0, 0)
        tuples = sum(min(i + 1, w1 or T) * min(i + 1, w2 or T) for i in range(T))
        shared = name.endswith('shared')
        x = [rand(B, H, T, dh) for _ in range(3 if shared else 5)]

        def f(q, *kv):
            k1, k2, v1, v2 = (kv[0], kv[0], kv[1], kv[1]) if shared else kv
            return ops.hyper_attention(q, k1, k2, v1, v2, 0, True, w1, w2, kernel='auto')
        return x, f, 4 * dh * B * H * tuples
    raise ValueError(name)


def kernel_case(name, B, H, T, dh, dtype, device, min_time, min_iters):
    """Seconds of forward, backward and forward + backward of one kernel row."""
    x, f, fwd_flops = kernel_call(name, B, H, T, dh, dtype, device)
    out = f(*x)
    dout = torch.randn_like(out)

    def fwd():
        with torch.no_grad():
            f(*x)

    def bwd():
        torch.autograd.grad(out, x, dout, retain_graph=True)

    def both():
        torch.autograd.grad(f(*x), x, dout)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    times = {mode: timed(step, device, min_time, min_iters)
             for mode, step in (('kernel_fwd', fwd), ('kernel_bwd', bwd), ('kernel_fwd_bwd', both))}
    peak = torch.cuda.max_memory_allocated() if device == 'cuda' else None
    # backward = 2 x forward FLOPs, the convention of FlashAttention's benchmarks (no recompute counted)
    flops = {'kernel_fwd': fwd_flops, 'kernel_bwd': 2 * fwd_flops, 'kernel_fwd_bwd': 3 * fwd_flops}
    return times, flops, peak


def kernel_rows(args):
    """Every kernel row at every (T, dh), SDPA first at each shape; a row that fails (no
    kernel, out of memory) is recorded with its error and the sweep goes on."""
    import kernels
    kernels.load_triton()  # before the first custom op call, which may import triton itself
    dev = args.device
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16, 'fp32': torch.float32}[args.kernel_dtype]
    peak, peak_src = hardware.peak_flops(dev)
    name = torch.cuda.get_device_name() if dev == 'cuda' else dev
    B, H = args.kernel_batch, args.kernel_heads
    records = []
    print(f"kernels on {name}, {args.kernel_dtype}, B={B} H={H}; peak {peak / 1e12:.1f} TFLOP/s ({peak_src})")
    print(f"{'kernel':<15}{'T':>6}{'dh':>5}  {'fwd ms':>8}{'bwd ms':>8}{'f+b ms':>8}  {'TFLOP/s f+b':>11}"
          f"{'% peak':>8}{'x SDPA':>8}")
    for T in args.kernel_seq_lens:
        for dh in args.kernel_head_dims:
            base = {}
            for row in args.kernel_list:
                if row == 'ha' and T > args.kernel_ha_full_max:
                    continue  # O(T^3)
                rec0 = dict(variant=row, block_size=T, batch_size=B, heads=H, head_dim=dh, dtype=args.kernel_dtype,
                            device=dev, device_name=name, peak_flops=peak, peak_source=peak_src,
                            frac_of_matmul_peak=None, flops_per_token=None)
                try:
                    times, flops, mem = kernel_case(row, B, H, T, dh, dtype, dev, args.kernel_min_time,
                                                    args.kernel_min_iters)
                except Exception as e:  # reported, not fatal
                    err = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                    records.append(dict(rec0, mode='kernel_fwd_bwd', seconds=None, tokens_per_s=None,
                                        peak_mem_bytes=None, error=err))
                    print(f"{row:<15}{T:>6}{dh:>5}  FAILED: {err}", flush=True)
                    if dev == 'cuda':
                        torch.cuda.empty_cache()
                    continue
                if row == 'sdpa':
                    base = times
                for mode, dt in times.items():
                    rec = dict(rec0, mode=mode, seconds=dt, tokens_per_s=B * T / dt, peak_mem_bytes=mem,
                               flops=flops[mode], tflops_per_s=flops[mode] / dt / 1e12,
                               frac_of_peak=flops[mode] / dt / peak,
                               sdpa_seconds=base.get(mode), time_vs_sdpa=dt / base[mode] if mode in base else None)
                    records.append(rec)
                r = records[-1]
                print(f"{row:<15}{T:>6}{dh:>5}  {times['kernel_fwd'] * 1e3:>8.3f}{times['kernel_bwd'] * 1e3:>8.3f}"
                      f"{times['kernel_fwd_bwd'] * 1e3:>8.3f}  {r['tflops_per_s']:>11.1f}{100 * r['frac_of_peak']:>7.1f}%"
                      f"{r['time_vs_sdpa'] or float('nan'):>8.2f}", flush=True)
    return records


def add_kernel_args(p):
    g = p.add_argument_group('kernel rows (default on CUDA)')
    g.add_argument('--kernels', choices=['auto', 'on', 'off'], default='auto', help='auto: on for --device cuda')
    g.add_argument('--kernels_only', action='store_true', help='only the kernel rows')
    g.add_argument('--kernel_seq_lens', default='1024,4096,8192')
    g.add_argument('--kernel_head_dims', default='64,128')
    g.add_argument('--kernel_batch', type=int, default=2)
    g.add_argument('--kernel_heads', type=int, default=8)
    g.add_argument('--kernel_dtype', default='bf16', choices=['bf16', 'fp16', 'fp32'])
    g.add_argument('--kernel_list', default=','.join(KERNEL_ROWS))
    g.add_argument('--kernel_ha_full_max', type=int, default=1024, help='longest T for the full (O(T^3)) ha row')
    g.add_argument('--kernel_min_time', type=float, default=0.2)
    g.add_argument('--kernel_min_iters', type=int, default=3)


def parse_kernel_args(args):
    args.kernel_seq_lens = [int(s) for s in str(args.kernel_seq_lens).split(',')]
    args.kernel_head_dims = [int(s) for s in str(args.kernel_head_dims).split(',')]
    args.kernel_list = [s.strip() for s in args.kernel_list.split(',')]
    unknown = set(args.kernel_list) - set(KERNEL_ROWS)
    if unknown:
        raise SystemExit(f"error: unknown kernel rows {sorted(unknown)}; valid: {', '.join(KERNEL_ROWS)}")
    return args.kernels == 'on' or args.kernels_only or (args.kernels == 'auto' and args.device == 'cuda')


# -----------------------------------------------------------------------------
# the sweep: one subprocess per case

def plan(args):
    cases = []
    for T in args.block_sizes:
        for variant in VARIANTS + REFERENCES + ['sdpa_min']:
            if variant == 'ha_ref' and T > args.ref_max:
                continue  # O(L^3) memory and time
            if variant == 'hfa_v1_kron' and T > args.ref_max:
                continue  # width dh^2 SDPA: slow on CPU at long context (see docs/performance.md)
            for mode in ('attention', 'train_step'):
                if variant == 'sdpa_min' and mode == 'attention':
                    continue
                cases.append(dict(variant=variant, mode=mode, block_size=T))
    return cases


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--block-sizes', default=None, help='comma list; CPU default 64,256,1024')
    p.add_argument('--batch-size', type=int, default=None, help='default 1 on CPU, 8 on CUDA')
    p.add_argument('--quick', action='store_true', help='tiny sweep that runs in seconds')
    p.add_argument('--threads', type=int, default=1, help='CPU threads per case (see docstring)')
    p.add_argument('--n-layer', type=int, default=2)
    p.add_argument('--n-head', type=int, default=2)
    p.add_argument('--n-embd', type=int, default=64)
    p.add_argument('--vocab', type=int, default=256)
    p.add_argument('--window1', type=int, default=128)
    p.add_argument('--window2', type=int, default=32)
    p.add_argument('--ref-max', type=int, default=256, help='largest block size for the O(L^3) rows')
    p.add_argument('--sample-tokens', type=int, default=512)
    p.add_argument('--in-process', action='store_true', help='no subprocess per case (implied by --quick)')
    p.add_argument('--out', default=None, help='write the records as JSON')
    p.add_argument('--case', default=None, help=argparse.SUPPRESS)  # internal: run one case
    add_kernel_args(p)
    args = p.parse_args()

    if args.case:
        case = json.loads(args.case)
        res = run_sample(case) if case['mode'] == 'sample' else [run_case(case)]
        print('RESULT ' + json.dumps(res))
        return

    with_kernels = parse_kernel_args(args)
    if args.kernels_only:
        write_records(kernel_rows(args), args.out)
        return
    cpu = args.device == 'cpu'
    if args.block_sizes:
        args.block_sizes = [int(s) for s in args.block_sizes.split(',')]
    else:
        args.block_sizes = [32] if args.quick else ([64, 256, 1024] if cpu else [64, 128, 256, 512, 1024])
    if args.quick:
        args.ref_max, args.sample_tokens = min(args.ref_max, max(args.block_sizes)), 16
    B = args.batch_size or (1 if cpu else 8)
    model_args = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, vocab=args.vocab,
                      window1=args.window1, window2=args.window2)
    common = dict(device=args.device, threads=args.threads, batch_size=B, model=model_args,
                  min_time=0.05 if args.quick else 1.0, min_iters=1 if args.quick else 2)

    if cpu:
        torch.set_num_threads(args.threads)
    peak0 = matmul_flops(args.device, 256 if args.quick else 1024, 0.1 if args.quick else 0.5)
    print(f"device {args.device}, threads {args.threads}, batch {B}, model n_layer={args.n_layer} "
          f"n_head={args.n_head} n_embd={args.n_embd} vocab={args.vocab}")

    records = []
    cases = [dict(common, **c) for c in plan(args)]
    cases += [dict(common, variant='sa', mode='sample', n_new=args.sample_tokens)]
    hdr = f"{'variant':<16}{'mode':<15}{'L':>5}{'B':>3}{'tokens/s':>11}{'peak MiB':>10}{'GFLOP/tok':>11}{'GFLOP/s':>9}"
    print(hdr)
    t_start = time.time()
    for case in cases:
        if args.in_process or args.quick:  # no fresh process: peak_mem_bytes is only indicative
            res = run_sample(case) if case['mode'] == 'sample' else [run_case(case)]
            for rec in res:
                records.append(rec)
                print_row(rec)
            continue
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), '--case', json.dumps(case)],
                               capture_output=True, text=True, timeout=args_timeout(args))
            line = [s for s in r.stdout.splitlines() if s.startswith('RESULT ')]
            if not line:
                raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'no result')
            res = json.loads(line[0][len('RESULT '):])
        except Exception as e:  # a case that fails (OOM, timeout) is reported, not fatal
            res = [dict(variant=case['variant'], mode=case['mode'], block_size=case.get('block_size'),
                        batch_size=B, tokens_per_s=None, peak_mem_bytes=None, flops_per_token=None,
                        frac_of_matmul_peak=None, error=str(e)[:200])]
        for rec in res:
            records.append(rec)
            print_row(rec)
    peak1 = matmul_flops(args.device, 256 if args.quick else 1024, 0.1 if args.quick else 0.5)
    peak = max(peak0, peak1)
    for rec in records:
        if rec.get('flops_per_s'):
            rec['frac_of_matmul_peak'] = rec['flops_per_s'] / peak
            rec['matmul_flops_per_s'] = peak
    print(f"matmul peak (fp32 1024^3, same threads): {peak / 1e9:.1f} GFLOP/s "
          f"(start {peak0 / 1e9:.1f}, end {peak1 / 1e9:.1f}); % mm column = achieved / peak")
    print('\n' + hdr + f"{'% mm':>7}")
    for rec in records:
        print_row(rec)
    print(f"total {time.time() - t_start:.0f} s")
    if with_kernels:
        records += kernel_rows(args)
    write_records(records, args.out)


def write_records(records, path):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(records, f, indent=1)
        print(f"wrote {len(records)} records to {path}")


def args_timeout(args):
    return 60 if args.quick else 400


def print_row(r):
    def fmt(v, scale, w, d):
        return f"{v / scale:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"
    if r.get('error'):
        print(f"{r['variant']:<16}{r['mode']:<15}{r['block_size'] or '':>5}  FAILED: {r['error']}", flush=True)
        return
    extra = f"  identical tokens: {r['identical_tokens']}" if 'identical_tokens' in r else ''
    print(f"{r['variant']:<16}{r['mode']:<15}{r['block_size']:>5}{r['batch_size']:>3}"
          f"{fmt(r['tokens_per_s'], 1, 11, 1)}{fmt(r['peak_mem_bytes'], 2 ** 20, 10, 1)}"
          f"{fmt(r['flops_per_token'], 1e9, 11, 4)}{fmt(r.get('flops_per_s'), 1e9, 9, 2)}"
          f"{fmt(r.get('frac_of_matmul_peak'), 0.01, 7, 1)}{extra}", flush=True)


if __name__ == '__main__':
    main()
