"""
The Triton kernels of HFA and linear attention against float64 references written from their
formulas: outputs and every gradient, through the custom ops (attention_kernels/<family>/ops.py)
and their autograd; a GPT of every kernel-backed variant with kernel='triton' against
kernel='torch'. HyperAttention's kernel has its own module, tests/test_triton_ha.py (which
imports this module's helpers).

On a machine without CUDA they run in Triton's interpreter on CPU tensors (tiny sizes:
T in {1, 17, 64}, dh in {16, 32} and an odd 20, windows, decoding offsets); with CUDA the
same cases run compiled, and the tests marked `cuda` add realistic sizes in bf16.
Tolerances: fp32 inputs within 1e-4 relative; bf16 / fp16 inputs within 2x the relative
RMSE of torch's SDPA on inputs of the same size and dtype, measured in the same test.
"""

import os

import pytest
import torch
import torch.nn.functional as F

import attention_kernels
from attention_kernels.hfa import ops as hfa_ops
from attention_kernels.hfa.naive import naive_hfa as ref_hfa
from attention_kernels.linear import ops as linear_ops
from attention_kernels.linear.naive import naive_linear as ref_linear
from attention_kernels.masks import visible

TRITON_ERROR = attention_kernels.load_triton()  # on Linux an error fails the session (conftest.py)
pytestmark = [pytest.mark.skipif(TRITON_ERROR is not None, reason=f'no usable triton: {TRITON_ERROR}'),
              pytest.mark.slow()]  # the Triton interpreter on CPU: make test, not make test-fast
DEV = 'cuda' if torch.cuda.is_available() else 'cpu'
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


# -----------------------------------------------------------------------------
# helpers

def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def outputs_and_grads(f, xs, dout):
    out = f(*xs)
    return [out] + list(torch.autograd.grad(out, xs, dout.to(out.dtype)))


def compare(f_kernel, f_ref, xs, dtype, seed):
    """Relative RMSE of the kernel's output and gradients on dtype inputs against the
    float64 reference on the same rounded inputs; None where the reference is exactly 0."""
    lo = [x.to(dtype).to(DEV).requires_grad_() for x in xs]
    hi = [x.detach().double().requires_grad_() for x in lo]
    dout = randn(*f_ref(*hi).shape, seed=seed).to(DEV)
    want = outputs_and_grads(f_ref, hi, dout)
    got = outputs_and_grads(f_kernel, lo, dout)
    errs = []
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.shape == b.shape
        assert torch.isfinite(a).all()
        scale = b.square().mean().sqrt().item()
        errs.append(None if scale == 0 else ((a.double() - b).square().mean().sqrt() / scale).item())
        if scale == 0:
            assert a.abs().max() <= 1e-6, 'the reference is exactly 0 here'
    return errs


def sdpa_errors(N, Tq, Tk, dh, offset, causal, window, dtype, seed):
    """The same errors for torch's SDPA (softmax attention) at this size and visibility."""
    xs = [randn(N, Tq, dh, seed=seed + 100), randn(N, Tk, dh, seed=seed + 101), randn(N, Tk, dh, seed=seed + 102)]
    m = visible(Tq, Tk, offset, causal, window, DEV)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    return compare(f, f, xs, dtype, seed)


def assert_within(errs, floors, names):
    for name, e, f in zip(names, errs, floors):
        if e is not None:
            assert e <= 2 * f, f'{name}: relative RMSE {e:.2e} > 2 x SDPA {f:.2e}'


def assert_fp32(errs, names):
    for name, e in zip(names, errs):
        assert e is None or e <= 1e-4, f'{name}: relative RMSE {e:.2e}'


# (Tq, Tk, offset, causal, window, dh): full sequences, one token, decoding after a prompt,
# non-causal, an odd head size
SHAPES = [(1, 1, 0, True, 0, 16), (17, 17, 0, True, 0, 32), (64, 64, 0, True, 0, 16), (64, 64, 0, True, 9, 32),
          (5, 40, 35, True, 8, 16), (1, 9, 8, True, 4, 32), (17, 17, 0, False, 0, 16), (17, 17, 0, True, 5, 20)]


