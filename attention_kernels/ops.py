"""
The kernels as torch.library custom ops: each has a forward op, a backward op, autograd
that links them, and a fake (meta) implementation giving output shapes and dtypes. So
torch.compile(fullgraph=True) traces a model through them without a graph break: the
compiler sees one opaque op where the kernel's Python loop or Triton launch would be.

    nanohfa::ha3_fwd / ha3_bwd         HyperAttention order 3, PyTorch or Triton (`backend`)
    nanohfa::hfa_fwd / hfa_bwd         HyperFeatureAttention, Triton
    nanohfa::linear_fwd / linear_bwd   linear attention, Triton

Tensors are flattened heads: q (N, Tq, dh), k, v (N, Tk, dh) with N = batch * heads (HFA:
a leading factor axis A). The functions at the bottom take the model's (B, H, T, dh)
layout. Shared keys/values are the same tensor passed twice; autograd sums their gradients.
"""

import torch
from torch import Tensor

import attention_kernels
from attention_kernels.ha import pytorch as torch_ha


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _keeps_fp32(dtype):
    """bf16/fp16 forwards also return their fp32 output: backward's D_i = dO_i . O_i from
    the rounded output would add most of the gradient error (attention_kernels/hfa/triton.py)."""
    return dtype in (torch.bfloat16, torch.float16)


def _or_empty(t, like):
    return t if t is not None else like.new_empty(0, dtype=torch.float32)


# -----------------------------------------------------------------------------
# HyperAttention, order 3

@torch.library.custom_op('nanohfa::ha3_fwd', mutates_args=())
def ha3_fwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, offset: int, causal: bool,
            window1: int, window2: int, scale: float, backend: str, block_q: int, block_k: int
            ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    if backend == 'triton':
        out, lse, out32 = attention_kernels.triton_module('ha').ha3_forward(
            q, k1, k2, v1, v2, offset, causal, window1, window2, scale, return_fp32=True)
        return out, lse, _or_empty(out32, q)
    out, lse, out32 = torch_ha.ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale,
                                           block_q, block_k)
    return out, lse, _or_empty(out32, q)


@ha3_fwd.register_fake
def _(q, k1, k2, v1, v2, offset, causal, window1, window2, scale, backend, block_q, block_k):
    keep = _keeps_fp32(q.dtype)
    return (torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q.dtype)),
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


# -----------------------------------------------------------------------------
# HyperFeatureAttention (Triton)

@torch.library.custom_op('nanohfa::hfa_fwd', mutates_args=())
def hfa_fwd(q: Tensor, k: Tensor, v: Tensor, offset: int, causal: bool, window: int, scale: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    out, lse, out32 = attention_kernels.triton_module('hfa').hfa_forward(q, k, v, offset, causal, window, scale)
    return out, lse, _or_empty(out32, q)


@hfa_fwd.register_fake
def _(q, k, v, offset, causal, window, scale):
    return (q.new_empty(q.shape[1:]), q.new_empty(q.shape[1:-1], dtype=torch.float32),
            q.new_empty(q.shape[1:] if _keeps_fp32(q.dtype) else (0,), dtype=torch.float32))


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


# -----------------------------------------------------------------------------
# linear attention (Triton)

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


# -----------------------------------------------------------------------------
# the model's layout: (B, H, T, dh) in, (B, H, Tq, dh) out

def _flat(t):
    return t.reshape(-1, t.size(-2), t.size(-1)).contiguous()


def hyper_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0, kernel='auto',
                    block_q=0, block_k=0):
    """Order-3 softmax HyperAttention of (B, H, T, dh) tensors; k2 is k1 (v2 is v1) for
    shared keys (values). Equals hyper_attention_reference with pair_masks, in value and
    gradient, on either backend."""
    B, H, Tq, dh = q.shape
    be = attention_kernels.backend(kernel, q, 'ha')
    if not causal:
        window1 = window2 = 0
    qf, k1f, v1f = _flat(q), _flat(k1), _flat(v1)
    k2f = k1f if k2 is k1 else _flat(k2)
    v2f = v1f if v2 is v1 else _flat(v2)
    out, _, _ = ha3_fwd(qf, k1f, k2f, v1f, v2f, offset, causal, window1, window2, dh ** -0.5, be, block_q, block_k)
    return out.view(B, H, Tq, dh)


def hfa_attention(q, k, v, offset, causal, window, scale):
    """Softmax HFA (Triton): q (A, B, H, Tq, dh), k (A, B, H, Tk, dh), v (B, H, Tk, dh);
    score = prod_a (q_a . k_a * scale)."""
    A, B, H, Tq, dh = q.shape
    qf = q.reshape(A, B * H, Tq, dh).contiguous()
    kf = k.reshape(A, B * H, k.size(-2), dh).contiguous()
    out, _, _ = hfa_fwd(qf, kf, _flat(v), offset, causal, window if causal else 0, scale)
    return out.view(B, H, Tq, dh)


def linear_attention(q, k, v, offset, causal, window, norm, scale):
    """Linear attention (Triton): sum_j visible (q_i . k_j * scale) v_j, divided by the number
    of visible keys if norm. q (B, H, Tq, dh), k, v (B, H, Tk, dh)."""
    B, H, Tq, dh = q.shape
    out = linear_fwd(_flat(q), _flat(k), _flat(v), offset, causal, window if causal else 0, norm, scale)
    return out.view(B, H, Tq, dh)
