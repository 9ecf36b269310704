"""
Order-3 softmax HyperAttention with both key slots windowed ([IA] Def 6.1, App. F), on
each query's two windows:

    K1g[i, t] = K1[p_i - w1 + 1 + t]   (t < w1),   K2g[i, u] = K2[p_i - w2 + 1 + u]   (u < w2)
    logit[i, t, u] = (K1g[i] @ (q_i * K2g[i])^T)[t, u] / sqrt(dh)            one batched matmul
    out[i]         = sum_u V2g[i, u] * (softmax(logit[i])^T @ V1g[i])[u]       one batched matmul

with p_i = offset + i (written for w2 <= w1: q multiplies the narrower window, the roles swap
otherwise); a window entry outside [0, Tk) is hidden. The windows are strided views of the
zero-padded keys and values, not copies. Only the w1 x w2 pairs a
query may see are computed: O(T w1 w2 dh) in a fixed number of ops, where the blockwise form
(pytorch.py) issues a dozen ops per block of queries and keys. The backward (`ha3_backward`)
recomputes the logits from the saved logsumexp, as the blockwise one does, and scatters the
gathered keys' gradients back with index_add_.

Memory: queries are taken in chunks so that one chunk's logits hold at most CHUNK_ELEMENTS
numbers (backward keeps two such tensors and four (N, c, narrow window, dh) products); the
windows themselves are strided views of the padded keys, never copies. The number of chunks
is the bound's: N T w1 w2 / CHUNK_ELEMENTS, the same ~20 ops each, whatever the geometry.

Numerics as pytorch.py: float32 compute (float64 stays float64), outputs and gradients cast
back; a query that sees no key pair gets 0 and zero gradients, its logsumexp -inf.
"""

import torch

from attention_kernels.ha.pytorch import EXP_FLOOR, _spans, compute_dtype, default_blocks

# logits per query chunk, by device: on the CPU a chunk whose tensors stay in cache (1 MiB of
# float32 logits: measured fastest, 256K against 16K to 16M, docs/performance.md); on a GPU
# 1 GiB, so that the [IA] table's call (144 heads x 1024 queries x 64 x 64) takes 3 chunks
CHUNK_ELEMENTS = {'cpu': 1 << 18, 'cuda': 1 << 28}


def applies(causal, window1, window2):
    """The form computes causal HA with both slots windowed."""
    return bool(causal and window1 > 0 and window2 > 0)


def logit_counts(Tq, Tk, offset, window1, window2):
    """(windowed, blockwise): the logits each form computes for one head, from the positions
    alone. The blockwise count is that of the blocks pytorch.py visits."""
    bq, b1 = default_blocks(Tq, window2)
    blockwise = sum((i1 - i0) * (b - a) * (hi2 - lo2)
                    for i0, i1, lo2, hi2, blocks in _spans(Tq, Tk, offset, True, window1, window2, bq, b1)
                    for a, b in blocks)
    return Tq * _width(window1, Tq, offset) * _width(window2, Tq, offset), blockwise


def _width(w, Tq, offset):
    """The gathered width: a window reaching back past position 0 from the last query
    (offset + Tq - 1) is, for every query, the same as one that reaches exactly to it."""
    return min(w, offset + Tq)


