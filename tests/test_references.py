"""
The naive references (attention_kernels/*/naive.py, sa.naive_softmax), which every kernel test
trusts, against their formulas written out element by element in Python loops, for every
combination of their flags: softmax, lse, dropout, norm, causal, window, offset, scale,
the HA order and slot offsets. float64, tiny sizes.
"""

import itertools
import math

import pytest
import torch

from attention_kernels.ha.naive import naive_ha3, naive_hyper_attention, slot_masks
from attention_kernels.hfa.naive import naive_hfa
from attention_kernels.linear.naive import naive_linear
from attention_kernels.sa import naive_softmax

pytestmark = pytest.mark.usefixtures('one_thread')
DT = torch.float64
Tq, Tk, DH = 3, 5, 4
# (offset, causal, window): a prompt continued at offset 2, with and without a window; non-causal
GEOMETRIES = [(2, True, 0), (2, True, 2), (0, False, 0), (-3, True, 0)]  # offset -3: query 0 sees nothing


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def sees(i, j, offset, causal, window):
    p = offset + i
    return not causal or (j <= p and (not window or p - j < window))


def weigh(rows, softmax):
    """Per query, the visible keys' (or tuples') logits -> weights: softmax or the logits
    themselves; a query that sees nothing: no weights. Also the row logsumexp (-inf if none)."""
    out, lse = [], []
    for row in rows:
        if not row:
            out.append({}), lse.append(-math.inf)
            continue
        top = max(row.values())
        z = sum(math.exp(x - top) for x in row.values())
        lse.append(top + math.log(z))
        out.append({j: math.exp(x - top) / z for j, x in row.items()} if softmax else dict(row))
    return out, lse


def dropout_mask(shape, p, seed):
    """What F.dropout(w, p) multiplies the weights by, drawn from the same generator state."""
    if not p:
        return torch.ones(shape, dtype=DT)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.functional.dropout(torch.ones(shape, dtype=DT), p)


def with_seed(f, seed):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return f()


def combine(weights, v, drop):
    """out[i] = sum_j w[i][j] drop[i, j] v[j], v (Tk, dh)."""
    out = torch.zeros(len(weights), v.size(-1), dtype=DT)
    for i, row in enumerate(weights):
        for j, w in row.items():
            out[i] += w * drop[i, j] * v[j]
    return out


@pytest.mark.parametrize('dropout', [0.0, 0.5])
@pytest.mark.parametrize('scale', [None, 0.3])
@pytest.mark.parametrize('offset, causal, window', GEOMETRIES)
def test_naive_softmax(offset, causal, window, scale, dropout):
    q, k, v = randn(Tq, DH, seed=1), randn(Tk, DH, seed=2), randn(Tk, DH, seed=3)
    c = DH ** -0.5 if scale is None else scale
    rows = [{j: c * float(q[i] @ k[j]) for j in range(Tk) if sees(i, j, offset, causal, window)} for i in range(Tq)]
    w, _ = weigh(rows, True)
    want = combine(w, v, dropout_mask((Tq, Tk), dropout, 7))
    got = with_seed(lambda: naive_softmax(q, k, v, offset, causal, window, scale, dropout), 7)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('dropout', [0.0, 0.5])
@pytest.mark.parametrize('scale', [None, 0.3])
@pytest.mark.parametrize('norm', [False, True])
@pytest.mark.parametrize('offset, causal, window', GEOMETRIES)
def test_naive_linear(offset, causal, window, norm, scale, dropout):
    q, k, v = randn(Tq, DH, seed=4), randn(Tk, DH, seed=5), randn(Tk, DH, seed=6)
    c = DH ** -0.5 if scale is None else scale
    rows = [{j: c * float(q[i] @ k[j]) for j in range(Tk) if sees(i, j, offset, causal, window)} for i in range(Tq)]
    w = [{j: x / (len(row) if norm else 1) for j, x in row.items()} for row in rows]
    want = combine(w, v, dropout_mask((Tq, Tk), dropout, 8))
    got = with_seed(lambda: naive_linear(q, k, v, offset, causal, window, norm, scale, dropout), 8)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('softmax, lse, dropout, scale', list(itertools.product([True, False], [False, True],
                                                                                 [0.0, 0.5], [None, 0.3])))
