"""
Causal linear attention in chunks ([IA] Eq. 1; the chunked form of linear attention as in
Katharopoulos et al. 2020 and flash-linear-attention): the same result as triton.py's
quadratic kernel for full causal self-attention (no window, no offset), with work linear in T.

Split the sequence into chunks of BT positions. With S_c = sum_{j in chunks before c} k_j v_j^T
(dh x dh, fp32), a query i in chunk c reads

    out_i = (scale / c_i) (q_i^T S_c + sum_{j in c, j <= i} (q_i . k_j) v_j)

(c_i = i + 1 with `norm`, else 1). Backward, with g_i = dO_i / c_i and the reverse state
R_c = sum_{i in chunks after c} q_i g_i^T:

    dq_c = scale (G_c S_c^T + tril(G_c V_c^T) K_c)
    dk_c = scale (V_c R_c^T + tril(G_c V_c^T)^T Q_c)
    dv_c = scale (K_c R_c + tril(Q_c K_c^T)^T G_c)

Kernels: `_states` runs once per head over the chunks in order (or reversed) and writes each
chunk's exclusive state (S from K, V; R from Q, G); the output and gradient kernels then run
every chunk in parallel. The state is stored in fp32 and rounded to the inputs' dtype for the
tensor-core dots, as the inputs are. FLOPs per head: about 4 T BT dh (within chunks) + 4 T dh^2
(states), against 2 T^2 dh for the quadratic form.
"""

import torch
import triton
import triton.language as tl

from attention_kernels.triton_common import (INTERPRETED, _cast, _mm, arch_of, check_inputs, device_of, dot_precision,
                                             head_block, upcast_dots)

def chunk_size(dtype, arch=90):
    """Positions per chunk: 64 (wgmma's tile height) for bf16 / fp16 on sm_90, 32 before it
    (64 spilled or overran shared memory on sm_80); 16 for fp32 (its dots run on the FMA
    units, and 64-row fp32 tiles spill) and in the interpreter (more chunk edges)."""
    if INTERPRETED or dtype == torch.float32:
        return 16
    return 64 if arch >= 90 else 32


def _launch(BD, arch):
    """(num_warps, num_stages). sm_90: 4 warps = one warp group (with 8, both groups computed
    the same 64-row tiles: 7 tile matmuls per chunk for 4 at dh 128), no spills. sm_80
    (mma.sync, per warp): 8 warps at dh 128 and one stage, where 4 warps and 2 stages spilled."""
    return (4, 2) if arch >= 90 else (8 if BD > 64 else 4, 1)


@triton.jit
def _load(X, n, rows, rd, seqlen, D: tl.constexpr):
    m = (rows[:, None] < seqlen) & (rd[None, :] < D)
    return tl.load(X + n * seqlen * D + rows[:, None] * D + rd[None, :], mask=m, other=0.0)


@triton.jit
def _scaled_rows(x, rows, NORM: tl.constexpr, UP: tl.constexpr):
    """x / (position + 1) row by row with NORM (the number of keys a causal query sees), in x's dtype."""
    if NORM:
        x = _cast(x.to(tl.float32) / (rows + 1).to(tl.float32)[:, None], x.dtype, UP)
    return x