# -----------------------------------------------------------------------------
# HyperFeatureAttention

def hfa_case(A, Tq, Tk, dh, N=2, seed=0):
    return [randn(A, N, Tq, dh, seed=seed), randn(A, N, Tk, dh, seed=seed + 1), randn(N, Tk, dh, seed=seed + 2)]


def hfa_kernel(offset, causal, window, scale):
    return lambda q, k, v: hfa_ops.hfa_fwd(q, k, v, offset, causal, window, scale)[0]


def hfa_ref(offset, causal, window, scale):
    return lambda q, k, v: ref_hfa(q, k, v, offset, causal, window, scale)


HFA_CASES = [(A, s) for A in (1, 2, 3, 4) for s in SHAPES if A == 2 or s in SHAPES[1:4] + SHAPES[5:6]]


@pytest.mark.parametrize('A, shape', HFA_CASES)
def test_hfa_fp32_equals_reference(A, shape):
    Tq, Tk, offset, causal, window, dh = shape
    scale = dh ** -0.5
    errs = compare(hfa_kernel(offset, causal, window, scale), hfa_ref(offset, causal, window, scale),
                   hfa_case(A, Tq, Tk, dh, seed=A + Tq), torch.float32, seed=3)
    assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])


BF16, FP16 = torch.bfloat16, torch.float16


@pytest.mark.parametrize('dtype, A, window, offset', [(BF16, 1, 0, 0), (BF16, 2, 0, 0), (BF16, 2, 16, 0), (BF16, 2, 0, 24),
                                                      (BF16, 3, 0, 0), (BF16, 4, 0, 0), (FP16, 2, 0, 0), (FP16, 4, 0, 0)])
def test_hfa_low_precision_within_2x_of_sdpa(dtype, A, window, offset):
    Tq, dh, N = 64 - offset, 32, 2
    Tk = Tq + offset
    scale = dh ** -0.5
    errs = compare(hfa_kernel(offset, True, window, scale), hfa_ref(offset, True, window, scale),
                   hfa_case(A, Tq, Tk, dh, N, seed=10 + A), dtype, seed=4)
    floor = sdpa_errors(N, Tq, Tk, dh, offset, True, window, dtype, seed=4)
    assert_within(errs, floor, ['out', 'dq', 'dk', 'dv'])


@pytest.mark.parametrize('rows_kept, rows_per_step', [(32, 16), (16, 32)])
def test_hfa_backward_with_unequal_tiles(monkeypatch, rows_kept, rows_per_step):
    """On a GPU the backward kernels keep R rows and step L at a time, R != L (dq keeps R
    queries, dk/dv R keys); the interpreter's own tiles are square, so choose them here."""
    from attention_kernels.hfa import triton as hfa_triton
    real = hfa_triton.block_sizes
    monkeypatch.setattr(hfa_triton, 'block_sizes', lambda kind, *a: (rows_kept, rows_per_step, 1, 1)
                        if kind.startswith('hfa_bwd') else real(kind, *a))
    for offset, window in [(0, 0), (0, 9), (7, 0)]:
        Tq, Tk, dh = 45, 45 + offset, 20
        errs = compare(hfa_kernel(offset, True, window, dh ** -0.5), hfa_ref(offset, True, window, dh ** -0.5),
                       hfa_case(2, Tq, Tk, dh, seed=offset + window), torch.float32, seed=13)
        assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])


