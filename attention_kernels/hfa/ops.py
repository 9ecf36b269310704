"""
HyperFeatureAttention's Triton kernel (triton.py) as torch.library custom ops (op_common.py):

    nanohfa::hfa_fwd / hfa_bwd

Each runs its Triton entry point through attention_kernels/guard.py: `strict` (the model's
kernel='triton') raises where kernel='auto' falls back to PyTorch (fallback.py), and `check`
(kernel_check) compares the first call of each configuration class with the definition.
"""

import torch
from torch import Tensor

from attention_kernels import fallback, guard
from attention_kernels.hfa.naive import naive_hfa
from attention_kernels.op_common import NAMESPACE, flat, keeps_fp32, load_triton, or_empty


def _config(q, offset, causal, window):
    """The configuration class: what the kernel's code path depends on, tiles included."""
    from attention_kernels.hfa.triton import block_sizes
    from attention_kernels.triton_common import arch_of, head_block
    A, D, arch = q.size(0), q.size(-1), arch_of(q)
    tiles = '/'.join('x'.join(map(str, block_sizes(kind, head_block(D), A, q.dtype, arch)))
                     for kind in ('hfa_fwd', 'hfa_bwd_dq', 'hfa_bwd'))
    return (f"hfa A={A} {str(q.dtype)[6:]} dh={D} {guard.form(causal, [window], offset)} "
            f"{q.device.type} sm_{arch} tiles {tiles}")


def _slice(q, k, v):
    """The heads the self-check recomputes: the first sequence's first ones (N = B * H)."""
    n = guard.heads(q.size(1), q.size(2), k.size(2))
    return n, (q[:, :n], k[:, :n], v[:n])


@torch.library.custom_op(f'{NAMESPACE}::hfa_fwd', mutates_args=())
def hfa_fwd(q: Tensor, k: Tensor, v: Tensor, offset: int, causal: bool, window: int, scale: float,
            strict: bool = True, check: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, out32): out32 the fp32 output for bf16/fp16 inputs, else empty."""
    load_triton()
    from attention_kernels.hfa.triton import hfa_forward

    def wrong(result):
        n, xs = _slice(q, k, v)
        return guard.wrong_output(result[0][:n], lambda *t: naive_hfa(*t, offset, causal, window, scale), xs,
                                  (xs[0][0], xs[1][0], xs[2]), (offset, causal, window))

    out, lse, out32 = guard.run('hfa_forward', _config(q, offset, causal, window), hfa_forward,
                                fallback.hfa_forward, (q, k, v, offset, causal, window, scale),
                                strict=strict, check=check, wrong=wrong)
    return out, lse, or_empty(out32, q)


@hfa_fwd.register_fake
def _(q, k, v, offset, causal, window, scale, strict=True, check=False):
    return (q.new_empty(q.shape[1:]), q.new_empty(q.shape[1:-1], dtype=torch.float32),
            q.new_empty(q.shape[1:] if keeps_fp32(q.dtype) else (0,), dtype=torch.float32))


@torch.library.custom_op(f'{NAMESPACE}::hfa_bwd', mutates_args=())
def hfa_bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, offset: int, causal: bool,
            window: int, scale: float, strict: bool = True, check: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    load_triton()
    from attention_kernels.hfa.triton import hfa_backward

    def wrong(grads):
        n, xs = _slice(q, k, v)
        want = guard.vjp(lambda *t: naive_hfa(*t, offset, causal, window, scale), [x.double() for x in xs],
                         dout[:n].double())
        return guard.wrong_grads((grads[0][:, :n], grads[1][:, :n], grads[2][:n]), ('dq', 'dk', 'dv'), want,
                                 dout[:n], (xs[0][0], xs[1][0], xs[2]), (offset, causal, window))

    return guard.run('hfa_backward', _config(q, offset, causal, window), hfa_backward, fallback.hfa_backward,
                     (q, k, v, out, lse, dout, offset, causal, window, scale), strict=strict, check=check,
                     wrong=wrong)


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


def hfa_attention(q, k, v, offset, causal, window, scale, strict=True, check=False):
    """Softmax HFA (Triton): q (A, B, H, Tq, dh), k (A, B, H, Tk, dh), v (B, H, Tk, dh);
    score = prod_a (q_a . k_a * scale)."""
    A, B, H, Tq, dh = q.shape
    qf = q.reshape(A, B * H, Tq, dh).contiguous()
    kf = k.reshape(A, B * H, k.size(-2), dh).contiguous()
    out, _, _ = hfa_fwd(qf, kf, flat(v), offset, causal, window if causal else 0, scale, strict, check)
    return out.view(B, H, Tq, dh)
