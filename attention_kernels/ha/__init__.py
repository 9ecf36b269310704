"""
HyperAttention of order n ([IA] Def 6.1, App. F): one joint softmax over (n-1)-tuples of keys.

    naive.py     the definition, every tuple materialised (any order): the tests' reference,
                 and the PyTorch path for order >= 4
    pytorch.py   order 3 blockwise with an online softmax (no Tq x Tk x Tk tensor); linear
                 HA (softmax=False) by prefix sums, O(T dh^2)
    windowed.py  order 3 with both slots windowed: each query's windows gathered, only its
                 w1 x w2 visible pairs computed, in a fixed number of ops
    triton.py    order 3 in Triton, forward and backward
    ops.py       order 3 as torch.library custom ops: the two PyTorch kernels, and the
                 Triton kernel

`attention` below runs the form attention_kernels.dispatch picks; the forms follow it.
"""

import attention_kernels
from attention_kernels.ha.naive import naive_hyper_attention, slot_masks
from attention_kernels.ha.ops import blockwise_attention, triton_attention, windowed_attention
from attention_kernels.ha.pytorch import linear_hyper_attention


def attention(q, k, v, offset=0, causal=True, order=3, windows=(0, 0), softmax=True, kernel='auto', check=True,
              form='auto'):
    """q (B, H, Tq, dh); k, v (n, B, H, Tk, dh) with n = order - 1 key and value streams, or
    (1, B, H, Tk, dh): one stream in every slot (shared keys and values). Query i sits at
    position offset + i. windows = (w1, w2) restrict slots 1 and 2 (0: full; later slots are
    full). Order 3 runs by gathered windows or blockwise (softmax; form, the model's ha_form,
    picks between them: 'auto' by the measured rule) or by prefix sums (softmax=False); order
    >= 4 and kernel='reference' materialise every tuple. No attention-weight dropout on any
    path. check: the Triton kernel's first-use self-check (attention_kernels/guard.py)."""
    n = order - 1
    fn = attention_kernels.dispatch(kernel, 'ha', q, k, check=check, offset=offset, causal=causal,
                                    softmax=softmax, order=order, windows=tuple(windows), ha_form=form)
    if k.size(0) == 1 and n > 1:  # shared: one tensor in every slot
        ks, vs = [k[0]] * n, [v[0]] * n
    else:
        ks, vs = list(k), list(v)
    return fn(q, ks, vs, offset, causal, (list(windows) + [0] * n)[:n], softmax)


# the forms: q (B, H, Tq, dh), ks and vs lists of n (B, H, Tk, dh), one tensor repeated where
# keys and values are shared; windows one per slot


def reference(q, ks, vs, offset, causal, windows, softmax):
    masks = slot_masks(q.size(-2), ks[0].size(-2), offset, causal, windows, q.device)
    return naive_hyper_attention(q, ks, vs, masks, softmax=softmax)


def blockwise(q, ks, vs, offset, causal, windows, softmax):
    """Order 3, softmax: online softmax over blocks of keys, no Tq x Tk x Tk tensor."""
    return blockwise_attention(q, *ks, *vs, offset, causal, *windows)


def gathered(q, ks, vs, offset, causal, windows, softmax):
    """Order 3, softmax, both slots windowed: each query's windows gathered."""
    return windowed_attention(q, *ks, *vs, offset, causal, *windows)


def prefix_sums(q, ks, vs, offset, causal, windows, softmax):
    """Order 3 without the softmax: O(T dh^2)."""
    return linear_hyper_attention(q, *ks, *vs, offset, causal, *windows)


def with_triton(q, ks, vs, offset, causal, windows, softmax, *, strict, check):
    """Order 3, softmax, in Triton."""
    return triton_attention(q, *ks, *vs, offset, causal, *windows, strict, check)
