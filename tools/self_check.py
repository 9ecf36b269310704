"""
Every Triton kernel's first-use self-check (attention_kernels/guard.py), run on purpose: the
forward and backward of each family at the configuration classes a GPT-2-small run, its
evaluation and its sampling use (bf16 at head sizes 64 and 128: causal T = 1024, windows,
decoding after a prompt; fp32 at 64), each compared with PyTorch in float64 on the first
heads. One JSON record per case (written as it finishes: a timeout keeps the ones done),
verdict 'ok', 'mismatch' (the guard's line) or 'failed' (the kernel did not compile or
launch); exit 1 if any is not 'ok'. tools/gpu_check.sh runs it; the GPU report shows it.

    python tools/self_check.py --out self_check.json     # on a GPU
    python tools/self_check.py --device cpu --tiny        # Triton's interpreter, tiny shapes (tests)
"""

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import attention_kernels  # noqa: E402  before anything imports triton (the interpreter on CPU)
from attention_kernels import guard  # noqa: E402


def cases(tiny):
    """(family, dtype, head size, Tq, Tk, offset, window(s), causal) per configuration class."""
    T, w, ha_w, dec = (32, 8, (8, 4), 4) if tiny else (1024, 256, (512, 32), 16)
    dhs = (16,) if tiny else (64, 128)
    out = []
    for dtype in (torch.bfloat16, torch.float32):
        for dh in dhs if dtype == torch.bfloat16 else dhs[:1]:
            for fam, windows in (('linear', (0, w)), ('hfa', (0, w)), ('ha', ((0, 0), ha_w))):
                for win in windows:
                    out.append((fam, dtype, dh, T, T, 0, win))
                out.append((fam, dtype, dh, dec, T, T - dec, windows[1]))  # decoding after a prompt
    return out


def run_case(fam, dtype, dh, Tq, Tk, offset, window, device, seed=0):
    """Forward and backward through dispatch(kernel='triton', check=True), as a model would."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device).to(dtype).requires_grad_()
    B, H = 1, 2
    if fam == 'hfa':
        xs = [rand(2, B, H, Tq, dh), rand(2, B, H, Tk, dh), rand(B, H, Tk, dh)]
        fn = attention_kernels.dispatch('triton', 'hfa', xs[0], xs[1], offset=offset, window=window)
        out = fn(*xs, offset, True, window, True, 0.0)
    elif fam == 'linear':
        xs = [rand(B, H, Tq, dh), rand(B, H, Tk, dh), rand(B, H, Tk, dh)]
        fn = attention_kernels.dispatch('triton', 'linear', xs[0], xs[1], offset=offset, window=window)
        out = fn(*xs, offset, True, window, False, 0.0)
    else:
        xs = [rand(B, H, Tq, dh)] + [rand(B, H, Tk, dh) for _ in range(4)]
        fn = attention_kernels.dispatch('triton', 'ha', xs[0], xs[1][None])
        out = fn(xs[0], xs[1:3], xs[3:5], offset, True, list(window), True)
    torch.autograd.grad(out, xs, torch.randn(out.shape, generator=g, device=device).to(dtype))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument('--device', default='cuda')
    p.add_argument('--tiny', action='store_true', help='tiny shapes (the interpreter)')
    p.add_argument('--out', default='self_check.json')
    args = p.parse_args(argv)
    err = attention_kernels.load_triton()
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.device != 'cuda':
        guard.CHECK_DEVICES = ('cuda', args.device)  # testing the check itself, in the interpreter
    records = []
    for fam, dtype, dh, Tq, Tk, offset, window in cases(args.tiny):
        rec = dict(family=fam, dtype=str(dtype)[6:], head_dim=dh, Tq=Tq, Tk=Tk, offset=offset, window=window)
        before = set(guard._checked)
        t0 = time.time()
        try:
            run_case(fam, dtype, dh, Tq, Tk, offset, window, args.device)
            rec.update(verdict='ok', detail='')
        except guard.KernelMismatch as e:
            rec.update(verdict='mismatch', detail=str(e))
        except Exception as e:  # a compile or launch failure (kernel='triton' raises it)
            lines = str(e).strip().splitlines()
            rec.update(verdict='failed', detail=f"{type(e).__name__}: {lines[0] if lines else ''}")
        rec.update(seconds=round(time.time() - t0, 2), checked=sorted(f"{e}: {c}" for e, c in guard._checked - before))
        records.append(rec)
        print(f"{rec['verdict']:<9}{fam:<7}{rec['dtype']:<9}dh {dh:<4}Tq {Tq:<5}Tk {Tk:<5}offset {offset:<5}"
              f"window {window!s:<10}{rec['seconds']:6.1f} s  {rec['detail']}", flush=True)
        with open(args.out + '.tmp', 'w') as f:
            json.dump(records, f, indent=1)
        os.replace(args.out + '.tmp', args.out)
    bad = [r for r in records if r['verdict'] != 'ok']
    print(f"{len(records) - len(bad)} of {len(records)} configurations agree with PyTorch; wrote {args.out}")
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
