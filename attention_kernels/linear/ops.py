"""
Linear attention's Triton kernels (triton.py: quadratic; triton_chunked.py: chunks with a
dh x dh state) as torch.library custom ops (op_common.py):

    nanohfa::linear_fwd / linear_bwd

`chunked` says which kernel (attention_kernels.dispatch chooses); each runs through
attention_kernels/guard.py: `strict` (kernel='triton') raises where kernel='auto' falls back
to PyTorch (fallback.py), and `check` (kernel_check) compares the first call of each
configuration class with the definition.
"""

import torch
from torch import Tensor

from attention_kernels import fallback, guard
from attention_kernels.linear.naive import naive_linear
from attention_kernels.op_common import NAMESPACE, flat, load_triton


def _config(q, offset, causal, window, norm, chunked):
    """The configuration class: what the kernel's code path depends on, tiles included."""
    from attention_kernels.linear.triton import block_sizes
    from attention_kernels.linear.triton_chunked import chunk_size
    from attention_kernels.triton_common import arch_of, head_block
    D, arch = q.size(-1), arch_of(q)
    if chunked:
        tiles = f"chunks of {chunk_size(q.dtype, arch)}"
    else:
        tiles = 'tiles ' + '/'.join('x'.join(map(str, block_sizes(kind, head_block(D), q.dtype, arch)))
                                    for kind in ('linear_fwd', 'linear_bwd'))
    return (f"linear{' chunked' * chunked}{' norm' * norm} {str(q.dtype)[6:]} dh={D} "
            f"{guard.form(causal, [window], offset)} {q.device.type} sm_{arch} {tiles}")


def _reference(offset, causal, window, norm, scale):
    return lambda q, k, v: naive_linear(q, k, v, offset, causal, window, norm, scale)


@torch.library.custom_op(f'{NAMESPACE}::linear_fwd', mutates_args=())
def linear_fwd(q: Tensor, k: Tensor, v: Tensor, offset: int, causal: bool, window: int, norm: bool,
               scale: float, chunked: bool = False, strict: bool = True, check: bool = False) -> Tensor:
    load_triton()
    from attention_kernels.linear.triton import linear_forward
    from attention_kernels.linear.triton_chunked import chunked_forward

    def kernel(q, k, v, offset, causal, window, norm, scale):
        return chunked_forward(q, k, v, norm, scale) if chunked else linear_forward(q, k, v, offset, causal, window,
                                                                                     norm, scale)

    def wrong(out):
        n = guard.heads(q.size(0), q.size(1), k.size(1))
        xs = (q[:n], k[:n], v[:n])
        return guard.wrong_output(out[:n], _reference(offset, causal, window, norm, scale), xs, xs,
                                  (offset, causal, window))

    return guard.run('linear_forward', _config(q, offset, causal, window, norm, chunked), kernel,
                     fallback.linear_forward, (q, k, v, offset, causal, window, norm, scale), strict=strict,
                     check=check, wrong=wrong)


@linear_fwd.register_fake
def _(q, k, v, *args):
    return torch.empty_like(q)


@torch.library.custom_op(f'{NAMESPACE}::linear_bwd', mutates_args=())
def linear_bwd(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, offset: int, causal: bool, window: int,
               norm: bool, scale: float, chunked: bool = False, strict: bool = True, check: bool = False
               ) -> tuple[Tensor, Tensor, Tensor]:
    load_triton()
    from attention_kernels.linear.triton import linear_backward
    from attention_kernels.linear.triton_chunked import chunked_backward

    def kernel(q, k, v, dout, offset, causal, window, norm, scale):
        if chunked:
            return chunked_backward(q, k, v, dout, norm, scale)
        return linear_backward(q, k, v, dout, offset, causal, window, norm, scale)

    def wrong(grads):
        n = guard.heads(q.size(0), q.size(1), k.size(1))
        xs = (q[:n], k[:n], v[:n])
        want = guard.vjp(_reference(offset, causal, window, norm, scale), [x.double() for x in xs],
                         dout[:n].double())
        return guard.wrong_grads([g[:n] for g in grads], ('dq', 'dk', 'dv'), want, dout[:n], xs,
                                 (offset, causal, window))

    return guard.run('linear_backward', _config(q, offset, causal, window, norm, chunked), kernel,
                     fallback.linear_backward, (q, k, v, dout, offset, causal, window, norm, scale), strict=strict,
                     check=check, wrong=wrong)


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


def linear_attention(q, k, v, offset, causal, window, norm, scale, chunked=False, strict=True, check=False):
    """Linear attention (Triton): sum_j visible (q_i . k_j * scale) v_j, divided by the number
    of visible keys if norm. q (B, H, Tq, dh), k, v (B, H, Tk, dh). chunked: the chunked
    kernel (full causal self-attention only)."""
    B, H, Tq, dh = q.shape
    out = linear_fwd(flat(q), flat(k), flat(v), offset, causal, window if causal else 0, norm, scale, chunked,
                     strict, check)
    return out.view(B, H, Tq, dh)