@pytest.mark.parametrize('fwd_tiles, bwd_tiles', [((64, 16), (16, 32)), ((32, 64), (64, 16))])
def test_hfa_forward_with_unequal_tiles(monkeypatch, fwd_tiles, bwd_tiles):
    """On a GPU the forward takes query tiles 2-4x its key tiles (128 x 32 at dh 128) or
    smaller; the unmasked and diagonal blocks must still be split right at every edge."""
    from attention_kernels.hfa import triton as hfa_triton
    real = hfa_triton.block_sizes
    monkeypatch.setattr(hfa_triton, 'block_sizes', lambda kind, *a: (*fwd_tiles, 1, 1) if kind == 'hfa_fwd'
                        else (*bwd_tiles, 1, 1) if kind.startswith('hfa_bwd') else real(kind, *a))
    for offset, window in [(0, 0), (0, 23), (9, 0)]:
        Tq, Tk, dh = 100, 100 + offset, 20
        errs = compare(hfa_kernel(offset, True, window, dh ** -0.5), hfa_ref(offset, True, window, dh ** -0.5),
                       hfa_case(2, Tq, Tk, dh, seed=offset + window), torch.float32, seed=14)
        assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])


def test_hfa_query_that_sees_nothing_gives_zero():
    """Queries past the keys with a window (decoding beyond the cache) read nothing: 0."""
    q, k, v = hfa_case(2, 4, 5, 16)
    out, lse, _ = hfa_ops.hfa_fwd(q.float().to(DEV), k.float().to(DEV), v.float().to(DEV), 3, True, 2, 0.25)
    assert torch.equal(out[:, -1].cpu(), torch.zeros(2, 16)) and torch.isinf(lse[:, -1]).all()
    errs = compare(hfa_kernel(3, True, 2, 0.25), hfa_ref(3, True, 2, 0.25), [q, k, v], torch.float32, seed=5)
    assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])


def test_hfa_model_layout():
    """hfa_ops.hfa_attention takes the model's (A, B, H, T, dh) streams."""
    q, k, v = randn(2, 2, 3, 17, 16, seed=1), randn(2, 2, 3, 17, 16, seed=2), randn(2, 3, 17, 16, seed=3)
    got = hfa_ops.hfa_attention(*(t.float().to(DEV) for t in (q, k, v)), 0, True, 0, 0.25)
    want = ref_hfa(q.flatten(1, 2), k.flatten(1, 2), v.flatten(0, 1), 0, True, 0, 0.25).view(2, 3, 17, 16)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-5)


# -----------------------------------------------------------------------------
# linear attention

def lin_kernel(offset, causal, window, norm, scale, chunked=False):
    return lambda q, k, v: linear_ops.linear_fwd(q, k, v, offset, causal, window, norm, scale, chunked)


def lin_ref(offset, causal, window, norm, scale):
    return lambda q, k, v: ref_linear(q, k, v, offset, causal, window, norm, scale)


@pytest.mark.parametrize('norm', [False, True])
@pytest.mark.parametrize('shape', SHAPES)
def test_linear_fp32_equals_reference(shape, norm):
    Tq, Tk, offset, causal, window, dh = shape
    xs = [randn(2, Tq, dh, seed=Tq), randn(2, Tk, dh, seed=Tq + 1), randn(2, Tk, dh, seed=Tq + 2)]
    errs = compare(lin_kernel(offset, causal, window, norm, dh ** -0.5), lin_ref(offset, causal, window, norm, dh ** -0.5),
                   xs, torch.float32, seed=6)
    assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('norm, window', [(False, 0), (True, 0), (True, 16)])
def test_linear_low_precision_within_2x_of_sdpa(dtype, norm, window):
    T, dh, N = 64, 32, 2
    xs = [randn(N, T, dh, seed=30), randn(N, T, dh, seed=31), randn(N, T, dh, seed=32)]
    errs = compare(lin_kernel(0, True, window, norm, dh ** -0.5), lin_ref(0, True, window, norm, dh ** -0.5),
                   xs, dtype, seed=7)
    floor = sdpa_errors(N, T, T, dh, 0, True, window, dtype, seed=7)
    assert_within(errs, floor, ['out', 'dq', 'dk', 'dv'])


