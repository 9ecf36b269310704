"""
The PyTorch kernels against their definitions (float64, tiny sizes). (The KV cache:
tests/test_attention.py.)

- the PyTorch HA kernels (blockwise, online softmax, recomputing backward; prefix sums without
  softmax) == ha/naive.py (every tuple materialised): outputs and gradients of
  q, k1, k2, v1, v2, for causal / non-causal, windows, decoding offsets, odd block sizes.
- HFA: the Kronecker-lift SDPA path == explicit scores == the definition; 'auto' picks by width.
- SA: every form of SDPA the entry picks == the definition.
- the model with kernel='reference' (every family's definition) == the model's own paths.
No timing assertions: timings live in bench.py and docs/performance.md.
"""

import pytest
import torch

import attention_kernels
from attention_kernels import hfa, sa
from attention_kernels.ha.naive import naive_hyper_attention, slot_masks
from attention_kernels.ha.ops import blockwise_attention
from attention_kernels.ha.pytorch import _spans, linear_hyper_attention
from attention_kernels.hfa.naive import naive_hfa
from model import GPT, GPTConfig

DT = torch.float64
pytestmark = pytest.mark.usefixtures('one_thread')


def inputs(Tq, Tk, seed, B=2, H=2, dh=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, Tq if a == 0 else Tk, dh, generator=g, dtype=DT).requires_grad_()
            for a in range(5)]


def reference(q, k1, k2, v1, v2, offset, causal, w1, w2, softmax):
    masks = slot_masks(q.size(-2), k1.size(-2), offset, causal, (w1, w2), q.device)
    return naive_hyper_attention(q, [k1, k2], [v1, v2], masks, softmax=softmax)


def hyper_attention(q, k1, k2, v1, v2, offset=0, causal=True, window1=0, window2=0, softmax=True,
                    block_q=0, block_k=0):
    """The PyTorch order-3 kernels, softmax (blockwise op) or linear (prefix sums)."""
    if not softmax:
        return linear_hyper_attention(q, k1, k2, v1, v2, offset, causal, window1, window2)
    return blockwise_attention(q, k1, k2, v1, v2, offset, causal, window1, window2, block_q or 0, block_k or 0)


