"""
HyperFeatureAttention ([IA] Def 5.1, Def E.2): a product of A score factors, one softmax.

    naive.py     the definition, scores materialised: the tests' reference
    pytorch.py   the PyTorch forms: explicit scores, and SDPA on Kronecker-lifted queries/keys
    triton.py    the A score tiles multiplied inside one flash-attention loop (A <= 4, softmax)
    ops.py       the Triton kernel as a torch.library custom op

`attention` below runs the form attention_kernels.dispatch picks; the forms follow it.
"""

import attention_kernels
from attention_kernels.hfa import pytorch
from attention_kernels.hfa.naive import naive_hfa
from attention_kernels.hfa.ops import hfa_attention


def attention(q, k, v, offset=0, causal=True, window=0, softmax=True, kron='auto', dropout_p=0.0, kernel='auto',
              check=True):
    """q (A, B, H, Tq, dh), k (A, B, H, Tk, dh), v (B, H, Tk, dh); query i at position
    offset + i, reading the keys within the last `window` positions (0: all, causal only).
    dropout_p: attention-weight dropout (0 when not training). kron: hfa_kron. check: the
    Triton kernel's first-use self-check (attention_kernels/guard.py). Returns (B, H, Tq, dh)."""
    fn = attention_kernels.dispatch(kernel, 'hfa', q, k, check=check, offset=offset, causal=causal, window=window,
                                    softmax=softmax, dropout_p=dropout_p, kron=kron)
    return fn(q, k, v, offset, causal, window, softmax, dropout_p)


def reference(q, k, v, offset, causal, window, softmax, dropout_p):
    return naive_hfa(q, k, v, offset, causal, window, softmax=softmax, dropout_p=dropout_p)


def lifted(q, k, v, offset, causal, window, softmax, dropout_p):
    """SDPA on Kronecker-lifted queries and keys (softmax only)."""
    return pytorch.lifted(q, k, v, offset, causal, window, dropout_p)


explicit = pytorch.explicit  # the scores materialised: takes these arguments as they are


def with_triton(q, k, v, offset, causal, window, softmax, dropout_p, *, strict, check):
    """The Triton kernel (softmax, A <= 4, no attention-weight dropout)."""
    return hfa_attention(q, k, v, offset, causal, window, q.size(-1) ** -0.5, strict, check)
