"""
Triton kernels of order-3 HyperAttention, forward and backward, exact ([IA] Def 6.1;
2-simplicial attention with windows, Roy et al. 2025). Per head:

    logit[i, j1, j2] = scale * sum_s q[i,s] k1[j1,s] k2[j2,s]
    P[i]             = softmax over the visible pairs (j1, j2)
    out[i]           = sum_{j1,j2} P[i, j1, j2] v1[j1] * v2[j2]          (elementwise)

Query i sits at position p = offset + i, key j at j. Causal: j1, j2 <= p; a window w1 > 0
also keeps p - j1 < w1, w2 > 0 keeps p - j2 < w2. Non-causal: every pair, windows ignored.
A query that sees no pair returns 0 and lse = -inf, with zero gradients.

Tiling. The logit is symmetric in the two key slots, so the wrapper names "a" the slot
with the narrower reach and "b" the other one (for windows (512, 32): a = slot 2). A tile
is a flash-attention tile whose rows are *lanes*: a lane is a (query i, key ja) pair with
row vector  A = scale * q_i * ka_ja  (elementwise, formed in registers), and whose columns
are a block of b keys:
    logits (R, BB) = A @ kb^T,   value sum = v_a * (P @ vb)  per lane.
Lanes are skewed, ja = p - t for t in a block of BA, so that each query's lanes cover
exactly its own window of a keys; G queries x BA lanes = R rows (64-128) share each column
block. Column blocks are swept with an online softmax per lane; lanes of one query are then
merged (their own max, sum and accumulator) into the query's statistics. Column blocks
that every lane sees whole skip the masks; blocks that causality or the windows hide from
every lane are never visited, so windowed HA costs O(T w1 w2 dh). Nothing larger than
O(T dh) is written: out and the per-query logsumexp lse (float32).

Backward, deterministic (no atomics), each kernel owning what it writes and recomputing
P = exp(logit - lse) from the saved lse; dP = dO_i . (va * vb), dS = P (dP - D_i),
D_i = dO_i . out_i (precomputed, O(T), from the forward's float32 output when given):
  _ha3_bwd_dq_kernel   query blocks, lanes (i, ja), sweep b columns: Gk = dS @ kb;
                       dq_i = scale sum_ja ka * Gk.
  _ha3_bwd_da_kernel   blocks of a keys, lanes (ja, i) (the queries that see ja), sweep b
                       columns: Gk = dS @ kb, Gv = P @ vb;
                       dka = scale sum_i q_i * Gk,  dva = sum_i dO_i * Gv.
  _ha3_bwd_db_kernel   blocks of b keys (columns), loop over the lane tiles that see them:
                       dkb = scale dS^T @ (q * ka),  dvb = P^T @ (dO * va).
  _ha3_bwd_dqa_kernel  dq and slot a in one sweep where every query's a keys fit one lane
                       tile (causal, narrow a window: the GPU configs' (512, 32)): the lanes
                       of a query group give Gk and Gv once; dq sums them along ja (owned),
                       slot a's dk, dv along i, added (float32, one query's lanes at a
                       time) into a plane per program parity (two programs of one parity
                       never share a key), the two summed once at the end: deterministic.
Elsewhere dq and slot a are two kernels (the same dS summed along different axes): full
causal at long T and non-causal, where an a key's queries span more programs than two
planes hold, and head size 256 (at 128 the fused kernel takes 32-lane tiles; 64 spilled).
From head size 128 the unfused slot a's and slot b's dk and dv are two launches each (one
accumulator each fits the registers).
Statistics, accumulators and gradient sums are float32 whatever the input dtype; matmul
inputs are the input dtype (fp32 inputs use IEEE fp32 dots, not TF32). A lane row is a
product of two inputs, which the input dtype rounds to half its digits (bf16 keeps 8 bits
of the product's 16); larger logits turn that into a larger error of exp. split_products
says how the lane products enter the logit (and dP) matmuls, in the forward and the
backward alike (they must agree: P = exp(logit - lse)): 'none' rounded to the input
dtype; 'logits', 'both' as hi + lo, two matmuls each; 'fp16' (bf16 inputs) in float16,
11 bits in one matmul, every float16 operand scaled by a power of two per head (keys,
values, lanes) or per query row (dO) into float16's range, on the device (_f16_scales,
_f16_rows), and the matmuls that sum over lanes or columns in scaled units, taken back
exactly after. Defaults (default_split): bf16 'fp16', fp16 'both' ('none' missed 2x
SDPA's bf16 error at logits of size 3); errors in docs/kernel_design_history.md.

Tile matmuls per (lane tile x column block) step, for FLOP accounting: forward 2 (3 with
hi + lo); backward 3 (dq) + 4 (slot a) + 4 (slot b) = 11 with 'none' or 'fp16', 17 with
'both'; fused, 4 (dq and slot a) + 4 = 8, 6 + 6 = 12 with 'both'; one warp group (4 warps)
per 64 tile rows, so no tile is computed twice (tools/compile_check.py counts them in the
compiled code), except where TILES says otherwise (head size 128).
"""


import torch
import triton
import triton.language as tl

from attention_kernels.triton_common import (LN2, LOG2E, _cast, _mm, arch_of, check_inputs, device_of, dot_precision,
                                             head_block, upcast_dots)


# -----------------------------------------------------------------------------
# shared pieces

@triton.jit
def _pos(i, offset, Tk, CAUSAL: tl.constexpr):
    """Absolute position of query i; without causality every query sees every key, which
    the masks below express as the position Tk - 1 (windows are then infinite)."""
    p = offset + i
    if not CAUSAL:
        p = i * 0 + (Tk - 1)
    return p


@triton.jit
def _rows(base, rows, ok, d, DH: tl.constexpr, DP: tl.constexpr, MASK_ROWS: tl.constexpr = True):
    """Rows `rows` of a row-major (T, DH) matrix as an (M, DP) block in its own dtype; rows
    where ok is False (MASK_ROWS: else every row is read) and the padding columns d >= DH
    read as 0."""
    ptr = base + rows[:, None] * DH + d[None, :]
    if MASK_ROWS:
        if DH == DP:
            x = tl.load(ptr, mask=ok[:, None], other=0.0)
        else:
            x = tl.load(ptr, mask=ok[:, None] & (d[None, :] < DH), other=0.0)
    else:
        if DH == DP:
            x = tl.load(ptr)
        else:
            x = tl.load(ptr, mask=d[None, :] < DH, other=0.0)
    return x


@triton.jit
def _gather(base, rows, ok, d, DH: tl.constexpr, DP: tl.constexpr):
    """_rows in float32."""
    return _rows(base, rows, ok, d, DH, DP).to(tl.float32)


@triton.jit
def _split(x, dt: tl.constexpr, UP: tl.constexpr, ON: tl.constexpr, F16: tl.constexpr = False):
    """float32 x as hi + lo in the matmul dtype: a product of two bf16 (or fp16) numbers is
    then held almost exactly, where hi alone would round it to 8 (11) bits. ON False: lo is
    hi and unused (the dots then take hi alone). F16 (SPLIT 3): hi is x in float16 (11
    bits; the caller has scaled x into its range) for the logit and dP matmuls, lo is x
    in dt for the matmuls that sum over lanes (slot b's dk and dv)."""
    if F16:
        hi = _cast(x, tl.float16, UP)
        lo = _cast(x, dt, UP)
    else:
        hi = _cast(x, dt, UP)
        lo = hi
        if ON:
            lo = _cast(x - hi.to(tl.float32), dt, UP)
    return hi, lo


