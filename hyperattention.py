"""
HyperAttention kernels ([IA] Def 6.1, App. F): softmax over tuples of keys.

    logit[i, j1, .., jn] = sum_s Q[i,s] K1[j1,s] ... Kn[jn,s] / sqrt(dh)
    out[i]               = sum_{j1..jn} softmax(logit[i])[j1..jn] V1[j1] * ... * Vn[jn]

`hyper_attention_reference` materialises every tuple (O(Tq Tk^n) memory): it is the
definition, for any order, used for order >= 4 and as a check.

`hyper_attention` is order 3 (pairs of keys), exact, and never builds a Tq x Tk x Tk tensor:

- softmax=True: flash-attention style. For a block of bq queries and a block of b1 first
  keys, the logits against every visible second key are ONE matmul,
      logit[(i,j1), j2] = ((q_i * k1_j1) @ k2^T)[j2]          (bq*b1, dh) x (dh, n2),
  folded into a running (max, sum) per query row (online softmax); the value sum is again
  a matmul,  sum_{j1,j2} P[i,j1,j2] v1[j1] * v2[j2] = sum_j1 v1[j1] * (P[i,j1,:] @ v2).
  Backward recomputes the block logits from the saved logsumexp (O(Tq) statistics).
  Blocks that causality or the windows hide entirely are never visited, so windowed HA
  costs O(T w1 w2 dh), also when decoding one token at a time from a KV cache.
- softmax=False (linear HA, [IA] App. F.3): the sum factorises,
      out[i,d] = sum_s q[i,s]/sqrt(dh) * S1_i[s,d] * S2_i[s,d],   S_a,i = sum_{j visible} k_a[j] v_a[j]^T,
  and S_a,i is a difference of prefix sums (windows included): O(T dh^2) time and memory.
"""

import math

import torch


def hyper_attention_reference(q, ks, vs, masks, softmax=True):
    """q (B, H, Tq, dh); ks, vs lists of n tensors (B, H, Tk, dh); masks a list of n bool
    (Tq, Tk): key slot a of query i may hold j iff masks[a][i, j]. A tuple is visible iff
    every slot is. softmax=False weighs each tuple by its raw logit (linear HA)."""
    n, dh = len(ks), q.size(-1)
    slots = 'klmnopqr'[:n]
    logit = torch.einsum(f"bhis,{','.join(f'bh{c}s' for c in slots)}->bhi{slots}", q, *ks) * dh ** -0.5
    m = masks[0]
    for a in range(1, n):  # outer "and" over the slots: (Tq, Tk, Tk, ...)
        m = m.unsqueeze(-1) & masks[a].view(masks[a].size(0), *([1] * a), masks[a].size(1))
    if softmax:
        w = logit.masked_fill(~m, float('-inf')).flatten(3).softmax(-1).view_as(logit)
    else:
        w = logit * m
    return torch.einsum(f"bhi{slots},{','.join(f'bh{c}d' for c in slots)}->bhid", w, *vs)


def pair_masks(n_q, n_k, offset, causal, window1, window2, device):
    from model import visible
    return [visible(n_q, n_k, offset, causal, window1, device),
            visible(n_q, n_k, offset, causal, window2, device)]


def hyper_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0,
                    softmax=True, block_q=None, block_k=None):
    """Order-3 HyperAttention, exact. q (B, H, Tq, dh); k*, v* (B, H, Tk, dh); query i sits
    at position offset + i, key j at j. Causal: j1, j2 <= offset + i. Windows (> 0) keep j1
    within the last window1 positions and j2 within the last window2 (2-simplicial
    attention). Equals hyper_attention_reference with pair_masks(...), in value and gradient."""
    if not causal:
        window1 = window2 = 0  # a window is a causal notion here, as in model.visible
    if not softmax:
        return _linear_ha(q, k1, k2, v1, v2, offset, causal, window1, window2)
    B, H, Tq, dh = q.shape
    Tk = k1.size(-2)
    bq = block_q or _default_block_q(Tq, window2)
    b1 = block_k or 32
    geo = (offset, causal, window1, window2, bq, b1)
    flat = [t.reshape(B * H, t.size(-2), dh) for t in (q, k1, k2, v1, v2)]
    out = _HA3.apply(*flat, geo)
    return out.view(B, H, Tq, dh)


