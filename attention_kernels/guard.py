"""
What stands between a Triton kernel and the model (kernel='auto' or 'triton').

The kernels are tested in Triton's interpreter, which runs one program at a time and so
cannot show a race, an ordering bug between warps or a layout only one GPU generation has.
On the user's GPU, therefore, each entry point (forward, backward) of each configuration
class (family, dtype, head size, causal / windowed / offset form, GPU and tile table) is

- replaced by its PyTorch stand-in (fallback.py) when it fails to compile or launch (another
  triton version, too little shared memory); bad arguments (ValueError, TypeError) raise;
- checked on its first call (the self-check; kernel_check=True, CUDA tensors): the PyTorch
  definition recomputes a slice of the same inputs in float64, the first sequence of the
  batch, its first heads (two, or one past 2^24 score entries) and the full length: the
  output on the first forward, every gradient on the first backward. A check that cannot
  run (HFA or linear past 2^24 scores per head, whose float64 reference materialises them;
  out of memory) says so in one line and trusts the kernel. The tolerances are the tests'
  (tests/test_kernels_triton.py) with twice their margin, as the check sees the model's own
  activations rather than Gaussian ones: relative RMSE <= 2e-4 for float32 inputs; for
  bfloat16 / float16 <= 4x the relative RMSE of torch's SDPA against float64 on the same
  slice in that dtype (and no less than the dtype's unit roundoff). Non-finite values fail.

A failure or a mismatch prints one line (the kernel, its configuration class, the error) and,
with kernel='auto', sends that class to PyTorch for the rest of the process; kernel='triton'
raises instead. What is remembered is about the kernel (a class found wrong is wrong for every
model), never a model's setting: each call brings its own (`strict`, `check`).

Before all this, the preflight (preflight.py) runs each family's first use in a child process,
where a crash or a hang costs the child, not the run; this check is the second line of defence.

The ops call `run` from their eager implementations, which torch.compile never traces (it
sees the fake implementations), so the check happens on first execution, outside the graph.
"""

import sys

import torch
from torch.nn import functional as F

from attention_kernels.masks import visible

CHECK_DEVICES = ('cuda',)  # where the self-check runs (the tests add 'cpu': the interpreter)
MARGIN = 2  # times the tests' tolerances
MAX_SCORES = 2 ** 24  # checked heads x Tq x Tk at most where the float64 reference materialises T x T

_replaced = {}  # configuration class -> the line that sent it to PyTorch
_checked = set()  # (entry point, configuration class) compared once already


class KernelMismatch(RuntimeError):
    """A Triton kernel disagreed with PyTorch in its self-check under kernel='triton'."""


def form(causal, windows, offset):
    """'causal', 'causal window', 'causal offset', ... or 'non-causal': the visibility form."""
    if not causal:
        return 'non-causal'
    return 'causal' + ' window' * any(windows) + ' offset' * (offset != 0)


def run(entry, config, kernel, stand_in, args, *, strict, check, wrong):
    """kernel(*args), guarded (see above). config: the configuration class, a string;
    wrong(result) -> None or what disagrees with PyTorch (the self-check, on first use)."""
    if config in _replaced:
        if strict:
            raise KernelMismatch(f"{_replaced[config]}; kernel='triton' stops here")
        return stand_in(*args)
    try:
        result = kernel(*args)
    except (ValueError, TypeError):
        raise
    except Exception as e:  # compile or launch failure
        if strict:
            raise
        lines = str(e).strip().splitlines()
        _replace(config, f"Triton {entry} ({config}) failed: {type(e).__name__}: {lines[0] if lines else ''}")
        return stand_in(*args)
    if check and args[0].device.type in CHECK_DEVICES and (entry, config) not in _checked:
        _checked.add((entry, config))
        try:
            why = wrong(result)
        except Exception as e:  # the check itself cannot run (too long a sequence, out of memory): say so
            lines = str(e).strip().splitlines()
            print(f"nanoHFA: Triton {entry} ({config}) not self-checked: {type(e).__name__}: "
                  f"{lines[0] if lines else ''}", file=sys.stderr, flush=True)
            why = None
        if why:
            msg = f"Triton {entry} ({config}) disagrees with PyTorch: {why}"
            if strict:
                raise KernelMismatch(f"{msg}; kernel='triton' stops here (kernel='auto' would use PyTorch)")
            _replace(config, msg)
            return stand_in(*args)
    return result