@pytest.mark.parametrize('A', [1, 3])
@pytest.mark.parametrize('offset, causal, window', GEOMETRIES)
def test_naive_hfa(offset, causal, window, A, softmax, lse, dropout, scale):
    q, k, v = randn(A, Tq, DH, seed=9), randn(A, Tk, DH, seed=10), randn(Tk, DH, seed=11)
    c = DH ** -0.5 if scale is None else scale
    rows = [{j: math.prod(c * float(q[a, i] @ k[a, j]) for a in range(A))
             for j in range(Tk) if sees(i, j, offset, causal, window)} for i in range(Tq)]
    w, want_lse = weigh(rows, softmax)
    want = combine(w, v, dropout_mask((Tq, Tk), dropout, 9))
    got = with_seed(lambda: naive_hfa(q, k, v, offset, causal, window, scale, softmax, dropout, lse), 9)
    if lse:
        got, got_lse = got
        torch.testing.assert_close(got_lse, torch.tensor(want_lse, dtype=DT), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('softmax, lse, scale', list(itertools.product([True, False], [False, True], [None, 0.3])))
@pytest.mark.parametrize('n', [1, 2, 3])
@pytest.mark.parametrize('offset, causal, windows', [(2, True, (0, 0, 0)), (2, True, (2, 0, 1)), (0, False, (2, 1, 0)),
                                                     (-3, True, (0, 0, 0))])
def test_naive_hyper_attention(offset, causal, windows, n, softmax, lse, scale):
    q = randn(Tq, DH, seed=12)
    ks, vs = [randn(Tk, DH, seed=13 + a) for a in range(n)], [randn(Tk, DH, seed=20 + a) for a in range(n)]
    c = DH ** -0.5 if scale is None else scale
    tuples = list(itertools.product(range(Tk), repeat=n))
    rows = [{t: c * float(sum(q[i, s] * math.prod(ks[a][t[a], s] for a in range(n)) for s in range(DH)))
             for t in tuples if all(sees(i, t[a], offset, causal, windows[a]) for a in range(n))} for i in range(Tq)]
    w, want_lse = weigh(rows, softmax)
    want = torch.zeros(Tq, DH, dtype=DT)
    for i, row in enumerate(w):
        for t, x in row.items():
            want[i] += x * math.prod(vs[a][t[a]] for a in range(n))
    masks = slot_masks(Tq, Tk, offset, causal, windows[:n], q.device)
    got = naive_hyper_attention(q, ks, vs, masks, softmax, scale, lse)
    if lse:
        got, got_lse = got
        torch.testing.assert_close(got_lse, torch.tensor(want_lse, dtype=DT), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('key_start', [(0, 0), (1, 3)])
@pytest.mark.parametrize('scale', [None, 0.3])
def test_naive_ha3_slices_the_keys(key_start, scale):
    """naive_ha3 on a slice of the keys (starting at key_start per slot) == the full keys
    with the slot's earlier keys hidden."""
    q, k1, k2, v1, v2 = randn(Tq, DH, seed=30), *(randn(Tk, DH, seed=31 + a) for a in range(4))
    s1, s2 = key_start
    out, lse = naive_ha3(q, k1[s1:], k2[s2:], v1[s1:], v2[s2:], 4, True, 3, 0, scale, key_start)
    masks = slot_masks(Tq, Tk, 4, True, (3, 0), q.device)
    masks[0][:, :s1] = False
    masks[1][:, :s2] = False
    want, want_lse = naive_hyper_attention(q, [k1, k2], [v1, v2], masks, scale=scale, lse=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-12)
