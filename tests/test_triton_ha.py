"""The Triton kernels of order-3 HyperAttention (attention_kernels/ha/triton.py) against the definition.

    logit[i, j1, j2] = scale * sum_s q[i,s] k1[j1,s] k2[j2,s],  one softmax over the visible
    pairs, out[i] = sum P[i, j1, j2] v1[j1] * v2[j2];  query i at position offset + i.

The reference (attention_kernels/ha/naive.py) materialises every pair in float64. Without CUDA the kernels run on CPU
under Triton's interpreter. TRITON_INTERPRET is read when a function is decorated, triton's
own library included, so it must be set before triton is first imported: the kernels run in
a child process started with it, and this process's environment is left as it was.
The last section runs the kernel in this process (interpreted as attention_kernels.load_triton
set it up) through its custom op, nanohfa::ha3_fwd / ha3_bwd, and their autograd, with
test_kernels_triton.py's helpers: every HA Triton test is in this module.
"""
import multiprocessing
import os

import pytest
import torch
import torch.nn.functional as F

import attention_kernels
from attention_kernels.ha import ops as ha_ops
from attention_kernels.ha.naive import naive_ha3 as reference
from test_kernels_triton import assert_fp32, assert_within, compare, randn, sdpa_errors

TRITON_ERROR = attention_kernels.load_triton()  # on Linux an error fails the session (conftest.py)
pytestmark = [pytest.mark.skipif(TRITON_ERROR is not None, reason=f'no usable triton: {TRITON_ERROR}'),
              pytest.mark.slow()]  # the Triton interpreter in a child process: make test, not make test-fast

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason='needs a CUDA GPU')


def _child_call(name, args=(), kwargs=None):
    import attention_kernels.ha.triton as module
    return getattr(module, name)(*args, **(kwargs or {}))


def _child_interpreted():
    from attention_kernels.triton_common import INTERPRETED
    return INTERPRETED


class Interpreted:
    """attention_kernels.ha.triton with every call made in a child process under TRITON_INTERPRET=1."""

    def __init__(self):
        saved = os.environ.get('TRITON_INTERPRET')
        os.environ['TRITON_INTERPRET'] = '1'  # inherited by the child when it starts, here
        try:
            self.pool = multiprocessing.get_context('spawn').Pool(1)
        finally:
            if saved is None:
                del os.environ['TRITON_INTERPRET']
            else:
                os.environ['TRITON_INTERPRET'] = saved
        self.interpreted = self.pool.apply(_child_interpreted)

    def ha3_forward(self, *args, **kwargs):
        return self.pool.apply(_child_call, ('ha3_forward', args, kwargs))

    def ha3_backward(self, *args, **kwargs):
        return self.pool.apply(_child_call, ('ha3_backward', args, kwargs))

    def close(self):
        self.pool.close()
        self.pool.join()


@pytest.fixture(scope='module')
def tha():
    """(module, device): the compiled kernels on CUDA, else the interpreted ones on CPU."""
    if CUDA:
        import attention_kernels.ha.triton as module
        yield module, 'cuda'
        return
    module = Interpreted()
    assert module.interpreted, 'the kernels must be interpreted on CPU'
    yield module, 'cpu'
    module.close()


# -----------------------------------------------------------------------------
# the definition

def reference_grads(ins, dout, *geo):
    """float64 (out, lse, (dq, dk1, dk2, dv1, dv2)); shared K/V: ins[2] is ins[1], etc."""
    leaves = [t.detach().double().requires_grad_() for t in (ins[0], ins[1], ins[3])]
    k2 = leaves[1] if ins[2] is ins[1] else ins[2].detach().double().requires_grad_()
    v2 = leaves[2] if ins[4] is ins[3] else ins[4].detach().double().requires_grad_()
    q, k1, v1 = leaves
    out, lse = reference(q, k1, k2, v1, v2, *geo)
    grads = torch.autograd.grad(out, [q, k1, k2, v1, v2], dout.double(), allow_unused=True)
    return out, lse, [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (q, k1, k2, v1, v2))]


