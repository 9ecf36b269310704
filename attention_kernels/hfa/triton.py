"""
HyperFeatureAttention in Triton ([IA] Def 5.1, E.2): flash attention whose score is the
product of A score tiles,

    s[i, j] = prod_{a=1..A} (q_a,i . k_a,j * scale)           (A = 1..4, scale = 1/sqrt(dh))
    out_i   = sum_j softmax_j(s[i, :] over visible j) v_j,

with one online softmax (running max and sum in fp32) and no T x T tensor. Visibility is
attention_kernels/masks.py's: causal, queries at an offset, the sliding window (pos - j < window).
The value is one tensor: hfa_v2's Hadamard product of value streams is formed by the
caller. Backward (two kernels, no atomics) recomputes the tiles from the saved
logsumexp: with dS = P * (dP - D_i) and T_a = q_a k_a^T * scale,
    dT_a = dS * prod_{b != a} T_b,   dq_a = scale dT_a k_a,   dk_a = scale dT_a^T q_a,
    dv   = P^T dO.
Inputs fp32, bf16 or fp16; products and statistics accumulate in fp32 (fp32 inputs use
IEEE fp32 dots, not TF32); any head size (padded to a power of two >= 16, masked loads).
"""

import torch
import triton
import triton.language as tl

from attention_kernels.triton_common import (LOG2E, _cast, _mm, _visible, arch_of, check_inputs, common_tiles,
                                             device_of, dot_precision, factor_offset, full_blocks, head_block, key_range,
                                             pipeline_stages, query_range, upcast_dots)

# the backward on sm_80 (mma.sync, per warp): (R, L, warps, stages) by head block and A
# (A = 4 at head blocks <= 32: 16 x 32 spilled 8 B non-causal once compiled with the launch's
# integer hints)
SM80_HFA_BWD = {32: {1: (64, 32, 4, 1), 2: (64, 32, 4, 1), 3: (64, 32, 4, 1), 4: (32, 16, 4, 1)},
                64: {1: (64, 32, 4, 1), 2: (32, 32, 4, 1), 3: (32, 32, 4, 1), 4: (32, 32, 4, 1)},
                128: {1: (64, 32, 4, 1), 2: (16, 32, 4, 1), 3: (16, 16, 4, 1), 4: (16, 64, 8, 1)}}

# the dq kernel at (head block, A), bf16/fp16 on sm_90, where it takes larger tiles than
# dk/dv: at dh 128, A = 2, 64 rows (wgmma) on one stage, 0.55 cycles per pair by
# the loop-only model (docs/kernel_design_history.md) against 0.92 on the shared 32 x 32 (dk/dv
# spilled 144 B there); at dh 128, A = 4, two stages: dk/dv's 16 x 64 on one stage spilled
# 8 B in the non-causal dq kernel once compiled with the launch's integer hints
HFA_BWD_DQ = {(128, 2): (64, 16, 4, 1), (128, 4): (16, 64, 8, 2)}


