"""
HyperFeatureAttention in PyTorch, the two forms the model runs without Triton:

- `explicit`: the A score matrices, multiplied out and softmaxed (O(Tq Tk) memory per head).
- `lifted`: (Q1 K1^T) * (Q2 K2^T) = (Q1 (x) Q2)(K1 (x) K2)^T with (x) the row-wise Kronecker
  product, so softmax HFA is exactly SDPA on lifted queries/keys of width dh^A: memory linear
  in T and torch's fused kernels, worth it while dh^A is small (docs/performance.md).
"""

import torch
from torch.nn import functional as F

from attention_kernels.masks import visible


def explicit(q, k, v, offset, causal, window, softmax=True, dropout_p=0.0):
    """q (A, B, H, Tq, dh), k (A, B, H, Tk, dh), v (B, H, Tk, dh); each factor scaled by
    1/sqrt(dh), applied once as dh^(-A/2)."""
    # one (B, H, Tq, Tk) score matrix per factor, multiplied out one by one: Tensor.prod's
    # backward is ~2x slower (zero checks), and indexing a stacked (A, ...) score tensor
    # would give each factor's gradient as a zero-filled (A, ...) tensor; unbind's is a stack
    w = None
    for qa, ka in zip(q.unbind(0), k.unbind(0)):
        sa = qa @ ka.transpose(-2, -1)
        w = sa * q.size(-1) ** (-0.5 * len(q)) if w is None else w * sa
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    if softmax:  # the mask added as 0 / -inf: the addition's backward costs nothing, masked_fill's does
        w = torch.softmax(w + torch.where(m, 0.0, float('-inf')).to(w.dtype), dim=-1)
    else:
        w = w * m
    return (F.dropout(w, dropout_p) if dropout_p else w) @ v


def lift(x):
    """Row-wise Kronecker product of the A streams: (A, ..., dh) -> (..., dh^A)."""
    out = x[0]
    for xa in x[1:]:
        out = (out.unsqueeze(-1) * xa.unsqueeze(-2)).flatten(-2)
    return out


def lifted(q, k, v, offset, causal, window, dropout_p=0.0):
    """Softmax HFA as SDPA on lifted queries and keys (shapes as `explicit`)."""
    ql, kl = lift(q), lift(k)
    scale = q.size(-1) ** (-0.5 * len(q))
    if causal and not window and ql.size(-2) == kl.size(-2):
        return F.scaled_dot_product_attention(ql, kl, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    m = visible(ql.size(-2), kl.size(-2), offset, causal, window, ql.device) if causal else None
    return F.scaled_dot_product_attention(ql, kl, v, attn_mask=m, dropout_p=dropout_p, scale=scale)