def max_rel(x, ref):
    """max |x - ref| / max |ref| (0 when both vanish)."""
    x, ref = x.double(), ref.double()
    scale = ref.abs().max()
    err = (x - ref).abs().max()
    return (err / scale).item() if scale > 0 else err.item()


def rel_rmse(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def inputs(N, Tq, Tk, dh, shared, dtype, device, gen, amplitude=1.0):
    q = torch.randn(N, Tq, dh, generator=gen, dtype=torch.float64) * amplitude
    k1, v1 = (torch.randn(N, Tk, dh, generator=gen, dtype=torch.float64) * amplitude for _ in range(2))
    k2, v2 = (k1, v1) if shared else (torch.randn(N, Tk, dh, generator=gen, dtype=torch.float64) * amplitude
                                      for _ in range(2))
    dout = torch.randn(N, Tq, dh, generator=gen, dtype=torch.float64)
    cast = {}
    def to(t):  # keep aliasing: the shared form passes the same tensor twice
        if id(t) not in cast:
            cast[id(t)] = t.to(device=device, dtype=dtype)
        return cast[id(t)]
    return [to(t) for t in (q, k1, k2, v1, v2)], dout.to(device=device, dtype=dtype)


def run_kernels(m, ins, dout, geo, config=None, split=None):
    """As the custom op runs them: backward takes the forward's float32 output (bf16/fp16)."""
    out, lse, out32 = m.ha3_forward(*ins, *geo, config=config, split_products=split)
    grads = m.ha3_backward(*ins, out if out32 is None else out32, lse, dout, *geo, config=config,
                           split_products=split)
    return out, lse, grads


# -----------------------------------------------------------------------------
# float32: the kernels equal the definition to 1e-4

# (N, Tq, Tk, dh, offset, causal, window1, window2, shared)
CASES = [
    (1, 1, 1, 16, 0, True, 0, 0, False),       # T = 1
    (2, 17, 17, 16, 0, True, 0, 0, False),     # full causal, separate K/V
    (1, 17, 17, 32, 0, True, 5, 3, True),      # both windows, shared K/V
    (1, 17, 17, 24, 0, True, 4, 0, False),     # odd head size; window on slot 1 only
    (1, 64, 64, 16, 0, True, 0, 0, False),
    (1, 64, 64, 16, 0, True, 16, 8, False),
    (1, 64, 64, 32, 0, True, 0, 4, True),
    (1, 17, 17, 16, 0, False, 5, 3, False),    # non-causal: every pair, windows ignored
    (1, 17, 40, 16, 23, True, 0, 0, False),    # chunked prefill: queries at an offset
    (1, 17, 64, 32, 47, True, 16, 8, True),
    (1, 1, 17, 32, 16, True, 5, 3, False),     # one-token decoding
]


@pytest.mark.parametrize('fuse', [True, False], ids=['fused', 'unfused'])
@pytest.mark.parametrize('N,Tq,Tk,dh,offset,causal,w1,w2,shared', CASES)
def test_fp32_matches_definition(tha, N, Tq, Tk, dh, offset, causal, w1, w2, shared, fuse):
    """fused: the backward's dq + slot-a kernel wherever it applies (causal, every query's
    a keys in one lane tile: all the causal cases here); unfused: dq and slot a apart."""
    m, dev = tha
    gen = torch.Generator().manual_seed(Tq * 1000 + Tk + dh + w1 + 7 * w2)
    ins, dout = inputs(N, Tq, Tk, dh, shared, torch.float32, dev, gen)
    geo = (offset, causal, w1, w2, dh ** -0.5)
    out, lse, grads = run_kernels(m, ins, dout, geo, config=dict(FUSE=fuse))
    ref_out, ref_lse, ref_grads = reference_grads(ins, dout, *geo)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32 and out.shape == (N, Tq, dh)
    assert max_rel(out, ref_out) < 1e-4
    assert (lse.double() - ref_lse).abs().max().item() < 1e-4
    names = ('dq', 'dk1', 'dk2', 'dv1', 'dv2')
    assert all(g.dtype == torch.float32 and g.shape == t.shape for g, t in zip(grads, ins))
    if shared:  # one tensor in both slots: the caller sums the two slots' gradients
        grads = [grads[0], grads[1] + grads[2], None, grads[3] + grads[4], None]
    for name, g, r in zip(names, grads, ref_grads):
        if g is not None:
            assert max_rel(g, r) < 1e-4, name


SMALL_BLOCKS = dict(G=2, BA=8, BB=16, JA=2, BU=8, BBD=16)


@pytest.mark.parametrize('Tq,Tk,offset,w1,w2', [(33, 33, 0, 0, 0), (40, 40, 0, 20, 12), (20, 48, 28, 0, 12)])
def test_fp32_small_blocks(tha, Tq, Tk, offset, w1, w2):
    """Blocks far smaller than the windows: many lane blocks per query, column sweeps with
    unmasked interior blocks, several query groups per key block, and slot b's lane tiles
    both with lane masks and (whole blocks of visible pairs) without."""
    m, dev = tha
    gen = torch.Generator().manual_seed(5)
    ins, dout = inputs(1, Tq, Tk, 16, False, torch.float32, dev, gen)
    geo = (offset, True, w1, w2, 0.25)
    out, lse, grads = run_kernels(m, ins, dout, geo, config=SMALL_BLOCKS)
    ref_out, ref_lse, ref_grads = reference_grads(ins, dout, *geo)
    assert max_rel(out, ref_out) < 1e-4
    for g, r in zip(grads, ref_grads):
        assert max_rel(g, r) < 1e-4


def test_fused_backward_where_it_applies():
    """The fused dq + slot-a kernel takes causal attention whose narrow window fits one lane
    tile (the GPU configs' windows (512, 32)), at head sizes up to 128; full causal at long
    T, non-causal, queries past the last key and head size 256 keep dq and slot a apart."""
    from attention_kernels.ha import triton as ha

    def fused(T, dh, w1, w2, causal=True, offset=0, Tk=None):
        Tk = Tk or T
        _, wa, wb = ha._geometry(T, Tk, offset, causal, w1, w2)
        dqa = ha._configs(T, Tk, dh, wa, wb)[3]
        return ha._fused(dqa, T, Tk, offset, causal, wa)
    assert fused(4096, 64, 512, 32) and fused(4096, 64, 32, 512) and fused(4096, 32, 512, 64)
    assert fused(64, 16, 0, 0)  # short: every key in one lane tile
    assert not fused(4096, 64, 0, 0) and not fused(4096, 64, 512, 128)
    assert not fused(64, 16, 0, 0, causal=False)
    assert not fused(17, 16, 0, 0, offset=5, Tk=17)  # queries past the last key
    assert fused(4096, 128, 512, 32) and not fused(4096, 256, 512, 32)


def test_fused_backward_owns_each_key_in_two_parities():
    """Programs of one parity never reach the same a key: a program's NG query groups reach
    NG * G + BA - 1 keys from its first query's window, and the next program of its parity
    starts 2 * NG * G queries later; so plane 0 + plane 1 is every key's whole sum."""
    from attention_kernels.ha import triton as ha
    for T, dh, w1, w2 in [(4096, 64, 512, 32), (4096, 16, 512, 64), (64, 16, 16, 8), (17, 32, 5, 3), (1, 16, 0, 0)]:
        _, wa, wb = ha._geometry(T, T, 0, True, w1, w2)
        c = ha._configs(T, T, dh, wa, wb)[3]
        assert c['FUSE'] and c['NG'] * c['G'] >= c['BA'] - 1, (T, dh, c)


@pytest.mark.parametrize('dh,w1,w2', [(64, 16, 8), (48, 0, 20), (100, 12, 0)])
def test_fused_backward_bf16_within_twice_sdpa(tha, dh, w1, w2):
    """The fused kernel at head sizes 33-64 and 65-128 (their own tiles) with the default
    split products: bf16 within 2x SDPA's error."""
    m, dev = tha
    check_bf16_against_sdpa(m, dev, 2, 48, dh, w1, w2, False, torch.Generator().manual_seed(dh + w2))


def test_large_logits_rescale(tha):
    """Logits of size ~30: the online softmax must rescale its running sums."""
    m, dev = tha
    gen = torch.Generator().manual_seed(3)
    ins, dout = inputs(1, 17, 17, 16, False, torch.float32, dev, gen, amplitude=2.5)
    geo = (0, True, 0, 0, 16 ** -0.5)
    out, lse, grads = run_kernels(m, ins, dout, geo, config=dict(BB=16))
    ref_out, ref_lse, ref_grads = reference_grads(ins, dout, *geo)
    assert ref_lse.max() > 30
    assert max_rel(out, ref_out) < 1e-4
    for g, r in zip(grads, ref_grads):
        assert max_rel(g, r) < 1e-4


def test_query_that_sees_nothing(tha):
    """Queries at positions 8..11 over keys 0..7 with window1 = 3: positions 10 and 11 see no
    key of slot 1, so no pair: out 0, lse -inf, gradients finite and zero for them."""
    m, dev = tha
    gen = torch.Generator().manual_seed(4)
    ins, dout = inputs(1, 4, 8, 16, False, torch.float32, dev, gen)
    geo = (8, True, 3, 0, 0.25)
    out, lse, grads = run_kernels(m, ins, dout, geo)
    ref_out, ref_lse, ref_grads = reference_grads(ins, dout, *geo)
    assert torch.equal(out[:, 2:], torch.zeros_like(out[:, 2:]))
    assert torch.isneginf(lse[:, 2:]).all() and torch.isfinite(lse[:, :2]).all()
    assert torch.equal(grads[0][:, 2:], torch.zeros_like(grads[0][:, 2:]))
    assert all(torch.isfinite(g).all() for g in grads)
    assert max_rel(out, ref_out) < 1e-4
    for g, r in zip(grads, ref_grads):
        assert max_rel(g, r) < 1e-4


def test_backward_is_deterministic(tha):
    m, dev = tha
    gen = torch.Generator().manual_seed(6)
    ins, dout = inputs(1, 17, 17, 16, True, torch.float32, dev, gen)
    geo = (0, True, 0, 4, 0.25)
    _, _, g1 = run_kernels(m, ins, dout, geo)
    _, _, g2 = run_kernels(m, ins, dout, geo)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_bad_inputs_say_what_is_wrong(tha):
    m, dev = tha
    q = torch.zeros(1, 4, 16, dtype=torch.float32, device=dev)
    k = torch.zeros(1, 5, 16, dtype=torch.float32, device=dev)
    with pytest.raises(ValueError, match='dtype'):
        m.ha3_forward(q, k, k, k, k.half(), 0, True, 0, 0, 0.25)
    with pytest.raises(ValueError, match=r'\(N, Tk, dh\)'):
        m.ha3_forward(q, k, k[:, :3], k, k, 0, True, 0, 0, 0.25)
    with pytest.raises(ValueError, match='head size'):
        big = torch.zeros(1, 4, 300, dtype=torch.float32, device=dev)
        m.ha3_forward(big, big, big, big, big, 0, True, 0, 0, 0.25)


# -----------------------------------------------------------------------------
# bf16: relative RMSE within 2x that of bf16 SDPA on comparable inputs

def sdpa_bf16_errors(N, T, dh, device, gen):
    """Relative RMSE of bf16 SDPA (out, dq, dk, dv) against float64 SDPA, causal, on inputs
    drawn like the HA test's (logits of unit size)."""
    q, k, v = (torch.randn(N, 1, T, dh, generator=gen, dtype=torch.float64).bfloat16().to(device)
               for _ in range(3))
    dout = torch.randn(N, 1, T, dh, generator=gen, dtype=torch.float64).to(device)

    def run(dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        return [out, *torch.autograd.grad(out, leaves, dout.to(dtype))]
    return [rel_rmse(a, b) for a, b in zip(run(torch.bfloat16), run(torch.float64))]


def check_bf16_against_sdpa(m, dev, N, T, dh, w1, w2, shared, gen, ref_fn=None, split=None):
    sd_out, sd_dq, sd_dk, sd_dv = sdpa_bf16_errors(N, T, dh, dev, gen)
    ins, dout = inputs(N, T, T, dh, shared, torch.bfloat16, dev, gen)
    geo = (0, True, w1, w2, dh ** -0.5)
    out, lse, grads = run_kernels(m, ins, dout, geo, split=split)
    ref_out, ref_lse, ref_grads = (ref_fn or reference_grads)(ins, dout, *geo)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert all(g.dtype == torch.bfloat16 for g in grads)
    errors = {'out': (rel_rmse(out, ref_out), sd_out), 'dq': (rel_rmse(grads[0], ref_grads[0]), sd_dq)}
    if shared:
        # one leaf in both slots: its reference gradient is already the sum of the two
        errors['dk'] = (rel_rmse(grads[1].double() + grads[2].double(), ref_grads[1]), sd_dk)
        errors['dv'] = (rel_rmse(grads[3].double() + grads[4].double(), ref_grads[3]), sd_dv)
    else:
        for i, name, bar in ((1, 'dk1', sd_dk), (2, 'dk2', sd_dk), (3, 'dv1', sd_dv), (4, 'dv2', sd_dv)):
            errors[name] = (rel_rmse(grads[i], ref_grads[i]), bar)
    worse = {k: f'{e:.2e} > 2 x {bar:.2e}' for k, (e, bar) in errors.items() if e > 2 * bar}
    assert not worse, worse
    return errors


@pytest.mark.parametrize('T,dh,w1,w2,shared', [(64, 32, 0, 0, False), (64, 16, 16, 8, True), (40, 24, 0, 5, False)])
def test_bf16_error_within_twice_sdpa(tha, T, dh, w1, w2, shared):
    """The default for bf16: the lane products in scaled float16 (split 'fp16')."""
    m, dev = tha
    check_bf16_against_sdpa(m, dev, 2, T, dh, w1, w2, shared, torch.Generator().manual_seed(T + dh))


def test_bf16_split_hi_lo_within_twice_sdpa(tha):
    """Split 'both' (the lane products as hi + lo bf16 pairs; fp16 inputs' default)."""
    m, dev = tha
    check_bf16_against_sdpa(m, dev, 2, 64, 16, 16, 8, True, torch.Generator().manual_seed(80), split='both')


def test_fp16_products_follow_power_of_two_scalings(tha):
    """Split 'fp16' scales its float16 operands by powers of two, per head and per query
    row. So q 2^-16 with k2 2^16 (k2 beyond float16's range) and v1 2^-16 with v2 2^16
    leave the output and lse unchanged bit for bit, and dO 2^-40 (below float16's range)
    scales each gradient by the chain rule's power of two (within bf16 rounding of lse)."""
    m, dev = tha
    gen = torch.Generator().manual_seed(12)
    ins, dout = inputs(1, 24, 24, 16, False, torch.bfloat16, dev, gen)
    geo = (0, True, 0, 0, 0.25)  # full causal: slot b (the wider) is slot 2
    out, lse, grads = run_kernels(m, ins, dout, geo)
    q, k1, k2, v1, v2 = ins
    big = [q * 2.0 ** -16, k1, k2 * 2.0 ** 16, v1 * 2.0 ** -16, v2 * 2.0 ** 16]
    out2, lse2, grads2 = run_kernels(m, big, dout * 2.0 ** -40, geo)
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    for g, g2, e in zip(grads, grads2, (16, 0, -16, 16, -16)):
        assert torch.isfinite(g2).all()
        assert rel_rmse(g2.double() * 2.0 ** (40 - e), g) < 1e-3


def test_fp16_products_are_for_bf16(tha):
    m, dev = tha
    x = torch.zeros(1, 4, 16, dtype=torch.float16, device=dev)
    with pytest.raises(ValueError, match="'fp16' is for bfloat16"):
        m.ha3_forward(x, x, x, x, x, 0, True, 0, 0, 0.25, split_products='fp16')


# -----------------------------------------------------------------------------
# CUDA: realistic sizes

def windowed_reference_grads(ins, dout, offset, causal, w1, w2, scale, chunk=64):
    """reference_grads for long causal sequences: per block of queries, only the keys each
    slot can reach, float64, checkpointed so that one block's pairs exist at a time."""
    from torch.utils.checkpoint import checkpoint
    leaves = [t.detach().double().requires_grad_() for t in ins]
    q, k1, k2, v1, v2 = leaves
    Tq, Tk = q.size(1), k1.size(1)
    outs, lses = [], []
    for i0 in range(0, Tq, chunk):
        i1 = min(i0 + chunk, Tq)
        p0, p1 = offset + i0, offset + i1 - 1
        hi = min(p1 + 1, Tk)
        lo1 = max(0, p0 - w1 + 1) if w1 else 0
        lo2 = max(0, p0 - w2 + 1) if w2 else 0
        o, l = checkpoint(reference, q[:, i0:i1], k1[:, lo1:hi], k2[:, lo2:hi], v1[:, lo1:hi], v2[:, lo2:hi],
                          offset + i0, causal, w1, w2, scale, (lo1, lo2), use_reentrant=False)
        outs.append(o)
        lses.append(l.detach())
    out = torch.cat(outs, 1)
    grads = torch.autograd.grad(out, leaves, dout.double())
    return out.detach(), torch.cat(lses, 1), list(grads)


@needs_cuda
@pytest.mark.parametrize('T,dh,w1,w2', [(2048, 64, 512, 32), (2048, 128, 512, 32), (1024, 64, 0, 0), (1024, 128, 32, 512)])
def test_cuda_bf16_realistic(tha, T, dh, w1, w2):
    m, dev = tha
    check_bf16_against_sdpa(m, dev, 4, T, dh, w1, w2, False, torch.Generator().manual_seed(T + dh),
                            ref_fn=windowed_reference_grads)


@needs_cuda
def test_cuda_chunked_prefill_and_determinism(tha):
    """The last 256 queries of a 4096-token sequence at offset 3840 equal the same queries of
    the whole sequence; the backward is bitwise reproducible."""
    m, dev = tha
    gen = torch.Generator().manual_seed(11)
    ins, dout = inputs(2, 4096, 4096, 64, False, torch.bfloat16, dev, gen)
    geo = (0, True, 512, 32, 0.125)
    out, lse, _ = m.ha3_forward(*ins, *geo)
    tail_out, tail_lse, _ = m.ha3_forward(ins[0][:, -256:], *ins[1:], 3840, True, 512, 32, 0.125)
    assert rel_rmse(tail_out, out[:, -256:]) < 1e-2
    assert (tail_lse - lse[:, -256:]).abs().max().item() < 1e-3
    g1 = m.ha3_backward(*ins, out, lse, dout, *geo)
    g2 = m.ha3_backward(*ins, out, lse, dout, *geo)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))