def block_sizes(kind, BD, A, dtype, arch=90):
    """(BM, BN, num_warps, num_stages) for kind 'hfa_fwd'; for 'hfa_bwd' (R, L, num_warps,
    num_stages): rows kept, rows per step, of both backward kernels but where 'hfa_bwd_dq'
    gives the dq kernel its own; for the GPU of compute capability `arch`. In the
    interpreter and for fp32: triton_common.common_tiles. On a GPU, the largest tiles whose
    live fp32 tiles fit 255 registers without spilling on sm_90 under triton 3.6 (torch
    2.11's) and 3.9, found with tools/compile_check.py (which prints registers and stack per
    configuration)."""
    shared = common_tiles(BD, dtype, arch, backward=kind != 'hfa_fwd')
    if shared:
        return shared
    if kind == 'hfa_bwd_dq':  # the dq kernel's own tiles where they differ from dk/dv's
        return (HFA_BWD_DQ.get((BD, A)) if arch >= 90 else None) or block_sizes('hfa_bwd', BD, A, dtype, arch)
    if kind == 'hfa_fwd':  # 128 rows on 8 warps: two warp groups of 64 rows, no tile twice
        if BD > 64:  # one stage; 64 columns spilled 8-48 B with A >= 2 (triton 3.6 or 3.9)
            return 128, 64 if A == 1 and arch >= 90 else 32, 8, 1
        # sm_80: 64 columns spilled 8 B with A = 4, and 32-56 B with A = 3 compiled with the
        # launch's integer hints; A = 4 on two stages 8 B at dh 32 (hints)
        cols = 32 if A >= 3 and arch < 90 else 64
        return 128, cols, 8, (1 if A == 4 and arch < 90 else 2) if A > 2 else pipeline_stages(BD)
    # backward: (rows each kernel keeps, rows per step, warps, stages); hfa_backward gives dq
    # R query rows and dk/dv R key rows, and every dot of both has R rows, so R = 64 runs
    # on wgmma. The largest R without spills on sm_90 (tools/compile_check.py): one stage
    # where two spilled (A = 3 at dh 64, A = 4 at dh 128); A = 4 at dh 64 and A = 3, 4 at
    # dh 128 spilled at every R >= 32 tried (8-2,600 B) and take 16-row tiles (mma.sync)
    if arch < 90:  # sm_80: its own, no spills (tools/compile_check.py --arch 80)
        return SM80_HFA_BWD[min(max(BD, 32), 128)][A]
    if BD > 64:  # A = 4: 16 x 16 on 4 warps spilled 8-24 B under triton 3.6 and ran 14 tile matmuls for 9
        return {1: (64, 16, 4, 2), 2: (32, 32, 4, 2), 3: (16, 32, 4, 2), 4: (16, 64, 8, 1)}[A]
    if A == 4 and BD <= 32:  # 16-row tiles on 4 warps compute tiles twice (and spilled 16 B at dh 16)
        return 16, 32, 2, 2
    # A = 4: a second stage spilled 8 B under triton 3.6
    return {1: (64, 64, 4, 3), 2: (64, 16, 4, 2), 3: (64, 16, 4, 1), 4: (16, 32, 4, 1)}[A]


@triton.jit
def _tile(q_ptr, k_ptr, sq, sk, a: tl.constexpr, rm, rn, rd, Tq, Tk, D: tl.constexpr,
          UP: tl.constexpr, PREC: tl.constexpr):
    """scale-free score tile q_a k_a^T (BM, BN), fp32."""
    q = tl.load(q_ptr + factor_offset(sq, a) + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < Tq) & (rd[None, :] < D), other=0.0)
    k = tl.load(k_ptr + factor_offset(sk, a) + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < Tk) & (rd[None, :] < D), other=0.0)
    return _mm(q, tl.trans(k), UP, PREC)


@triton.jit
def _product_except(t1, t2, t3, t4, skip: tl.constexpr, A: tl.constexpr):
    """prod_{b != skip} t_b over the first A tiles (A >= 2)."""
    if skip == 1:
        r = t2
    else:
        r = t1
        if skip != 2:
            r = r * t2
    if A >= 3:
        if skip != 3:
            r = r * t3
    if A >= 4:
        if skip != 4:
            r = r * t4
    return r


@triton.jit
def _score(q, k_ptr, sk, a: tl.constexpr, rn, rd, Tk, D: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """q k_a^T (BM, BN) for a loaded query tile q, fp32."""
    k = tl.load(k_ptr + factor_offset(sk, a) + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < Tk) & (rd[None, :] < D), other=0.0)
    return _mm(q, tl.trans(k), UP, PREC)


