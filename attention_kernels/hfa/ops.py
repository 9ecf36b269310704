"""
HyperFeatureAttention's Triton kernel (triton.py) as torch.library custom ops (op_common.py):

    nanohfa::hfa_fwd / hfa_bwd
"""

import torch
from torch import Tensor

import attention_kernels
from attention_kernels.op_common import flat, keeps_fp32, or_empty


@torch.library.custom_op('nanohfa::hfa_fwd', mutates_args=())
def hfa_fwd(q: Tensor, k: Tensor, v: Tensor, offset: int, causal: bool, window: int, scale: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    out, lse, out32 = attention_kernels.triton_module('hfa').hfa_forward(q, k, v, offset, causal, window, scale)
    return out, lse, or_empty(out32, q)


@hfa_fwd.register_fake
def _(q, k, v, offset, causal, window, scale):
    return (q.new_empty(q.shape[1:]), q.new_empty(q.shape[1:-1], dtype=torch.float32),
            q.new_empty(q.shape[1:] if keeps_fp32(q.dtype) else (0,), dtype=torch.float32))


@torch.library.custom_op('nanohfa::hfa_bwd', mutates_args=())
def hfa_bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, offset: int, causal: bool,
            window: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    return attention_kernels.triton_module('hfa').hfa_backward(q, k, v, out, lse, dout, offset, causal, window, scale)


@hfa_bwd.register_fake
def _(q, k, v, *args):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _hfa_setup(ctx, inputs, output):
    q, k, v, *ctx.args = inputs
    out, lse, out32 = output
    ctx.save_for_backward(q, k, v, out32 if out32.numel() else out, lse)
    ctx.mark_non_differentiable(lse, out32)


def _hfa_backward(ctx, dout, _dlse, _dout32):
    q, k, v, out, lse = ctx.saved_tensors
    return (*hfa_bwd(q, k, v, out, lse, dout.contiguous(), *ctx.args),) + (None,) * len(ctx.args)


hfa_fwd.register_autograd(_hfa_backward, setup_context=_hfa_setup)


def hfa_attention(q, k, v, offset, causal, window, scale):
    """Softmax HFA (Triton): q (A, B, H, Tq, dh), k (A, B, H, Tk, dh), v (B, H, Tk, dh);
    score = prod_a (q_a . k_a * scale)."""
    A, B, H, Tq, dh = q.shape
    qf = q.reshape(A, B * H, Tq, dh).contiguous()
    kf = k.reshape(A, B * H, k.size(-2), dh).contiguous()
    out, _, _ = hfa_fwd(qf, kf, flat(v), offset, causal, window if causal else 0, scale)
    return out.view(B, H, Tq, dh)
