"""
Linear attention in Triton ([IA] Eq. 1): the softmax removed, nothing else,

    out_i = (1 / c_i) sum_{j visible from i} (q_i . k_j * scale) v_j,

c_i = 1, or with `norm` the number of keys query i sees (linear_norm). Blockwise like flash
attention (the quadratic form: no T x T tensor, no state of size dh x dh), visibility as
attention_kernels/masks.py (causal, offset, sliding window). Backward, two kernels without atomics:
with g_i = dO_i / c_i,
    dq_i = scale sum_j (g_i . v_j) k_j,   dk_j = scale sum_i (g_i . v_j) q_i,   dv_j = sum_i s_ij g_i.
Inputs fp32, bf16 or fp16; dots accumulate in fp32; any head size (padded, masked loads).
Full causal self-attention over long sequences has its own kernels, triton_chunked.py (a
dh x dh state per chunk: work linear in T), which attention_kernels.dispatch chooses.
"""

import torch
import triton
import triton.language as tl

from attention_kernels.triton_common import (_cast, _mm, _visible, arch_of, check_inputs, common_tiles, device_of,
                                             dot_precision, head_block, key_range, pipeline_stages, query_range,
                                             upcast_dots)


def block_sizes(kind, BD, dtype, arch=90):
    """(BM, BN, num_warps, num_stages) of kind 'linear_fwd' or 'linear_bwd' for the GPU of
    compute capability `arch`; in the interpreter and for fp32: triton_common.common_tiles.
    The largest tiles without spills on sm_90 (tools/compile_check.py)."""
    shared = common_tiles(BD, dtype, arch, backward=kind == 'linear_bwd')
    if shared:
        return shared
    if kind == 'linear_fwd':  # 128 rows on 8 warps: two warp groups of 64 rows, no tile twice
        if BD > 64:  # sm_80: 64 columns spilled 8 B non-causal once compiled with the run-time hints
            return 128, 64 if arch >= 90 else 32, 8, 1
        return 128, 64, 8, pipeline_stages(BD)
    t = (128, 64, 8, 1) if BD > 64 else (64, 64, 4, pipeline_stages(BD))  # dh 128: 64 rows on 8 warps computed every tile twice
    # sm_80 (mma.sync, per warp): a second stage spilled 8-112 B in some of these kernels
    return t if arch >= 90 else t[:3] + (1,)


@triton.jit
def _count(pos, Tk, window, CAUSAL: tl.constexpr):
    """The number of keys each query position sees (at least 1, so that 0 / c = 0)."""
    if CAUSAL:
        hi = tl.minimum(pos + 1, Tk)
        lo = tl.maximum(pos - window + 1, 0) * (window > 0)
        c = hi - lo
    else:
        c = pos * 0 + Tk
    return tl.maximum(c, 1).to(tl.float32)


@triton.jit
def _linear_fwd(Q, K, V, O, Tq, Tk, offset, window, scale, CAUSAL: tl.constexpr, NORM: tl.constexpr,
                D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                UP: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(1)
    n = tl.program_id(0).to(tl.int64)  # heads on axis 0: up to 2^31 - 1
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    pos = offset + rm
    qm = (rm[:, None] < Tq) & (rd[None, :] < D)
    q = tl.load(Q + n * Tq * D + rm[:, None] * D + rd[None, :], mask=qm, other=0.0)
    acc = tl.full([BM, BD], 0.0, tl.float32)
    lo, hi = key_range(pid_m * BM, BM, BN, Tq, Tk, offset, window, CAUSAL)
    for start in range(lo, hi, BN):
        rn = start + tl.arange(0, BN)
        km = (rn[:, None] < Tk) & (rd[None, :] < D)
        k = tl.load(K + n * Tk * D + rn[:, None] * D + rd[None, :], mask=km, other=0.0)
        v = tl.load(V + n * Tk * D + rn[:, None] * D + rd[None, :], mask=km, other=0.0)
        s = tl.where(_visible(pos, rn, Tk, window, CAUSAL), _mm(q, tl.trans(k), UP, PREC) * scale, 0.0)
        acc += _mm(_cast(s, v.dtype, UP), v, UP, PREC)
    if NORM:
        acc = acc / _count(pos, Tk, window, CAUSAL)[:, None]
    tl.store(O + n * Tq * D + rm[:, None] * D + rd[None, :], _cast(acc, O.dtype.element_ty, UP), mask=qm)


@triton.jit
def _load_g(DO, n, rm, rd, pos, Tq, Tk, window, CAUSAL: tl.constexpr, NORM: tl.constexpr, D: tl.constexpr,
            UP: tl.constexpr):
    """g = dO / c (the normalisation moved onto the output gradient), in dO's dtype."""
    g = tl.load(DO + n * Tq * D + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < Tq) & (rd[None, :] < D),
                other=0.0)
    if NORM:
        g = _cast(g.to(tl.float32) / _count(pos, Tk, window, CAUSAL)[:, None], g.dtype, UP)
    return g