@triton.jit
def _fwd_sweep(m_i, l_i, acc, q1, q2, q3, q4, k_ptr, v_ptr, sk_a, pos, rd, Tk, window, scale, start0, end,
               A: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, UP: tl.constexpr,
               PREC: tl.constexpr, MASKED: tl.constexpr):
    """Online softmax over the key blocks [start0, end); MASKED False: blocks that every row
    of the tile sees whole (full_blocks), no visibility arithmetic."""
    for start in range(start0, end, BN):
        rn = start + tl.arange(0, BN)
        t = _score(q1, k_ptr, sk_a, 0, rn, rd, Tk, D, UP, PREC) * scale
        if A >= 2:
            t = t * (_score(q2, k_ptr, sk_a, 1, rn, rd, Tk, D, UP, PREC) * scale)
        if A >= 3:
            t = t * (_score(q3, k_ptr, sk_a, 2, rn, rd, Tk, D, UP, PREC) * scale)
        if A >= 4:
            t = t * (_score(q4, k_ptr, sk_a, 3, rn, rd, Tk, D, UP, PREC) * scale)
        if MASKED:
            s = tl.where(_visible(pos, rn, Tk, window, CAUSAL), t * LOG2E, float('-inf'))
        else:
            s = t * LOG2E
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < Tk) & (rd[None, :] < D), other=0.0)
        acc = acc * alpha[:, None] + _mm(_cast(p, v.dtype, UP), v, UP, PREC)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _hfa_fwd(Q, K, V, O, O32, LSE, sq_a, sk_a, Tq, Tk, offset, window, scale,
             A: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr, KEEP32: tl.constexpr):
    pid_m = tl.program_id(1)
    n = tl.program_id(0).to(tl.int64)  # heads on axis 0: up to 2^31 - 1
    q_ptr, k_ptr = Q + n * Tq * D, K + n * Tk * D
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    pos = offset + rm
    qp = q_ptr + rm[:, None] * D + rd[None, :]
    qm = (rm[:, None] < Tq) & (rd[None, :] < D)
    q1 = tl.load(qp, mask=qm, other=0.0)  # the A query tiles stay in registers
    q2, q3, q4 = q1, q1, q1
    if A >= 2:
        q2 = tl.load(qp + sq_a, mask=qm, other=0.0)
    if A >= 3:
        q3 = tl.load(qp + factor_offset(sq_a, 2), mask=qm, other=0.0)
    if A >= 4:
        q4 = tl.load(qp + factor_offset(sq_a, 3), mask=qm, other=0.0)
    m_i = tl.full([BM], float('-inf'), tl.float32)
    l_i = tl.full([BM], 0.0, tl.float32)
    acc = tl.full([BM, BD], 0.0, tl.float32)
    lo, hi = key_range(pid_m * BM, BM, BN, Tq, Tk, offset, window, CAUSAL)
    a, b = full_blocks(pid_m * BM, BM, BN, lo, hi, Tq, Tk, offset, window, CAUSAL)
    kv = (q1, q2, q3, q4, k_ptr, V + n * Tk * D, sk_a, pos, rd, Tk, window, scale)
    m_i, l_i, acc = _fwd_sweep(m_i, l_i, acc, *kv, lo, a, A, CAUSAL, D, BN, UP, PREC, True)
    m_i, l_i, acc = _fwd_sweep(m_i, l_i, acc, *kv, a, b, A, CAUSAL, D, BN, UP, PREC, False)
    m_i, l_i, acc = _fwd_sweep(m_i, l_i, acc, *kv, b, hi, A, CAUSAL, D, BN, UP, PREC, True)
    seen = l_i > 0.0  # a query that sees no key: output 0, logsumexp -inf
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / LOG2E, float('-inf'))
    tl.store(O + n * Tq * D + rm[:, None] * D + rd[None, :], _cast(out, O.dtype.element_ty, UP), mask=qm)
    if KEEP32:  # the fp32 output, for D_i = dO_i . O_i in backward
        tl.store(O32 + n * Tq * D + rm[:, None] * D + rd[None, :], out, mask=qm)
    tl.store(LSE + n * Tq + rm, lse, mask=rm < Tq)


@triton.jit
def _factors(x_ptr, y_ptr, sx, sy, rx, ry, rd, Tx, Ty, scale, A: tl.constexpr, D: tl.constexpr, UP: tl.constexpr,
             PREC: tl.constexpr):
    """The scaled factor tiles x_a y_a^T * scale (rx rows, ry columns; unused ones = T_1) and
    their product, the score tile: (q, k) for the query-block kernel, (k, q) transposed."""
    t1 = _tile(x_ptr, y_ptr, sx, sy, 0, rx, ry, rd, Tx, Ty, D, UP, PREC) * scale
    t2, t3, t4 = t1, t1, t1
    s = t1
    if A >= 2:
        t2 = _tile(x_ptr, y_ptr, sx, sy, 1, rx, ry, rd, Tx, Ty, D, UP, PREC) * scale
        s = s * t2
    if A >= 3:
        t3 = _tile(x_ptr, y_ptr, sx, sy, 2, rx, ry, rd, Tx, Ty, D, UP, PREC) * scale
        s = s * t3
    if A >= 4:
        t4 = _tile(x_ptr, y_ptr, sx, sy, 3, rx, ry, rd, Tx, Ty, D, UP, PREC) * scale
        s = s * t4
    return t1, t2, t3, t4, s


