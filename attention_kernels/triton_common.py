"""
Pieces shared by the Triton kernels: the visibility rule of attention_kernels/masks.py on tiles, the
key (query) blocks a query (key) block has to visit, dots with fp32 accumulation, and the
tile sizes.

Triton compiles for GPUs only. On a machine without CUDA, attention_kernels/__init__.py imports
triton with its interpreter switched on (TRITON_INTERPRET=1 for that import only), so the
same kernels run on CPU tensors, slowly: that is how CI tests them. The interpreter (triton 3.9)
multiplies bfloat16 tiles as their raw bits and truncates fp32 -> bf16 casts, so there bf16
tiles are widened to fp32 before each dot (products of bf16 values are exact in fp32 and
accumulate in fp32, as on tensor cores) and casts round to nearest-even on the bits: the
numbers are those of the GPU kernel up to summation order.
"""

import contextlib

import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e)): exp2 is the fast instruction
INTERPRETED = bool(getattr(getattr(triton, 'knobs', None), 'runtime', None)
                   and triton.knobs.runtime.interpret)


@triton.jit
def _mm(a, b, UP: tl.constexpr, PREC: tl.constexpr):
    """a @ b with fp32 accumulation; UP widens both operands to fp32 first (interpreter)."""
    if UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _cast(x, dtype: tl.constexpr, UP: tl.constexpr):
    """x.to(dtype) rounded to nearest-even as on the GPU; UP (interpreter, bf16): the
    interpreter truncates fp32 -> bf16, so the rounding is done on the bits first."""
    if UP:
        b = x.to(tl.float32).to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _visible(pos, rn, Tk, window, CAUSAL: tl.constexpr):
    """(BM, BN): may the query at absolute position pos[i] read key rn[j]."""
    vis = (rn[None, :] < Tk) & (pos[:, None] >= 0)
    if CAUSAL:
        vis = vis & (rn[None, :] <= pos[:, None])
        vis = vis & ((window == 0) | (pos[:, None] - rn[None, :] < window))
    return vis