@pytest.fixture
def chunked_linear(monkeypatch):
    """The calls the chunked kernels receive, to show that the chunked path ran."""
    from attention_kernels.linear import triton_chunked
    calls = []
    for name in ('chunked_forward', 'chunked_backward'):
        fn = getattr(triton_chunked, name)
        monkeypatch.setattr(triton_chunked, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    yield calls


@pytest.mark.parametrize('norm', [False, True])
@pytest.mark.parametrize('T, dh', [(1, 16), (16, 16), (17, 32), (50, 20)])
def test_linear_chunked_fp32_equals_reference(chunked_linear, T, dh, norm):
    """The chunked form (a dh x dh state per chunk of 16 here) equals the definition, at
    lengths below, at and across chunk edges."""
    xs = [randn(2, T, dh, seed=T), randn(2, T, dh, seed=T + 1), randn(2, T, dh, seed=T + 2)]
    errs = compare(lin_kernel(0, True, 0, norm, dh ** -0.5, chunked=True), lin_ref(0, True, 0, norm, dh ** -0.5), xs,
                   torch.float32, seed=8)
    assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])
    assert chunked_linear == ['chunked_forward', 'chunked_backward']


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('norm', [False, True])
def test_linear_chunked_low_precision_within_2x_of_sdpa(chunked_linear, dtype, norm):
    T, dh, N = 64, 32, 2
    xs = [randn(N, T, dh, seed=40), randn(N, T, dh, seed=41), randn(N, T, dh, seed=42)]
    errs = compare(lin_kernel(0, True, 0, norm, dh ** -0.5, chunked=True), lin_ref(0, True, 0, norm, dh ** -0.5), xs,
                   dtype, seed=9)
    floor = sdpa_errors(N, T, T, dh, 0, True, 0, dtype, seed=9)
    assert_within(errs, floor, ['out', 'dq', 'dk', 'dv'])
    assert chunked_linear == ['chunked_forward', 'chunked_backward']


@pytest.mark.parametrize('tiles', [(64, 16), (32, 64)])
def test_linear_with_unequal_tiles(monkeypatch, tiles):
    """The quadratic kernels at query tiles larger (128 x 64 at dh 128 on a GPU) and smaller
    than their key tiles, with windows and a decoding offset."""
    from attention_kernels.linear import triton as lin_triton
    monkeypatch.setattr(lin_triton, 'block_sizes', lambda kind, *a: (*tiles, 1, 1))
    for offset, window, norm in [(0, 0, True), (0, 23, False), (9, 0, True)]:
        Tq, Tk, dh = 100, 100 + offset, 20
        xs = [randn(2, Tq, dh, seed=offset), randn(2, Tk, dh, seed=offset + 1), randn(2, Tk, dh, seed=offset + 2)]
        errs = compare(lin_kernel(offset, True, window, norm, dh ** -0.5),
                       lin_ref(offset, True, window, norm, dh ** -0.5), xs, torch.float32, seed=15)
        assert_fp32(errs, ['out', 'dq', 'dk', 'dv'])


# -----------------------------------------------------------------------------
# the model: kernel='triton' computes what kernel='torch' computes, and the dispatch

MODEL_VARIANTS = {
    'linear': dict(attention='linear'),
    'linear_norm_window': dict(attention='linear', linear_norm=True, attn_window=5),
    'sa_nosoftmax': dict(attention='sa', softmax=False),
    'hfa_v1': dict(attention='hfa_v1'),
    'hfa_v2_A3': dict(attention='hfa_v2', hfa_order=3),
    'hfa_mixed_window': dict(attention='hfa_v1', n_head=4, n_hfa_head=2, head_dim=4, attn_window=4),
    'ha': dict(attention='ha'),
    'ha_shared_windows': dict(attention='ha', ha_share_kv=True, ha_window1=6, ha_window2=3),
    'sa,ha': dict(attn_layers='sa,ha'),
}


def tiny_gpt(kernel, kw):
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=17), **kw, 'kernel': kernel})
    return GPT(cfg).to(DEV)