@triton.jit
def _probs(q_ptr, k_ptr, v_ptr, do_ptr, LSE, DELTA, n, sq_a, sk_a, rm, rn, rd, Tq, Tk, offset, window, scale,
           A: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """The (BM, BN) tiles of the backward: T_1..T_4 (scaled factors; unused ones = T_1),
    P and dS = P * (dP - D_i)."""
    t1, t2, t3, t4, s = _factors(q_ptr, k_ptr, sq_a, sk_a, rm, rn, rd, Tq, Tk, scale, A, D, UP, PREC)
    pos = offset + rm
    vis = _visible(pos, rn, Tk, window, CAUSAL) & (rm[:, None] < Tq)
    lse = tl.load(LSE + n * Tq + rm, mask=rm < Tq, other=0.0)
    lse = tl.where(lse == float('-inf'), 0.0, lse)  # a query that sees nothing: P = 0
    delta = tl.load(DELTA + n * Tq + rm, mask=rm < Tq, other=0.0)
    p = tl.where(vis, tl.exp2(s * LOG2E - lse[:, None] * LOG2E), 0.0)
    do = tl.load(do_ptr + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < Tq) & (rd[None, :] < D), other=0.0)
    v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < Tk) & (rd[None, :] < D), other=0.0)
    dp = _mm(do, tl.trans(v), UP, PREC)
    ds = p * (dp - delta[:, None])
    return t1, t2, t3, t4, p, ds, do


@triton.jit
def _probs_t(q_ptr, k_ptr, v_ptr, do_ptr, LSE, DELTA, n, sq_a, sk_a, rm, rn, rd, Tq, Tk, offset, window, scale,
             A: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """_probs transposed, (BN, BM) tiles for the key-block kernel: each dot then has the key
    block's rows (64: a wgmma tile) rather than the query step's."""
    t1, t2, t3, t4, s = _factors(k_ptr, q_ptr, sk_a, sq_a, rn, rm, rd, Tk, Tq, scale, A, D, UP, PREC)
    pos = offset + rm
    vis = (rn[:, None] < Tk) & (pos[None, :] >= 0) & (rm[None, :] < Tq)  # _visible, transposed
    if CAUSAL:
        vis = vis & (rn[:, None] <= pos[None, :]) & ((window == 0) | (pos[None, :] - rn[:, None] < window))
    lse = tl.load(LSE + n * Tq + rm, mask=rm < Tq, other=0.0)
    lse = tl.where(lse == float('-inf'), 0.0, lse)  # a query that sees nothing: P = 0
    delta = tl.load(DELTA + n * Tq + rm, mask=rm < Tq, other=0.0)
    p = tl.where(vis, tl.exp2(s * LOG2E - lse[None, :] * LOG2E), 0.0)
    do = tl.load(do_ptr + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < Tq) & (rd[None, :] < D), other=0.0)
    v = tl.load(v_ptr + rn[:, None] * D + rd[None, :], mask=(rn[:, None] < Tk) & (rd[None, :] < D), other=0.0)
    dp = _mm(v, tl.trans(do), UP, PREC)
    ds = p * (dp - delta[None, :])
    return t1, t2, t3, t4, p, ds, do


@triton.jit
def _factor_grad(ds, t1, t2, t3, t4, a: tl.constexpr, A: tl.constexpr):
    if A == 1:
        return ds
    return ds * _product_except(t1, t2, t3, t4, a, A)