def value_and_grads(f, x, seed):
    out = f(*x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return [out] + list(torch.autograd.grad(out, x, g))


# (Tq, Tk, offset): a full sequence, one-token decoding, a chunk decoded after a prompt
SHAPES = [(11, 11, 0), (1, 9, 8), (4, 10, 6)]
WINDOWS = [(0, 0), (3, 2), (0, 4), (5, 0)]
BLOCKS = [(None, None), (2, 3), (4, 1)]


# decoding (offset > 0) is causal only, so the non-causal cases take full sequences
CASES = [(shape, causal) for shape in SHAPES for causal in (True, False) if causal or not shape[2]]


@pytest.mark.parametrize('softmax', [True, False])
@pytest.mark.parametrize('windows', WINDOWS)
@pytest.mark.parametrize('shape, causal', CASES)
def test_ha_kernel_equals_reference(shape, causal, windows, softmax):
    Tq, Tk, offset = shape
    w1, w2 = windows
    x = inputs(Tq, Tk, seed=Tq + 7 * Tk)
    want = value_and_grads(lambda *t: reference(*t, offset, causal, w1, w2, softmax), x, 1)
    for bq, b1 in BLOCKS:
        got = value_and_grads(lambda *t: hyper_attention(*t, offset=offset, causal=causal, window1=w1,
                                                         window2=w2, softmax=softmax, block_q=bq, block_k=b1), x, 1)
        for name, a, b in zip(['out', 'dq', 'dk1', 'dk2', 'dv1', 'dv2'], got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=f"{name} blocks {bq},{b1}")


def test_ha_kernel_large_logits_are_exact():
    """Logits spread over hundreds: the online softmax must rescale, not overflow, and the
    floor that keeps exp away from denormals must not leak weight into hidden pairs."""
    x = inputs(9, 9, seed=3)
    with torch.no_grad():
        x[0].mul_(30.0)
    want = value_and_grads(lambda *t: reference(*t, 0, True, 0, 0, True), x, 2)
    got = value_and_grads(lambda *t: hyper_attention(*t, block_q=2, block_k=2), x, 2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('kw', [dict(), dict(offset=3, window1=3, window2=2), dict(causal=False),
                                dict(softmax=False, window2=2)])
def test_ha_gradcheck(kw):
    Tq = 2 if kw.get('offset') else 5
    x = [t.detach().requires_grad_() for t in inputs(Tq, 5, seed=11, B=1, H=1, dh=3)]
    assert torch.autograd.gradcheck(lambda *t: hyper_attention(*t, block_q=2, block_k=2, **kw), x)


def test_ha_skips_hidden_blocks():
    """Windowed decoding visits O(w1) first keys and O(w2) second keys, however long the
    cache: the cost per token is O(w1 w2), not O(T^2)."""
    Tk, w1, w2, b1 = 1000, 40, 8, 16
    spans = list(_spans(1, Tk, Tk - 1, True, w1, w2, 1, b1))
    assert len(spans) == 1
    _, _, lo2, hi2, blocks = spans[0]
    assert hi2 - lo2 == w2
    assert sum(b - a for a, b in blocks) == w1
    assert all(a >= Tk - w1 for a, _ in blocks)


def test_ha_kernel_float32_close_to_float64():
    x = inputs(20, 20, seed=5, dh=8)
    want = hyper_attention(*x, block_q=4, block_k=8)
    got = hyper_attention(*[t.float() for t in x], block_q=4, block_k=8)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def rel_rmse(a, b):
    return ((a.double() - b.double()).square().mean().sqrt() / b.double().square().mean().sqrt()).item()


def low_precision_errors(f, x, dtype, seed):
    """Relative RMSE of f's output and gradients on dtype inputs, against f in float64 on
    the same (rounded) inputs."""
    lo = [t.detach().to(dtype).requires_grad_() for t in x]
    hi = [t.detach().double().requires_grad_() for t in lo]
    got, want = value_and_grads(f, lo, seed), value_and_grads(f, hi, seed)
    return [rel_rmse(a, b) for a, b in zip(got, want)]


def sdpa_errors(Tq, Tk, dtype, seed, dh):
    """The same errors for torch's own SDPA on inputs of the same size: the floor a kernel
    in dtype is compared with."""
    x = inputs(Tq, Tk, seed, dh=dh)[:3]
    return low_precision_errors(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True), x, dtype, seed)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('windows', [(0, 0), (9, 4)])
def test_ha_kernel_low_precision_within_2x_of_sdpa(dtype, windows):
    """bf16 / fp16 inputs: statistics in fp32 and an exp floor that does not depend on the
    dtype, so the output and every gradient are as close to float64 as SDPA's own."""
    T, dh = 32, 16
    x = inputs(T, T, seed=21, dh=dh)
    got = low_precision_errors(lambda *t: hyper_attention(*t, window1=windows[0], window2=windows[1]), x, dtype, 3)
    floor = sdpa_errors(T, T, dtype, 21, dh)
    names = ['out', 'dq', 'dk1', 'dk2', 'dv1', 'dv2']
    ref = [floor[0], floor[1], floor[2], floor[2], floor[3], floor[3]]
    for name, e, f in zip(names, got, ref):
        assert e <= 2 * f, f'{name}: relative RMSE {e:.2e} vs SDPA {f:.2e}'
    assert all(t.dtype == dtype for t in value_and_grads(hyper_attention, [t.detach().to(dtype).requires_grad_() for t in x], 0))


def test_ha_kernel_query_that_sees_nothing_gives_zero():
    """A query whose windows hold no key (here the last ones, past the cache) gets 0 and
    zero gradients, as SDPA; the others are unchanged."""
    Tq, Tk, offset, w1, w2 = 4, 5, 3, 2, 2  # query 3 sits at 6: j >= 5 is past the keys
    x = inputs(Tq, Tk, seed=8)
    got = value_and_grads(lambda *t: hyper_attention(*t, offset=offset, window1=w1, window2=w2, block_q=2), x, 1)
    want = value_and_grads(lambda *t: reference(*t, offset, True, w1, w2, True), x, 1)
    assert torch.equal(got[0][:, :, -1], torch.zeros_like(got[0][:, :, -1]))
    assert got[0][:, :, :-1].abs().min() > 0
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


SYNC_OPS = {'nonzero', '_local_scalar_dense', 'item', 'is_nonzero', 'equal', 'masked_select', 'unique',
            '_unique2', 'unique_consecutive'}


class OpRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Every aten op name run while active (a host-device sync is one of SYNC_OPS)."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('windows', [(0, 0), (5, 3)])
def test_ha_kernels_make_no_host_sync(windows):
    """Block masks come from positions (Python ints), never from reading a tensor back:
    no nonzero / item / int(tensor) in the forward or backward of either HA kernel."""
    from attention_kernels.ha import pytorch as H
    flat = [t.detach().reshape(4, t.size(-2), t.size(-1)).float() for t in inputs(9, 12, seed=4)]
    with OpRecorder() as rec:
        out, lse, _ = H.ha3_forward(*flat, 3, True, *windows, 0.5, 4, 3)
        H.ha3_backward(*flat, out, lse, torch.ones_like(out), 3, True, *windows, 0.5, 4, 3)
        linear_hyper_attention(*flat, 3, True, *windows)
    assert 'bmm' in rec.names  # the recorder sees the kernels' ops
    assert not rec.names & SYNC_OPS, rec.names & SYNC_OPS


# -----------------------------------------------------------------------------
# HFA: lifted SDPA == explicit scores == the definition

@pytest.mark.parametrize('order', [2, 3])
@pytest.mark.parametrize('values_product', [False, True])
@pytest.mark.parametrize('causal,Tq,Tk,offset,window', [(True, 7, 7, 0, 0), (True, 3, 9, 6, 0), (True, 1, 9, 8, 0),
                                                        (False, 6, 6, 0, 0), (True, 7, 7, 0, 3), (True, 3, 9, 6, 4)])
def test_hfa_paths_equal_definition(order, values_product, causal, Tq, Tk, offset, window):
    g = torch.Generator().manual_seed(Tq + order)
    A, nv, dh = order, (order if values_product else 1), 4
    q = torch.randn(A, 2, 2, Tq, dh, generator=g, dtype=DT).requires_grad_()
    k = torch.randn(A, 2, 2, Tk, dh, generator=g, dtype=DT).requires_grad_()
    v = torch.randn(nv, 2, 2, Tk, dh, generator=g, dtype=DT).requires_grad_()
    want = value_and_grads(lambda q, k, v: naive_hfa(q, k, v.prod(0), offset, causal, window), [q, k, v], 4)
    for kron, path in (('on', 'torch_kron'), ('off', 'torch_explicit')):
        assert attention_kernels.dispatch('torch', 'hfa', q, k, kron=kron) is attention_kernels.FORMS['hfa'][path]
        got = value_and_grads(lambda q, k, v: hfa.attention(q, k, v.prod(0), offset, causal, window, kron=kron,
                                                            kernel='torch'), [q, k, v], 4)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=path)