@triton.jit
def key_range(m0, BM: tl.constexpr, BN: tl.constexpr, Tq, Tk, offset, window, CAUSAL: tl.constexpr):
    """[lo, hi) of the keys that queries m0 .. m0 + BM - 1 may read (lo a multiple of BN)."""
    if CAUSAL:
        hi = tl.minimum(offset + tl.minimum(m0 + BM, Tq), Tk)
        lo = tl.maximum(offset + m0 - window + 1, 0) * (window > 0)
        lo = (lo // BN) * BN
    else:
        lo = m0 * 0
        hi = Tk + m0 * 0
    return lo, hi


@triton.jit
def query_range(n0, BN: tl.constexpr, BM: tl.constexpr, Tq, Tk, offset, window, CAUSAL: tl.constexpr):
    """[lo, hi) of the queries that may read keys n0 .. n0 + BN - 1 (lo a multiple of BM)."""
    if CAUSAL:
        lo = (tl.maximum(n0 - offset, 0) // BM) * BM
        last = tl.minimum(tl.maximum(n0 + BN - 1 + window - offset, 0), Tq)  # with a window
        hi = Tq - (Tq - last) * (window > 0)
    else:
        lo = n0 * 0
        hi = Tq + n0 * 0
    return lo, hi


def head_block(D):
    """Head size padded to a power of two >= 16 (tl.dot's smallest tile side)."""
    return max(16, triton.next_power_of_2(D))


def upcast_dots(dtype):
    return INTERPRETED and dtype == torch.bfloat16


def dot_precision(dtype):
    return 'ieee' if dtype == torch.float32 else 'tf32'  # fp32 inputs get fp32 dots, not TF32


# the HFA backward on sm_80 (mma.sync, per warp): (R, L, warps, stages) by head block and A
SM80_HFA_BWD = {32: {1: (64, 32, 4, 1), 2: (64, 32, 4, 1), 3: (64, 32, 4, 1), 4: (32, 16, 4, 1)},  # A = 4: 16 x 32 spilled 8 B non-causal (hints)
                64: {1: (64, 32, 4, 1), 2: (32, 32, 4, 1), 3: (32, 32, 4, 1), 4: (32, 32, 4, 1)},
                128: {1: (64, 32, 4, 1), 2: (16, 32, 4, 1), 3: (16, 16, 4, 1), 4: (16, 64, 8, 1)}}


# HFA's dq kernel at (head block, A), bf16/fp16 on sm_90, where it takes larger tiles than
# dk/dv: at dh 128, A = 2, 64 rows (wgmma) on one stage, 0.55 cycles per pair by
# the loop-only model (docs/kernel_design_history.md) against 0.92 on the shared 32 x 32 (dk/dv spilled 144 B there)
# A = 4 at dh 128: dk/dv's 16 x 64 on one stage spilled 8 B in the non-causal dq kernel once
# compiled with the launch's integer hints; two stages spill in neither form
HFA_BWD_DQ = {(128, 2): (64, 16, 4, 1), (128, 4): (16, 64, 8, 2)}


def block_sizes(kind, BD, A, dtype, arch=90):
    """(BM, BN, num_warps, num_stages) for kind 'hfa_fwd', 'linear_fwd', 'linear_bwd' (linear:
    A = 1); for 'hfa_bwd' (R, L, num_warps, num_stages): rows kept, rows per step, of both
    backward kernels but where 'hfa_bwd_dq' gives the dq kernel its own; for the
    GPU of compute capability `arch` (before sm_90: the backward with one stage). Small tiles in the interpreter (more block edges tested). On a GPU, the
    largest tiles whose live fp32 tiles fit 255 registers without spilling on sm_90 under
    triton 3.6 (torch 2.11's) and 3.9, found with tools/compile_check.py (which prints registers and stack per configuration)."""
    if INTERPRETED:
        return 16, 16, 1, 1
    if kind == 'hfa_bwd_dq':  # the dq kernel's own tiles where they differ from dk/dv's
        own = HFA_BWD_DQ.get((BD, A)) if arch >= 90 and dtype != torch.float32 else None
        return own or block_sizes('hfa_bwd', BD, A, dtype, arch)
    stages = 2 if BD > 64 else 3
    if dtype == torch.float32:  # fp32 dots run on FMA units, not tensor cores: small tiles
        if arch < 90:  # sm_80's smaller shared memory: 3 stages of A = 4 needed 176 KB
            stages = 1
        return (16, 32, 4, stages) if BD > 64 and kind.endswith('bwd') else (32, 32, 4, stages)
    if kind.endswith('fwd'):  # 128 rows on 8 warps: two warp groups of 64 rows, no tile twice
        if BD > 64:  # one stage; 64 columns spilled 8-48 B with A >= 2 (triton 3.6 or 3.9), and
            return 128, 64 if A == 1 and arch >= 90 else 32, 8, 1  # 8 B for A = 1 on sm_80 (with the run-time hints)
        # sm_80: 64 columns spilled 8 B with A = 4, and 32-56 B with A = 3 compiled with the
        # launch's integer hints; A = 4 on two stages 8 B at dh 32 (hints)
        cols = 32 if A >= 3 and arch < 90 else 64
        return 128, cols, 8, (1 if A == 4 and arch < 90 else 2) if A > 2 else stages
    # backward: (rows each kernel keeps, rows per step, warps, stages); hfa_backward gives dq
    # R query rows and dk/dv R key rows, and every dot of both has R rows, so R = 64 runs
    # on wgmma. The largest R without spills on sm_90 (tools/compile_check.py): one stage
    # where two spilled (A = 3 at dh 64, A = 4 at dh 128); A = 4 at dh 64 and A = 3, 4 at
    # dh 128 spilled at every R >= 32 tried (8-2,600 B) and take 16-row tiles (mma.sync)
    if kind == 'hfa_bwd' and arch < 90:  # sm_80: its own, no spills (tools/compile_check.py --arch 80)
        return SM80_HFA_BWD[min(max(BD, 32), 128)][A]
    if kind == 'linear_bwd':  # dh 128: 64 rows on 8 warps computed every tile twice
        t = (128, 64, 8, 1) if BD > 64 else (64, 64, 4, stages)
    elif BD > 64:  # A = 4: 16 x 16 on 4 warps spilled 8-24 B under triton 3.6 and ran 14 tile matmuls for 9
        t = {1: (64, 16, 4, 2), 2: (32, 32, 4, 2), 3: (16, 32, 4, 2), 4: (16, 64, 8, 1)}[A]
    elif A == 4 and BD <= 32:  # 16-row tiles on 4 warps compute tiles twice (and spilled 16 B at dh 16)
        t = (16, 32, 2, 2)
    else:  # A = 4: a second stage spilled 8 B under triton 3.6
        t = {1: (64, 64, 4, 3), 2: (64, 16, 4, 2), 3: (64, 16, 4, 1), 4: (16, 32, 4, 1)}[A]
    # sm_80 (mma.sync, per warp): a second stage spilled 8-112 B in some of these kernels
    return t if arch >= 90 else t[:3] + (1,)


def arch_of(t):
    """The compute capability tiles are chosen for: the tensor's GPU (80 for an A100, 90 for
    an H100/H200); 90 for CPU tensors (the interpreter, whose tiles are its own)."""
    if not t.is_cuda:
        return 90
    major, minor = torch.cuda.get_device_capability(t.device)
    return 10 * major + minor


def device_of(t):
    """Launch on the tensor's GPU, not the current one (a process may hold cuda:1 tensors
    while cuda:0 is current); CPU tensors (the interpreter) need no guard."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@triton.jit
def factor_offset(stride, a: tl.constexpr):
    """a * stride in int64: the offset of factor a in an (A, N, T, D) tensor. stride = N T D
    fits int32 while a * stride may not (A = 3, N T D = 2^30), and int32 would wrap."""
    return stride.to(tl.int64) * a


@triton.jit
def full_blocks(m0, BM: tl.constexpr, BN: tl.constexpr, lo, hi, Tq, Tk, offset, window, CAUSAL: tl.constexpr):
    """[a, b) within the key blocks [lo, hi) (starts lo + k BN) that every query
    m0 .. m0 + BM - 1 sees whole: no mask needed there. A block starting at s is whole for
    every row when s + BN - 1 <= the first row's position (causal), s + BN <= Tk, and (with
    a window) s > the last row's position - window."""
    if CAUSAL:
        p_first = offset + m0
        p_last = offset + tl.minimum(m0 + BM, Tq) - 1
        need = tl.maximum(p_last - window + 1 - lo, 0) * (window > 0)
        a = tl.minimum(lo + (need + BN - 1) // BN * BN, hi)
        b = lo + tl.maximum(tl.minimum(p_first + 1, Tk) - lo, 0) // BN * BN
    else:
        a = lo
        b = lo + tl.maximum(Tk - lo, 0) // BN * BN
    b = tl.minimum(tl.maximum(b, a), hi)
    return a, b
