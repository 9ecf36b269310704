"""
HyperAttention of order n ([IA] Def 6.1, App. F): one joint softmax over (n-1)-tuples of keys.

    naive.py     the definition, every tuple materialised (any order): the tests' reference,
                 and the PyTorch path for order >= 4
    pytorch.py   order 3 blockwise with an online softmax (no Tq x Tk x Tk tensor); linear
                 HA (softmax=False) by prefix sums, O(T dh^2)
    triton.py    order 3 in Triton, forward and backward
    ops.py       order 3 as a torch.library custom op (PyTorch or Triton inside)

`attention` below takes the model's choices and picks one of them.
"""

from attention_kernels.ha.naive import naive_hyper_attention, slot_masks
from attention_kernels.ha.ops import hyper_attention
from attention_kernels.ha.pytorch import linear_hyper_attention


def attention(q, k, v, offset=0, causal=True, order=3, windows=(0, 0), softmax=True, kernel='auto'):
    """q (B, H, Tq, dh); k, v (n, B, H, Tk, dh) with n = order - 1 key and value streams, or
    (1, B, H, Tk, dh): one stream in every slot (shared keys and values). Query i sits at
    position offset + i. windows = (w1, w2) restrict slots 1 and 2 (0: full; later slots are
    full). kernel: 'auto' / 'triton' / 'torch' (attention_kernels.backend) or 'reference'.
    Order 3 runs blockwise (softmax) or by prefix sums (softmax=False); order >= 4 and
    kernel='reference' materialise every tuple. No attention-weight dropout on any path."""
    n = order - 1
    shared = k.size(0) == 1 and n > 1
    if shared:  # the same key and value stream in every slot
        k, v = k.expand(n, *k.shape[1:]), v.expand(n, *v.shape[1:])
    w1, w2 = windows
    if n == 2 and kernel != 'reference':
        if not softmax:
            return linear_hyper_attention(q, k[0], k[1], v[0], v[1], offset, causal, w1, w2)
        k1, v1 = k[0], v[0]
        k2, v2 = (k1, v1) if shared else (k[1], v[1])  # shared: one tensor in both slots
        return hyper_attention(q, k1, k2, v1, v2, offset, causal, w1, w2, kernel)
    masks = slot_masks(q.size(-2), k.size(-2), offset, causal, ([w1, w2] + [0] * n)[:n], q.device)
    return naive_hyper_attention(q, list(k), list(v), masks, softmax=softmax)
