"""
Order-3 HyperAttention as torch.library custom ops (op_common.py), one pair per kernel:

    nanohfa::ha3_blockwise_fwd / ha3_blockwise_bwd   the blockwise PyTorch kernel (pytorch.py)
    nanohfa::ha3_windowed_fwd / ha3_windowed_bwd     the gathered-windows PyTorch kernel (windowed.py)
    nanohfa::ha3_fwd / ha3_bwd                       the Triton kernel (triton.py)

The PyTorch kernels are ops too because their own backwards recompute the logits from the
logsumexp (autograd would keep every block's, or the whole T x w1 x w2 tensor). The Triton ops run through
attention_kernels/guard.py, as HFA's and linear attention's: `strict` (kernel='triton')
raises where kernel='auto' falls back to PyTorch (fallback.py), and `check` (kernel_check)
compares the first call of each configuration class with the blockwise kernel in float64.
Shared keys/values are the same tensor passed twice; autograd sums their gradients.
"""

import torch
from torch import Tensor

from attention_kernels import fallback, guard
from attention_kernels.ha import pytorch as torch_ha
from attention_kernels.ha import windowed as windowed_ha
from attention_kernels.op_common import NAMESPACE, flat, keeps_fp32, load_triton, lse_dtype, or_empty

# -----------------------------------------------------------------------------
# the blockwise PyTorch kernel


@torch.library.custom_op(f'{NAMESPACE}::ha3_blockwise_fwd', mutates_args=())
def ha3_blockwise_fwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, offset: int, causal: bool,
                      window1: int, window2: int, scale: float, block_q: int = 0, block_k: int = 0
                      ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    out, lse, out32 = torch_ha.ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale,
                                           block_q, block_k)
    return out, lse, or_empty(out32, q)


@torch.library.custom_op(f'{NAMESPACE}::ha3_blockwise_bwd', mutates_args=())
def ha3_blockwise_bwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, out: Tensor, lse: Tensor,
                      dout: Tensor, offset: int, causal: bool, window1: int, window2: int, scale: float,
                      block_q: int = 0, block_k: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(torch_ha.ha3_backward(q, k1, k2, v1, v2, out, lse, dout.contiguous(), offset, causal, window1,
                                       window2, scale, block_q, block_k))


# -----------------------------------------------------------------------------
# the gathered-windows PyTorch kernel


@torch.library.custom_op(f'{NAMESPACE}::ha3_windowed_fwd', mutates_args=())
def ha3_windowed_fwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, offset: int, causal: bool,
                     window1: int, window2: int, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    out, lse, out32 = windowed_ha.ha3_forward(q, k1, k2, v1, v2, offset, causal, window1, window2, scale)
    return out, lse, or_empty(out32, q)


@torch.library.custom_op(f'{NAMESPACE}::ha3_windowed_bwd', mutates_args=())
def ha3_windowed_bwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, out: Tensor, lse: Tensor,
                     dout: Tensor, offset: int, causal: bool, window1: int, window2: int, scale: float
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(windowed_ha.ha3_backward(q, k1, k2, v1, v2, out, lse, dout.contiguous(), offset, causal, window1,
                                          window2, scale))


# -----------------------------------------------------------------------------
# the Triton kernel


def _config(q, k, offset, causal, window1, window2):
    """The configuration class: what the kernel's code path depends on, tiles (shrunk to
    short sequences) and the fused backward included."""
    load_triton()
    from attention_kernels.ha.triton import _configs, _fused, _geometry
    from attention_kernels.triton_common import arch_of
    Tq, Tk, dh, arch = q.size(1), k.size(1), q.size(-1), arch_of(q)
    _, wa, wb = _geometry(Tq, Tk, offset, causal, window1, window2)
    _, fwd, dq, dqa, da, db = _configs(Tq, Tk, dh, wa, wb, None, q.dtype, arch)
    tiles = ' '.join(f"{part}=" + 'x'.join(str(c[x]) for x in ('G', 'BA', 'JA', 'BU', 'BB') if x in c)
                     for part, c in (('fwd', fwd), ('dq', dq), ('da', da), ('db', db)))
    fused = ' fused' * bool(_fused(dqa, Tq, Tk, offset, causal, wa))
    return (f"ha {str(q.dtype)[6:]} dh={dh} {guard.form(causal, [window1, window2], offset)} "
            f"{q.device.type} sm_{arch} tiles {tiles}{fused}")


def _check_args(q, k1, k2, v1, v2, offset, causal, window1, window2, scale):
    """The self-check's slice (the first sequence's first heads), in float64, and what the
    SDPA floor is measured on (guard.py)."""
    n = guard.heads(q.size(0), q.size(1), k1.size(1), materialised=False)
    xs = [t[:n].double() for t in (q, k1, k2, v1, v2)]
    return n, xs, (q[:n], k1[:n], v1[:n]), (offset, causal, window1)


