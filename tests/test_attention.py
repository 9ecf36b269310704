"""The attention family of model.py, checked against its definitions (README, [IA] Sec. 4-6).

Every variant's `Attention` layer is compared with a naive reference written here
straight from the formulas: explicit Python loops over batch, heads, query positions
and key positions / key tuples, explicit visibility masks, and the layer's own weights
sliced out of c_attn / c_proj. Outputs and gradients (w.r.t. the input and every
weight) must agree in float64. Then: causality through the whole GPT, identities
between variants, closed-form parameter counts, config errors, KV-cache decoding and
sampling, and a short training run per variant.

Weight layout assumed (and thereby tested): a head group's c_attn output is
(stream, head, dh)-major, streams ordered queries, keys, values:
    sa / linear      q, k, v                               3 streams
    hfa_v1 (A)       q_1..q_A, k_1..k_A, v                 2A + 1
    hfa_v2 (A)       q_1..q_A, k_1..k_A, v_1..v_A          3A
    ha order n       q, k_1..k_{n-1}, v_1..v_{n-1}         1 + 2(n - 1)
    ha shared        q, k, v                               3
"""
import itertools
import math
import runpy
from pathlib import Path

import pytest
import torch

from attention_kernels.ha.naive import naive_hyper_attention, slot_masks
from model import (GPT, ATTENTIONS, Attention, GPTConfig, HAHeads, HFAHeads, KVCache,
                   LinearHeads, SoftmaxHeads)

DT = torch.float64
pytestmark = pytest.mark.usefixtures('one_thread')


# -----------------------------------------------------------------------------
# the variants under test: name -> GPTConfig overrides (tiny sizes)

BASE = dict(block_size=16, vocab_size=13, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)

