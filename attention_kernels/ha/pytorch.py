"""
HyperAttention of order 3 in PyTorch ([IA] Def 6.1, App. F): softmax over pairs of keys,

    logit[i, j1, j2] = sum_s Q[i,s] K1[j1,s] K2[j2,s] / sqrt(dh)
    out[i]           = sum_{j1,j2} softmax(logit[i])[j1,j2] V1[j1] * V2[j2],

computed without the Tq x Tk x Tk tensor of naive.py's definition.

`ha3_forward` / `ha3_backward` are exact (ops.py makes them one autograd op, `blockwise_attention`):

- flash-attention style. For a block of bq queries and a block of b1 first keys, the
  logits against every visible second key are ONE matmul,
      logit[(i,j1), j2] = ((q_i * k1_j1) @ k2^T)[j2]          (bq*b1, dh) x (dh, n2),
  folded into a running (max, sum) per query row (online softmax); the value sum is again
  a matmul,  sum_{j1,j2} P[i,j1,j2] v1[j1] * v2[j2] = sum_j1 v1[j1] * (P[i,j1,:] @ v2).
  Backward recomputes the block logits from the saved logsumexp (O(Tq) statistics).
  Blocks that causality or the windows hide entirely are never visited, so windowed HA
  costs O(T w1 w2 dh), also when decoding one token at a time from a KV cache.
- Numerics: everything is computed in float32 (float64 inputs stay float64), whatever the
  input dtype; the output and the gradients are cast back to it. A query that sees no
  key pair gets 0 and zero gradients (SDPA's convention), and its logsumexp is -inf.
- The block geometry is plain Python arithmetic on positions: no host-device sync.

`linear_hyper_attention` (softmax=False, linear HA, [IA] App. F.3): the sum factorises,
      out[i,d] = sum_s q[i,s]/sqrt(dh) * S1_i[s,d] * S2_i[s,d],   S_a,i = sum_{j visible} k_a[j] v_a[j]^T,
  and S_a,i is a difference of prefix sums (windows included): O(T dh^2) time and memory.
"""

import math

import torch

# exp of arguments below this floor is denormal or zero in float32, which CPUs compute
# ~30x slower; the floor's own weight, 5e-38, is far below the precision of any row sum
# (which holds exp(0) = 1), and hidden pairs are zeroed exactly after the exp.
EXP_FLOOR = math.log(torch.finfo(torch.float32).tiny) + 1.0


def default_blocks(Tq, window2):
    """(bq, b1). Rows of a logit block are bq*b1; the j2 span of a query block is about
    bq + w2, so with a narrow second window a large bq mostly computes masked-out logits."""
    bq = 16 if not window2 else max(8, min(32, window2))
    return min(bq, max(Tq, 1)), 32


def compute_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


# -----------------------------------------------------------------------------
# softmax HA, order 3: blockwise with an online softmax

def _spans(Tq, Tk, offset, causal, window1, window2, bq, b1):
    """Yield, per query block [i0, i1), the j2 span [lo2, hi2) and the j1 blocks to visit.
    Everything outside these spans is masked for every query in the block."""
    if not causal:
        window1 = window2 = 0
    for i0 in range(0, Tq, bq):
        i1 = min(i0 + bq, Tq)
        p0, p1 = offset + i0, offset + i1 - 1  # absolute positions of first/last query
        hi = min(p1 + 1, Tk) if causal else Tk
        lo1 = max(0, p0 - window1 + 1) if window1 else 0
        lo2 = max(0, p0 - window2 + 1) if window2 else 0
        yield i0, i1, lo2, hi, [(a, min(a + b1, hi)) for a in range(lo1, hi, b1)]


def _mask(pos, keys, p0, p1, k0, k1, causal, window):
    """Visibility of keys [k0, k1) to the queries at positions pos = [p0, p1], restricted
    to the smallest key slice [c0, c1) holding every hidden entry: (c0, c1, vis), or None
    when the block is fully visible. The slice is found from the positions alone: key j
    is hidden from some query iff j > p0 (causality) or j <= p1 - window."""
    if not causal:
        return None
    c0, c1 = k1, k0
    if p0 + 1 < k1:  # causality hides j in (p0, k1)
        c0, c1 = min(c0, max(k0, p0 + 1)), k1
    if window and p1 - window + 1 > k0:  # the window hides j in [k0, p1 - window]
        c0, c1 = k0, max(c1, min(k1, p1 - window + 1))
    if c0 >= c1:
        return None
    kk = keys[c0 - k0:c1 - k0]
    vis = kk[None, :] <= pos[:, None]
    if window:
        vis &= pos[:, None] - kk[None, :] < window
    return c0 - k0, c1 - k0, vis