@pytest.mark.parametrize('name', list(MODEL_VARIANTS))
def test_gpt_triton_equals_torch(name):
    idx = torch.randint(0, 17, (2, 19), generator=torch.Generator().manual_seed(1)).to(DEV)
    res = {}
    for kernel in ('torch', 'triton'):
        model = tiny_gpt(kernel, MODEL_VARIANTS[name])
        logits, loss = model(idx, targets=idx)
        loss.backward()
        res[kernel] = [logits] + [p.grad for p in model.parameters()]
    for a, b in zip(res['triton'], res['torch']):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_kernel_flag_is_checked():
    from model import GPTConfig
    with pytest.raises(ValueError, match="'auto', 'triton', 'torch'|auto, triton, torch"):
        GPTConfig(kernel='cuda')


# -----------------------------------------------------------------------------
# loading: the interpreter is switched on for triton's import only

def test_interpreter_setting_does_not_leak():
    assert os.environ.get('TRITON_INTERPRET') == attention_kernels._triton['env_before']


# -----------------------------------------------------------------------------
# bench.py's kernel rows (here at a toy size; on CUDA: tools/gpu_check.sh)

def test_bench_kernel_rows_records():
    import argparse
    import bench
    p = argparse.ArgumentParser()
    bench.add_kernel_args(p)
    args = p.parse_args(['--kernels_only', '--kernel_seq_lens', '16', '--kernel_head_dims', '16', '--kernel_batch', '1',
                         '--kernel_heads', '2', '--kernel_dtype', 'fp32', '--kernel_list', 'sdpa,linear,hfa_A2,ha_win',
                         '--kernel_min_time', '0', '--kernel_min_iters', '1'])
    args.device = DEV
    assert bench.parse_kernel_args(args)
    records = bench.kernel_rows(args)
    assert not [r for r in records if r.get('error')]
    assert {(r['variant'], r['mode']) for r in records} == {
        (v, m) for v in ('sdpa', 'linear', 'hfa_A2', 'ha_win') for m in ('kernel_fwd', 'kernel_bwd', 'kernel_fwd_bwd')}
    for r in records:
        assert r['seconds'] > 0 and r['flops'] > 0 and r['frac_of_peak'] > 0 and r['time_vs_sdpa'] > 0
        assert r['flops'] == pytest.approx(r['tflops_per_s'] * 1e12 * r['seconds'])


# -----------------------------------------------------------------------------
# CUDA only: realistic sizes in bf16, compiled kernels

@cuda
@pytest.mark.parametrize('dh', [64, 128])
@pytest.mark.parametrize('A, window', [(1, 0), (2, 0), (2, 256), (3, 0)])
def test_cuda_hfa_bf16_realistic(A, window, dh):
    T, N = 1024, 8
    scale = dh ** -0.5
    xs = hfa_case(A, T, T, dh, N, seed=60)
    errs = compare(hfa_kernel(0, True, window, scale), hfa_ref(0, True, window, scale), xs, torch.bfloat16, seed=10)
    floor = sdpa_errors(N, T, T, dh, 0, True, window, torch.bfloat16, seed=10)
    assert_within(errs, floor, ['out', 'dq', 'dk', 'dv'])


@cuda
@pytest.mark.parametrize('dh', [64, 128])
@pytest.mark.parametrize('norm, window', [(False, 0), (True, 0), (True, 256)])
def test_cuda_linear_bf16_realistic(norm, window, dh):
    T, N = 1024, 8
    xs = [randn(N, T, dh, seed=70 + i) for i in range(3)]
    errs = compare(lin_kernel(0, True, window, norm, dh ** -0.5), lin_ref(0, True, window, norm, dh ** -0.5),
                   xs, torch.bfloat16, seed=11)
    floor = sdpa_errors(N, T, T, dh, 0, True, window, torch.bfloat16, seed=11)
    assert_within(errs, floor, ['out', 'dq', 'dk', 'dv'])