VARIANTS = {
    'sa':               dict(attention='sa'),
    'linear':           dict(attention='linear'),
    'linear_norm':      dict(attention='linear', linear_norm=True),
    'hfa_v1':           dict(attention='hfa_v1'),                         # kron path (dh^2 = 64)
    'hfa_v1_direct':    dict(attention='hfa_v1', hfa_kron='off'),          # materialised scores
    'hfa_v2_A2':        dict(attention='hfa_v2', hfa_order=2),
    'hfa_v2_A3':        dict(attention='hfa_v2', hfa_order=3),             # dh^3 = 512: direct
    'hfa_v2_A3_kron':   dict(attention='hfa_v2', hfa_order=3, hfa_kron='on'),
    'hfa_mixed':        dict(attention='hfa_v1', n_head=4, n_hfa_head=2, hfa_order=2,
                             head_dim=16 // (4 * 2)),                       # 2 SA + 2 HFA heads
    'hfa_v2_mixed':     dict(attention='hfa_v2', n_head=4, n_hfa_head=2, hfa_order=2,
                             head_dim=16 // (4 * 2)),
    'hfa_v1_nosoftmax': dict(attention='hfa_v1', softmax=False),
    'hfa_v2_nosoftmax': dict(attention='hfa_v2', softmax=False),
    'ha':               dict(attention='ha'),
    'ha_shared':        dict(attention='ha', ha_share_kv=True),
    'ha_windows':       dict(attention='ha', ha_window1=3, ha_window2=2),
    'ha_window2_only':  dict(attention='ha', ha_window2=2),
    'ha_nosoftmax':     dict(attention='ha', softmax=False),
    'ha_shared_nosoftmax': dict(attention='ha', softmax=False, ha_share_kv=True),
    'ha4':              dict(attention='ha', ha_order=4),
    'ha4_shared':       dict(attention='ha', ha_order=4, ha_share_kv=True),
    'ha4_windows':      dict(attention='ha', ha_order=4, ha_window1=3, ha_window2=2),
    'sa_noncausal':     dict(attention='sa', causal=False),
    'linear_noncausal': dict(attention='linear', causal=False),
    'hfa_v1_noncausal': dict(attention='hfa_v1', causal=False),
    'hfa_v2_noncausal': dict(attention='hfa_v2', causal=False, hfa_kron='off'),
    'ha_noncausal':     dict(attention='ha', causal=False),
    'sa_window':        dict(attention='sa', attn_window=3),
    'linear_window':    dict(attention='linear', attn_window=3),
    'linear_norm_window': dict(attention='linear', linear_norm=True, attn_window=4),
    'hfa_v1_window':    dict(attention='hfa_v1', attn_window=3),               # kron path
    'hfa_v2_window':    dict(attention='hfa_v2', attn_window=2, hfa_kron='off'),  # explicit scores
    'hfa_mixed_window': dict(attention='hfa_v1', n_head=4, n_hfa_head=2, hfa_order=2,
                             head_dim=16 // (4 * 2), attn_window=3),
}


def config(name, **kw):
    return GPTConfig(**{**BASE, **VARIANTS[name], **kw})


# -----------------------------------------------------------------------------
# the naive reference, straight from the formulas

def visible(i, j, causal, window=0):
    """Causal LM: position i reads j <= i; a window w also needs i - j < w."""
    if not causal:
        return True
    return j <= i and (window == 0 or i - j < window)


def softmax_list(scores):
    m = max(s.detach() for s in scores)
    e = [torch.exp(s - m) for s in scores]
    z = sum(e)
    return [ei / z for ei in e]


def ref_sa_head(q, k, v, causal, window=0):
    T, dh = q.shape
    out = []
    for i in range(T):
        js = [j for j in range(T) if visible(i, j, causal, window)]
        p = softmax_list([torch.dot(q[i], k[j]) / math.sqrt(dh) for j in js])
        out.append(sum(pj * v[j] for pj, j in zip(p, js)))
    return torch.stack(out)


def ref_linear_head(q, k, v, causal, norm, window=0):
    T, dh = q.shape
    out = []
    for i in range(T):
        js = [j for j in range(T) if visible(i, j, causal, window)]
        o = sum((torch.dot(q[i], k[j]) / math.sqrt(dh)) * v[j] for j in js)
        out.append(o / len(js) if norm else o)
    return torch.stack(out)


def ref_hfa_head(qs, ks, vs, causal, softmax, window=0):
    """scores_ij = prod_a (q_a,i . k_a,j / sqrt dh); one softmax after the product;
    value_j = prod over the value streams (one for v1, A for v2)."""
    T, dh = qs[0].shape
    out = []
    for i in range(T):
        js = [j for j in range(T) if visible(i, j, causal, window)]
        scores = []
        for j in js:
            s = torch.ones((), dtype=qs[0].dtype)
            for qa, ka in zip(qs, ks):
                s = s * (torch.dot(qa[i], ka[j]) / math.sqrt(dh))
            scores.append(s)
        w = softmax_list(scores) if softmax else scores
        vals = []
        for j in js:
            val = vs[0][j]
            for vc in vs[1:]:
                val = val * vc[j]
            vals.append(val)
        out.append(sum(wj * val for wj, val in zip(w, vals)))
    return torch.stack(out)


def ref_ha_head(q, ks, vs, windows, causal, softmax):
    """logit[i, j_1..j_n] = sum_s q[i,s] prod_a k_a[j_a, s] / sqrt dh; one joint softmax
    over every tuple whose slot a is visible (j_a <= i, within window a);
    value = prod_a v_a[j_a] (elementwise)."""
    T, dh = q.shape
    out = []
    for i in range(T):
        slots = [[j for j in range(T) if visible(i, j, causal, w)] for w in windows]
        tuples = list(itertools.product(*slots))
        logits, vals = [], []
        for tup in tuples:
            kk, vv = ks[0][tup[0]], vs[0][tup[0]]
            for a in range(1, len(tup)):
                kk, vv = kk * ks[a][tup[a]], vv * vs[a][tup[a]]
            logits.append(torch.sum(q[i] * kk) / math.sqrt(dh))
            vals.append(vv)
        w = softmax_list(logits) if softmax else logits
        out.append(sum(wt * vt for wt, vt in zip(w, vals)))
    return torch.stack(out)


def expected_groups(cfg, kind):
    """[(group kind, n heads, n streams)] in head order, from the spec, not from the model."""
    H, A, n = cfg.n_head, cfg.hfa_order, cfg.ha_order
    if kind in ('sa', 'linear'):
        return [(kind, H, 3)]
    if kind in ('hfa_v1', 'hfa_v2'):
        n_hfa = H if cfg.n_hfa_head < 0 else cfg.n_hfa_head
        streams = 2 * A + 1 if kind == 'hfa_v1' else 3 * A
        return ([('sa', H - n_hfa, 3)] if n_hfa < H else []) + ([(kind, n_hfa, streams)] if n_hfa else [])
    if kind == 'ha':
        return [('ha', H, 3 if cfg.ha_share_kv else 1 + 2 * (n - 1))]
    raise AssertionError(kind)


def project(linear, x, n_streams, H, dh):
    """x (T, d) -> streams[s][h] of shape (T, dh), rows sliced from the (stream, head, dh)-major W."""
    W, b = linear.weight, linear.bias
    assert W.shape[0] == n_streams * H * dh
    out = []
    for s in range(n_streams):
        heads = []
        for h in range(H):
            r = slice((s * H + h) * dh, (s * H + h + 1) * dh)
            y = x @ W[r].T
            heads.append(y + b[r] if b is not None else y)
        out.append(heads)
    return out


def ref_attention(layer, cfg, kind, x):
    B, T, _ = x.shape
    dh, A, n = cfg.dh, cfg.hfa_order, cfg.ha_order - 1
    plan = expected_groups(cfg, kind)
    assert [g.h for g in layer.groups] == [h for _, h, _ in plan]
    ys = []
    for b in range(B):
        heads = []
        for g, (gk, H, S) in zip(layer.groups, plan):
            st = project(g.c_attn, x[b], S, H, dh)
            for h in range(H):
                s = [st[c][h] for c in range(S)]
                w = cfg.attn_window  # sliding window of the sa, linear and hfa heads
                if gk == 'sa':
                    heads.append(ref_sa_head(s[0], s[1], s[2], cfg.causal, w))
                elif gk == 'linear':
                    heads.append(ref_linear_head(s[0], s[1], s[2], cfg.causal, cfg.linear_norm, w))
                elif gk in ('hfa_v1', 'hfa_v2'):
                    heads.append(ref_hfa_head(s[:A], s[A:2 * A], s[2 * A:], cfg.causal, cfg.softmax, w))
                else:
                    if cfg.ha_share_kv:
                        ks, vs = [s[1]] * n, [s[2]] * n
                    else:
                        ks, vs = s[1:1 + n], s[1 + n:]
                    windows = ([cfg.ha_window1, cfg.ha_window2] + [0] * n)[:n]
                    heads.append(ref_ha_head(s[0], ks, vs, windows, cfg.causal, cfg.softmax))
        y = torch.cat(heads, dim=-1)                       # (T, H * dh), heads in group order
        ys.append(y @ layer.c_proj.weight.T + layer.c_proj.bias)
    return torch.stack(ys)


def randomise(module, seed, scale=0.5):
    """Weights of O(1) size, so that softmaxes are far from uniform and products matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return module


# -----------------------------------------------------------------------------
# 1. layer == reference: outputs and gradients

@pytest.mark.parametrize('name', list(VARIANTS))
def test_layer_matches_reference(name):
    cfg = config(name)
    kind = cfg.attention
    T = 5 if cfg.ha_order >= 4 else 7
    layer = randomise(Attention(cfg, kind).to(DT), seed=1)
    x = torch.randn(2, T, cfg.n_embd, dtype=DT, generator=torch.Generator().manual_seed(2),
                    requires_grad=True)
    R = torch.randn(2, T, cfg.n_embd, dtype=DT, generator=torch.Generator().manual_seed(3))
    params = list(layer.parameters())

    y = layer(x)
    y_ref = ref_attention(layer, cfg, kind, x)
    assert y.shape == (2, T, cfg.n_embd)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    assert y.abs().max() > 1e-3  # not trivially zero

    g = torch.autograd.grad((y * R).sum(), [x] + params)
    g_ref = torch.autograd.grad((y_ref * R).sum(), [x] + params)
    for (pn, _), a, b in zip([('x', x)] + list(layer.named_parameters()), g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=lambda m: f'grad {pn}: {m}')
        assert b.abs().max() > 0, f'grad {pn} is zero: the reference does not use it'


def dense_ha(q, ks, vs, windows, causal, softmax):
    """The materialised definition (attention_kernels/ha/naive.py) for longer sequences,
    (B, H, T, dh); itself checked against the loop reference in test_dense_ha_reference_agrees."""
    masks = slot_masks(q.size(-2), ks[0].size(-2), 0, causal, windows, q.device)
    return naive_hyper_attention(q, ks, vs, masks, softmax=softmax)


@pytest.mark.parametrize('order', [3, 4])
def test_dense_ha_reference_agrees(order):
    g = torch.Generator().manual_seed(0)
    n = order - 1
    q, *kv = (torch.randn(1, 1, 6, 4, dtype=DT, generator=g) for _ in range(1 + 2 * n))
    ks, vs = kv[:n], kv[n:]
    for windows, causal, sm in [((0, 0), True, True), ((3, 2), True, True), ((0, 2), True, False),
                                ((0, 0), False, True)]:
        windows = (list(windows) + [0] * n)[:n]
        d = dense_ha(q, ks, vs, windows, causal, sm)[0, 0]
        r = ref_ha_head(q[0, 0], [k[0, 0] for k in ks], [v[0, 0] for v in vs], windows, causal, sm)
        torch.testing.assert_close(d, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('windows', [(0, 0), (13, 5), (0, 9)])
@pytest.mark.parametrize('share', [False, True])
def test_ha_long_sequence(windows, share):
    """T = 45 crosses any small chunk/block boundary of the HA kernel."""
    cfg = GPTConfig(**{**BASE, 'block_size': 64, 'attention': 'ha', 'ha_share_kv': share,
                       'ha_window1': windows[0], 'ha_window2': windows[1]})
    layer = randomise(Attention(cfg, 'ha').to(DT), seed=4, scale=0.4)
    T, H, dh = 45, cfg.n_head, cfg.dh
    x = torch.randn(2, T, cfg.n_embd, dtype=DT, generator=torch.Generator().manual_seed(5),
                    requires_grad=True)
    S = 3 if share else 5
    s = layer.groups[0].c_attn(x).view(2, T, S, H, dh).permute(2, 0, 3, 1, 4)
    ks, vs = ([s[1], s[1]], [s[2], s[2]]) if share else ([s[1], s[2]], [s[3], s[4]])
    y_ref = dense_ha(s[0], ks, vs, windows, True, True).transpose(1, 2).reshape(2, T, H * dh)
    y_ref = layer.c_proj(y_ref)
    y = layer(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-10)
    gx = torch.autograd.grad(y.square().sum(), x)[0]
    gx_ref = torch.autograd.grad(y_ref.square().sum(), x)[0]
    torch.testing.assert_close(gx, gx_ref, rtol=1e-8, atol=1e-10)


# -----------------------------------------------------------------------------
# 2. causality through the whole GPT

CAUSAL_VARIANTS = [n for n in VARIANTS if VARIANTS[n].get('causal', True)]


def full_logits(model, idx):
    logits, _ = model(idx, targets=idx)  # with targets the model returns every position
    return logits


@pytest.mark.parametrize('name', CAUSAL_VARIANTS + ['sa,ha', 'ha,sa'])
def test_gpt_is_causal(name):
    if ',' in name:
        cfg = GPTConfig(**{**BASE, 'attn_layers': name})
    else:
        cfg = config(name)
    model = randomise(GPT(cfg).to(DT), seed=6, scale=0.3).eval()
    T = 8
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, cfg.vocab_size, (2, T), generator=g)
    base = full_logits(model, idx)
    for p in range(T):
        idx2 = idx.clone()
        idx2[:, p:] = (idx[:, p:] + 1 + torch.randint(0, cfg.vocab_size - 1, (2, T - p), generator=g)) \
            % cfg.vocab_size
        out = full_logits(model, idx2)
        assert torch.equal(out[:, :p], base[:, :p]), f'position < {p} changed when tokens >= {p} changed'
        assert not torch.allclose(out[:, p], base[:, p]), f'position {p} ignores its own token'


@pytest.mark.parametrize('name', [n for n in VARIANTS if not VARIANTS[n].get('causal', True)])
def test_noncausal_reads_the_future(name):
    """causal=False really is bidirectional (so the causality test above can fail)."""
    model = randomise(GPT(config(name)).to(DT), seed=6, scale=0.3).eval()
    idx = torch.randint(0, 13, (1, 8), generator=torch.Generator().manual_seed(7))
    idx2 = idx.clone()
    idx2[0, -1] = (idx[0, -1] + 1) % 13
    assert not torch.allclose(full_logits(model, idx)[:, 0], full_logits(model, idx2)[:, 0])


@pytest.mark.parametrize('name', CAUSAL_VARIANTS + ['sa,ha'])
def test_kv_cache_decoding_matches_full_forward(name):
    """Decoding token by token from the cache (offset > 0) gives the full forward's logits."""
    cfg = GPTConfig(**{**BASE, 'attn_layers': name}) if ',' in name else config(name)
    model = randomise(GPT(cfg).to(DT), seed=8, scale=0.3).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(9))
    base = full_logits(model, idx)
    cache = KVCache(cfg.n_layer)
    steps = [model(idx[:, :4], cache=cache)[0]]            # a prompt of 4, then one at a time
    for t in range(4, 9):
        steps.append(model(idx[:, t:t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, 1), base[:, [3, 4, 5, 6, 7, 8]], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize('name', ['sa', 'sa_window', 'linear_norm_window', 'hfa_v1', 'hfa_v2_A3', 'hfa_v2_mixed',
                                  'hfa_v1_window', 'ha', 'ha_windows', 'ha_nosoftmax', 'ha4_windows', 'sa,ha'])
def test_generate_with_cache_samples_the_same_tokens(name):
    """generate keeps the cache while the sequence fits: the same seed samples the same tokens
    with and without it, also past block_size (16), where the context is cropped."""
    cfg = GPTConfig(**{**BASE, 'attn_layers': name}) if ',' in name else config(name)
    model = randomise(GPT(cfg).to(DT), seed=2, scale=0.3).eval()
    prompt = torch.randint(0, cfg.vocab_size, (2, 3), generator=torch.Generator().manual_seed(3))
    out = {}
    for use_cache in (True, False):
        torch.manual_seed(5)
        out[use_cache] = model.generate(prompt, 16, temperature=1.0, top_k=8, use_cache=use_cache)
    assert out[True].shape == (2, 19)
    assert torch.equal(out[True], out[False])


# -----------------------------------------------------------------------------
# 3. identities between variants

def test_hfa_order1_equals_sa():
    for kron in ('on', 'off'):
        sa = randomise(GPT(GPTConfig(**BASE)).to(DT), seed=10, scale=0.3)
        hfa = GPT(GPTConfig(**{**BASE, 'attention': 'hfa_v1', 'hfa_order': 1, 'hfa_kron': kron})).to(DT)
        hfa.load_state_dict(sa.state_dict())  # same names and shapes: 2A + 1 = 3 streams
        assert isinstance(hfa.transformer.h[0].attn.groups[0], HFAHeads)
        idx = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(11))
        torch.testing.assert_close(full_logits(hfa, idx), full_logits(sa, idx), rtol=1e-10, atol=1e-12)


def test_sa_without_softmax_is_linear():
    lin = randomise(GPT(GPTConfig(**{**BASE, 'attention': 'linear'})).to(DT), seed=12, scale=0.3)
    sa = GPT(GPTConfig(**{**BASE, 'softmax': False})).to(DT)
    sa.load_state_dict(lin.state_dict())
    idx = torch.randint(0, 13, (2, 10), generator=torch.Generator().manual_seed(13))
    torch.testing.assert_close(full_logits(sa, idx), full_logits(lin, idx), rtol=1e-10, atol=1e-12)


def test_hfa_order2_differs_from_sa():
    """The identity above is not vacuous: with A = 2 the scores are a product."""
    cfg = GPTConfig(**{**BASE, 'attention': 'hfa_v1', 'hfa_order': 2})
    layer = randomise(Attention(cfg, 'hfa_v1').to(DT), seed=12)
    sa = Attention(GPTConfig(**BASE), 'sa').to(DT)
    with torch.no_grad():  # SA with the first factor's q, k and the value stream
        W, b = layer.groups[0].c_attn.weight, layer.groups[0].c_attn.bias
        n = cfg.n_head * cfg.dh
        keep = torch.cat([torch.arange(0, n), torch.arange(2 * n, 3 * n), torch.arange(4 * n, 5 * n)])
        sa.groups[0].c_attn.weight.copy_(W[keep])
        sa.groups[0].c_attn.bias.copy_(b[keep])
        sa.c_proj.load_state_dict(layer.c_proj.state_dict())
    x = torch.randn(1, 6, 16, dtype=DT)
    assert not torch.allclose(layer(x), sa(x), atol=1e-6)


@pytest.mark.parametrize('share', [False, True])
def test_ha_windows_covering_context_equal_full(share):
    full = randomise(GPT(config('ha', ha_share_kv=share)).to(DT), seed=13, scale=0.3)
    idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(14))
    for w1, w2 in [(12, 12), (16, 0), (0, 40)]:
        win = GPT(config('ha', ha_share_kv=share, ha_window1=w1, ha_window2=w2)).to(DT)
        win.load_state_dict(full.state_dict())
        torch.testing.assert_close(full_logits(win, idx), full_logits(full, idx), rtol=1e-10, atol=1e-12)
    small = GPT(config('ha', ha_share_kv=share, ha_window1=4, ha_window2=2)).to(DT)
    small.load_state_dict(full.state_dict())
    assert not torch.allclose(full_logits(small, idx), full_logits(full, idx), atol=1e-6)


WINDOWED = ['sa_window', 'linear_window', 'linear_norm_window', 'hfa_v1_window', 'hfa_v2_window',
            'hfa_mixed_window']


@pytest.mark.parametrize('name', WINDOWED)
def test_attn_window_covering_context_equals_full(name):
    """A window at least as long as the sequence is no window; a short one is a real change."""
    over = {k: v for k, v in VARIANTS[name].items() if k != 'attn_window'}
    full = randomise(GPT(GPTConfig(**{**BASE, **over})).to(DT), seed=17, scale=0.3)
    idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(18))
    for w in (12, 16):
        win = GPT(GPTConfig(**{**BASE, **over, 'attn_window': w})).to(DT)
        win.load_state_dict(full.state_dict())
        torch.testing.assert_close(full_logits(win, idx), full_logits(full, idx), rtol=1e-10, atol=1e-12)
    small = GPT(config(name)).to(DT)
    small.load_state_dict(full.state_dict())
    assert not torch.allclose(full_logits(small, idx), full_logits(full, idx), atol=1e-6)


@pytest.mark.parametrize('name', WINDOWED)
def test_attn_window_hides_older_tokens(name):
    """One layer, window w: position i reads tokens i - w + 1 .. i only."""
    cfg = GPTConfig(**{**BASE, **VARIANTS[name], 'n_layer': 1})
    w = cfg.attn_window
    model = randomise(GPT(cfg).to(DT), seed=19, scale=0.3).eval()
    idx = torch.randint(0, 13, (1, 10), generator=torch.Generator().manual_seed(20))
    idx2 = idx.clone()
    idx2[0, 0] = (idx[0, 0] + 1) % 13
    a, b = full_logits(model, idx), full_logits(model, idx2)
    assert not torch.allclose(a[:, w - 1], b[:, w - 1]), 'the oldest token inside the window is read'
    assert torch.equal(a[:, w:], b[:, w:]), 'a token outside the window was read'


def test_attn_window_leaves_ha_alone():
    """attn_window windows the sa layers of 'sa,ha' and not its HA layer; an all-HA model refuses it."""
    with pytest.raises(ValueError, match='ha_window1'):
        GPTConfig(**{**BASE, 'attention': 'ha', 'attn_window': 4})
    cfg = GPTConfig(**{**BASE, 'n_layer': 1, 'attention': 'ha'})
    ha = randomise(Attention(cfg, 'ha').to(DT), seed=21)
    ha_w = Attention(GPTConfig(**{**BASE, 'attn_layers': 'sa,ha', 'attn_window': 2}), 'ha').to(DT)
    ha_w.load_state_dict(ha.state_dict())
    x = torch.randn(1, 9, 16, dtype=DT, generator=torch.Generator().manual_seed(22))
    torch.testing.assert_close(ha_w(x), ha(x), rtol=1e-12, atol=1e-12)


def test_attn_window_flops():
    """Mixing FLOPs count the keys a query sees: min(i + 1, w) of them."""
    T, w = 16, 4
    full, win = GPT(GPTConfig(**BASE)), GPT(GPTConfig(**{**BASE, 'attn_window': w}))
    seen = sum(min(i + 1, w) for i in range(T)) / T
    diff = 3 * 2 * 2 * 4 * 8 * ((T + 1) / 2 - seen)  # 3 x layers x heads x 4 dh x (keys saved)
    assert full.flops_per_token(T) - win.flops_per_token(T) == pytest.approx(diff)


@pytest.mark.parametrize('order', [3, 4])
def test_ha_share_kv_equals_copied_weights(order):
    """ha_share_kv ties K_a = K_1 and V_a = V_1: same as an unshared model whose extra key and
    value rows are copies of the first ones."""
    shared = randomise(GPT(config('ha', ha_share_kv=True, ha_order=order)).to(DT), seed=15, scale=0.3)
    free = GPT(config('ha', ha_order=order)).to(DT)
    sd = shared.state_dict()
    n, nh = order - 1, BASE['n_head'] * 8
    for key in list(sd):
        if key.endswith('groups.0.c_attn.weight') or key.endswith('groups.0.c_attn.bias'):
            q, k, v = sd[key].split(nh)                  # (q, k, v) -> (q, k x n, v x n)
            sd[key] = torch.cat([q] + [k] * n + [v] * n)
    free.load_state_dict(sd)
    idx = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(16))
    torch.testing.assert_close(full_logits(free, idx), full_logits(shared, idx), rtol=1e-10, atol=1e-12)
    # and the tie is real: perturbing the copied K2 changes the unshared model
    with torch.no_grad():
        free.transformer.h[0].attn.groups[0].c_attn.weight[2 * nh:3 * nh] += 0.5
    assert not torch.allclose(full_logits(free, idx), full_logits(shared, idx), atol=1e-6)


