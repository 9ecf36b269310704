"""
HyperFeatureAttention by its definition ([IA] Def 5.1, Def E.2), scores materialised:

    score[i, j] = prod_a (q_a,i . k_a,j * scale)       A factors, logits (not probabilities)
    out[i]      = sum_j softmax_j(score[i, j]) v_j     over the keys query i sees

(softmax=False: the scores themselves weigh the values). The float64 reference of the tests.
"""

import torch
from torch.nn import functional as F

from attention_kernels.masks import visible


def naive_hfa(q, k, v, offset=0, causal=True, window=0, scale=None, softmax=True, dropout_p=0.0, lse=False):
    """q (A, ..., Tq, dh), k (A, ..., Tk, dh), v (..., Tk, dh); query i at position offset + i.
    A query that sees no key gets 0. scale defaults to 1/sqrt(dh) per factor. With lse=True:
    (out, row logsumexp of the visible scores, -inf where no key is visible), with or
    without the softmax."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    s = 1.0
    for a in range(q.size(0)):
        s = s * (q[a] @ k[a].transpose(-1, -2) * scale)
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    hidden = s.masked_fill(~m, float('-inf'))
    w = torch.softmax(hidden, -1).nan_to_num(0.0) if softmax else s * m
    out = (F.dropout(w, dropout_p) if dropout_p else w) @ v
    return (out, hidden.logsumexp(-1)) if lse else out