@torch.library.custom_op(f'{NAMESPACE}::ha3_fwd', mutates_args=())
def ha3_fwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, offset: int, causal: bool,
            window1: int, window2: int, scale: float, strict: bool = True, check: bool = False
            ) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    load_triton()
    from attention_kernels.ha.triton import ha3_forward
    args = (q, k1, k2, v1, v2, offset, causal, window1, window2, scale)

    def wrong(result):
        n, xs, sdpa_qkv, geometry = _check_args(*args)
        return guard.wrong_output(result[0][:n], lambda *t: torch_ha.ha3_forward(*t, *args[5:])[0], xs, sdpa_qkv,
                                  geometry)

    out, lse, out32 = guard.run('ha3_forward', _config(q, k1, offset, causal, window1, window2), ha3_forward,
                                fallback.ha3_forward, args, strict=strict, check=check, wrong=wrong)
    return out, lse, or_empty(out32, q)


@torch.library.custom_op(f'{NAMESPACE}::ha3_bwd', mutates_args=())
def ha3_bwd(q: Tensor, k1: Tensor, k2: Tensor, v1: Tensor, v2: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
            offset: int, causal: bool, window1: int, window2: int, scale: float, strict: bool = True,
            check: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    load_triton()
    from attention_kernels.ha.triton import ha3_backward
    geo = (offset, causal, window1, window2, scale)

    def wrong(grads):  # the blockwise kernel's own backward: no autograd inside an op
        n, xs, sdpa_qkv, geometry = _check_args(q, k1, k2, v1, v2, *geo)
        out64, lse64, _ = torch_ha.ha3_forward(*xs, *geo)
        want = torch_ha.ha3_backward(*xs, out64, lse64, dout[:n].double(), *geo)
        return guard.wrong_grads([g[:n] for g in grads], ('dq', 'dk1', 'dk2', 'dv1', 'dv2'), want, dout[:n],
                                 sdpa_qkv, geometry)

    return tuple(guard.run('ha3_backward', _config(q, k1, offset, causal, window1, window2), ha3_backward,
                           fallback.ha3_backward, (q, k1, k2, v1, v2, out, lse, dout.contiguous(), *geo),
                           strict=strict, check=check, wrong=wrong))


# -----------------------------------------------------------------------------
# both: shapes for torch.compile, autograd


def _fwd_fake(q, k1, k2, v1, v2, *args):
    keep = keeps_fp32(q.dtype)
    return (torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=lse_dtype(q.dtype)),
            q.new_empty(q.shape if keep else (0,), dtype=torch.float32))


def _bwd_fake(q, k1, k2, v1, v2, out, lse, dout, *args):
    return tuple(torch.empty_like(t) for t in (q, k1, k2, v1, v2))


def _setup(ctx, inputs, output):
    q, k1, k2, v1, v2, *ctx.args = inputs
    out, lse, out32 = output
    ctx.save_for_backward(q, k1, k2, v1, v2, out32 if out32.numel() else out, lse)
    ctx.mark_non_differentiable(lse, out32)


def _autograd(bwd):
    def backward(ctx, dout, _dlse, _dout32):
        q, k1, k2, v1, v2, out, lse = ctx.saved_tensors
        return (*bwd(q, k1, k2, v1, v2, out, lse, dout, *ctx.args),) + (None,) * len(ctx.args)
    return backward


for _fwd, _bwd in ((ha3_blockwise_fwd, ha3_blockwise_bwd), (ha3_windowed_fwd, ha3_windowed_bwd), (ha3_fwd, ha3_bwd)):
    _fwd.register_fake(_fwd_fake)
    _bwd.register_fake(_bwd_fake)
    _fwd.register_autograd(_autograd(_bwd), setup_context=_setup)


def _flat(q, k1, k2, v1, v2):
    """(N, T, dh) views; k2 stays k1 (v2 v1) when shared, so that autograd sums the two."""
    qf, k1f, v1f = flat(q), flat(k1), flat(v1)
    return qf, k1f, k1f if k2 is k1 else flat(k2), v1f, v1f if v2 is v1 else flat(v2)


def blockwise_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0, block_q=0, block_k=0):
    """Order-3 softmax HyperAttention of (B, H, T, dh) tensors by the blockwise PyTorch
    kernel; k2 is k1 (v2 is v1) for shared keys (values). Equals naive.py's definition, in
    value and gradient."""
    B, H, Tq, dh = q.shape
    if not causal:
        window1 = window2 = 0
    out, _, _ = ha3_blockwise_fwd(*_flat(q, k1, k2, v1, v2), offset, causal, window1, window2, dh ** -0.5,
                                  block_q, block_k)
    return out.view(B, H, Tq, dh)


def windowed_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0):
    """The same by the gathered-windows kernel: causal, both windows set (windowed.applies)."""
    B, H, Tq, dh = q.shape
    out, _, _ = ha3_windowed_fwd(*_flat(q, k1, k2, v1, v2), offset, causal, window1, window2, dh ** -0.5)
    return out.view(B, H, Tq, dh)


def triton_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0, strict=True, check=False):
    """The same by the Triton kernel."""
    B, H, Tq, dh = q.shape
    if not causal:
        window1 = window2 = 0
    out, _, _ = ha3_fwd(*_flat(q, k1, k2, v1, v2), offset, causal, window1, window2, dh ** -0.5, strict, check)
    return out.view(B, H, Tq, dh)