def _default_block_q(Tq, window2):
    # Rows of a logit block are bq*b1; the j2 span of a query block is about bq + w2, so
    # with a narrow second window a large bq mostly computes masked-out logits.
    bq = 16 if not window2 else max(8, min(32, window2))
    return min(bq, Tq)


# -----------------------------------------------------------------------------
# softmax HA, order 3: blockwise with an online softmax

def _spans(Tq, Tk, offset, causal, window1, window2, bq, b1):
    """Yield, per query block [i0, i1), the j2 span [lo2, hi2) and the j1 blocks to visit.
    Everything outside these spans is masked for every query in the block."""
    for i0 in range(0, Tq, bq):
        i1 = min(i0 + bq, Tq)
        p0, p1 = offset + i0, offset + i1 - 1  # absolute positions of first/last query
        hi = min(p1 + 1, Tk) if causal else Tk
        lo1 = max(0, p0 - window1 + 1) if window1 else 0
        lo2 = max(0, p0 - window2 + 1) if window2 else 0
        yield i0, i1, lo2, hi, [(a, min(a + b1, hi)) for a in range(lo1, hi, b1)]


def _mask(pos, keys, causal, window):
    """Visibility (len(pos), len(keys)) restricted to the smallest key slice [c0, c1) holding
    every hidden entry: returns (c0, c1, vis) or None when the block is fully visible."""
    if not causal:
        return None
    vis = keys[None, :] <= pos[:, None]
    if window:
        vis &= pos[:, None] - keys[None, :] < window
    hidden = (~vis).any(0).nonzero()
    if hidden.numel() == 0:
        return None
    c0, c1 = int(hidden[0]), int(hidden[-1]) + 1
    return c0, c1, vis[:, c0:c1]


def _masked_exp(L, shift, mask1, mask2):
    """exp(L - shift) in place, with exact zeros at hidden pairs. Hidden logits enter as
    -inf (so that they never win the row max); the clamp keeps exp away from -inf and from
    denormal results, which run ~30x slower on CPU; the multiply then zeroes them exactly.
    The floor exp(log(tiny) + 1) is far below the precision of a sum that holds exp(0)."""
    L -= shift
    L.clamp_(min=math.log(torch.finfo(L.dtype).tiny) + 1.0)
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


