"""
Linear attention's Triton kernel (triton.py) as torch.library custom ops (op_common.py):

    nanohfa::linear_fwd / linear_bwd
"""

import torch
from torch import Tensor

import attention_kernels
from attention_kernels.op_common import flat


@torch.library.custom_op('nanohfa::linear_fwd', mutates_args=())
def linear_fwd(q: Tensor, k: Tensor, v: Tensor, offset: int, causal: bool, window: int, norm: bool,
               scale: float) -> Tensor:
    return attention_kernels.triton_module('linear').linear_forward(q, k, v, offset, causal, window, norm, scale)


@linear_fwd.register_fake
def _(q, k, v, *args):
    return torch.empty_like(q)


@torch.library.custom_op('nanohfa::linear_bwd', mutates_args=())
def linear_bwd(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, offset: int, causal: bool, window: int,
               norm: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    return attention_kernels.triton_module('linear').linear_backward(q, k, v, dout, offset, causal, window, norm, scale)


@linear_bwd.register_fake
def _(q, k, v, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _linear_setup(ctx, inputs, output):
    q, k, v, *ctx.args = inputs
    ctx.save_for_backward(q, k, v)


def _linear_backward(ctx, dout):
    q, k, v = ctx.saved_tensors
    return (*linear_bwd(q, k, v, dout.contiguous(), *ctx.args),) + (None,) * len(ctx.args)


linear_fwd.register_autograd(_linear_backward, setup_context=_linear_setup)


def linear_attention(q, k, v, offset, causal, window, norm, scale):
    """Linear attention (Triton): sum_j visible (q_i . k_j * scale) v_j, divided by the number
    of visible keys if norm. q (B, H, Tq, dh), k, v (B, H, Tk, dh)."""
    B, H, Tq, dh = q.shape
    out = linear_fwd(flat(q), flat(k), flat(v), offset, causal, window if causal else 0, norm, scale)
    return out.view(B, H, Tq, dh)