def test_hfa_auto_choice_follows_width():
    """'auto' lifts only when dh^A <= KRON_MAX_WIDTH (measured crossover, docs/performance.md),
    and only with the softmax."""
    def path(A, dh, kernel='torch', **kw):
        return attention_kernels.route(kernel, 'hfa', torch.float32, 'cpu', factors=A, head_size=dh, **kw)
    assert path(2, 16) == 'torch_kron'          # 256
    assert path(2, 32) == 'torch_explicit'      # 1024
    assert path(3, 6) == 'torch_kron'           # 216
    assert path(2, 16, softmax=False) == 'torch_explicit'
    assert path(2, 16, kernel='reference') == 'reference'


@pytest.mark.parametrize('attention', ['sa', 'linear', 'hfa_v1', 'ha'])
def test_attention_weight_dropout_only_while_training(attention):
    """dropout drops attention weights while training (sa, linear, hfa: every path takes it),
    never in eval; HA applies none (its kernels never form the weights)."""
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, attention=attention, dropout=0.5)
    torch.manual_seed(0)
    heads = GPT(cfg).transformer.h[0].attn.groups[0]  # the heads alone: no residual dropout
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))
    heads.eval()
    want = heads(x)
    heads.train()
    got = [heads(x), heads(x)]
    if attention == 'ha':
        assert all(torch.equal(y, want) for y in got)
    else:
        assert not torch.allclose(got[0], got[1]) and not torch.allclose(got[0], want)