def _replace(config, msg):
    _replaced[config] = msg
    print(f"nanoHFA: {msg}; kernel='auto' computes this configuration with PyTorch from now on",
          file=sys.stderr, flush=True)


def heads(N, Tq, Tk, materialised=True):
    """How many heads (of the first sequence) the self-check recomputes: two, or one where
    two would pass MAX_SCORES score entries; a reference that materialises the scores
    cannot check a head beyond it (run prints that the class went unchecked)."""
    if materialised and Tq * Tk > MAX_SCORES:
        raise ValueError(f"{Tq} x {Tk} scores per head, more than the check's {MAX_SCORES} in float64")
    return max(1, min(2, N, MAX_SCORES // max(Tq * Tk, 1))) if materialised else min(2, N)


def wrong_output(out, ref, xs, sdpa_qkv, geometry):
    """The forward's self-check: out (the kernel's, sliced as xs) against ref(*xs) in float64."""
    want = ref(*(x.detach().double() for x in xs))
    return _worst([('out', out, want)], sdpa_qkv, geometry, None)


def wrong_grads(grads, names, want, dout, sdpa_qkv, geometry):
    """The backward's self-check: the kernel's gradients for the output gradient dout against
    the float64 ones of the definition, `want` (on the same slice)."""
    return _worst(list(zip(names, grads, want)), sdpa_qkv, geometry, dout)


def vjp(f, xs, dout):
    """The gradients of <dout, f(*xs)>. torch.func, not torch.autograd: a custom op's
    implementation (where this runs) has autograd dispatch switched off."""
    _, pull = torch.func.vjp(f, *[x.detach() for x in xs])
    return pull(dout)


def _worst(triples, sdpa_qkv, geometry, dout):
    """The first (name, got, want) outside its tolerance, said in one phrase, else None."""
    if any(got.numel() == 0 for _, got, _ in triples):
        return None
    dtype = triples[0][1].dtype
    floors = None if dtype == torch.float32 else sdpa_errors(*sdpa_qkv, *geometry, dtype, dout)
    for name, got, want in triples:
        if not torch.isfinite(got).all():
            return f"{name} has non-finite values"
        scale = want.square().mean().sqrt().item()
        err = (got.double() - want).square().mean().sqrt().item()
        if scale == 0:
            bound, err, what = 1e-6, got.abs().max().item(), 'max |x| where the reference is 0'
        elif floors is None:
            bound, err, what = MARGIN * 1e-4, err / scale, 'relative RMSE'
        else:
            floor = floors[name.rstrip('12')]  # dk1, dk2: as SDPA's dk
            bound = max(2 * MARGIN * floor, torch.finfo(dtype).eps / 2)
            err, what = err / scale, f"relative RMSE (SDPA's {floor:.1e})"
        if err > bound:
            return f"{name} {what} {err:.1e} > {bound:.1e}"
    return None


def sdpa_errors(q, k, v, offset, causal, window, dtype, dout=None):
    """Relative RMSE of torch's SDPA in `dtype` against float64 on the same rounded inputs
    (q, k, v one head each or a few): {'out'} and, given dout, {'dq', 'dk', 'dv'}; the tests'
    floor (tests/test_kernels_triton.py, sdpa_errors)."""
    m = visible(q.size(-2), k.size(-2), offset, causal, window, q.device)
    lo = [t.detach().to(dtype) for t in (q, k, v)]
    res = {}
    for key, xs in (('lo', lo), ('hi', [t.double() for t in lo])):
        out = F.scaled_dot_product_attention(*xs, attn_mask=m)
        grads = vjp(lambda *t: F.scaled_dot_product_attention(*t, attn_mask=m), xs, dout.to(out.dtype)) \
            if dout is not None else ()
        res[key] = [t.nan_to_num(0.0) for t in (out, *grads)]  # SDPA: NaN where a query sees no key
    names = ['out', 'dq', 'dk', 'dv']
    errs = {}
    for name, a, b in zip(names, res['lo'], res['hi']):
        scale = b.square().mean().sqrt().item()
        errs[name] = (a.double() - b).square().mean().sqrt().item() / scale if scale else 0.0
    return errs
