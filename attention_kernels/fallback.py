"""
PyTorch stand-ins for the Triton entry points, same signatures and results: what
kernel='auto' runs for a configuration whose Triton kernel failed to compile or launch on
the user's GPU (another triton version, too little shared memory) or disagreed with
PyTorch in its first-use self-check (guard.py). HA uses the windowed PyTorch kernel
(ha/windowed.py) where its rule takes it on CUDA (narrow windows: a fixed number of ops,
where the blockwise one issues a dozen per block of queries and keys), else the blockwise
one (ha/pytorch.py); HFA and linear attention their definitions (naive.py), which materialise
the (Tq, Tk) scores as the model's own PyTorch path does, differentiated in float32.
"""

import torch

from attention_kernels.guard import vjp
from attention_kernels.ha import pytorch as blockwise
from attention_kernels.ha import windowed
from attention_kernels.hfa.naive import naive_hfa
from attention_kernels.linear.naive import naive_linear


def _ha_form(q, k1, offset, causal, window1, window2):
    return windowed if windowed.wins(q.size(1), k1.size(1), offset, causal, window1, window2, 'cuda') else blockwise


def ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale):
    return _ha_form(q, k1, offset, causal, window1, window2).ha3_forward(q, k1, k2, v1, v2, offset, causal, window1,
                                                                          window2, scale)


def ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset, causal, window1, window2, scale):
    return _ha_form(q, k1, offset, causal, window1, window2).ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset,
                                                                           causal, window1, window2, scale)


def hfa_forward(q, k, v, offset, causal, window, scale):
    out, lse = naive_hfa(q.float(), k.float(), v.float(), offset, causal, window, scale, lse=True)
    keep = q.dtype != torch.float32
    return out.to(q.dtype), lse, (out if keep else None)


def hfa_backward(q, k, v, out, lse, dout, offset, causal, window, scale):
    grads = vjp(lambda *t: naive_hfa(*t, offset, causal, window, scale), [t.float() for t in (q, k, v)], dout.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def linear_forward(q, k, v, offset, causal, window, norm, scale):
    return naive_linear(q.float(), k.float(), v.float(), offset, causal, window, norm, scale).to(q.dtype)


def linear_backward(q, k, v, dout, offset, causal, window, norm, scale):
    grads = vjp(lambda *t: naive_linear(*t, offset, causal, window, norm, scale), [t.float() for t in (q, k, v)],
                dout.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
