"""
Softmax self-attention, the baseline:

    out[i] = sum_{j visible} softmax_j(q_i . k_j * scale) v_j        (scale 1/sqrt(dh))

`naive_softmax` materialises the weights (the tests' reference); `sdpa` runs torch's
scaled_dot_product_attention in the form its fused kernels run fastest; `attention` runs the
one attention_kernels.dispatch picks.
"""

import torch

import attention_kernels
from torch.nn import functional as F

from attention_kernels.masks import visible


def naive_softmax(q, k, v, offset=0, causal=True, window=0, scale=None, dropout_p=0.0):
    """q (..., Tq, dh), k, v (..., Tk, dh); query i at position offset + i. A query that sees
    no key gets 0."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    w = torch.softmax(((q @ k.transpose(-2, -1)) * scale).masked_fill(~m, float('-inf')), -1).nan_to_num(0.0)
    return (F.dropout(w, dropout_p) if dropout_p else w) @ v


def attention(q, k, v, offset=0, causal=True, window=0, dropout_p=0.0, kernel='auto'):
    """q (B, H, Tq, dh), k, v (B, H, Tk, dh); window (0: all keys) applies to causal attention
    only. kernel='reference': the definition; else SDPA."""
    fn = attention_kernels.dispatch(kernel, 'sa', q, k, offset=offset, causal=causal, window=window,
                                    dropout_p=dropout_p)
    return fn(q, k, v, offset, causal, window, dropout_p)


def reference(q, k, v, offset, causal, window, dropout_p):
    return naive_softmax(q, k, v, offset, causal, window, dropout_p=dropout_p)


def sdpa(q, k, v, offset, causal, window, dropout_p):
    """SDPA without a mask when none is needed (non-causal, a full causal square, one query at
    the last position), else with the visibility mask."""
    if not window or not causal:  # the mask-free forms SDPA runs fastest
        if not causal or (q.size(-2) == 1 and offset == k.size(-2) - 1):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        if q.size(-2) == k.size(-2):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible(q.size(-2), k.size(-2), offset, causal, window,
                                                                     q.device), dropout_p=dropout_p)