# -----------------------------------------------------------------------------
# 4. parameter counts in closed form

def n_streams(cfg, kind):
    A, n = cfg.hfa_order, cfg.ha_order
    return {'sa': 3, 'linear': 3, 'hfa_v1': 2 * A + 1, 'hfa_v2': 3 * A,
            'ha': 3 if cfg.ha_share_kv else 1 + 2 * (n - 1)}[kind]


def closed_form_params(cfg, non_embedding=True):
    d, H, dh, V, b = cfg.n_embd, cfg.n_head, cfg.dh, cfg.vocab_size, int(cfg.bias)
    total = V * d + (0 if non_embedding else cfg.block_size * d) + (2 if b else 1) * d  # wte(=lm_head), wpe, ln_f
    for kind in cfg.layer_attentions():
        if kind in ('hfa_v1', 'hfa_v2') and 0 <= cfg.n_hfa_head < H:
            groups = [(3, H - cfg.n_hfa_head)] + ([(n_streams(cfg, kind), cfg.n_hfa_head)] if cfg.n_hfa_head else [])
        else:
            groups = [(n_streams(cfg, kind), H)]
        attn = sum(S * d * Hg * dh + b * S * Hg * dh for S, Hg in groups) + H * dh * d + b * d
        mlp = d * 4 * d + b * 4 * d + 4 * d * d + b * d
        norms = 2 * (2 if b else 1) * d
        total += attn + mlp + norms
    return total


