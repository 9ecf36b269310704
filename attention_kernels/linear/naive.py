"""
Linear attention by its definition ([IA] Eq. 1), the softmax removed and nothing else:

    out[i] = sum_{j visible} (q_i . k_j * scale) v_j        (scale 1/sqrt(dh))

divided by the number of visible keys with norm=True. The T x T weights are materialised:
the float64 reference of the tests, and the PyTorch path of the model.
"""

from torch.nn import functional as F

from attention_kernels.masks import visible


def naive_linear(q, k, v, offset=0, causal=True, window=0, norm=False, scale=None, dropout_p=0.0):
    """q (..., Tq, dh), k, v (..., Tk, dh); query i at position offset + i."""
    scale = q.size(-1) ** -0.5 if scale is None else scale
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    w = (q @ k.transpose(-2, -1)) * scale * m
    if norm:
        w = w / m.sum(-1, keepdim=True).clamp(min=1)  # a query that sees no key: 0
    return (F.dropout(w, dropout_p) if dropout_p else w) @ v
