"""
HyperFeatureAttention ([IA] Def 5.1, Def E.2): a product of A score factors, one softmax.

    naive.py     the definition, scores materialised: the tests' reference
    pytorch.py   the PyTorch forms: explicit scores, and SDPA on Kronecker-lifted queries/keys
    triton.py    the A score tiles multiplied inside one flash-attention loop (A <= 4, softmax)
    ops.py       the Triton kernel as a torch.library custom op

`attention` below takes the model's choices and picks one of them (`path`).
"""

import attention_kernels
from attention_kernels.hfa.naive import naive_hfa
from attention_kernels.hfa.ops import hfa_attention
from attention_kernels.hfa.pytorch import explicit, lifted

KRON_MAX_WIDTH = 256  # hfa_kron='auto' lifts iff dh^A <= this (measured crossover, docs/performance.md)


def path(q, softmax=True, kron='auto', dropout_p=0.0, kernel='auto'):
    """Which form computes HFA for queries like q (A, B, H, Tq, dh): 'triton' (softmax, A <= 4,
    no attention-weight dropout, as attention_kernels.backend allows), else 'kron' (SDPA on
    lifted queries: kron='on', or 'auto' with dh^A <= KRON_MAX_WIDTH; softmax only), else
    'explicit'; kernel='reference' gives 'reference'."""
    if kernel == 'reference':
        return 'reference'
    A, dh = q.size(0), q.size(-1)
    if attention_kernels.backend(kernel, q[0], 'hfa', softmax and A <= 4 and not dropout_p) == 'triton':
        return 'triton'
    if softmax and (kron == 'on' or (kron == 'auto' and dh ** A <= KRON_MAX_WIDTH)):
        return 'kron'
    return 'explicit'


def attention(q, k, v, offset=0, causal=True, window=0, softmax=True, kron='auto', dropout_p=0.0, kernel='auto'):
    """q (A, B, H, Tq, dh), k (A, B, H, Tk, dh), v (B, H, Tk, dh); query i at position
    offset + i, reading the keys within the last `window` positions (0: all, causal only).
    dropout_p: attention-weight dropout (0 when not training). Returns (B, H, Tq, dh)."""
    how = path(q, softmax, kron, dropout_p, kernel)
    if how == 'triton':
        return hfa_attention(q, k, v, offset, causal, window, q.size(-1) ** -0.5)
    if how == 'kron':
        return lifted(q, k, v, offset, causal, window, dropout_p)
    if how == 'explicit':
        return explicit(q, k, v, offset, causal, window, softmax, dropout_p)
    return naive_hfa(q, k, v, offset, causal, window, softmax=softmax, dropout_p=dropout_p)
