"""
PyTorch stand-ins for the Triton entry points, same signatures and results: what
kernel='auto' runs when a Triton kernel fails to compile or launch on the user's GPU
(another triton version, too little shared memory). HA uses the blockwise PyTorch kernel
(ha/pytorch.py); HFA and linear attention materialise the (Tq, Tk) scores, which is what the
model's own PyTorch path does, and differentiate by autograd in float32.
"""

import torch

from attention_kernels.ha import pytorch as torch_ha
from attention_kernels.masks import visible


def ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale, *, config=None, return_fp32=False):
    out, lse, out32 = torch_ha.ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale)
    return (out, lse.float(), out32) if return_fp32 else (out, lse.float())


def ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset, causal, window1, window2, scale, **_):
    return torch_ha.ha3_backward(q, k1, k2, v1, v2, out, lse, dout, offset, causal, window1, window2, scale)


def _hfa(q, k, v, offset, causal, window, scale):
    s = 1.0
    for a in range(q.size(0)):
        s = s * (q[a] @ k[a].transpose(-1, -2) * scale)
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    s = s.masked_fill(~m, float('-inf'))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return p @ v, lse


def hfa_forward(q, k, v, offset, causal, window, scale):
    out, lse = _hfa(q.float(), k.float(), v.float(), offset, causal, window, scale)
    keep = q.dtype != torch.float32
    return out.to(q.dtype), lse, (out if keep else None)


def hfa_backward(q, k, v, out, lse, dout, offset, causal, window, scale):
    with torch.enable_grad():
        xs = [t.detach().float().requires_grad_() for t in (q, k, v)]
        o, _ = _hfa(*xs, offset, causal, window, scale)
        grads = torch.autograd.grad(o, xs, dout.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def _linear(q, k, v, offset, causal, window, norm, scale):
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    s = (q @ k.transpose(-1, -2)) * scale * m
    if norm:
        s = s / m.sum(-1, keepdim=True).clamp(min=1)
    return s @ v


def linear_forward(q, k, v, offset, causal, window, norm, scale):
    return _linear(q.float(), k.float(), v.float(), offset, causal, window, norm, scale).to(q.dtype)


def linear_backward(q, k, v, dout, offset, causal, window, norm, scale):
    with torch.enable_grad():
        xs = [t.detach().float().requires_grad_() for t in (q, k, v)]
        grads = torch.autograd.grad(_linear(*xs, offset, causal, window, norm, scale), xs, dout.float())
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