@triton.jit
def _states(X, Y, S, seqlen, nchunks, NORM_Y: tl.constexpr, REVERSE: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
            BT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """S[n, c] = sum of X_j Y_j^T over the chunks before c (after c with REVERSE), fp32."""
    n = tl.program_id(0).to(tl.int64)
    rd = tl.arange(0, BD)
    acc = tl.full([BD, BD], 0.0, tl.float32)
    for step in range(0, nchunks):
        c = (nchunks - 1 - step) if REVERSE else step
        tl.store(S + (n * nchunks + c) * D * D + rd[:, None] * D + rd[None, :], acc,
                 mask=(rd[:, None] < D) & (rd[None, :] < D))
        rows = c * BT + tl.arange(0, BT)
        x = _load(X, n, rows, rd, seqlen, D)
        y = _scaled_rows(_load(Y, n, rows, rd, seqlen, D), rows, NORM_Y, UP)
        acc += _mm(tl.trans(x), y, UP, PREC)


@triton.jit
def _state(S, n, c, nchunks, rd, D: tl.constexpr, dtype: tl.constexpr, UP: tl.constexpr):
    m = (rd[:, None] < D) & (rd[None, :] < D)
    s = tl.load(S + (n * nchunks + c) * D * D + rd[:, None] * D + rd[None, :], mask=m, other=0.0)
    return _cast(s, dtype, UP)


@triton.jit
def _causal_chunk(x, a, b, s, rows, UP: tl.constexpr, PREC: tl.constexpr):
    """x s + tril(x a^T) b in float32: a chunk's rows x against the state s of the chunks
    before it and, causally, against its own rows (output: q, k, v, S; dq: g, v, k, S^T)."""
    acc = _mm(x, s, UP, PREC)
    p = tl.where(rows[:, None] >= rows[None, :], _mm(x, tl.trans(a), UP, PREC), 0.0)
    return acc + _mm(_cast(p, b.dtype, UP), b, UP, PREC)


@triton.jit
def _chunk_fwd(Q, K, V, S, O, seqlen, nchunks, scale, NORM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
               BT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    rows = c * BT + tl.arange(0, BT)
    rd = tl.arange(0, BD)
    q = _load(Q, n, rows, rd, seqlen, D)
    k = _load(K, n, rows, rd, seqlen, D)
    v = _load(V, n, rows, rd, seqlen, D)
    acc = _causal_chunk(q, k, v, _state(S, n, c, nchunks, rd, D, q.dtype, UP), rows, UP, PREC) * scale
    if NORM:
        acc = acc / (rows + 1).to(tl.float32)[:, None]
    tl.store(O + n * seqlen * D + rows[:, None] * D + rd[None, :], _cast(acc, O.dtype.element_ty, UP),
             mask=(rows[:, None] < seqlen) & (rd[None, :] < D))


@triton.jit
def _chunk_bwd_dq(K, V, DO, S, DQ, seqlen, nchunks, scale, NORM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                  BT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    rows = c * BT + tl.arange(0, BT)
    rd = tl.arange(0, BD)
    g = _scaled_rows(_load(DO, n, rows, rd, seqlen, D), rows, NORM, UP)
    k = _load(K, n, rows, rd, seqlen, D)
    v = _load(V, n, rows, rd, seqlen, D)
    acc = _causal_chunk(g, v, k, tl.trans(_state(S, n, c, nchunks, rd, D, g.dtype, UP)), rows, UP, PREC)
    tl.store(DQ + n * seqlen * D + rows[:, None] * D + rd[None, :], _cast(acc * scale, DQ.dtype.element_ty, UP),
             mask=(rows[:, None] < seqlen) & (rd[None, :] < D))


@triton.jit
def _chunk_bwd_dkdv(Q, K, V, DO, R, DK, DV, seqlen, nchunks, scale, NORM: tl.constexpr, D: tl.constexpr,
                    BD: tl.constexpr, BT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    rows = c * BT + tl.arange(0, BT)
    rd = tl.arange(0, BD)
    q = _load(Q, n, rows, rd, seqlen, D)
    k = _load(K, n, rows, rd, seqlen, D)
    v = _load(V, n, rows, rd, seqlen, D)
    g = _scaled_rows(_load(DO, n, rows, rd, seqlen, D), rows, NORM, UP)
    r = _state(R, n, c, nchunks, rd, D, q.dtype, UP)
    causal = rows[:, None] >= rows[None, :]  # (query i, key j) within the chunk
    dp = tl.where(causal, _mm(g, tl.trans(v), UP, PREC), 0.0)
    dk = _mm(v, tl.trans(r), UP, PREC) + _mm(tl.trans(_cast(dp, q.dtype, UP)), q, UP, PREC)
    s = tl.where(causal, _mm(q, tl.trans(k), UP, PREC), 0.0)
    dv = _mm(k, r, UP, PREC) + _mm(tl.trans(_cast(s, g.dtype, UP)), g, UP, PREC)
    out = n * seqlen * D + rows[:, None] * D + rd[None, :]
    m = (rows[:, None] < seqlen) & (rd[None, :] < D)
    tl.store(DK + out, _cast(dk * scale, DK.dtype.element_ty, UP), mask=m)
    tl.store(DV + out, _cast(dv * scale, DV.dtype.element_ty, UP), mask=m)


def _meta(q, D):
    BD = head_block(D)
    BT = chunk_size(q.dtype, arch_of(q))
    return BD, dict(D=D, BD=BD, BT=BT, UP=upcast_dots(q.dtype), PREC=dot_precision(q.dtype))


def _state_pass(x, y, norm_y, reverse, meta):
    N, T, D = x.shape
    NC = triton.cdiv(T, meta['BT'])
    s = torch.empty(N, NC, D, D, device=x.device, dtype=torch.float32)
    w, st = _launch(meta['BD'], arch_of(x))
    _states[(N,)](x, y, s, T, NC, NORM_Y=norm_y, REVERSE=reverse, num_warps=w, num_stages=st, **meta)
    return s, NC


def chunked_forward(q, k, v, norm, scale):
    """q, k, v (N, T, dh), contiguous, one dtype -> out (N, T, dh): causal, no window."""
    check_inputs('chunked_forward', q, k, v)
    N, T, D = q.shape
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    BD, meta = _meta(q, D)
    with device_of(q):
        s, NC = _state_pass(k, v, False, False, meta)
        w, st = _launch(BD, arch_of(q))
        _chunk_fwd[(N, NC)](q, k, v, s, out, T, NC, scale, NORM=norm, num_warps=w, num_stages=st, **meta)
    return out


def chunked_backward(q, k, v, dout, norm, scale):
    """(dq, dk, dv) of chunked_forward."""
    check_inputs('chunked_backward', q, k, v)
    N, T, D = q.shape
    dout = dout.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0:
        return dq, dk, dv
    BD, meta = _meta(q, D)
    w, st = _launch(BD, arch_of(q))
    with device_of(q):
        s, NC = _state_pass(k, v, False, False, meta)  # recomputed: cheaper than keeping N T/BT dh^2 floats
        _chunk_bwd_dq[(N, NC)](k, v, dout, s, dq, T, NC, scale, NORM=norm, num_warps=w, num_stages=st, **meta)
        del s
        r, _ = _state_pass(q, dout, norm, True, meta)
        _chunk_bwd_dkdv[(N, NC)](q, k, v, dout, r, dk, dv, T, NC, scale, NORM=norm, num_warps=w, num_stages=st, **meta)
    return dq, dk, dv