@pytest.mark.parametrize('name', list(VARIANTS) + ['sa,ha', 'hfa_v1,hfa_v2', 'nobias'])
def test_param_count_closed_form(name):
    if name == 'nobias':
        cfg = GPTConfig(**{**BASE, 'attention': 'ha', 'bias': False})
    elif ',' in name:
        cfg = GPTConfig(**{**BASE, 'attn_layers': name})
    else:
        cfg = config(name)
    model = GPT(cfg)
    assert model.get_num_params() == closed_form_params(cfg)
    assert model.get_num_params(non_embedding=False) == closed_form_params(cfg, non_embedding=False)


def test_param_count_examples():
    """Two worked numbers, d = 16, H = 2, dh = 8, bias: per-layer attention
    sa 3*16*16 + 3*16 + 16*16 + 16 = 1088; ha order 3 unshared 5*256 + 80 + 272 = 1632."""
    sa, ha = GPT(GPTConfig(**BASE)), GPT(GPTConfig(**{**BASE, 'attention': 'ha'}))
    assert sum(p.numel() for p in sa.transformer.h[0].attn.parameters()) == 1088
    assert sum(p.numel() for p in ha.transformer.h[0].attn.parameters()) == 1632


def test_flops_per_token_sa_closed_form():
    """6 x matmul weights + 3 x (4 dh per visible key per head per layer)."""
    cfg = GPTConfig(**BASE)
    m = GPT(cfg)
    T, d, H, dh, L, V = 16, 16, 2, 8, 2, 13
    matmul = L * (3 * d * d + d * d + 8 * d * d) + V * d
    mixing = L * H * 4 * dh * (T + 1) / 2
    assert m.flops_per_token(T) == pytest.approx(6 * matmul + 3 * mixing)
    # HA scales with the number of visible pairs: sum_i (i + 1)^2 / T
    ha = GPT(GPTConfig(**{**BASE, 'attention': 'ha'}))
    pairs = sum((i + 1) ** 2 for i in range(T)) / T
    assert ha.flops_per_token(T) == pytest.approx(6 * (matmul + L * 2 * d * d) + 3 * L * H * 4 * dh * pairs)