# -----------------------------------------------------------------------------
# through the custom ops and their autograd, in this process (test_kernels_triton.py's helpers)

def ha_kernel(offset, causal, w1, w2, shared, kernel='triton'):
    """The Triton (or the blockwise PyTorch) op on (q, k1, k2, v1, v2), or on (q, k, v) with
    k and v in both slots."""
    op = ha_ops.ha3_fwd if kernel == 'triton' else ha_ops.ha3_blockwise_fwd

    def f(q, *kv):
        k1, k2, v1, v2 = (kv[0], kv[0], kv[1], kv[1]) if shared else kv
        return op(q, k1, k2, v1, v2, offset, causal, w1, w2, q.size(-1) ** -0.5)[0]
    return f


def ha_ref(offset, causal, w1, w2, shared):
    def f(q, *kv):
        k1, k2, v1, v2 = (kv[0], kv[0], kv[1], kv[1]) if shared else kv
        return reference(q, k1, k2, v1, v2, offset, causal, w1, w2, q.size(-1) ** -0.5)[0]
    return f


def ha_case(N, Tq, Tk, dh, shared, seed):
    return [randn(N, Tq, dh, seed=seed)] + [randn(N, Tk, dh, seed=seed + 1 + i) for i in range(2 if shared else 4)]


def ha_names(shared):
    return ['out', 'dq', 'dk', 'dv'] if shared else ['out', 'dq', 'dk1', 'dk2', 'dv1', 'dv2']