class _HA3(torch.autograd.Function):
    """Inputs flattened to (N = B*H, T, dh). Saves only the inputs, the output and the
    per-row logsumexp; backward recomputes each block's probabilities from them."""

    @staticmethod
    def forward(ctx, q, k1, k2, v1, v2, geo):
        offset, causal, w1, w2, bq, b1 = geo
        N, Tq, dh = q.shape
        Tk = k1.size(1)
        qs = q * dh ** -0.5
        out = torch.empty_like(q)
        lse = torch.empty(N, Tq, dtype=q.dtype, device=q.device)
        ar = torch.arange(Tk + Tq + offset, device=q.device)
        for i0, i1, lo2, hi2, blocks in _spans(Tq, Tk, offset, causal, w1, w2, bq, b1):
            pos = ar[i0:i1] + offset
            qb = qs[:, i0:i1]
            k2s, v2s = k2[:, lo2:hi2], v2[:, lo2:hi2]
            mask2 = _mask(pos, ar[lo2:hi2], causal, w2)
            m = torch.full((N, i1 - i0), float('-inf'), dtype=q.dtype, device=q.device)
            l = torch.zeros_like(m)
            acc = torch.zeros(N, i1 - i0, dh, dtype=q.dtype, device=q.device)
            for a, b in blocks:
                mask1 = _mask(pos, ar[a:b], causal, w1)
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
            out[:, i0:i1] = acc / l[..., None]
            lse[:, i0:i1] = m + l.log()
        ctx.geo = geo
        ctx.save_for_backward(q, k1, k2, v1, v2, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        """With P the normalised weights and dP[i,j1,j2] = dO_i . (v1_j1 * v2_j2):
            dlogit = P * (dP - D_i),  D_i = dO_i . O_i
            dq  ~ sum_j1 k1_j1 * (dlogit[i,j1,:] @ k2),   dk1 ~ sum_i q_i * (dlogit[i,j1,:] @ k2)
            dk2 ~ dlogit^T @ (q_i * k1_j1),               (the ~ is the 1/sqrt(dh) scale)
            dv1 = sum_i dO_i * (P[i,j1,:] @ v2),          dv2 = P^T @ (dO_i * v1_j1)."""
        q, k1, k2, v1, v2, out, lse = ctx.saved_tensors
        offset, causal, w1, w2, bq, b1 = ctx.geo
        N, Tq, dh = q.shape
        Tk = k1.size(1)
        scale = dh ** -0.5
        dout = dout.contiguous()
        qs = q * scale
        D = (dout * out).sum(-1)
        dqs = torch.zeros_like(q)
        dk1, dk2, dv1, dv2 = (torch.zeros_like(t) for t in (k1, k2, v1, v2))
        ar = torch.arange(Tk + Tq + offset, device=q.device)
        for i0, i1, lo2, hi2, blocks in _spans(Tq, Tk, offset, causal, w1, w2, bq, b1):
            pos = ar[i0:i1] + offset
            qb, dob = qs[:, i0:i1], dout[:, i0:i1]
            k2s, v2s = k2[:, lo2:hi2], v2[:, lo2:hi2]
            mask2 = _mask(pos, ar[lo2:hi2], causal, w2)
            lse_b, D_b = lse[:, i0:i1, None, None], D[:, i0:i1, None, None]
            for a, b in blocks:
                k1b, v1b = k1[:, a:b], v1[:, a:b]
                mask1 = _mask(pos, ar[a:b], causal, w1)
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
        return dqs * scale, dk1, dk2, dv1, dv2, None


# -----------------------------------------------------------------------------
# linear HA, order 3: prefix sums

def _linear_ha(q, k1, k2, v1, v2, offset, causal, window1, window2):
    """out[i,d] = sum_s q[i,s]/sqrt(dh) * S1_i[s,d] * S2_i[s,d] with S_a,i the sum of
    k_a[j] v_a[j]^T over the keys slot a may hold: C[hi] - C[lo], C the prefix sums.
    Only the keys some query can see are summed (decoding touches O(window) keys)."""
    Tq, Tk, dh = q.size(-2), k1.size(-2), q.size(-1)
    pos = torch.arange(Tq, device=q.device) + offset
    hi = (pos + 1).clamp(max=Tk) if causal else torch.full_like(pos, Tk)

    def window_sum(k, v, w):
        lo = (pos - w + 1).clamp(min=0) if (causal and w) else torch.zeros_like(pos)
        k0 = int(lo.min())
        k1_ = int(hi.max())
        kv = k[..., k0:k1_, :, None] * v[..., k0:k1_, None, :]  # (B, H, n, dh, dh)
        C = torch.cat([torch.zeros_like(kv[..., :1, :, :]), kv.cumsum(-3)], dim=-3)
        return C[..., hi - k0, :, :] - C[..., lo - k0, :, :]    # (B, H, Tq, dh, dh)

    S1 = window_sum(k1, v1, window1)
    S2 = window_sum(k2, v2, window2)
    return torch.einsum('bhis,bhisd->bhid', q * dh ** -0.5, S1 * S2)
