"""
HyperAttention by its definition ([IA] Def 6.1, App. F), every key tuple materialised:

    logit[i, j1, .., jn] = scale * sum_s Q[i,s] K1[j1,s] ... Kn[jn,s]     (scale 1/sqrt(dh))
    out[i]               = sum_{j1..jn} softmax(logit[i])[j1..jn] V1[j1] * ... * Vn[jn]

over the tuples whose every slot is visible to query i. O(Tq Tk^n) memory: the reference the
tests compare every kernel with (in float64, tiny sizes), and the PyTorch path for order >= 4.
"""

import torch

from attention_kernels.masks import visible


def naive_hyper_attention(q, ks, vs, masks, softmax=True, scale=None, lse=False):
    """q (..., Tq, dh); ks, vs lists of n tensors (..., Tk, dh); masks a list of n bool
    (Tq, Tk): key slot a of query i may hold j iff masks[a][i, j]. softmax=False weighs each
    tuple by its raw logit (linear HA). A query with no visible tuple gets 0 (as the kernels).
    Returns out (..., Tq, dh), or with lse=True (out, row logsumexp of the visible logits
    (..., Tq), -inf where nothing is visible), with or without the softmax."""
    n, dh = len(ks), q.size(-1)
    slots = 'klmnopqr'[:n]
    logit = torch.einsum(f"...is,{','.join(f'...{c}s' for c in slots)}->...i{slots}", q, *ks)
    logit = logit * (dh ** -0.5 if scale is None else scale)
    m = masks[0]
    for a in range(1, n):  # outer "and" over the slots: (Tq, Tk, Tk, ...)
        m = m.unsqueeze(-1) & masks[a].view(masks[a].size(0), *([1] * a), masks[a].size(1))
    hidden = logit.masked_fill(~m, float('-inf'))
    if softmax:  # a query with no visible tuple: 0, as the kernels
        w = hidden.flatten(-n).softmax(-1).view_as(logit).nan_to_num(0.0)
    else:
        w = logit * m
    out = torch.einsum(f"...i{slots},{','.join(f'...{c}d' for c in slots)}->...id", w, *vs)
    return (out, hidden.flatten(-n).logsumexp(-1)) if lse else out


def slot_masks(n_q, n_k, offset, causal, windows, device):
    """One visibility mask per key slot, slot a within the last windows[a] positions (0: full)."""
    return [visible(n_q, n_k, offset, causal, w, device) for w in windows]


def naive_ha3(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0, scale=None, key_start=(0, 0)):
    """Order 3 with the kernels' arguments: (out, lse). k1/v1 hold the keys at positions
    key_start[0] + 0, 1, ..., k2/v2 those at key_start[1] + 0, 1, ... (a slice of the keys)."""
    Tq = q.size(-2)
    masks = [visible(Tq, k1.size(-2), offset - key_start[0], causal, window1, q.device),
             visible(Tq, k2.size(-2), offset - key_start[1], causal, window2, q.device)]
    return naive_hyper_attention(q, [k1, k2], [v1, v2], masks, scale=scale, lse=True)