@triton.jit
def _pair_dot(hi, lo, bT, SPLIT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """(hi + lo) @ bT with float32 accumulation; SPLIT False: hi @ bT."""
    if SPLIT:
        acc = _mm(lo, bT, UP, PREC)
        acc = _mm(hi, bT, UP, PREC, acc)
    else:
        acc = _mm(hi, bT, UP, PREC)
    return acc


@triton.jit
def _pair_dot_t(b, hi, lo, SPLIT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """b @ (hi + lo)^T with float32 accumulation; SPLIT False: b @ hi^T."""
    if SPLIT:
        acc = _mm(b, tl.trans(lo), UP, PREC)
        acc = _mm(b, tl.trans(hi), UP, PREC, acc)
    else:
        acc = _mm(b, tl.trans(hi), UP, PREC)
    return acc


@triton.jit
def _key_tile(base, j, j_end, d, DH: tl.constexpr, DP: tl.constexpr, MASKED: tl.constexpr):
    """Key rows j (BB,) as a (BB, DP) tile in the input dtype; MASKED: rows >= j_end read 0."""
    ptr = base + j[:, None] * DH + d[None, :]
    if MASKED:
        if DH == DP:
            x = tl.load(ptr, mask=(j < j_end)[:, None], other=0.0)
        else:
            x = tl.load(ptr, mask=(j < j_end)[:, None] & (d[None, :] < DH), other=0.0)
    else:
        if DH == DP:
            x = tl.load(ptr)
        else:
            x = tl.load(ptr, mask=d[None, :] < DH, other=0.0)
    return x


@triton.jit
def _column_regions(p_min, p_max, Tk, Wb, BB: tl.constexpr):
    """Split the b keys seen by lanes at positions [p_min, p_max] into a leading masked
    range [lo, lead_end), an unmasked run of whole blocks [lead_end, mid_end) that every
    lane sees, and a trailing masked range [mid_end, hi)."""
    lo = tl.maximum(0, p_min - Wb + 1)
    hi = tl.minimum(p_max, Tk - 1) + 1
    in_lo = tl.maximum(lo, p_max - Wb + 1)
    in_hi = tl.minimum(p_min, Tk - 1) + 1
    n_in = tl.maximum(in_hi - in_lo, 0) // BB
    lead_end = tl.minimum(in_lo, hi)
    mid_end = tl.maximum(in_lo + n_in * BB, lead_end)
    return lo, lead_end, mid_end, hi


@triton.jit
def _visible(j, p_r, Wb):
    """(R, BB) visibility of b keys j for lanes at positions p_r (the a key is checked
    when the lane is formed)."""
    return (j[None, :] <= p_r[:, None]) & (p_r[:, None] - j[None, :] < Wb)


@triton.jit
def _head_scales(SC, n, qk_scale, SPLIT: tl.constexpr):
    """(lane scale, logit unscale u, Gk unscale, slot b's dv unscale) of head n. SPLIT 3
    (float16 products): from SC, see _f16_scales; else qk_scale and ones, constants the
    compiler folds away."""
    if SPLIT == 3:
        s_lane = tl.load(SC + n * 4)
        u = tl.load(SC + n * 4 + 1)
        gk = tl.load(SC + n * 4 + 2)
        dvb = tl.load(SC + n * 4 + 3)
    else:
        s_lane = qk_scale
        u = 1.0
        gk = 1.0
        dvb = 1.0
    return s_lane, u, gk, dvb


# -----------------------------------------------------------------------------
# forward

@triton.jit
def _fwd_sweep(A, A_lo, m, l, acc, KB, VB, p_r, j0, j1, Wb, d, u,
               DH: tl.constexpr, DP: tl.constexpr, BB: tl.constexpr,
               MASKED: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr, SPLIT: tl.constexpr):
    """Online softmax of the lanes A (R, DP) over b keys [j0, j1); the base-2 logits are
    u times the matmul's (m in the matmul's units; u is 1.0 but for SPLIT 3)."""
    for s in range(j0, j1, BB):
        j = s + tl.arange(0, BB)
        kb = _key_tile(KB, j, j1, d, DH, DP, MASKED)
        vb = _key_tile(VB, j, j1, d, DH, DP, MASKED)
        S = _pair_dot(A, A_lo, tl.trans(kb), SPLIT == 1 or SPLIT == 2, UP, PREC)
        if MASKED:
            S = tl.where(_visible(j, p_r, Wb) & (j < j1)[None, :], S, float('-inf'))
        m_new = tl.maximum(m, tl.max(S, 1))
        m_use = tl.where(m_new == float('-inf'), 0.0, m_new)  # lanes that saw nothing yet
        P = tl.math.exp2(S * u - (m_use * u)[:, None])
        alpha = tl.math.exp2((m - m_use) * u)
        l = l * alpha + tl.sum(P, 1)
        acc = _mm(_cast(P, VB.dtype.element_ty, UP), vb, UP, PREC, acc * alpha[:, None])
        m = m_new
    return m, l, acc


@triton.jit
def _ha3_fwd_kernel(Q, KA, KB, VA, VB, O, O32, LSE, SC,
                    Tq, Tk, offset, Wa, Wb, qk_scale,
                    CAUSAL: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr,
                    G: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr,
                    KEEP32: tl.constexpr, SPLIT: tl.constexpr):
    R: tl.constexpr = G * BA
    n = tl.program_id(1).to(tl.int64)
    i0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * G  # longest causal rows first
    Q += n * Tq * DH
    O += n * Tq * DH
    O32 += n * Tq * DH
    LSE += n * Tq
    KA += n * Tk * DH
    KB += n * Tk * DH
    VA += n * Tk * DH
    VB += n * Tk * DH
    dt = Q.dtype.element_ty
    s_lane, u, _, _ = _head_scales(SC, n, qk_scale, SPLIT)

    d = tl.arange(0, DP)
    r = tl.arange(0, R)
    i_r = i0 + r // BA
    t_r = r % BA
    q_ok = i_r < Tq
    p_r = _pos(i_r, offset, Tk, CAUSAL)
    p_lo = _pos(i0, offset, Tk, CAUSAL)
    p_hi = _pos(tl.minimum(i0 + G, Tq) - 1, offset, Tk, CAUSAL)
    lo, lead_end, mid_end, hi = _column_regions(p_lo, p_hi, Tk, Wb, BB)

    M = tl.full((G,), float('-inf'), tl.float32)
    L = tl.zeros((G,), tl.float32)
    Oacc = tl.zeros((G, DP), tl.float32)
    t_lo = tl.maximum(0, p_lo - (Tk - 1))
    t_hi = tl.minimum(p_hi, Wa - 1) + 1
    for tb in range(t_lo, t_hi, BA):
        tp = tb + t_r
        ja = p_r - tp
        ok = q_ok & (ja >= 0) & (ja < Tk) & (tp < Wa)
        A, A_lo = _split(_gather(Q, i_r, ok, d, DH, DP) * s_lane * _gather(KA, ja, ok, d, DH, DP), dt, UP,
                         SPLIT == 1, SPLIT == 3)
        m = tl.full((R,), float('-inf'), tl.float32)
        l = tl.zeros((R,), tl.float32)
        acc = tl.zeros((R, DP), tl.float32)
        m, l, acc = _fwd_sweep(A, A_lo, m, l, acc, KB, VB, p_r, lo, lead_end, Wb, d, u, DH, DP, BB, True, UP, PREC, SPLIT)
        m, l, acc = _fwd_sweep(A, A_lo, m, l, acc, KB, VB, p_r, lead_end, mid_end, Wb, d, u, DH, DP, BB, False, UP, PREC, SPLIT)
        m, l, acc = _fwd_sweep(A, A_lo, m, l, acc, KB, VB, p_r, mid_end, hi, Wb, d, u, DH, DP, BB, True, UP, PREC, SPLIT)
        # merge the lanes of each query: lane r holds sum_jb exp2(s - m_r) vb, times va
        m = tl.where(ok, m, float('-inf'))
        c = acc * _gather(VA, ja, ok, d, DH, DP)
        m3 = tl.reshape(m, (G, BA))
        M_new = tl.maximum(M, tl.max(m3, 1))
        M_use = tl.where(M_new == float('-inf'), 0.0, M_new)
        w = tl.math.exp2((m3 - M_use[:, None]) * u)
        alpha = tl.math.exp2((M - M_use) * u)
        L = L * alpha + tl.sum(tl.reshape(l, (G, BA)) * w, 1)
        Oacc = Oacc * alpha[:, None] + tl.sum(tl.reshape(c, (G, BA, DP)) * w[:, :, None], 1)
        M = M_new

    gi = i0 + tl.arange(0, G)
    seen = L > 0
    L_div = tl.where(seen, L, 1.0)
    out = tl.where(seen[:, None], Oacc / L_div[:, None], 0.0)
    lse = tl.where(seen, (M * u + tl.log2(L_div)) * LN2, float('-inf'))
    o_mask = (gi < Tq)[:, None] & (d[None, :] < DH)
    tl.store(O + gi[:, None] * DH + d[None, :], _cast(out, dt, UP), mask=o_mask)
    if KEEP32:  # for backward's D_i = dO_i . out_i (the rounded output adds gradient error)
        tl.store(O32 + gi[:, None] * DH + d[None, :], out, mask=o_mask)
    tl.store(LSE + gi, lse, mask=gi < Tq)


# -----------------------------------------------------------------------------
# backward

@triton.jit
def _head_inputs(n, Tq, Tk, Q, KA, KB, VA, VB, DO, LSE, DELTA, W, DH: tl.constexpr):
    """The backward kernels' inputs moved to head n: query rows (Tq, DH), key rows (Tk, DH)
    and per-query statistics (Tq,)."""
    return (Q + n * Tq * DH, KA + n * Tk * DH, KB + n * Tk * DH, VA + n * Tk * DH, VB + n * Tk * DH,
            DO + n * Tq * DH, LSE + n * Tq, DELTA + n * Tq, W + n * Tq)


@triton.jit
def _lane_stats(LSE, DELTA, i_r, ok):
    """Per-lane base-2 logsumexp (+inf where the lane is not a visible pair or its query
    sees nothing, so that its probabilities are exactly 0) and D = dO . out."""
    lse = tl.load(LSE + i_r, mask=ok, other=0.0)
    lse2 = tl.where(ok & (lse > float('-inf')), lse * LOG2E, float('inf'))
    delta = tl.load(DELTA + i_r, mask=ok, other=0.0)
    return lse2, delta


@triton.jit
def _bwd_sweep(A, A_lo, Bm, Bm_lo, lse2, delta, Gk, Gv, KB, VB, p_r, j0, j1, Wb, d, u,
               DH: tl.constexpr, DP: tl.constexpr, BB: tl.constexpr, MASKED: tl.constexpr,
               PART: tl.constexpr, SPLIT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """Over b keys [j0, j1), per lane: Gk += dS @ kb (PART 0, 1) and Gv += P @ vb (PART 0, 2;
    PART 3: Gk only, for dq). Gv alone needs no dP."""
    for s in range(j0, j1, BB):
        j = s + tl.arange(0, BB)
        kb = _key_tile(KB, j, j1, d, DH, DP, MASKED)
        vb = _key_tile(VB, j, j1, d, DH, DP, MASKED)
        S = _pair_dot(A, A_lo, tl.trans(kb), SPLIT == 1 or SPLIT == 2, UP, PREC)
        S = S * u - lse2[:, None]
        if MASKED:
            S = tl.where(_visible(j, p_r, Wb) & (j < j1)[None, :], S, float('-inf'))
        P = tl.math.exp2(S)
        if PART != 2:
            dP = _pair_dot(Bm, Bm_lo, tl.trans(vb), SPLIT == 2, UP, PREC)
            dS = P * (dP - delta[:, None])
            Gk = _mm(_cast(dS, KB.dtype.element_ty, UP), kb, UP, PREC, Gk)
        if PART == 0 or PART == 2:
            Gv = _mm(_cast(P, VB.dtype.element_ty, UP), vb, UP, PREC, Gv)
    return Gk, Gv


@triton.jit
def _lane_grads(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, n, i_r, ja, ok, p_r, p_min, p_max, Tk, Wb, qk_scale, d,
                R: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr, BB: tl.constexpr, PART: tl.constexpr,
                SPLIT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr):
    """Per lane (i_r, ja) at positions p_r in [p_min, p_max], over every b key it sees:
    (Gk, Gv) = (dS @ kb, P @ vb) as _bwd_sweep's PART asks (Gv is Gk, unused, when PART
    asks for Gk alone). SPLIT 3: the sweep's sums are in float16's scaled units (dS / w,
    kb / 2^e_kb, vb / 2^e_vb, dO c with w = 2^e_vb / c: see _f16_rows), taken back here."""
    dt = Q.dtype.element_ty
    s_lane, u, gk, _ = _head_scales(SC, n, qk_scale, SPLIT)
    lo, lead_end, mid_end, hi = _column_regions(p_min, p_max, Tk, Wb, BB)
    A, A_lo = _split(_gather(Q, i_r, ok, d, DH, DP) * s_lane * _gather(KA, ja, ok, d, DH, DP), dt, UP,
                     SPLIT == 1 or SPLIT == 2, SPLIT == 3)
    Bm, Bm_lo = _split(_gather(DO, i_r, ok, d, DH, DP) * _gather(VA, ja, ok, d, DH, DP), dt, UP,
                       SPLIT == 2 and PART != 2, SPLIT == 3)
    lse2, delta = _lane_stats(LSE, DELTA, i_r, ok)
    Gk = tl.zeros((R, DP), tl.float32)
    Gv = Gk  # carried unchanged (never a second accumulator) when only Gk is asked for
    if PART == 0 or PART == 2:
        Gv = tl.zeros((R, DP), tl.float32)
    Gk, Gv = _bwd_sweep(A, A_lo, Bm, Bm_lo, lse2, delta, Gk, Gv, KB, VB, p_r, lo, lead_end, Wb, d, u, DH, DP, BB, True, PART, SPLIT, UP, PREC)
    Gk, Gv = _bwd_sweep(A, A_lo, Bm, Bm_lo, lse2, delta, Gk, Gv, KB, VB, p_r, lead_end, mid_end, Wb, d, u, DH, DP, BB, False, PART, SPLIT, UP, PREC)
    Gk, Gv = _bwd_sweep(A, A_lo, Bm, Bm_lo, lse2, delta, Gk, Gv, KB, VB, p_r, mid_end, hi, Wb, d, u, DH, DP, BB, True, PART, SPLIT, UP, PREC)
    if SPLIT == 3:
        w = tl.load(W + i_r, mask=ok, other=1.0)
        Gk = Gk * (w * gk)[:, None]
        if PART == 0 or PART == 2:
            Gv = Gv * w[:, None]
    return Gk, Gv


@triton.jit
def _ha3_bwd_dq_kernel(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, DQ,
                       Tq, Tk, offset, Wa, Wb, qk_scale, scale,
                       CAUSAL: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr,
                       G: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, SPLIT: tl.constexpr,
                       UP: tl.constexpr, PREC: tl.constexpr):
    R: tl.constexpr = G * BA
    n = tl.program_id(1).to(tl.int64)
    i0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * G
    Q, KA, KB, VA, VB, DO, LSE, DELTA, W = _head_inputs(n, Tq, Tk, Q, KA, KB, VA, VB, DO, LSE, DELTA, W, DH)
    DQ += n * Tq * DH
    dt = Q.dtype.element_ty

    d = tl.arange(0, DP)
    r = tl.arange(0, R)
    i_r = i0 + r // BA
    t_r = r % BA
    q_ok = i_r < Tq
    p_r = _pos(i_r, offset, Tk, CAUSAL)
    p_lo = _pos(i0, offset, Tk, CAUSAL)
    p_hi = _pos(tl.minimum(i0 + G, Tq) - 1, offset, Tk, CAUSAL)

    dq = tl.zeros((G, DP), tl.float32)
    t_lo = tl.maximum(0, p_lo - (Tk - 1))
    t_hi = tl.minimum(p_hi, Wa - 1) + 1
    for tb in range(t_lo, t_hi, BA):
        tp = tb + t_r
        ja = p_r - tp
        ok = q_ok & (ja >= 0) & (ja < Tk) & (tp < Wa)
        Gk, _ = _lane_grads(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, n, i_r, ja, ok, p_r, p_lo, p_hi, Tk, Wb, qk_scale, d,
                            R, DH, DP, BB, 3, SPLIT, UP, PREC)
        # re-read rather than hold ka through the sweeps (registers)
        dq += tl.sum(tl.reshape(_gather(KA, ja, ok, d, DH, DP) * Gk, (G, BA, DP)), 1)

    gi = i0 + tl.arange(0, G)
    tl.store(DQ + gi[:, None] * DH + d[None, :], _cast(dq * scale, dt, UP),
             mask=(gi < Tq)[:, None] & (d[None, :] < DH))


@triton.jit
def _ha3_bwd_da_kernel(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, DKA, DVA,
                       Tq, Tk, offset, Wa, Wb, qk_scale, scale,
                       CAUSAL: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr,
                       JA: tl.constexpr, BU: tl.constexpr, BB: tl.constexpr, SPLIT: tl.constexpr,
                       UP: tl.constexpr, PREC: tl.constexpr, PART: tl.constexpr):
    """PART 0: dka and dva; 1: dka only; 2: dva only (two launches where one kernel holding
    both lane accumulators would spill, head size 128 and up)."""
    R: tl.constexpr = JA * BU
    n = tl.program_id(1).to(tl.int64)
    ja0 = tl.program_id(0) * JA
    Q, KA, KB, VA, VB, DO, LSE, DELTA, W = _head_inputs(n, Tq, Tk, Q, KA, KB, VA, VB, DO, LSE, DELTA, W, DH)
    DKA += n * Tk * DH
    DVA += n * Tk * DH
    dt = Q.dtype.element_ty

    d = tl.arange(0, DP)
    r = tl.arange(0, R)
    ja_r = ja0 + r // BU
    u_r = r % BU
    ja_last = tl.minimum(ja0 + JA, Tk) - 1
    # lane (ja, u): query i = ja - offset + u (causal, so p - ja = u) or i = u
    if CAUSAL:
        u_lo = tl.maximum(0, offset - ja_last)
        u_hi = tl.minimum(Wa - 1, Tq - 1 + offset - ja0) + 1
    else:
        u_lo = 0
        u_hi = Tq
    dk = tl.zeros((JA, DP), tl.float32)
    dv = tl.zeros((JA, DP), tl.float32)
    for ub in range(u_lo, u_hi, BU):
        up = ub + u_r
        if CAUSAL:
            i_r = ja_r - offset + up
            p_min = tl.maximum(ja0 + ub, offset)
            p_max = tl.minimum(ja_last + ub + BU - 1, offset + Tq - 1)
        else:
            i_r = up
            p_min = Tk - 1
            p_max = Tk - 1
        ok = (ja_r < Tk) & (i_r >= 0) & (i_r < Tq) & (up < Wa)
        p_r = _pos(i_r, offset, Tk, CAUSAL)
        Gk, Gv = _lane_grads(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, n, i_r, ja_r, ok, p_r, p_min, p_max, Tk, Wb, qk_scale, d,
                             R, DH, DP, BB, PART, SPLIT, UP, PREC)
        if PART != 2:
            dk += tl.sum(tl.reshape(_gather(Q, i_r, ok, d, DH, DP) * Gk, (JA, BU, DP)), 1)
        if PART != 1:
            dv += tl.sum(tl.reshape(_gather(DO, i_r, ok, d, DH, DP) * Gv, (JA, BU, DP)), 1)

    jo = ja0 + tl.arange(0, JA)
    mask = (jo < Tk)[:, None] & (d[None, :] < DH)
    if PART != 2:
        tl.store(DKA + jo[:, None] * DH + d[None, :], _cast(dk * scale, dt, UP), mask=mask)
    if PART != 1:
        tl.store(DVA + jo[:, None] * DH + d[None, :], _cast(dv, dt, UP), mask=mask)


@triton.jit
def _add_lanes(base, ja, ok, C, g_r, d, G: tl.constexpr, DH: tl.constexpr):
    """base[ja] += C (float32 rows, read-modify-write) for the lanes where ok. Lanes of
    different queries share keys, so one query's lanes at a time (theirs are distinct),
    with a barrier after each: the next pass reads rows other threads wrote."""
    ptr = base + ja[:, None] * DH + d[None, :]
    for g in tl.static_range(G):
        mask = (ok & (g_r == g))[:, None] & (d[None, :] < DH)
        tl.store(ptr, tl.load(ptr, mask=mask, other=0.0) + C, mask=mask)
        tl.debug_barrier()


@triton.jit
def _ha3_bwd_dqa_kernel(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, DQ, PK, PV,
                        Tq, Tk, offset, Wa, Wb, qk_scale, scale, plane_stride,
                        DH: tl.constexpr, DP: tl.constexpr, G: tl.constexpr, BA: tl.constexpr,
                        BB: tl.constexpr, NG: tl.constexpr, SPLIT: tl.constexpr,
                        UP: tl.constexpr, PREC: tl.constexpr):
    """dq and slot a's gradients in one sweep (causal; every query's a keys in one lane tile,
    i.e. min(Wa, Tk) <= BA). The lanes (i, ja) of a query group give Gk = dS @ kb and
    Gv = P @ vb once; summed along ja they are dq (owned: the group's queries are this
    program's), along i slot a's dk and dv, whose keys other programs' queries also see.
    Those sums are added, exactly in float32, to a plane per program parity: the NG groups
    of a program reach NG * G + BA - 1 <= 2 NG * G keys, so no two programs of one parity
    share a key, and dka = plane 0 + plane 1 is summed in a fixed order (deterministic, no
    atomics)."""
    R: tl.constexpr = G * BA
    n = tl.program_id(1).to(tl.int64)
    prog = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest causal rows first
    plane = (prog % 2).to(tl.int64)
    Q, KA, KB, VA, VB, DO, LSE, DELTA, W = _head_inputs(n, Tq, Tk, Q, KA, KB, VA, VB, DO, LSE, DELTA, W, DH)
    DQ += n * Tq * DH
    PK += plane * plane_stride + n * Tk * DH
    PV += plane * plane_stride + n * Tk * DH
    dt = Q.dtype.element_ty

    d = tl.arange(0, DP)
    r = tl.arange(0, R)
    g_r = r // BA
    t_r = r % BA
    s_end = tl.minimum((prog + 1) * NG * G, Tq)
    for s in range(prog * NG * G, s_end, G):
        i_r = s + g_r
        q_ok = i_r < s_end
        p_r = offset + i_r
        p_lo = offset + s
        p_hi = offset + tl.minimum(s + G, s_end) - 1
        tb = tl.maximum(0, p_lo - (Tk - 1))
        tp = tb + t_r
        ja = p_r - tp
        ok = q_ok & (ja >= 0) & (ja < Tk) & (tp < Wa)
        Gk, Gv = _lane_grads(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, n, i_r, ja, ok, p_r, p_lo, p_hi, Tk, Wb, qk_scale, d,
                             R, DH, DP, BB, 0, SPLIT, UP, PREC)
        # re-read rather than hold ka, q and dO through the sweeps (registers)
        dq = tl.sum(tl.reshape(_rows(KA, ja, ok, d, DH, DP).to(tl.float32) * Gk, (G, BA, DP)), 1)
        gi = s + tl.arange(0, G)
        tl.store(DQ + gi[:, None] * DH + d[None, :], _cast(dq * scale, dt, UP),
                 mask=(gi < s_end)[:, None] & (d[None, :] < DH))
        _add_lanes(PK, ja, ok, _rows(Q, i_r, ok, d, DH, DP).to(tl.float32) * Gk, g_r, d, G, DH)
        _add_lanes(PV, ja, ok, _rows(DO, i_r, ok, d, DH, DP).to(tl.float32) * Gv, g_r, d, G, DH)


@triton.jit
def _db_step(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, i_r, p_r, ja, ok, Wb, s_lane, u, d,
             DH: tl.constexpr, DP: tl.constexpr, MASKED: tl.constexpr, LANES: tl.constexpr,
             SPLIT: tl.constexpr, UP: tl.constexpr, PREC: tl.constexpr, PART: tl.constexpr):
    """One lane tile, queries i_r at positions p_r and a keys ja, against the b-key block j. LANES: some lanes may be no visible pair (ok says which); else every
    lane is one and nothing is masked (slot b forms its lanes anew at every step, so their
    masks cost as much as a fifth of its instructions)."""
    dt = KA.dtype.element_ty
    # each product rounded before the next is formed (two float32 tiles at once spilled)
    A, A_lo = _split(_rows(Q, i_r, ok, d, DH, DP, LANES).to(tl.float32) * s_lane
                     * _rows(KA, ja, ok, d, DH, DP, LANES).to(tl.float32), dt, UP, SPLIT == 1 or SPLIT == 2, SPLIT == 3)
    Bm, Bm_lo = _split(_rows(DO, i_r, ok, d, DH, DP, LANES).to(tl.float32)
                       * _rows(VA, ja, ok, d, DH, DP, LANES).to(tl.float32), dt, UP, SPLIT == 2 and PART != 2,
                       SPLIT == 3)
    if LANES:
        lse2, delta = _lane_stats(LSE, DELTA, i_r, ok)
    else:  # a visible pair per lane: its query sees something, so lse is finite
        lse2 = tl.load(LSE + i_r) * LOG2E
        delta = tl.load(DELTA + i_r)
    ST = _pair_dot_t(kb, A, A_lo, SPLIT == 1 or SPLIT == 2, UP, PREC)  # (BB, R)
    ST = ST * u - lse2[None, :]
    if MASKED:
        ST = tl.where((j[:, None] <= p_r[None, :]) & (p_r[None, :] - j[:, None] < Wb), ST, float('-inf'))
    PT = tl.math.exp2(ST)
    if SPLIT == 3:  # the sums over lanes take the products in dt
        A = A_lo
        Bm_sum = Bm_lo
    else:
        Bm_sum = Bm
    if PART != 2:
        dPT = _pair_dot_t(vb, Bm, Bm_lo, SPLIT == 2, UP, PREC)
        dST = PT * (dPT - delta[None, :])
        dk = _mm(_cast(dST, dt, UP), A, UP, PREC, dk)
    if PART != 1:
        dv = _mm(_cast(PT, dt, UP), Bm_sum, UP, PREC, dv)
    return dk, dv


@triton.jit
def _db_region(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, i_start, i_end,
               Tk, offset, Wa, Wb, s_lane, u, d,
               CAUSAL: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr,
               G: tl.constexpr, BA: tl.constexpr, MASKED: tl.constexpr, SPLIT: tl.constexpr,
               UP: tl.constexpr, PREC: tl.constexpr, PART: tl.constexpr):
    """Accumulate into the b-key block j the lane tiles of queries [i_start, i_end):
    dk (PART 0, 1) and dv (PART 0, 2; needs no dP). SPLIT 3: kb, vb and the lanes' hi are
    float16 in scaled units, LSE carries w (P here is P w: see _f16_rows), and dk, dv sum
    over the lanes' lo (the products in dt). Where the columns need no mask (the steady
    state), lane tiles that are all visible pairs skip the lane masks too: causal, and
    not with the hi + lo splits (a second loop body spilled there, in the non-causal dk
    launch at head size 128, and as a third body in the masked regions)."""
    R: tl.constexpr = G * BA
    r = tl.arange(0, R)
    g_r = r // BA
    t_r = r % BA
    every = r >= 0
    for s in range(i_start, i_end, G):
        i_r = s + g_r
        q_ok = i_r < i_end
        p_r = _pos(i_r, offset, Tk, CAUSAL)
        p_lo = _pos(s, offset, Tk, CAUSAL)
        p_hi = _pos(tl.minimum(s + G, i_end) - 1, offset, Tk, CAUSAL)
        t_lo = tl.maximum(0, p_lo - (Tk - 1))
        t_hi = tl.minimum(p_hi, Wa - 1) + 1
        # whole blocks of a keys t < min(p_lo + 1, Wa) are visible pairs for every query of
        # a full group that is not past the last key: no lane masks there
        t_all = t_lo
        if CAUSAL and not MASKED and (SPLIT == 0 or SPLIT == 3):  # else the second body spilled
            n_all = tl.where((s + G <= i_end) & (t_lo == 0) & (p_hi <= Tk - 1), tl.minimum(p_lo + 1, Wa) // BA, 0)
            t_all = t_lo + n_all * BA
            for tb in range(t_lo, t_all, BA):
                dk, dv = _db_step(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, i_r, p_r, p_r - (tb + t_r), every, Wb,
                                  s_lane, u, d, DH, DP, MASKED, False, SPLIT, UP, PREC, PART)
        for tb in range(t_all, t_hi, BA):
            tp = tb + t_r
            ja = p_r - tp
            ok = q_ok & (ja >= 0) & (ja < Tk) & (tp < Wa)
            dk, dv = _db_step(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, i_r, p_r, ja, ok, Wb, s_lane, u,
                              d, DH, DP, MASKED, True, SPLIT, UP, PREC, PART)
    return dk, dv


@triton.jit
def _ha3_bwd_db_kernel(Q, KA, KB, VA, VB, DO, LSE, DELTA, W, SC, DKB, DVB,
                       Tq, Tk, offset, Wa, Wb, qk_scale,
                       CAUSAL: tl.constexpr, DH: tl.constexpr, DP: tl.constexpr,
                       G: tl.constexpr, BA: tl.constexpr, BB: tl.constexpr, SPLIT: tl.constexpr,
                       UP: tl.constexpr, PREC: tl.constexpr, PART: tl.constexpr):
    """PART 0: dkb and dvb; 1: dkb only; 2: dvb only (as the slot-a kernel)."""
    n = tl.program_id(1).to(tl.int64)
    c0 = tl.program_id(0) * BB
    s_lane, u, _, dvb = _head_scales(SC, n, qk_scale, SPLIT)
    Q, KA, KB, VA, VB, DO, LSE, DELTA, W = _head_inputs(n, Tq, Tk, Q, KA, KB, VA, VB, DO, LSE, DELTA, W, DH)
    DKB += n * Tk * DH
    DVB += n * Tk * DH
    dt = Q.dtype.element_ty

    d = tl.arange(0, DP)
    j = c0 + tl.arange(0, BB)
    kb = _key_tile(KB, j, Tk, d, DH, DP, True)
    vb = _key_tile(VB, j, Tk, d, DH, DP, True)
    # Keys j >= Tk own rows that are never stored, so they need no mask. Queries in
    # [mid_lo, mid_hi) see the whole block: p >= c_last and p - c0 < Wb.
    c_last = tl.minimum(c0 + BB, Tk) - 1
    if CAUSAL:
        i_lo = tl.maximum(0, c0 - offset)
        i_hi = tl.minimum(Tq, c_last + Wb - offset)
        mid_lo = tl.minimum(tl.maximum(i_lo, c_last - offset), i_hi)
        mid_hi = tl.maximum(tl.minimum(i_hi, c0 + Wb - offset), mid_lo)
    else:
        i_lo = 0
        i_hi = Tq
        mid_lo = 0
        mid_hi = Tq
    dk = tl.zeros((BB, DP), tl.float32)
    dv = dk  # carried unchanged when PART is 1
    if PART != 1:
        dv = tl.zeros((BB, DP), tl.float32)
    dk, dv = _db_region(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, i_lo, mid_lo,
                        Tk, offset, Wa, Wb, s_lane, u, d, CAUSAL, DH, DP, G, BA, True, SPLIT, UP, PREC, PART)
    dk, dv = _db_region(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, mid_lo, mid_hi,
                        Tk, offset, Wa, Wb, s_lane, u, d, CAUSAL, DH, DP, G, BA, False, SPLIT, UP, PREC, PART)
    dk, dv = _db_region(dk, dv, kb, vb, j, Q, KA, VA, DO, LSE, DELTA, mid_hi, i_hi,
                        Tk, offset, Wa, Wb, s_lane, u, d, CAUSAL, DH, DP, G, BA, True, SPLIT, UP, PREC, PART)
    mask = (j < Tk)[:, None] & (d[None, :] < DH)
    # the lanes carry s_lane (scale * log2(e) but for SPLIT 3): dkb = scale * dS^T @ (q * ka)
    # = (qk_scale ln(2) / s_lane) * dS^T @ A
    k_scale = LN2
    if SPLIT == 3:
        k_scale = qk_scale * LN2 / s_lane
    if PART != 2:
        tl.store(DKB + j[:, None] * DH + d[None, :], _cast(dk * k_scale, dt, UP), mask=mask)
    if PART != 1:
        tl.store(DVB + j[:, None] * DH + d[None, :], _cast(dv * dvb, dt, UP), mask=mask)


# -----------------------------------------------------------------------------
# launchers

def _pow2(x):
    """Smallest power of two >= x (x >= 1)."""
    return 1 << (max(int(x), 1) - 1).bit_length()


def _geometry(Tq, Tk, offset, causal, window1, window2):
    """Effective windows (a window that hides nothing becomes `big`) and whether slot 2 is
    the narrow one, i.e. the lanes' slot a."""
    big = Tq + Tk + max(offset, 0) + 1  # larger than any p - j
    w1 = window1 if causal and window1 > 0 else big
    w2 = window2 if causal and window2 > 0 else big
    return w2 < w1, min(w1, w2), max(w1, w2)


def _lanes(span, rows, n_groups):
    """(groups, lanes per group): lanes cover one group's `span` of a keys (or queries),
    groups * lanes = rows, at most the n_groups there are, and at least 16 rows in all."""
    per = min(_pow2(span), rows, 64)
    groups = min(max(rows // per, 1), _pow2(n_groups))
    per = max(per, 16 // groups)
    return groups, per


def _warps(rows):
    """One warp group (4 warps) per 64 rows of a tile: Hopper's wgmma gives each warp group
    64 rows, so 8 warps on a 64-row tile would compute every tile twice (or split its
    columns and recompute the softmax operands). Fewer rows (short sequences): mma.sync,
    a warp per 16 rows."""
    return max(1, min(8, rows // 16))


SPLITS = {'none': 0, 'logits': 1, 'both': 2, 'fp16': 3}


def default_split(dtype):
    """How the lane products enter the logit and dP matmuls (see ha3_backward): 0 = rounded
    to the input dtype, 1 = the logits' operand as hi + lo, 2 = the logits' and dP's, 3 =
    both in float16, scaled (bf16 inputs only). fp32: 0; fp16: 'both'."""
    if dtype == torch.float32:
        return 0
    return SPLITS[DEFAULT_SPLIT if dtype == torch.bfloat16 else 'both']


DEFAULT_SPLIT = 'fp16'
SPLIT_DA_FROM = 128  # padded head size from which each slot's dk and dv are two launches

# Tiles per (dtype class, padded head size), each kernel's (rows, cols, pipeline stages[,
# warps]): the lane kernels' (forward, dq, slot a; da_k: slot a's dk launch where it
# differs) lane rows and b-key columns; the slot-b kernel's b-key rows and lane columns.
# Rows are 64 per warp group (see _warps). From 128 on, each slot's dk and dv are two
# launches (SPLIT_DA_FROM); db_k: slot b's dk launch's own lanes. Chosen with
# tools/compile_check.py: the largest tiles with no register spill on sm_90 (with the
# default split) and shared memory within the limit. dqa: the fused dq + slot-a kernel;
# at 64 on 128 lanes (4 query groups) x 16 columns, 8 warps (64 x 16 on 4 warps: 1.4x the
# time by tools/program_model.py, its steps bound by one warp's stalls per scheduler; 32
# columns spilled 64-88 B when compiled without the integer hints, e.g. T not a multiple
# of 16); at 128 on 32 lanes x 32 columns, 4 warps (64-lane tiles spilled 350-1,470 B: two
# 64 x 128 float32 accumulators); none at 256. Slot b at 128 on one stage: with two, its
# dv launch spilled 8 B under triton 3.6 (the GPU machine's). Unfused at 128, dq and slot a's dk
# spill 8-168 B with one warp group on their 64-row tiles in every tiling tried, so they
# take two: spill-free, but the second computes the logits and dP again (5 tile matmuls
# per step instead of 3).
TILES = {
    'low': {16: dict(fwd=(128, 64, 2), dq=(128, 64, 2), da=(128, 32, 2), db=(128, 64, 2), dqa=(128, 32, 1)),
            32: dict(fwd=(128, 64, 2), dq=(128, 64, 2), da=(128, 32, 2), db=(128, 64, 2), dqa=(64, 32, 1)),
            64: dict(fwd=(128, 64, 2), dq=(128, 32, 2), da=(128, 16, 2), db=(128, 32, 1), dqa=(128, 16, 1)),
            128: dict(fwd=(128, 32, 2), dq=(64, 16, 2, 8), da=(64, 16, 2), da_k=(64, 16, 2, 8), db=(64, 32, 1),
                      db_k=(64, 16, 1), dqa=(32, 32, 1, 4)),
            256: dict(fwd=(64, 16, 1), dq=(64, 16, 1), da=(64, 16, 1), db=(64, 16, 1))},
    # sm_80 (A100: mma.sync per warp, 166,912 B of shared memory): 'low' spilled there
    'low_sm80': {16: dict(fwd=(128, 64, 2), dq=(128, 64, 2), da=(128, 32, 1), db=(64, 32, 2), dqa=(128, 32, 1)),
                 32: dict(fwd=(128, 64, 2), dq=(128, 64, 2), da=(128, 32, 2), db=(64, 32, 2), dqa=(128, 32, 1)),
                 64: dict(fwd=(128, 32, 2), dq=(128, 16, 2), da=(128, 16, 2), db=(64, 16, 1), dqa=(64, 16, 1)),
                 128: dict(fwd=(128, 16, 2), dq=(64, 16, 2, 8), da=(64, 16, 2), da_k=(64, 16, 2, 8), db=(32, 16, 1),
                           db_k=(32, 16, 1), dqa=(32, 32, 1, 4)),
                 256: dict(fwd=(64, 16, 1), dq=(64, 16, 1), da=(64, 16, 1), db=(64, 16, 1))},
    'fp32': {16: dict(fwd=(64, 32, 2), dq=(64, 32, 2), da=(64, 32, 2), db=(64, 32, 2), dqa=(64, 32, 2)),
             32: dict(fwd=(64, 32, 2), dq=(64, 32, 2), da=(64, 32, 2), db=(64, 32, 2), dqa=(64, 32, 2)),
             64: dict(fwd=(64, 32, 2), dq=(64, 32, 2), da=(64, 32, 2), db=(32, 32, 2), dqa=(64, 32, 2)),
             128: dict(fwd=(32, 32, 2), dq=(32, 16, 2), da=(32, 16, 2), db=(32, 32, 2)),
             256: dict(fwd=(32, 16, 1), dq=(16, 16, 1), da=(16, 16, 1), db=(16, 16, 1))},
}


def _tile_table(dtype, arch):
    if dtype == torch.float32:
        return TILES['fp32']
    return TILES['low'] if arch >= 90 else TILES['low_sm80']


def _configs(Tq, Tk, dh, wa, wb, override=None, dtype=torch.bfloat16, arch=90):
    """Per kernel: block sizes, warps and pipeline stages, from TILES, shrunk to what short
    sequences need. `override` (tests): flat keys G, BA (lane kernels), BB (their column
    blocks), JA, BU (slot-a kernel), BBD (the slot-b kernel's key rows), num_warps,
    num_stages, applied to every kernel they fit."""
    dp = head_block(dh)
    span_b = min(wb, Tk)
    t = _tile_table(dtype, arch)[dp]
    parts = (1, 2) if dp >= SPLIT_DA_FROM else (0,)
    o = override or {}

    def cols(bb, spread):  # no wider than the b keys one tile can see
        return max(16, min(bb, _pow2(span_b + spread)))

    def by_query(rows, bb, stages, warps=None):
        G, BA = _lanes(min(wa, Tk), rows, Tq)
        warps = warps if warps and G * BA == rows else _warps(G * BA)  # a shrunk tile: its own
        return dict(G=G, BA=BA, BB=cols(bb, G), num_warps=warps, num_stages=stages)

    fwd = by_query(*t['fwd'])
    dq = by_query(*t['dq'])
    dqa = dict(G=1, BA=1, FUSE=False)  # the fused kernel, where the table has it
    if 'dqa' in t:
        dqa = dict(by_query(*t['dqa']), FUSE=o.get('FUSE', True))
    rows, bb, stages = t['da'][:3]
    JA, BU = _lanes(min(wa, Tq), rows, Tk)  # a keys owned, queries per key
    da = dict(JA=JA, BU=BU, BB=cols(bb, JA + BU), num_warps=_warps(JA * BU), num_stages=stages, PARTS=parts)
    if 'da_k' in t and len(t['da_k']) > 3 and JA * BU == t['da_k'][0]:
        da['K_WARPS'] = t['da_k'][3]  # warps of the dk launch (PART 1)
    rows, lanes, stages = t['db']
    G, BA = _lanes(min(wa, Tk), lanes, Tq)
    BBD = max(16, min(rows, _pow2(Tk)))
    db = dict(G=G, BA=BA, BB=BBD, num_warps=_warps(BBD), num_stages=stages, PARTS=parts)
    if 'db_k' in t and BBD == t['db_k'][0]:  # the dk launch's own lanes (PART 1)
        db['K_G'], db['K_BA'] = _lanes(min(wa, Tk), t['db_k'][1], Tq)
    for c in (fwd, dq, dqa, da):
        c.update({k: o[k] for k in ('G', 'BA', 'BB', 'JA', 'BU', 'num_warps', 'num_stages') if k in o and k in c})
    if dqa['FUSE']:  # groups per program (NG * G >= BA: see the kernel) and the a keys one group reaches
        dqa.update(NG=triton.cdiv(dqa['BA'], dqa['G']))
    db.update({k: o[k] for k in ('G', 'BA', 'num_warps', 'num_stages') if k in o})
    if 'BBD' in o:
        db['BB'] = o['BBD']
    return dp, fwd, dq, dqa, da, db


def _fused(c, Tq, Tk, offset, causal, wa):
    """Whether the backward takes the fused dq + slot-a kernel: causal, no query past the
    last key, and every query's a keys within one lane tile (narrow windows: the GPU configs'
    (512, 32))."""
    return c['FUSE'] and causal and offset + Tq <= Tk and min(wa, Tk) <= c['BA']


def _launch(c, part):
    """A backward kernel's launch options for one PART: its configuration less the plan's
    keys, with the dk launch's own warps where it has them."""
    out = {k: v for k, v in c.items() if k not in ('PARTS', 'K_WARPS', 'K_G', 'K_BA', 'FUSE')}
    if part == 1:
        out.update({k[2:]: v for k, v in c.items() if k in ('K_G', 'K_BA')})
        if 'K_WARPS' in c:
            out['num_warps'] = c['K_WARPS']
    return out


def _head_chunks(N, most=65535):
    """Slices of at most `most` heads: the grid's second axis is limited to 65535 on CUDA."""
    return [slice(n, min(n + most, N)) for n in range(0, N, most)]


def _check(q, ks_vs, what):
    if q.dim() != 3:
        raise ValueError(f"{what}: q must be (N, Tq, dh), got shape {tuple(q.shape)}")
    N, _, dh = q.shape
    Tk = ks_vs[0].size(1) if ks_vs[0].dim() == 3 else -1
    for t in ks_vs:
        if t.dim() != 3 or t.size(0) != N or t.size(1) != Tk or t.size(2) != dh:
            raise ValueError(f"{what}: k1, k2, v1, v2 must all be (N, Tk, dh) = ({N}, Tk, {dh}), "
                             f"got {tuple(t.shape)}")
    check_inputs(what, q, *ks_vs)
    if not 1 <= dh <= 256:
        raise ValueError(f"{what}: head size {dh} unsupported; 1 <= dh <= 256")


def _split_mode(split_products, dtype):
    """SPLITS' number for a split_products argument (None: default_split); fp32: 0."""
    if dtype == torch.float32:
        return 0
    if split_products is None:
        return default_split(dtype)
    if isinstance(split_products, bool):
        return 2 if split_products else 0
    if split_products not in SPLITS:
        raise ValueError(f"split_products must be one of {', '.join(SPLITS)} or None, not {split_products!r}")
    if split_products == 'fp16' and dtype != torch.bfloat16:
        raise ValueError(f"split_products='fp16' is for bfloat16 inputs (fp16 inputs already round the products "
                         f"to float16: use 'none' or 'both'), got {dtype}")
    return SPLITS[split_products]


def _exponent(t, dims):
    """Per slice of t, the e in [-60, 60] with max |t| < 2^e (0 for a slice of zeros), int32."""
    return torch.frexp(torch.linalg.vector_norm(t, float('inf'), dims, dtype=torch.float32))[1].clamp(-60, 60)


def _two_to(e):
    """2^e, float32, for an integer tensor e."""
    return torch.ldexp(torch.ones(e.shape, device=e.device), e.clamp(-120, 120))


def _f16_scales(q, ka, kb, va, vb, qk_scale, backward=True):
    """Split 'fp16' (bf16 inputs): the lane products enter the logit and dP matmuls in
    float16, 11 bits where bf16 keeps 8, in one matmul each (hi + lo takes two), and every
    float16 operand is scaled by a power of two per head into float16's range, on the
    device (no host sync). kb16 = kb 2^-e_kb and vb16 = vb 2^-e_vb lie in (-1, 1) (max |x|
    < 2^e); the lanes are q ka s with s = 2^(14 - e_q - e_ka), so |A| < 2^14, and the
    logits in base 2 are u (A . kb16), u = qk_scale 2^e_kb / s. Returns kb16, vb16 (None
    unless `backward`: the forward multiplies P by vb in bf16), the exponents of va and vb,
    and per head [s, u, 2^e_kb, 2^-e_vb] (N, 4) float32."""
    e_q, e_ka, e_kb, e_va, e_vb = (_exponent(t, (1, 2)) for t in (q, ka, kb, va, vb))
    s = _two_to(14 - e_q - e_ka)
    kb16 = (kb * _two_to(-e_kb).to(kb.dtype)[:, None, None]).to(torch.float16)  # bf16 products exact
    vb16 = (vb * _two_to(-e_vb).to(vb.dtype)[:, None, None]).to(torch.float16) if backward else None
    sc = torch.stack([s, qk_scale * _two_to(e_kb) / s, _two_to(e_kb), _two_to(-e_vb)], 1).contiguous()
    return kb16, vb16, e_va, e_vb, sc


def _f16_rows(dout, delta, lse, e_va, e_vb, dp):
    """Split 'fp16', per query row i: dO_i c_i with c_i = 2^(14 - log2 dp - e_o,i - e_va),
    so that |dO c va| < 2^14 / dp and dP16 = (dO c va) . vb16 < 2^14, i.e. dP / w with w =
    2^e_vb / c. Returns dO c (bf16, exact), D / w, w, and lse - ln w (slot b forms P w)."""
    ce = (14 - (dp.bit_length() - 1) - _exponent(dout, (2,)) - e_va[:, None]).clamp(-120, 120)
    w = _two_to(e_vb[:, None] - ce)
    return (dout * _two_to(ce).to(dout.dtype)[..., None], (delta / w).contiguous(), w.contiguous(),
            (lse - torch.log(w)).contiguous())


def ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale, *, config=None, split_products=None):
    """Order-3 HyperAttention forward. q (N, Tq, dh); k1, k2, v1, v2 (N, Tk, dh), one dtype
    (fp32, bf16 or fp16). Returns out (N, Tq, dh) in that dtype, lse (N, Tq) float32, the
    logsumexp of the scaled logits over the visible pairs (-inf where there is none), and
    the output in float32 for bf16/fp16 inputs (else None), which ha3_backward takes as
    `out` for a more accurate D_i = dO_i . out_i (as hfa_forward). split_products:
    'logits' or 'both' form the logits from the lane product q*ka as hi + lo, 'fp16' in
    scaled float16 (see ha3_backward; pass the same to it). `config` overrides block sizes
    (tests)."""
    _check(q, (k1, k2, v1, v2), "ha3_forward")
    q, k1, k2, v1, v2 = (t.contiguous() for t in (q, k1, k2, v1, v2))
    N, Tq, dh = q.shape
    Tk = k1.size(1)
    out = torch.empty_like(q)
    keep = q.dtype != torch.float32
    out32 = torch.empty(q.shape, dtype=torch.float32, device=q.device) if keep else None
    lse = torch.empty(N, Tq, dtype=torch.float32, device=q.device)
    if N * Tq == 0:
        return out, lse, out32
    if Tk == 0:
        out.zero_(), lse.fill_(float('-inf'))
        if keep:
            out32.zero_()
        return out, lse, out32
    swap, wa, wb = _geometry(Tq, Tk, offset, causal, window1, window2)
    ka, kb, va, vb = (k2, k1, v2, v1) if swap else (k1, k2, v1, v2)
    dp, c, _, _, _, _ = _configs(Tq, Tk, dh, wa, wb, config, q.dtype, arch_of(q))
    prec, up = dot_precision(q.dtype), upcast_dots(q.dtype)
    split = _split_mode(split_products, q.dtype)
    qk_scale = float(scale) * LOG2E.value
    sc = lse  # unread unless split is 3
    if split == 3:
        kb, _, _, _, sc = _f16_scales(q, ka, kb, va, vb, qk_scale, backward=False)
    with device_of(q):
        for h in _head_chunks(N):
            _ha3_fwd_kernel[(triton.cdiv(Tq, c['G']), h.stop - h.start)](
                q[h], ka[h], kb[h], va[h], vb[h], out[h], (out32 if keep else out)[h], lse[h], sc[h], Tq, Tk,
                offset, wa, wb, qk_scale, CAUSAL=bool(causal), DH=dh, DP=dp, PREC=prec, UP=up, KEEP32=keep,
                SPLIT=split if split == 3 else min(split, 1), **c)
    return out, lse, out32


def ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset, causal, window1, window2, scale,
                 *, split_products=None, config=None):
    """Gradients (dq, dk1, dk2, dv1, dv2), in the input dtype, of <dout, out> for the
    forward above, from its out (best its float32 output) and lse. Deterministic: no
    atomics; every gradient row is summed by one program in a fixed order.
    split_products (bf16/fp16 inputs): how the lane products q*ka and dO*va, which the
    input dtype rounds to half their digits, enter the logit and dP matmuls: 'none'
    (rounded: 11 tile matmuls per step, 8 where dq and slot a are fused), 'logits' (the
    logits' as hi + lo, two matmuls: 14), 'both' (17, fused 12), 'fp16' (bf16 inputs:
    both in float16, 11 bits, scaled by powers of two into its range: 11, fused 8), or
    None for default_split; the same as the forward's. See docs."""
    _check(q, (k1, k2, v1, v2), "ha3_backward")
    q, k1, k2, v1, v2, out, dout = (t.contiguous() for t in (q, k1, k2, v1, v2, out, dout))
    lse = lse.contiguous().float()
    N, Tq, dh = q.shape
    Tk = k1.size(1)
    dq = torch.zeros_like(q)
    dk1, dk2, dv1, dv2 = (torch.zeros_like(t) for t in (k1, k2, v1, v2))
    if N * Tq == 0 or Tk == 0:
        return dq, dk1, dk2, dv1, dv2
    split = _split_mode(split_products, q.dtype)
    delta = (dout.float() * out.float()).sum(-1)  # D_i = dO_i . out_i, (N, Tq)
    swap, wa, wb = _geometry(Tq, Tk, offset, causal, window1, window2)
    ka, kb, va, vb = (k2, k1, v2, v1) if swap else (k1, k2, v1, v2)
    dka, dkb, dva, dvb = (dk2, dk1, dv2, dv1) if swap else (dk1, dk2, dv1, dv2)
    dp, _, cq, cf, ca, cb = _configs(Tq, Tk, dh, wa, wb, config, q.dtype, arch_of(q))
    fused = _fused(cf, Tq, Tk, offset, causal, wa)
    prec, up = dot_precision(q.dtype), upcast_dots(q.dtype)
    common = dict(CAUSAL=bool(causal), DH=dh, DP=dp, SPLIT=split, PREC=prec, UP=up)
    qk_scale = float(scale) * LOG2E.value
    w, sc, lse_b = lse, lse, lse  # unread unless split is 3
    if split == 3:  # the float16 operands and their scales (see _f16_scales, _f16_rows)
        kb, vb, e_va, e_vb, sc = _f16_scales(q, ka, kb, va, vb, qk_scale)
        dout, delta, w, lse_b = _f16_rows(dout, delta, lse, e_va, e_vb, dp)
    if fused:  # slot a's partial sums, one float32 plane per program parity (see the kernel)
        planes = torch.zeros((2, 2, N, Tk, dh), dtype=torch.float32, device=q.device)
    with device_of(q):
        for h in _head_chunks(N):
            ins = (q[h], ka[h], kb[h], va[h], vb[h], dout[h], lse[h], delta[h], w[h], sc[h])
            if fused:
                _ha3_bwd_dqa_kernel[(triton.cdiv(Tq, cf['NG'] * cf['G']), h.stop - h.start)](
                    *ins, dq[h], planes[0][:, h], planes[1][:, h], Tq, Tk, offset, wa, wb, qk_scale,
                    float(scale), planes.stride(1), DH=dh, DP=dp, SPLIT=split, PREC=prec, UP=up,
                    **_launch(cf, 0))
            else:
                _ha3_bwd_dq_kernel[(triton.cdiv(Tq, cq['G']), h.stop - h.start)](
                    *ins, dq[h], Tq, Tk, offset, wa, wb, qk_scale, float(scale), **common, **cq)
                for part in ca['PARTS']:
                    _ha3_bwd_da_kernel[(triton.cdiv(Tk, ca['JA']), h.stop - h.start)](
                        *ins, dka[h], dva[h], Tq, Tk, offset, wa, wb, qk_scale, float(scale), PART=part, **common,
                        **_launch(ca, part))
            for part in cb['PARTS']:
                _ha3_bwd_db_kernel[(triton.cdiv(Tk, cb['BB']), h.stop - h.start)](
                    *ins[:6], lse_b[h], *ins[7:], dkb[h], dvb[h], Tq, Tk, offset, wa, wb, qk_scale, PART=part, **common,
                    **_launch(cb, part))
    if fused:  # plane 0 + plane 1 in a fixed order; the lanes carry scale * log2(e) in A only
        dka.copy_((planes[0, 0] + planes[0, 1]) * scale)
        dva.copy_(planes[1, 0] + planes[1, 1])
    return dq, dk1, dk2, dv1, dv2