# -----------------------------------------------------------------------------
# 5. configuration errors and per-layer choice

@pytest.mark.parametrize('kw', [dict(attention='ha', ha_window1=4), dict(attention='ha', ha_window2=2),
                                dict(attention='sa', attn_window=3)])
def test_windows_without_causality_are_refused(kw):
    """A window is the last w positions up to the query: causal=False has none, and ignoring it
    would run another model than the one asked for."""
    with pytest.raises(ValueError, match='causal windows .* causal=False has none; set them to 0, or causal=True'):
        GPTConfig(**{**BASE, **kw, 'causal': False})
    GPTConfig(**{**BASE, **kw})  # causal: accepted


def test_unknown_attention_lists_valid_ones():
    with pytest.raises(ValueError, match=f"unknown attention 'flash'; valid: {', '.join(ATTENTIONS)}$"):
        GPTConfig(**{**BASE, 'attention': 'flash'})
    with pytest.raises(ValueError, match='valid'):
        GPTConfig(**{**BASE, 'attn_layers': 'sa,hyper'})


def test_attn_layers_length_mismatch():
    with pytest.raises(ValueError, match='n_layer'):
        GPTConfig(**{**BASE, 'n_layer': 3, 'attn_layers': 'sa,ha'})
    with pytest.raises(ValueError, match='n_layer'):
        GPTConfig(**{**BASE, 'n_layer': 1, 'attn_layers': 'sa,ha'})


