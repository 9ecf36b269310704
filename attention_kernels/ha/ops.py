"""
Order-3 HyperAttention as torch.library custom ops (op_common.py), PyTorch (pytorch.py) or
Triton (triton.py) by their `backend` argument:

    nanohfa::ha3_fwd / ha3_bwd

Shared keys/values are the same tensor passed twice; autograd sums their gradients.
"""

import torch
from torch import Tensor

import attention_kernels
from attention_kernels.ha import pytorch as torch_ha
from attention_kernels.op_common import flat, keeps_fp32, lse_dtype, or_empty


@torch.library.custom_op('nanohfa::ha3_fwd', mutates_args=())
def ha3_fwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, offset: int, causal: bool,
            window1: int, window2: int, scale: float, backend: str, block_q: int, block_k: int
            ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    if backend == 'triton':
        out, lse, out32 = attention_kernels.triton_module('ha').ha3_forward(
            q, k1, k2, v1, v2, offset, causal, window1, window2, scale, return_fp32=True)
        return out, lse, or_empty(out32, q)
    out, lse, out32 = torch_ha.ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale,
                                           block_q, block_k)
    return out, lse, or_empty(out32, q)


@ha3_fwd.register_fake
def _(q, k1, k2, v1, v2, offset, causal, window1, window2, scale, backend, block_q, block_k):
    keep = keeps_fp32(q.dtype)
    return (torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=lse_dtype(q.dtype)),
            q.new_empty(q.shape if keep else (0,), dtype=torch.float32))


@torch.library.custom_op('nanohfa::ha3_bwd', mutates_args=())
def ha3_bwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
            offset: int, causal: bool, window1: int, window2: int, scale: float, backend: str,
            block_q: int, block_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    args = (q, k1, k2, v1, v2, out, lse, dout.contiguous(), offset, causal, window1, window2, scale)
    if backend == 'triton':
        grads = attention_kernels.triton_module('ha').ha3_backward(*args)
    else:
        grads = torch_ha.ha3_backward(*args, block_q, block_k)
    return tuple(grads)


@ha3_bwd.register_fake
def _(q, k1, k2, v1, v2, out, lse, dout, *args):
    return tuple(torch.empty_like(t) for t in (q, k1, k2, v1, v2))


def _ha3_setup(ctx, inputs, output):
    q, k1, k2, v1, v2, *ctx.args = inputs
    out, lse, out32 = output
    ctx.save_for_backward(q, k1, k2, v1, v2, out32 if out32.numel() else out, lse)
    ctx.mark_non_differentiable(lse, out32)


def _ha3_backward(ctx, dout, _dlse, _dout32):
    q, k1, k2, v1, v2, out, lse = ctx.saved_tensors
    return (*ha3_bwd(q, k1, k2, v1, v2, out, lse, dout, *ctx.args),) + (None,) * len(ctx.args)


ha3_fwd.register_autograd(_ha3_backward, setup_context=_ha3_setup)


def hyper_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0, kernel='auto',
                    block_q=0, block_k=0):
    """Order-3 softmax HyperAttention of (B, H, T, dh) tensors; k2 is k1 (v2 is v1) for
    shared keys (values). Equals naive.py's definition, in value and gradient, on either
    backend (`kernel` as attention_kernels.backend takes it)."""
    B, H, Tq, dh = q.shape
    be = attention_kernels.backend(kernel, q, 'ha')
    if not causal:
        window1 = window2 = 0
    qf, k1f, v1f = flat(q), flat(k1), flat(v1)
    k2f = k1f if k2 is k1 else flat(k2)
    v2f = v1f if v2 is v1 else flat(v2)
    out, _, _ = ha3_fwd(qf, k1f, k2f, v1f, v2f, offset, causal, window1, window2, dh ** -0.5, be, block_q, block_k)
    return out.view(B, H, Tq, dh)