def _masked_exp(L, shift, mask1, mask2):
    """exp(L - shift) in place, with exact zeros at hidden pairs. Hidden logits enter as
    -inf (so that they never win the row max); the clamp keeps exp away from -inf and from
    denormal results; the multiply then zeroes them exactly."""
    L -= shift
    L.clamp_(min=EXP_FLOOR)
    P = L.exp_()
    if mask1 is not None:
        c0, c1, vis = mask1
        P[:, :, c0:c1] *= vis[None, :, :, None]
    if mask2 is not None:
        c0, c1, vis = mask2
        P[..., c0:c1] *= vis[None, :, None, :]
    return P


def _block_logits(qs, k1b, k2s, mask1, mask2):
    """logits (N, bq, b1, n2) = sum_s qs[i,s] k1b[j1,s] k2s[j2,s], -inf where hidden;
    also returns the (N, bq*b1, dh) matrix of products qs[i] * k1b[j1]."""
    N, bq, dh = qs.shape
    b1, n2 = k1b.size(1), k2s.size(1)
    qk = (qs[:, :, None, :] * k1b[:, None, :, :]).view(N, bq * b1, dh)
    L = torch.bmm(qk, k2s.transpose(1, 2)).view(N, bq, b1, n2)
    for ax, m in ((2, mask1), (3, mask2)):
        if m is not None:
            c0, c1, vis = m
            sl = L[:, :, c0:c1] if ax == 2 else L[..., c0:c1]
            sl.masked_fill_((~vis)[None, :, :, None] if ax == 2 else (~vis)[None, :, None, :], float('-inf'))
    return qk, L


def _blocks(Tq, Tk, offset, causal, w1, w2, bq, b1, device):
    """Per query block: (i0, i1, lo2, hi2, mask2, [(a, b, mask1)]), masks from _mask."""
    ar = torch.arange(Tk + Tq + offset, device=device)
    for i0, i1, lo2, hi2, blocks in _spans(Tq, Tk, offset, causal, w1, w2, bq, b1):
        p0, p1 = offset + i0, offset + i1 - 1
        pos = ar[p0:p1 + 1]
        mask2 = _mask(pos, ar[lo2:hi2], p0, p1, lo2, hi2, causal, w2)
        yield i0, i1, lo2, hi2, mask2, [(a, b, _mask(pos, ar[a:b], p0, p1, a, b, causal, w1)) for a, b in blocks]


def ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale, block_q=0, block_k=0):
    """Order-3 HyperAttention forward. q (N, Tq, dh), k*, v* (N, Tk, dh); query i sits at
    position offset + i. Returns out (N, Tq, dh) in q's dtype, the row logsumexp (N, Tq) in
    the compute dtype (-inf for a query that sees no pair), and the output in the compute
    dtype when that differs from q's (else None): backward's D_i = dO_i . O_i is best taken
    from it, not from the rounded output."""
    dtype, cdt = q.dtype, compute_dtype(q.dtype)
    q, k1, k2, v1, v2 = (t.to(cdt) for t in (q, k1, k2, v1, v2))
    N, Tq, dh = q.shape
    Tk = k1.size(1)
    d_bq, d_b1 = default_blocks(Tq, window2)
    bq, b1 = block_q or d_bq, block_k or d_b1
    qs = q * scale
    out = torch.zeros_like(q)
    lse = torch.full((N, Tq), float('-inf'), dtype=cdt, device=q.device)
    for i0, i1, lo2, hi2, mask2, blocks in _blocks(Tq, Tk, offset, causal, window1, window2, bq, b1, q.device):
        qb = qs[:, i0:i1]
        k2s, v2s = k2[:, lo2:hi2], v2[:, lo2:hi2]
        m = torch.full((N, i1 - i0), float('-inf'), dtype=cdt, device=q.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(N, i1 - i0, dh, dtype=cdt, device=q.device)
        for a, b, mask1 in blocks:
            _, L = _block_logits(qb, k1[:, a:b], k2s, mask1, mask2)
            n, nb, n1, n2 = L.shape
            m_new = torch.maximum(m, L.view(n, nb, -1).amax(-1))
            m_safe = m_new.masked_fill(m_new == float('-inf'), 0.0)  # rows with nothing visible yet
            P = _masked_exp(L, m_safe[:, :, None, None], mask1, mask2)
            alpha = torch.exp(m - m_safe)
            l = l * alpha + P.view(n, nb, -1).sum(-1)
            pv = torch.bmm(P.view(n, nb * n1, n2), v2s).view(n, nb, n1, dh)
            acc = acc * alpha[..., None] + (pv * v1[:, None, a:b]).sum(2)
            m = m_new
        if blocks:  # a row that saw nothing has acc = 0 and l = 0: out 0, lse -inf
            out[:, i0:i1] = acc / l.clamp(min=torch.finfo(cdt).tiny)[..., None]
            lse[:, i0:i1] = m + l.log()
    return out.to(dtype), lse, (out if dtype != cdt else None)


def ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset, causal, window1, window2, scale,
                 block_q=0, block_k=0):
    """Gradients (dq, dk1, dk2, dv1, dv2) of ha3_forward, in the inputs' dtypes. With P the
    normalised weights and dP[i,j1,j2] = dO_i . (v1_j1 * v2_j2):
        dlogit = P * (dP - D_i),  D_i = dO_i . O_i
        dq  ~ sum_j1 k1_j1 * (dlogit[i,j1,:] @ k2),   dk1 ~ sum_i q_i * (dlogit[i,j1,:] @ k2)
        dk2 ~ dlogit^T @ (q_i * k1_j1),               (the ~ is the scale)
        dv1 = sum_i dO_i * (P[i,j1,:] @ v2),          dv2 = P^T @ (dO_i * v1_j1).
    Shared keys/values (k2 is k1) get two gradients: the caller sums them."""
    dtypes = [t.dtype for t in (q, k1, k2, v1, v2)]
    cdt = compute_dtype(q.dtype)
    q, k1, k2, v1, v2, out, dout = (t.to(cdt) for t in (q, k1, k2, v1, v2, out, dout))
    lse = lse.to(cdt)
    N, Tq, dh = q.shape
    Tk = k1.size(1)
    d_bq, d_b1 = default_blocks(Tq, window2)
    bq, b1 = block_q or d_bq, block_k or d_b1
    qs = q * scale
    D = (dout * out).sum(-1)
    lse = lse.masked_fill(lse == float('-inf'), 0.0)  # rows that see nothing: P = 0 stays 0
    dqs = torch.zeros_like(q)
    dk1, dk2, dv1, dv2 = (torch.zeros_like(t) for t in (k1, k2, v1, v2))
    for i0, i1, lo2, hi2, mask2, blocks in _blocks(Tq, Tk, offset, causal, window1, window2, bq, b1, q.device):
        qb, dob = qs[:, i0:i1], dout[:, i0:i1]
        k2s, v2s = k2[:, lo2:hi2], v2[:, lo2:hi2]
        lse_b, D_b = lse[:, i0:i1, None, None], D[:, i0:i1, None, None]
        for a, b, mask1 in blocks:
            k1b, v1b = k1[:, a:b], v1[:, a:b]
            qk, L = _block_logits(qb, k1b, k2s, mask1, mask2)
            n, nb, n1, n2 = L.shape
            P = _masked_exp(L, lse_b, mask1, mask2).view(n, nb * n1, n2)
            dov = (dob[:, :, None, :] * v1b[:, None, :, :]).view(n, nb * n1, dh)
            dP = torch.bmm(dov, v2s.transpose(1, 2))
            pv = torch.bmm(P, v2s).view(n, nb, n1, dh)
            dv1[:, a:b] += (pv * dob[:, :, None]).sum(1)
            dv2[:, lo2:hi2] += torch.bmm(P.transpose(1, 2), dov)
            dL = dP.view(n, nb, n1, n2).sub_(D_b).mul_(P.view(n, nb, n1, n2)).view(n, nb * n1, n2)
            G = torch.bmm(dL, k2s).view(n, nb, n1, dh)
            dqs[:, i0:i1] += (G * k1b[:, None]).sum(2)
            dk1[:, a:b] += (G * qb[:, :, None]).sum(1)
            dk2[:, lo2:hi2] += torch.bmm(dL.transpose(1, 2), qk)
    grads = (dqs * scale, dk1, dk2, dv1, dv2)  # dk1, dk2 carry the scale through qs
    return tuple(g.to(d) for g, d in zip(grads, dtypes))


# -----------------------------------------------------------------------------
# linear HA, order 3: prefix sums

def linear_hyper_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0):
    """out[i,d] = sum_s q[i,s]/sqrt(dh) * S1_i[s,d] * S2_i[s,d] with S_a,i the sum of
    k_a[j] v_a[j]^T over the keys slot a may hold: C[hi] - C[lo], C the prefix sums.
    Only the keys some query can see are summed (decoding touches O(window) keys).
    q (..., Tq, dh), k*, v* (..., Tk, dh); plain autograd, no host sync."""
    Tq, Tk, dh = q.size(-2), k1.size(-2), q.size(-1)
    if not causal:
        window1 = window2 = 0
    pos = torch.arange(Tq, device=q.device) + offset
    hi = (pos + 1).clamp(max=Tk) if causal else torch.full_like(pos, Tk)
    k_hi = min(offset + Tq, Tk) if causal else Tk  # = hi.max(), from the positions

    def window_sum(k, v, w):
        lo = (pos - w + 1).clamp(min=0) if w else torch.zeros_like(pos)
        k0 = min(max(0, offset - w + 1) if w else 0, k_hi)  # = lo.min()
        kv = k[..., k0:k_hi, :, None] * v[..., k0:k_hi, None, :]  # (..., n, dh, dh)
        C = torch.cat([torch.zeros_like(kv[..., :1, :, :]), kv.cumsum(-3)], dim=-3)
        return C[..., (hi - k0).clamp(min=0), :, :] - C[..., (lo - k0).clamp(min=0, max=k_hi - k0), :, :]

    S1 = window_sum(k1, v1, window1)
    S2 = window_sum(k2, v2, window2)
    return torch.einsum('...is,...isd->...id', q * dh ** -0.5, S1 * S2)
