"""
Pieces shared by the Triton kernels of every family (HA, HFA, linear): constants, the
dtypes they take and the input checks, dots with fp32 accumulation and round-to-nearest
casts (both interpreter-aware), the visibility rule of attention_kernels/masks.py on tiles,
the key (query) blocks a query (key) block has to visit, and the tiles every family takes
in the interpreter and for float32 inputs. Each family's own tile table lives with its
kernels.

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

from attention_kernels import TRITON_DTYPES as DTYPES  # the dtypes every Triton kernel takes

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e)): exp2 is the fast instruction
LN2 = tl.constexpr(0.6931471805599453)
INTERPRETED = bool(getattr(getattr(triton, 'knobs', None), 'runtime', None)
                   and triton.knobs.runtime.interpret)


@triton.jit
def _mm(a, b, UP: tl.constexpr, PREC: tl.constexpr, acc=None):
    """a @ b (+ acc) with fp32 accumulation; UP widens both operands to fp32 first
    (interpreter: it multiplies bf16 tiles as their raw bits)."""
    if UP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _cast(x, dtype: tl.constexpr, UP: tl.constexpr):
    """x.to(dtype) rounded to nearest-even as on the GPU; UP (interpreter) and dtype bf16:
    the interpreter truncates fp32 -> bf16, so the rounding is done on the bits first."""
    if UP and dtype == tl.bfloat16:
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


def common_tiles(BD, dtype, arch, backward):
    """(rows, cols, num_warps, num_stages) that HFA's and linear attention's blockwise kernels
    share, where their own tables (in their family) do not apply; None elsewhere. In the
    interpreter small tiles (more block edges tested); fp32 dots run on FMA units, not
    tensor cores: small tiles, and on sm_80 one stage (3 stages of HFA A = 4 needed 176 KB
    of its smaller shared memory)."""
    if INTERPRETED:
        return 16, 16, 1, 1
    if dtype != torch.float32:
        return None
    stages = 1 if arch < 90 else pipeline_stages(BD)
    return (16, 32, 4, stages) if BD > 64 and backward else (32, 32, 4, stages)


def pipeline_stages(BD):
    """Software-pipeline stages of a blockwise kernel's key (query) loop by head block."""
    return 2 if BD > 64 else 3


def check_inputs(what, q, *others):
    """Every input in q's dtype, one of DTYPES, and on q's device (shapes: the family's)."""
    for t in others:
        if t.dtype != q.dtype:
            raise ValueError(f"{what}: all inputs must share q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{what}: all inputs must be on q's device {q.device}, got {t.device}")
    if q.dtype not in DTYPES:
        raise ValueError(f"{what}: dtype {q.dtype} unsupported; use float32, bfloat16 or float16 "
                         f"(kernel='torch' for others)")


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