HA_SHAPES = [(1, 1, 0, True, (0, 0), 16), (17, 17, 0, True, (0, 0), 32), (64, 64, 0, True, (16, 8), 16),
             (64, 64, 0, True, (0, 5), 32), (5, 40, 35, True, (12, 4), 16), (1, 9, 8, True, (4, 2), 32),
             (17, 17, 0, False, (0, 0), 16), (17, 17, 0, True, (6, 3), 20)]


@pytest.mark.parametrize('shared', [False, True])
@pytest.mark.parametrize('shape', HA_SHAPES)
def test_ha_fp32_equals_reference(shape, shared):
    Tq, Tk, offset, causal, (w1, w2), dh = shape
    errs = compare(ha_kernel(offset, causal, w1, w2, shared), ha_ref(offset, causal, w1, w2, shared),
                   ha_case(2, Tq, Tk, dh, shared, seed=40), torch.float32, seed=8)
    assert_fp32(errs, ha_names(shared))


def ha_floor(f, shared):
    return [f[0], f[1], f[2], f[3]] if shared else [f[0], f[1], f[2], f[2], f[3], f[3]]


@pytest.mark.parametrize('dtype, windows, shared', [(torch.bfloat16, (0, 0), False), (torch.bfloat16, (16, 8), False),
                                                    (torch.bfloat16, (0, 0), True), (torch.float16, (0, 0), False)])
def test_ha_low_precision_within_2x_of_sdpa(dtype, windows, shared):
    T, dh, N = 32, 16, 2
    errs = compare(ha_kernel(0, True, *windows, shared), ha_ref(0, True, *windows, shared),
                   ha_case(N, T, T, dh, shared, seed=50), dtype, seed=9)
    assert_within(errs, ha_floor(sdpa_errors(N, T, T, dh, 0, True, 0, dtype, seed=9), shared), ha_names(shared))


@needs_cuda
@pytest.mark.parametrize('shared', [False, True])
def test_cuda_ha_bf16_windowed_realistic(shared):
    """T = 1024 with Roy et al.'s windows (512, 32), against the PyTorch kernel in float64."""
    T, N, dh = 1024, 4, 64
    errs = compare(ha_kernel(0, True, 512, 32, shared), ha_kernel(0, True, 512, 32, shared, 'torch'),
                   ha_case(N, T, T, dh, shared, seed=80), torch.bfloat16, seed=12)
    assert_within(errs, ha_floor(sdpa_errors(N, T, T, dh, 0, True, 0, torch.bfloat16, seed=12), shared),
                  ha_names(shared))