def _chunk(N, Tq, w1, w2, device):
    bound = CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS['cpu'])
    return max(1, min(Tq, bound // max(1, N * w1 * w2)))


class _Padded:
    """The streams padded with zeros so that every query's window is a slice: position j sits
    at row j + front. A window is then a strided view of it, (N, c, w, dh), not a gather."""

    def __init__(self, Tq, Tk, offset, widths, streams):
        self.front, self.Tk, self.offset = max(widths) - 1, Tk, offset
        back = max(0, offset + Tq - Tk)
        self.streams = [torch.nn.functional.pad(t, (0, 0, self.front, back)).contiguous() for t in streams]

    def start(self, i0, w):
        return self.offset + i0 - w + 1 + self.front  # the padded row of query i0's first key

    def view(self, t, i0, i1, w):
        N, L, dh = t.shape
        return t.as_strided((N, i1 - i0, w, dh), (L * dh, dh, dh, 1), t.storage_offset() + self.start(i0, w) * dh)

    def valid(self, i0, i1, w, device):
        j = torch.arange(i0, i1, device=device)[:, None] + torch.arange(w, device=device) + (self.offset - w + 1)
        return (j >= 0) & (j < self.Tk)

    def rows_of(self, i0, i1, w, device):
        """The padded rows of a view's entries, flat: where its gradient goes (index_add_)."""
        r = torch.arange(i0, i1, device=device)[:, None] + torch.arange(w, device=device) + self.start(0, w)
        return r.reshape(-1)


def _chunks(q, pad, w1, w2, wide1):
    """Per query chunk: (i0, i1, hidden (c, w_wide, w_narrow))."""
    N, Tq, _ = q.shape
    c = _chunk(N, Tq, w1, w2, q.device)
    ww, wn = (w1, w2) if wide1 else (w2, w1)
    for i0 in range(0, Tq, c):
        i1 = min(i0 + c, Tq)
        yield i0, i1, ~(pad.valid(i0, i1, ww, q.device)[:, :, None] & pad.valid(i0, i1, wn, q.device)[:, None, :])


def _weights(L, shift, hidden):
    """exp(L - shift) in place with exact zeros at hidden pairs (the clamp keeps exp away from
    denormals, which CPUs compute slowly)."""
    P = L.sub_(shift).clamp_(min=EXP_FLOOR).exp_()
    return P.masked_fill_(hidden, 0.0)


def _prepare(q, k1, k2, v1, v2, offset, window1, window2, scale):
    """The scaled queries and the padded streams in compute dtype (shared keys and values
    padded once), as ((wide keys, wide values), w_wide), ((narrow ...), w_narrow): q's products
    are taken on the narrower slot's window and the wider one's gradients come out of matmuls,
    so that every elementwise product is (c, narrow width, dh)."""
    shared = k2 is k1 and v2 is v1
    cdt = compute_dtype(q.dtype)
    q, k1, k2, v1, v2 = (t.to(cdt) for t in (q, k1, k2, v1, v2))
    Tq = q.size(1)
    w1, w2 = _width(window1, Tq, offset), _width(window2, Tq, offset)
    pad = _Padded(Tq, k1.size(1), offset, (w1, w2), [k1, v1] if shared else [k1, v1, k2, v2])
    s1 = pad.streams[:2]
    s2 = s1 if shared else pad.streams[2:]
    wide, narrow = ((s1, w1), (s2, w2)) if w1 >= w2 else ((s2, w2), (s1, w1))
    return q * scale, pad, wide, narrow, shared, (w1, w2, w1 >= w2)


def ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale):
    """pytorch.ha3_forward's signature and results (out, lse, out32), for applies(...) cases."""
    assert applies(causal, window1, window2), "the windowed form needs causal attention and both windows"
    dtype = q.dtype
    qs, pad, ((kw, vw), ww), ((kn, vn), wn), _, geo = _prepare(q, k1, k2, v1, v2, offset, window1, window2, scale)
    cdt = qs.dtype
    out = torch.empty_like(qs)
    lse = torch.empty(qs.shape[:2], dtype=cdt, device=qs.device)
    for i0, i1, hidden in _chunks(qs, pad, *geo):
        A = qs[:, i0:i1, None, :] * pad.view(kn, i0, i1, wn)                 # (N, c, wn, dh)
        L = torch.matmul(pad.view(kw, i0, i1, ww), A.transpose(-1, -2))      # (N, c, ww, wn)
        L.masked_fill_(hidden, float('-inf'))
        m = L.amax((-2, -1))
        m_safe = m.masked_fill(m == float('-inf'), 0.0)  # a query that sees nothing
        P = _weights(L, m_safe[..., None, None], hidden)
        s = P.sum((-2, -1))
        P /= s.clamp(min=torch.finfo(cdt).tiny)[..., None, None]
        PtV = torch.matmul(P.transpose(-1, -2), pad.view(vw, i0, i1, ww))    # (N, c, wn, dh)
        out[:, i0:i1] = (PtV * pad.view(vn, i0, i1, wn)).sum(2)
        lse[:, i0:i1] = m_safe + s.log()  # log 0 = -inf where nothing is seen
    return out.to(dtype), lse, (out if dtype != cdt else None)


def ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset, causal, window1, window2, scale):
    """Gradients (dq, dk1, dk2, dv1, dv2) in the inputs' dtypes; pytorch.ha3_backward's
    formulas on the windows, with A = q_i * K_narrow:
        dV_narrow = dO * (P^T @ V_wide),   dV_wide = P @ (dO * V_narrow),
        dlogit = P * (V_wide @ (dO * V_narrow)^T - D_i),
        dK_wide = dlogit @ A,   dA = dlogit^T @ K_wide,   dq ~ sum dA * K_narrow,   dK_narrow ~ dA * q,
    summed back onto the keys. With shared keys and values the whole gradient is returned as
    dk1 (dv1) and dk2 (dv2) is zero: the caller sums the two."""
    dtypes = [t.dtype for t in (q, k1, k2, v1, v2)]
    qs, pad, ((kw, vw), ww), ((kn, vn), wn), shared, geo = _prepare(q, k1, k2, v1, v2, offset, window1, window2,
                                                                     scale)
    cdt = qs.dtype
    out, dout, lse = out.to(cdt), dout.to(cdt), lse.to(cdt)
    lse = lse.masked_fill(lse == float('-inf'), 0.0)  # rows that see nothing: P = 0 stays 0
    N, Tq, dh = qs.shape
    D = (dout * out).sum(-1)
    dqs = torch.empty_like(qs)
    grads = [torch.zeros_like(t) for t in pad.streams]  # in the streams' order: k1, v1[, k2, v2]
    g1 = grads[:2]
    g2 = g1 if shared else grads[2:]
    (gkw, gvw), (gkn, gvn) = (g1, g2) if geo[2] else (g2, g1)
    for i0, i1, hidden in _chunks(qs, pad, *geo):
        c = i1 - i0
        qc, do = qs[:, i0:i1, None, :], dout[:, i0:i1, None, :]
        Kw, Vw, Kn, Vn = (pad.view(t, i0, i1, w) for t, w in ((kw, ww), (vw, ww), (kn, wn), (vn, wn)))
        A = qc * Kn
        L = torch.matmul(Kw, A.transpose(-1, -2)).masked_fill_(hidden, float('-inf'))
        P = _weights(L, lse[:, i0:i1, None, None], hidden)
        B = do * Vn                                                           # (N, c, wn, dh)
        dVn = torch.matmul(P.transpose(-1, -2), Vw).mul_(do)
        dVw = torch.matmul(P, B)
        dL = torch.matmul(Vw, B.transpose(-1, -2)).sub_(D[:, i0:i1, None, None]).mul_(P)
        dKw = torch.matmul(dL, A)
        dA = torch.matmul(dL.transpose(-1, -2), Kw)
        dqs[:, i0:i1] = (dA * Kn).sum(2)
        dKn = dA.mul_(qc)
        for grad, part, w in ((gkw, dKw, ww), (gvw, dVw, ww), (gkn, dKn, wn), (gvn, dVn, wn)):
            grad.index_add_(1, pad.rows_of(i0, i1, w, qs.device), part.reshape(N, c * w, dh))
    Tk = k1.size(1)
    back = [g[:, pad.front:pad.front + Tk] for g in grads]
    dk1, dv1 = back[:2]
    dk2, dv2 = (torch.zeros_like(dk1), torch.zeros_like(dv1)) if shared else back[2:]
    out = (dqs * scale, dk1, dk2, dv1, dv2)  # the keys' gradients carry the scale through qs
    return tuple(g.to(d) for g, d in zip(out, dtypes))


# the rule (measured on one CPU thread, forward + backward, docs/performance.md): the windowed
# form is the faster where it computes at most this fraction of the blockwise form's logits
WINS_BELOW = {'cpu': 0.6, 'cuda': 1.0}  # on CUDA it is the fallback's: ops, not flops, decide


def wins(Tq, Tk, offset, causal, window1, window2, device='cpu'):
    """Whether ha_form='auto' computes this call by gathered windows (plain arithmetic on
    positions, a few dozen steps: no cache, nothing for torch.compile to guard on)."""
    if not applies(causal, window1, window2):
        return False
    gathered, blockwise = logit_counts(Tq, Tk, offset, window1, window2)
    return gathered <= WINS_BELOW.get(device, WINS_BELOW['cpu']) * blockwise