@triton.jit
def _linear_bwd_dq(K, V, DO, DQ, Tq, Tk, offset, window, scale, CAUSAL: tl.constexpr, NORM: tl.constexpr,
                   D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   UP: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(1)
    n = tl.program_id(0).to(tl.int64)  # heads on axis 0: up to 2^31 - 1
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    pos = offset + rm
    g = _load_g(DO, n, rm, rd, pos, Tq, Tk, window, CAUSAL, NORM, D, UP)
    acc = tl.full([BM, BD], 0.0, tl.float32)
    lo, hi = key_range(pid_m * BM, BM, BN, Tq, Tk, offset, window, CAUSAL)
    for start in range(lo, hi, BN):
        rn = start + tl.arange(0, BN)
        km = (rn[:, None] < Tk) & (rd[None, :] < D)
        k = tl.load(K + n * Tk * D + rn[:, None] * D + rd[None, :], mask=km, other=0.0)
        v = tl.load(V + n * Tk * D + rn[:, None] * D + rd[None, :], mask=km, other=0.0)
        ds = tl.where(_visible(pos, rn, Tk, window, CAUSAL), _mm(g, tl.trans(v), UP, PREC), 0.0)
        acc += _mm(_cast(ds, k.dtype, UP), k, UP, PREC)
    tl.store(DQ + n * Tq * D + rm[:, None] * D + rd[None, :], _cast(acc * scale, DQ.dtype.element_ty, UP),
             mask=(rm[:, None] < Tq) & (rd[None, :] < D))


@triton.jit
def _linear_bwd_dkdv(Q, K, V, DO, DK, DV, Tq, Tk, offset, window, scale, CAUSAL: tl.constexpr,
                     NORM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    pid_n = tl.program_id(1)
    n = tl.program_id(0).to(tl.int64)  # heads on axis 0: up to 2^31 - 1
    rn = pid_n * BN + tl.arange(0, BN)
    rd = tl.arange(0, BD)
    km = (rn[:, None] < Tk) & (rd[None, :] < D)
    k = tl.load(K + n * Tk * D + rn[:, None] * D + rd[None, :], mask=km, other=0.0)
    v = tl.load(V + n * Tk * D + rn[:, None] * D + rd[None, :], mask=km, other=0.0)
    dk = tl.full([BN, BD], 0.0, tl.float32)
    dv = tl.full([BN, BD], 0.0, tl.float32)
    lo, hi = query_range(pid_n * BN, BN, BM, Tq, Tk, offset, window, CAUSAL)
    for start in range(lo, hi, BM):
        rm = start + tl.arange(0, BM)
        pos = offset + rm
        q = tl.load(Q + n * Tq * D + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < Tq) & (rd[None, :] < D),
                    other=0.0)
        g = _load_g(DO, n, rm, rd, pos, Tq, Tk, window, CAUSAL, NORM, D, UP)
        vis = _visible(pos, rn, Tk, window, CAUSAL) & (rm[:, None] < Tq)  # (BM, BN)
        s = tl.where(vis, _mm(q, tl.trans(k), UP, PREC) * scale, 0.0)
        dp = tl.where(vis, _mm(g, tl.trans(v), UP, PREC), 0.0)
        dv += _mm(tl.trans(_cast(s, g.dtype, UP)), g, UP, PREC)
        dk += _mm(tl.trans(_cast(dp, q.dtype, UP)), q, UP, PREC)
    tl.store(DK + n * Tk * D + rn[:, None] * D + rd[None, :], _cast(dk * scale, DK.dtype.element_ty, UP), mask=km)
    tl.store(DV + n * Tk * D + rn[:, None] * D + rd[None, :], _cast(dv, DV.dtype.element_ty, UP), mask=km)


def _check(q, k, v, what):
    check_inputs(what, q, k, v)
    N, Tq, D = q.shape
    if k.shape != v.shape or k.shape[0] != N or k.size(-1) != D:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    return N, Tq, k.size(1), D


def _meta(q, causal, norm, D):
    BD = head_block(D)
    return BD, dict(CAUSAL=causal, NORM=norm, D=D, BD=BD, UP=upcast_dots(q.dtype), PREC=dot_precision(q.dtype))


def linear_forward(q, k, v, offset, causal, window, norm, scale):
    """q (N, Tq, dh), k, v (N, Tk, dh), contiguous, one dtype -> out (N, Tq, dh)."""
    N, Tq, Tk, D = _check(q, k, v, 'linear_forward')
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    BD, meta = _meta(q, causal, norm, D)
    BM, BN, warps, stages = block_sizes('linear_fwd', BD, q.dtype, arch_of(q))
    with device_of(q):
        _linear_fwd[(N, triton.cdiv(Tq, BM))](q, k, v, out, Tq, Tk, offset, window if causal else 0, scale,
                                              BM=BM, BN=BN, num_warps=warps, num_stages=stages, **meta)
    return out


def linear_backward(q, k, v, dout, offset, causal, window, norm, scale):
    """Gradients (dq, dk, dv) of linear_forward."""
    N, Tq, Tk, D = _check(q, k, v, 'linear_backward')
    dout = dout.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    BD, meta = _meta(q, causal, norm, D)
    BM, BN, warps, stages = block_sizes('linear_bwd', BD, q.dtype, arch_of(q))
    win = window if causal else 0
    with device_of(q):
        _linear_bwd_dq[(N, triton.cdiv(Tq, BM))](k, v, dout, dq, Tq, Tk, offset, win, scale, BM=BM, BN=BN,
                                                 num_warps=warps, num_stages=stages, **meta)
    with device_of(q):
        _linear_bwd_dkdv[(N, triton.cdiv(Tk, BN))](q, k, v, dout, dk, dv, Tq, Tk, offset, win, scale, BM=BM, BN=BN,
                                                   num_warps=warps, num_stages=stages, **meta)
    return dq, dk, dv