@triton.jit
def _hfa_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sq_a, sk_a, Tq, Tk, offset, window, scale,
                A: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    pid_m = tl.program_id(1)
    n = tl.program_id(0).to(tl.int64)  # heads on axis 0: up to 2^31 - 1
    q_ptr, k_ptr, v_ptr, do_ptr = Q + n * Tq * D, K + n * Tk * D, V + n * Tk * D, DO + n * Tq * D
    rm = pid_m * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    dq1 = tl.full([BM, BD], 0.0, tl.float32)
    dq2, dq3, dq4 = dq1, dq1, dq1
    lo, hi = key_range(pid_m * BM, BM, BN, Tq, Tk, offset, window, CAUSAL)
    kmask = rd[None, :] < D
    for start in range(lo, hi, BN):
        rn = start + tl.arange(0, BN)
        t1, t2, t3, t4, p, ds, do = _probs(q_ptr, k_ptr, v_ptr, do_ptr, LSE, DELTA, n, sq_a, sk_a, rm, rn, rd,
                                           Tq, Tk, offset, window, scale, A, CAUSAL, D, UP, PREC)
        kp = k_ptr + rn[:, None] * D + rd[None, :]
        km = (rn[:, None] < Tk) & kmask
        k1 = tl.load(kp, mask=km, other=0.0)
        dq1 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 1, A), k1.dtype, UP), k1, UP, PREC)
        if A >= 2:
            k2 = tl.load(kp + sk_a, mask=km, other=0.0)
            dq2 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 2, A), k1.dtype, UP), k2, UP, PREC)
        if A >= 3:
            k3 = tl.load(kp + factor_offset(sk_a, 2), mask=km, other=0.0)
            dq3 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 3, A), k1.dtype, UP), k3, UP, PREC)
        if A >= 4:
            k4 = tl.load(kp + factor_offset(sk_a, 3), mask=km, other=0.0)
            dq4 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 4, A), k1.dtype, UP), k4, UP, PREC)
    dp = DQ + n * Tq * D + rm[:, None] * D + rd[None, :]
    om = (rm[:, None] < Tq) & (rd[None, :] < D)
    ty = DQ.dtype.element_ty
    tl.store(dp, _cast(dq1 * scale, ty, UP), mask=om)
    if A >= 2:
        tl.store(dp + sq_a, _cast(dq2 * scale, ty, UP), mask=om)
    if A >= 3:
        tl.store(dp + factor_offset(sq_a, 2), _cast(dq3 * scale, ty, UP), mask=om)
    if A >= 4:
        tl.store(dp + factor_offset(sq_a, 3), _cast(dq4 * scale, ty, UP), mask=om)


@triton.jit
def _hfa_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sq_a, sk_a, Tq, Tk, offset, window, scale,
                  A: tl.constexpr, CAUSAL: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    pid_n = tl.program_id(1)
    n = tl.program_id(0).to(tl.int64)  # heads on axis 0: up to 2^31 - 1
    q_ptr, k_ptr, v_ptr, do_ptr = Q + n * Tq * D, K + n * Tk * D, V + n * Tk * D, DO + n * Tq * D
    rn = pid_n * BN + tl.arange(0, BN)
    rd = tl.arange(0, BD)
    dk1 = tl.full([BN, BD], 0.0, tl.float32)
    dk2, dk3, dk4, dv = dk1, dk1, dk1, dk1
    lo, hi = query_range(pid_n * BN, BN, BM, Tq, Tk, offset, window, CAUSAL)
    qmask = rd[None, :] < D
    for start in range(lo, hi, BM):
        rm = start + tl.arange(0, BM)
        t1, t2, t3, t4, p, ds, do = _probs_t(q_ptr, k_ptr, v_ptr, do_ptr, LSE, DELTA, n, sq_a, sk_a, rm, rn, rd,
                                             Tq, Tk, offset, window, scale, A, CAUSAL, D, UP, PREC)
        dv += _mm(_cast(p, do.dtype, UP), do, UP, PREC)
        qp = q_ptr + rm[:, None] * D + rd[None, :]
        qm = (rm[:, None] < Tq) & qmask
        q1 = tl.load(qp, mask=qm, other=0.0)
        dk1 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 1, A), q1.dtype, UP), q1, UP, PREC)
        if A >= 2:
            q2 = tl.load(qp + sq_a, mask=qm, other=0.0)
            dk2 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 2, A), q1.dtype, UP), q2, UP, PREC)
        if A >= 3:
            q3 = tl.load(qp + factor_offset(sq_a, 2), mask=qm, other=0.0)
            dk3 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 3, A), q1.dtype, UP), q3, UP, PREC)
        if A >= 4:
            q4 = tl.load(qp + factor_offset(sq_a, 3), mask=qm, other=0.0)
            dk4 += _mm(_cast(_factor_grad(ds, t1, t2, t3, t4, 4, A), q1.dtype, UP), q4, UP, PREC)
    om = (rn[:, None] < Tk) & (rd[None, :] < D)
    kp = DK + n * Tk * D + rn[:, None] * D + rd[None, :]
    ty = DK.dtype.element_ty
    tl.store(kp, _cast(dk1 * scale, ty, UP), mask=om)
    if A >= 2:
        tl.store(kp + sk_a, _cast(dk2 * scale, ty, UP), mask=om)
    if A >= 3:
        tl.store(kp + factor_offset(sk_a, 2), _cast(dk3 * scale, ty, UP), mask=om)
    if A >= 4:
        tl.store(kp + factor_offset(sk_a, 3), _cast(dk4 * scale, ty, UP), mask=om)
    tl.store(DV + n * Tk * D + rn[:, None] * D + rd[None, :], _cast(dv, DV.dtype.element_ty, UP), mask=om)


