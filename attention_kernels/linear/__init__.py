"""
Linear attention ([IA] Eq. 1): the softmax removed, optionally divided by the visible keys.

    naive.py     the definition, T x T weights materialised: the tests' reference and the
                 PyTorch form
    triton.py    the same in Triton, no T x T tensor (forward and backward), blockwise
                 like flash attention: O(T^2 dh) work
    triton_chunked.py  full causal self-attention in chunks with a dh x dh state: O(T dh^2)
                 work; dispatch gives it sequences of CHUNKED_MIN_T or more
    ops.py       the Triton kernels as torch.library custom ops

`attention` below runs the form attention_kernels.dispatch picks; the forms follow it.
"""

import attention_kernels
from attention_kernels.linear.naive import naive_linear
from attention_kernels.linear.ops import linear_attention


def attention(q, k, v, offset=0, causal=True, window=0, norm=False, dropout_p=0.0, kernel='auto', check=True):
    """q (B, H, Tq, dh), k, v (B, H, Tk, dh); query i at position offset + i, reading the keys
    within the last `window` positions (0: all, causal only); norm divides by their number.
    dropout_p: attention-weight dropout (0 when not training), which only the PyTorch form has.
    check: the Triton kernels' first-use self-check (attention_kernels/guard.py)."""
    fn = attention_kernels.dispatch(kernel, 'linear', q, k, check=check, offset=offset, causal=causal,
                                    window=window, dropout_p=dropout_p)
    return fn(q, k, v, offset, causal, window, norm, dropout_p)


def reference(q, k, v, offset, causal, window, norm, dropout_p):
    return naive_linear(q, k, v, offset, causal, window, norm, None, dropout_p)


def with_triton(q, k, v, offset, causal, window, norm, dropout_p, *, strict, check):
    return linear_attention(q, k, v, offset, causal, window, norm, q.size(-1) ** -0.5, False, strict, check)


def with_triton_chunked(q, k, v, offset, causal, window, norm, dropout_p, *, strict, check):
    return linear_attention(q, k, v, offset, causal, window, norm, q.size(-1) ** -0.5, True, strict, check)
