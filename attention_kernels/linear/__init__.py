"""
Linear attention ([IA] Eq. 1): the softmax removed, optionally divided by the visible keys.

    naive.py     the definition, T x T weights materialised: the tests' reference and the
                 PyTorch path
    triton.py    the same in Triton, no T x T tensor (forward and backward), blockwise
                 like flash attention: O(T^2 dh) work
    triton_chunked.py  full causal self-attention in chunks with a dh x dh state: O(T dh^2)
                 work; triton.py hands it sequences of CHUNKED_MIN_T or more
    ops.py       the Triton kernel as a torch.library custom op

`attention` below takes the model's choices and picks one of them.
"""

import attention_kernels
from attention_kernels.linear.naive import naive_linear
from attention_kernels.linear.ops import linear_attention


def attention(q, k, v, offset=0, causal=True, window=0, norm=False, dropout_p=0.0, kernel='auto'):
    """q (B, H, Tq, dh), k, v (B, H, Tk, dh); query i at position offset + i, reading the keys
    within the last `window` positions (0: all, causal only); norm divides by their number.
    dropout_p: attention-weight dropout (0 when not training), which only the PyTorch path has."""
    scale = q.size(-1) ** -0.5
    if kernel != 'reference' and attention_kernels.backend(kernel, q, 'linear', not dropout_p) == 'triton':
        return linear_attention(q, k, v, offset, causal, window, norm, scale)
    return naive_linear(q, k, v, offset, causal, window, norm, scale, dropout_p)