def _check(q, k, v, what):
    check_inputs(what, q, k, v)
    A, N, Tq, D = q.shape
    if not 1 <= A <= 4:
        raise ValueError(f"the Triton HFA kernel takes 1 to 4 score factors, not {A}; use kernel='torch'")
    if k.shape[:2] != (A, N) or k.shape[-1] != D or v.shape != (N, k.size(2), D):
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    return A, N, Tq, k.size(2), D


def hfa_forward(q, k, v, offset, causal, window, scale):
    """q (A, N, Tq, dh), k (A, N, Tk, dh), v (N, Tk, dh), contiguous, one dtype.
    Returns out (N, Tq, dh) in that dtype, lse (N, Tq) fp32 (-inf: sees no key) and, for
    bf16/fp16 inputs, the output in fp32 (else None): backward's D_i = dO_i . O_i from the
    rounded output costs 2-3x the gradient error of SDPA once product scores sharpen the
    softmax; from the fp32 output it does not (measured in the tests)."""
    A, N, Tq, Tk, D = _check(q, k, v, 'hfa_forward')
    out = torch.empty(N, Tq, D, dtype=q.dtype, device=q.device)
    keep = q.dtype != torch.float32
    out32 = torch.empty(N, Tq, D, dtype=torch.float32, device=q.device) if keep else None
    lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    if N == 0 or Tq == 0:
        return out, lse, out32
    BD = head_block(D)
    BM, BN, warps, stages = block_sizes('hfa_fwd', BD, A, q.dtype, arch_of(q))
    grid = (N, triton.cdiv(Tq, BM))
    with device_of(q):
        _hfa_fwd[grid](q, k, v, out, out32 if keep else out, lse, N * Tq * D, N * Tk * D, Tq, Tk, offset, window if causal else 0, scale,
                       A=A, CAUSAL=causal, D=D, BD=BD, BM=BM, BN=BN, UP=upcast_dots(q.dtype),
                       PREC=dot_precision(q.dtype), KEEP32=keep, num_warps=warps, num_stages=stages)
    return out, lse, out32


def hfa_backward(q, k, v, out, lse, dout, offset, causal, window, scale):
    """Gradients (dq, dk, dv) of hfa_forward, in the inputs' dtype; `out` is best the fp32
    output of hfa_forward where it gave one."""
    A, N, Tq, Tk, D = _check(q, k, v, 'hfa_backward')
    dout = dout.contiguous()
    delta = (dout.float() * out.float()).sum(-1)  # D_i = dO_i . O_i
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if N == 0 or Tq == 0 or Tk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    BD = head_block(D)
    common = dict(A=A, CAUSAL=causal, D=D, BD=BD, UP=upcast_dots(q.dtype), PREC=dot_precision(q.dtype))
    win = window if causal else 0
    # each kernel keeps R rows (its accumulators) and steps L rows at a time: dq keeps R
    # queries, dk/dv R keys; their dots all have R rows (wgmma's 64 where R = 64)
    R, L, warps, stages = block_sizes('hfa_bwd_dq', BD, A, q.dtype, arch_of(q))
    with device_of(q):
        _hfa_bwd_dq[(N, triton.cdiv(Tq, R))](q, k, v, dout, lse, delta, dq, N * Tq * D, N * Tk * D, Tq, Tk,
                                             offset, win, scale, BM=R, BN=L, num_warps=warps,
                                             num_stages=stages, **common)
    R, L, warps, stages = block_sizes('hfa_bwd', BD, A, q.dtype, arch_of(q))
    with device_of(q):
        _hfa_bwd_dkdv[(N, triton.cdiv(Tk, R))](q, k, v, dout, lse, delta, dk, dv, N * Tq * D, N * Tk * D, Tq, Tk,
                                               offset, win, scale, BM=L, BN=R, num_warps=warps,
                                               num_stages=stages, **common)
    return dq, dk, dv