# -----------------------------------------------------------------------------
# SA: each form of SDPA == the definition

@pytest.mark.parametrize('causal,Tq,Tk,offset,window', [
    (True, 7, 7, 0, 0),    # the full causal square (is_causal)
    (True, 1, 9, 8, 0),    # one query at the last position (no mask)
    (True, 3, 9, 6, 0),    # a chunk after a prompt (mask)
    (True, 7, 7, 0, 3),    # a window (mask)
    (False, 6, 6, 0, 3),   # non-causal: every key, the window ignored (no mask)
])
def test_sa_forms_equal_definition(causal, Tq, Tk, offset, window):
    g = torch.Generator().manual_seed(Tq)
    x = [torch.randn(2, 2, T, 4, generator=g, dtype=DT).requires_grad_() for T in (Tq, Tk, Tk)]
    got = value_and_grads(lambda *t: sa.attention(*t, offset, causal, window), x, 5)
    want = value_and_grads(lambda *t: sa.naive_softmax(*t, offset, causal, window), x, 5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


# -----------------------------------------------------------------------------
# the model on its definitions (kernel='reference') == the model on its own paths

def tiny_gpt(kw, seed=0):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=12, vocab_size=13, **kw)
    torch.manual_seed(seed)
    model = GPT(cfg).to(DT).eval()
    with torch.no_grad():  # larger weights than GPT-2's init, so logits really differ by position
        for p in model.parameters():
            p.normal_(0, 0.4)
    return model


REFERENCE_VARIANTS = {
    'sa': dict(attention='sa'),
    'sa_window': dict(attention='sa', attn_window=3),
    'sa_noncausal': dict(attention='sa', causal=False),
    'linear_norm_window': dict(attention='linear', linear_norm=True, attn_window=3),
    'hfa_v1_kron': dict(attention='hfa_v1'),
    'hfa_v2_A3_explicit': dict(attention='hfa_v2', hfa_order=3, hfa_kron='off'),
    'hfa_v1_nosoftmax_window': dict(attention='hfa_v1', softmax=False, attn_window=3),
    'ha_windows': dict(attention='ha', ha_window1=4, ha_window2=2),
    'ha_shared': dict(attention='ha', ha_share_kv=True),
    'ha_nosoftmax': dict(attention='ha', softmax=False, ha_window2=3),
}


@pytest.mark.parametrize('name', list(REFERENCE_VARIANTS))
def test_model_paths_equal_reference_kernel(name):
    idx = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(6))
    res = {}
    for kernel in ('torch', 'reference'):
        model = tiny_gpt({**REFERENCE_VARIANTS[name], 'kernel': kernel})
        logits, loss = model(idx, targets=idx)
        loss.backward()
        res[kernel] = [logits] + [p.grad for p in model.parameters()]
    for a, b in zip(res['torch'], res['reference']):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