def test_per_layer_choice_builds_the_right_classes():
    cfg = GPTConfig(**{**BASE, 'n_layer': 6, 'attn_layers': 'sa, linear,hfa_v1,hfa_v2,ha,sa',
                       'hfa_order': 3})
    model = GPT(cfg)
    got = [[type(g) for g in b.attn.groups] for b in model.transformer.h]
    assert got == [[SoftmaxHeads], [LinearHeads], [HFAHeads], [HFAHeads], [HAHeads], [SoftmaxHeads]]
    streams = [b.attn.groups[0].c_attn.out_features // (cfg.n_head * cfg.dh) for b in model.transformer.h]
    assert streams == [3, 3, 7, 9, 5, 3]


def test_mixed_heads_layout():
    cfg = config('hfa_mixed')
    groups = Attention(cfg, 'hfa_v1').groups
    assert [type(g) for g in groups] == [SoftmaxHeads, HFAHeads] and [g.h for g in groups] == [2, 2]
    assert cfg.dh == 2
    assert [type(g) for g in Attention(config('hfa_mixed', n_hfa_head=0), 'hfa_v1').groups] == [SoftmaxHeads]
    assert [type(g) for g in Attention(config('hfa_mixed', n_hfa_head=4), 'hfa_v1').groups] == [HFAHeads]
    with pytest.raises(ValueError):
        config('hfa_mixed', n_hfa_head=5)


def test_other_config_errors():
    with pytest.raises(ValueError, match='divisible'):
        GPTConfig(**{**BASE, 'n_embd': 15})
    with pytest.raises(ValueError):
        GPTConfig(**{**BASE, 'hfa_order': 0})
    with pytest.raises(ValueError):
        GPTConfig(**{**BASE, 'ha_order': 1})
    with pytest.raises(ValueError):
        GPTConfig(**{**BASE, 'hfa_kron': 'maybe'})
    assert GPTConfig.from_dict({**BASE, 'attention': 'ha', 'learning_rate': 1e-3}).attention == 'ha'


# -----------------------------------------------------------------------------
# 6. every variant trains: a few AdamW steps on a small character corpus

CORPUS = ''.join(
    f"{w} {v} the {o}. " for w, v, o in itertools.product(
        ['the cat', 'a dog', 'my bird', 'one fox', 'her hen'],
        ['sees', 'eats', 'likes', 'hides from'],
        ['hat', 'mat', 'rat', 'bat', 'vat', 'cap'])) * 4   # ~5 KB, regular enough to learn fast

TRAIN_VARIANTS = ['sa', 'linear', 'linear_norm', 'hfa_v1', 'hfa_v2_A2', 'hfa_v2_A3', 'hfa_mixed',
                  'hfa_v1_nosoftmax', 'hfa_v2_nosoftmax', 'ha', 'ha_shared', 'ha_windows',
                  'ha_nosoftmax', 'ha4', 'sa,ha']


@pytest.mark.slow  # 30 AdamW steps per variant
@pytest.mark.parametrize('name', TRAIN_VARIANTS)
def test_variant_trains(name):
    torch.manual_seed(0)
    chars = sorted(set(CORPUS))
    data = torch.tensor([chars.index(c) for c in CORPUS])
    T = 12 if name == 'ha4' else 32
    over = dict(block_size=T, vocab_size=len(chars), n_embd=32, n_head=4)
    if ',' in name:
        cfg = GPTConfig(**{**BASE, **over, 'attn_layers': name})
    else:
        cfg = GPTConfig(**{**BASE, **VARIANTS[name], **over,
                           **({'head_dim': 32 // (4 * 2)} if name == 'hfa_mixed' else {})})
    model = GPT(cfg)
    opt = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), 'cpu')
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(30):
        ix = torch.randint(0, len(data) - T - 1, (8,), generator=g)
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
        _, loss = model(x, y)
        assert torch.isfinite(loss), f'non-finite loss at step {len(losses)}'
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    start, end = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert start == pytest.approx(math.log(len(chars)), abs=0.5)   # starts near uniform
    assert end < start - 0.5, f'loss {start:.3f} -> {end:.3f}'


# -----------------------------------------------------------------------------
# 7. the config files build the model they name, with keys train.py knows

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {'sa': 'sa', 'linear': 'linear', 'hfa': 'hfa_v1', 'hfa_v2': 'hfa_v2', 'ha': 'ha'}


def train_py_keys():
    """The configuration keys of train.py (settings.py's table)."""
    from nanohfa import settings
    return set(settings.defaults(settings.TRAIN))


@pytest.mark.parametrize('name', [p + n for p in ('', 'cpu_') for n in CONFIGS])
def test_config_file(name):
    values = {k: v for k, v in runpy.run_path(str(ROOT / 'config' / f'{name}.py')).items()
              if not k.startswith('_')}
    unknown = set(values) - train_py_keys()
    assert not unknown, f'config/{name}.py sets keys train.py does not have: {unknown}'
    cfg = GPTConfig.from_dict({**values, 'vocab_size': 65})
    assert CONFIGS[name.removeprefix('cpu_')] in cfg.layer_attentions()
    with torch.device('meta'):
        GPT(cfg)  # builds (no memory on the meta device)
    if name.startswith('cpu_'):
        assert values['dataset'] == 'shakespeare_char' and values['device'] == 'cpu'
        assert values['compile'] is False and values['out_dir'] == f"out-cpu-{name[4:]}"
    else:
        assert values['dataset'] == 'openwebtext' and values['out_dir'] == f'out-{name}'
        assert cfg.n_layer == 12 and cfg.n_embd == 768 and cfg.block_size == 1024
