"""
HyperAttention kernels ([IA] Def 6.1, App. F): softmax over tuples of keys.

    logit[i, j1, .., jn] = sum_s Q[i,s] K1[j1,s] ... Kn[jn,s] / sqrt(dh)
    out[i]               = sum_{j1..jn} softmax(logit[i])[j1..jn] V1[j1] * ... * Vn[jn]

`hyper_attention_reference` materialises every tuple (O(Tq Tk^n) memory): it is the
definition, for any order, used for order >= 4 and as a check.
`hyper_attention` is order 3 (pairs of keys) computed in query chunks.
"""

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
                    softmax=True, chunk=16):
    """Order-3 HyperAttention. q (B, H, Tq, dh); k*, v* (B, H, Tk, dh); query i sits at
    position offset + i. Windows (> 0) keep j1 within the last window1 positions and j2
    within the last window2. Computed chunk queries at a time: O(chunk Tk^2) memory."""
    outs = []
    for s in range(0, q.size(-2), chunk):
        qc = q[..., s:s + chunk, :]
        masks = pair_masks(qc.size(-2), k1.size(-2), offset + s, causal, window1, window2, q.device)
        outs.append(hyper_attention_reference(qc, [k1, k2], [v1, v2], masks, softmax))
    return torch.cat(outs, dim=-2)
