"""The interaction read-out (interactions.py): it reproduces the layer it reads, averages
positions exactly, and gives the known answer where there is one:

1. a hand-set SA head reads as its hand-set matrix, exactly;
2. the colliding-agents model the experiment trains reads as the devised coefficients in
   the functional-equivalence sense of [IA] Cor. 4.9 (Ct * Wt), although its C is another;
3. on a task with planted three-way interactions, an HA model's top three-way triples are
   the planted ones, and an SA model shows none (criterion in test_planted_three_way).

Then the command line on checkpoints written by train.py and by hand, and on a tiny GPT-2
written by transformers' save_pretrained (init_from), and its bad inputs.
"""
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import interactions as ia
from experiments import beyond_pairwise as bp, colliding_agents as ca
from experiments.common import seed_all, torch_threads
from model import GPT, GPTConfig, make_attention

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def run(args, check=True):
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    r = subprocess.run([PY, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if check and r.returncode:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def random_layer(cfg, kind, gen, std=0.4):
    """A model.py attention layer in float64 with weights large enough for sharp scores."""
    layer = make_attention(cfg, kind).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
    return layer.eval()


# -- the read-out reproduces the layer ---------------------------------------------------------

VARIANTS = {
    'sa': dict(attention='sa'),
    'sa_bias': dict(attention='sa', bias=True),
    'linear': dict(attention='linear'),
    'sa_no_softmax': dict(attention='sa', softmax=False),
    'hfa_v1': dict(attention='hfa_v1'),
    'hfa_v1_order3_kron': dict(attention='hfa_v1', hfa_order=3, head_dim=2),
    'hfa_v2': dict(attention='hfa_v2', bias=True),
    'hfa_mixed': dict(attention='hfa_v1', n_hfa_head=2),
    'hfa_no_softmax': dict(attention='hfa_v1', softmax=False),
    'ha': dict(attention='ha'),
    'ha_share_kv': dict(attention='ha', ha_share_kv=True, bias=True),
    'ha_no_softmax': dict(attention='ha', softmax=False),
}


@pytest.mark.parametrize('name', list(VARIANTS))
def test_readout_reproduces_the_layer(name):
    """Rebuild the layer's output from the read-out alone (scores C or T, values Wt along a
    direction u) and compare with model.py's forward: every stream, head and group is where
    the read-out says it is. float64, causal, T = 6."""
    gen = torch.Generator().manual_seed(len(name))
    cfg = GPTConfig(**{**dict(n_embd=12, n_head=3, block_size=8, bias=False, kernel='torch'), **VARIANTS[name]})
    layer = random_layer(cfg, cfg.attention, gen)
    N, T = 5, 6
    X = torch.randn(N, cfg.n_embd, generator=gen, dtype=torch.float64)
    seq = torch.randint(0, N, (T,), generator=gen)
    u = torch.randn(cfg.n_embd, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        got = layer(X[seq][None])[0] @ u
    heads = ia.read_attention(layer.state_dict(), cfg, cfg.attention, X, out_direction=u)
    assert len(heads) == cfg.n_head and [r['head'] for r in heads] == list(range(cfg.n_head))
    want = torch.zeros(T, dtype=torch.float64) + (layer.c_proj.bias @ u if cfg.bias else 0)
    for i in range(T):
        a, seen = seq[i], seq[:i + 1]
        for r in heads:
            if 'T' in r:
                s = r['T'][a][seen][:, seen].reshape(-1)
                val = r['Wt'][seen][:, seen].reshape(-1)
            else:
                s, val = r['C'][a][seen], r['Wt'][seen]
            w = torch.softmax(s, 0) if r['softmax'] else s
            want[i] += w @ val
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (got, want)
    for r in heads:  # the effective coefficient is the coefficient times the value, per key
        if 'T' in r:
            assert torch.allclose(r['M'], r['T'] * r['Wt'][None])
        else:
            assert torch.allclose(r['M'], r['C'] * r['Wt'][None, :])
            if 'factors' in r:  # one position: the product is the product of the factors
                assert torch.allclose(r['C'], r['factors'].prod(0), rtol=1e-12, atol=1e-14)


def test_readout_reproduction_fails_on_a_wrong_stream_order():
    """The reproduction test can fail: swapping HA's two key streams changes the read-out."""
    gen = torch.Generator().manual_seed(3)
    cfg = GPTConfig(n_embd=8, n_head=2, block_size=8, bias=False, attention='ha', kernel='torch')
    layer = random_layer(cfg, 'ha', gen)
    X = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    sd = layer.state_dict()
    w = sd['groups.0.c_attn.weight'].view(5, 2 * 4, 8).clone()
    swapped = {**sd, 'groups.0.c_attn.weight': w[[0, 2, 1, 3, 4]].reshape(-1, 8)}
    t, t_swapped = (ia.read_attention(s, cfg, 'ha', X)[0]['T'] for s in (sd, swapped))
    assert torch.allclose(t_swapped, t.transpose(1, 2)) and not torch.allclose(t, t_swapped)


# -- positions and the LayerNorm ------------------------------------------------------------------

def layernorm(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


@pytest.mark.parametrize('kind', ['sa', 'hfa_v1', 'ha'])
def test_mean_over_positions_is_the_mean_score(kind):
    """positions='mean': each coefficient is the mean, over independent query and key
    positions, of the score the head computes for those tokens at those positions: the naive
    reference loops over every position pair (triple), from the formula, in float64."""
    gen = torch.Generator().manual_seed(7)
    cfg = GPTConfig(vocab_size=5, block_size=3, n_layer=1, n_head=2, n_embd=8, bias=True, attention=kind)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    sd = model.state_dict()
    tokens = torch.tensor([0, 2, 3, 4])
    inputs = ia.token_inputs(sd, cfg, 0, tokens, positions='mean', ln=True, chunk_elems=8)  # chunks of 1 position
    layer_sd = {k[len('transformer.h.0.attn.'):]: v for k, v in sd.items() if k.startswith('transformer.h.0.attn.')}
    heads = ia.read_attention(layer_sd, cfg, kind, inputs)
    # the reference: x(a, p) = LN(wte[a] + wpe[p]); streams by the formula, per head
    x = layernorm(sd['transformer.wte.weight'][tokens][:, None] + sd['transformer.wpe.weight'][None],
                  sd['transformer.h.0.ln_1.weight'], sd['transformer.h.0.ln_1.bias'])  # (N, P, d)
    W, B = sd['transformer.h.0.attn.groups.0.c_attn.weight'], sd['transformer.h.0.attn.groups.0.c_attn.bias']
    dh, H = cfg.dh, cfg.n_head
    S = (x @ W.T + B).view(4, 3, -1, H, dh)  # (N, P, streams, H, dh)
    P = range(3)
    for h, r in enumerate(heads):
        if kind == 'sa':
            ref = sum(S[:, i, 0, h] @ S[:, j, 1, h].T for i in P for j in P) / 9 / math.sqrt(dh)
            assert torch.allclose(r['C'], ref, rtol=1e-11, atol=1e-12)
        elif kind == 'hfa_v1':  # the mean of the product of the two factors
            ref = sum((S[:, i, 0, h] @ S[:, j, 2, h].T) * (S[:, i, 1, h] @ S[:, j, 3, h].T)
                      for i in P for j in P) / 9 / dh
            assert torch.allclose(r['C'], ref, rtol=1e-11, atol=1e-12)
            prod_of_means = r['factors'].prod(0)
            assert not torch.allclose(r['C'], prod_of_means, rtol=1e-3)  # it is not the product of the means
        else:
            ref = sum(torch.einsum('as,bs,cs->abc', S[:, i, 0, h], S[:, j, 1, h], S[:, k, 2, h])
                      for i in P for j in P for k in P) / 27 / math.sqrt(dh)
            assert torch.allclose(r['T'], ref, rtol=1e-11, atol=1e-12)


def test_position_options():
    gen = torch.Generator().manual_seed(1)
    cfg = GPTConfig(vocab_size=6, block_size=4, n_layer=2, n_head=1, n_embd=4, bias=False)
    sd = GPT(cfg).state_dict()
    tokens = torch.arange(6)
    wte, wpe = sd['transformer.wte.weight'].double(), sd['transformer.wpe.weight'].double()
    ln_w = sd['transformer.h.1.ln_1.weight'].double()
    with torch.no_grad():
        ln_w.copy_(torch.randn(4, generator=gen, dtype=torch.float64))
    sd['transformer.h.1.ln_1.weight'] = ln_w.float()
    none, = ia.token_inputs(sd, cfg, 1, tokens, positions='none')
    assert torch.allclose(none[0], layernorm(wte, ln_w, 0), atol=1e-6)
    at2, = ia.token_inputs(sd, cfg, 1, tokens, positions='2', ln=False)
    assert torch.equal(at2[0], wte + wpe[2])
    with pytest.raises(ia.UserError, match="outside the context"):
        list(ia.token_inputs(sd, cfg, 1, tokens, positions='4'))
    with pytest.raises(ia.UserError, match="'mean', 'none' or a position"):
        list(ia.token_inputs(sd, cfg, 1, tokens, positions='first'))


@pytest.mark.parametrize('kind', ['sa', 'linear', 'hfa_v1', 'ha'])
def test_token_share_separates_token_heads_from_positional_heads(kind):
    """No position embedding: the scores depend on the tokens alone (share 1). Every token
    embedded alike: they depend on positions alone, which the read-out averages away (share
    near 0). Sampled from the formula by token_share; the read-out does not enter the draw."""
    gen = torch.Generator().manual_seed(11)
    cfg = GPTConfig(vocab_size=6, block_size=16, n_layer=1, n_head=2, n_embd=8, bias=False, attention=kind)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.7)
    tokens = list(range(6))
    layer_sd = lambda sd: {k[len('transformer.h.0.attn.'):]: v for k, v in sd.items() if '.attn.' in k}  # noqa: E731
    for wte_rows_alike, expect in ((False, None), (True, 0.0)):
        sd = dict(model.state_dict())
        if wte_rows_alike:
            sd['transformer.wte.weight'] = sd['transformer.wte.weight'][:1].expand(6, -1).clone()
        else:
            sd['transformer.wpe.weight'] = torch.zeros_like(sd['transformer.wpe.weight'])
        heads = ia.read_attention(layer_sd(sd), cfg, kind, ia.token_inputs(sd, cfg, 0, torch.arange(6)))
        shares = ia.token_share(sd, cfg, 0, tokens, heads)
        if expect is None:
            assert all(s == pytest.approx(1.0, abs=1e-9) for s in shares), shares
        else:
            assert all(s < 0.02 for s in shares), shares


@pytest.mark.parametrize('kind,w1,w2', [('sa', 0, 0), ('sa', 2, 0), ('linear', 0, 0), ('hfa_v1', 0, 0),
                                         ('ha', 0, 0), ('ha', 3, 2)])
def test_offset_profile_against_the_formula(kind, w1, w2):
    """The score by key offset, averaged over tokens, over the offsets the head sees (windows
    included): a naive reference over every token pair (triple) and position, from the
    formula, float64."""
    gen = torch.Generator().manual_seed(13)
    windows = dict(ha_window1=w1, ha_window2=w2) if kind == 'ha' else dict(attn_window=w1)
    cfg = GPTConfig(vocab_size=4, block_size=5, n_layer=1, n_head=2, n_embd=8, bias=True, attention=kind, **windows)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    sd = model.state_dict()
    profiles = ia.offset_profile(sd, cfg, 0, [0, 1, 3])
    x = layernorm(sd['transformer.wte.weight'][[0, 1, 3]][:, None] + sd['transformer.wpe.weight'][None],
                  sd['transformer.h.0.ln_1.weight'], sd['transformer.h.0.ln_1.bias'])  # (tokens, P, d)
    W, B = sd['transformer.h.0.attn.groups.0.c_attn.weight'], sd['transformer.h.0.attn.groups.0.c_attn.bias']
    S = (x @ W.T + B).view(3, 5, -1, 2, 4)  # (tokens, P, streams, H, dh)
    sees = lambda i, j, w: j <= i and (not w or i - j < w)  # noqa: E731
    for h, prof in enumerate(profiles):
        if kind == 'ha':
            t = torch.einsum('aip,bjp,ckp->abcijk', S[:, :, 0, h], S[:, :, 1, h], S[:, :, 2, h]).mean((0, 1, 2)) / 2
            D1, D2 = w1 or 5, w2 or 5
            assert prof.shape == (D1, D2)
            ref, n = torch.zeros(D1, D2, dtype=torch.float64), torch.zeros(D1, D2)
            for i in range(5):
                pairs = [(j1, j2) for j1 in range(5) for j2 in range(5) if sees(i, j1, w1) and sees(i, j2, w2)]
                mean = sum(t[i, j1, j2] for j1, j2 in pairs) / len(pairs)  # centred over the visible pairs
                for j1, j2 in pairs:
                    ref[i - j1, i - j2] += t[i, j1, j2] - mean
                    n[i - j1, i - j2] += 1
            assert torch.allclose(prof, ref / n, rtol=1e-10, atol=1e-12)
            continue
        if kind == 'hfa_v1':
            c = torch.einsum('aip,bjp,aiq,bjq->ij', S[:, :, 0, h], S[:, :, 2, h], S[:, :, 1, h], S[:, :, 3, h]) / 9 / 4
        else:
            c = torch.einsum('aip,bjp->ij', S[:, :, 0, h], S[:, :, 1, h]) / 9 / 2
        ref = []
        for d in range(w1 or 5):
            vals = []
            for i in range(d, 5):
                seen = [c[i, j] for j in range(5) if sees(i, j, w1)]
                vals.append(c[i, i - d] - (sum(seen) / len(seen) if kind != 'linear' else 0))
            ref.append(sum(vals) / len(vals))
        assert torch.allclose(prof, torch.stack(ref), rtol=1e-10, atol=1e-12)


# -- known answer 1: a hand-set SA head --------------------------------------------------------

def hand_set_model():
    """One SA layer of 2 heads, dh = 4 (so 1/sqrt(dh) = 1/2, exact), vocabulary = n_embd = 8 with
    wte = I: the read-out in the token basis is W_Q,h^T W_K,h / 2 itself."""
    cfg = GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=2, n_embd=8, bias=False, attention='sa')
    model = GPT(cfg)
    gen = torch.Generator().manual_seed(5)
    wq = torch.randint(-3, 4, (8, 8), generator=gen).float()  # rows: (head, dh)
    wk = torch.randint(-3, 4, (8, 8), generator=gen).float()
    wv = torch.randn(8, 8, generator=gen)
    with torch.no_grad():
        model.transformer.wte.weight.copy_(torch.eye(8))
        model.transformer.h[0].attn.groups[0].c_attn.weight.copy_(torch.cat([wq, wk, wv]))
    hand = [wq[4 * h:4 * h + 4].T @ wk[4 * h:4 * h + 4] / 2 for h in range(2)]
    return model, hand


def test_hand_set_sa_head_reads_exactly():
    model, hand = hand_set_model()
    sd, cfg = model.state_dict(), model.config
    inputs = ia.token_inputs(sd, cfg, 0, torch.arange(8), positions='none', ln=False)
    layer_sd = {k[len('transformer.h.0.attn.'):]: v for k, v in sd.items() if '.attn.' in k}
    heads = ia.read_attention(layer_sd, cfg, 'sa', inputs)
    for r, C in zip(heads, hand):
        assert torch.equal(r['C'], C.double())
        # softmax head: ranked by the query-centred coefficient, so the top pair is the row-wise winner
        a, b = ia.top_entries(r['ranked'], 1)[0][0]
        assert (C - C.mean(1, keepdim=True))[a, b] == (C - C.mean(1, keepdim=True)).max()


def save_ckpt(folder, model, itos, dataset=None):
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({'model': model.state_dict(), 'model_args': asdict(model.config), 'iter_num': 0,
                'tokenizer': {'tokenizer': 'char', 'vocab_size': len(itos), 'itos': itos}, 'dataset': dataset},
               folder / 'ckpt.pt')


@pytest.mark.slow
def test_hand_set_sa_head_through_the_command_line(tmp_path):
    model, hand = hand_set_model()
    itos = list('abcdefgh')
    save_ckpt(tmp_path / 'run', model, itos)
    r = run(['interactions.py', f'--out_dir={tmp_path / "run"}', '--positions=none', '--ln=False', '--top_k=3'])
    assert 'no training data found' in r.stdout
    report = json.loads((tmp_path / 'run' / 'interactions' / 'interactions.json').read_text())
    assert [t['text'] for t in report['tokens']] == itos
    for head, C in zip(report['heads'], hand):
        assert np.array_equal(np.array(head['C']), C.numpy())
        centred = C - C.mean(1, keepdim=True)
        a, b = divmod(int(centred.argmax()), 8)
        assert head['top_pairs'][0]['text'].startswith(f"{itos[a]} -> {itos[b]}")
        assert head['top_pairs'][0]['value'] == pytest.approx(centred.max().item(), rel=1e-6)
    for name in ('layer0_head0.png', 'layer0_head1.png', 'layer0_heads.png'):
        assert (tmp_path / 'run' / 'interactions' / name).stat().st_size > 10_000


# -- known answer 2: colliding agents ([IA] Cor. 4.9) ----------------------------------------------

def as_attention_layer(C, W, gen):
    """The experiment's linear SA (y = (X C X^T) X W_V, scalar output) as a model.py 'linear'
    layer of one head of width N: W_Q = sqrt(N) R C^T and W_K = R with R a random rotation (so
    W_Q^T W_K / sqrt(N) = C, in another head basis), the value W_V in the first coordinate, read
    out through the first coordinate of W_O."""
    N = C.shape[0]
    cfg = GPTConfig(n_embd=N, n_head=1, head_dim=N, block_size=64, attention='linear', causal=False, bias=False,
                    kernel='torch')
    R, _ = torch.linalg.qr(torch.randn(N, N, generator=gen, dtype=torch.float64))
    wv, wo = torch.zeros(N, N, dtype=torch.float64), torch.zeros(N, N, dtype=torch.float64)
    wv[0], wo[0, 0] = W[:, 0], 1.0
    sd = {'groups.0.c_attn.weight': torch.cat([math.sqrt(N) * R @ C.T, R, wv]), 'c_proj.weight': wo}
    layer = make_attention(cfg).double()
    layer.load_state_dict(sd)
    return layer, cfg


@pytest.mark.parametrize('kind', ['onehot', 'sinusoidal'])
def test_colliding_agents_readout_equals_devised_coefficients(kind):
    N, R, L = 24, 1, 6  # the experiment's --quick sizes
    with torch_threads(1):
        gen = seed_all(0)
        s, y = ca.make_data(600, L, N, R, gen)
        P = ca.embedding(N, kind)
        trained = ca.LinearSA(P, init='theory')
        ca.train(trained, s, y, 60)
    assert ca.mse(trained, s, y) < 1e-8
    layer, cfg = as_attention_layer(trained.C.detach(), trained.W.detach(), gen)
    with torch.no_grad():  # the layer computes the experiment's model
        assert torch.allclose(layer(P[s])[..., 0], trained(s), rtol=1e-9, atol=1e-9)
    e0 = torch.zeros(N, dtype=torch.float64)
    e0[0] = 1
    r, = ia.read_attention(layer.state_dict(), cfg, 'linear', P, out_direction=e0)
    devised = ca.set_params(ca.LinearSA(P), *ca.devised(N, R, kind))
    Ct_dev, Wt_dev = devised.effective()
    # the functional-equivalence object Ct * Wt is the devised one...
    assert ((r['M'] - devised.interaction()) ** 2).mean() < 1e-9  # the experiment reports 2e-11 at full size
    assert torch.allclose(r['M'], trained.interaction().detach(), rtol=1e-9, atol=1e-9)
    # ...although the coefficient matrix and the values are not: only their product is pinned down
    assert (r['C'] - Ct_dev).abs().max() > 0.1 and (r['Wt'] - Wt_dev).abs().max() > 0.1
    if kind == 'sinusoidal':  # and only in the token basis: the embedding coordinates read otherwise
        wrong, = ia.read_attention(layer.state_dict(), cfg, 'linear', torch.eye(N, dtype=torch.float64),
                                   out_direction=e0)
        assert ((wrong['M'] - devised.interaction()) ** 2).mean() > 1e-3


# -- known answer 3: planted three-way interactions --------------------------------------------------

PLANTED = [(0, 1, 2), (3, 4, 5)]  # (query, key, key): y_i counts the pairs (j, k) completing one


def planted_tables(N):
    f = torch.zeros(N, N, N)
    for a, b, c in PLANTED:
        f[a, b, c] = f[a, c, b] = 1.0
    return f, torch.ones(N, N)


def contrast(model, a, b, c, filler, ctx):
    """The interaction contrast I3 = y(b, c) - y(b, f) - y(f, c) + y(f, f): the model's output
    for a query a whose context holds two filler tokens f, then b in place of one, c in place of
    the other, both. Zero for every function that is a sum of pairwise (query, key) terms."""
    seqs = []
    for x, z in ((b, c), (b, filler), (filler, c), (filler, filler)):
        seqs.append(torch.cat([torch.tensor([a, x, z]), ctx]))
    with torch.no_grad():
        y = model([torch.stack(seqs)])[:, 0].double()
    return (y[0] - y[1] - y[2] + y[3]).item()


@pytest.mark.slow
def test_planted_three_way():
    """An HA model trained on planted three-way interactions reads as them; an SA model shows none.

    The three-way part of a read-out: the HA head's effective coefficient M[a, b, c] =
    T[a, b, c] Wt[b, c] (the model has a scalar output), summed over the two key orders (the
    sum over key pairs cannot tell them apart), with its (query, key) main effects removed
    (interactions.three_way_part). "Shows none", measured on the trained model's function
    whatever its architecture: the interaction contrast I3 (see contrast()) of every query
    and key pair is below 5% of a planted triple's (2) on random contexts."""
    N, L, d = 6, 6, 16
    tables = planted_tables(N)
    models = {}
    with torch_threads(1):
        for kind, dh in (('ha', 8), ('linear', 12)):
            gen = seed_all(0)
            train = bp.threeway_task(1000, L, N, tables, gen)
            test = bp.threeway_task(300, L, N, tables, gen)
            models[kind] = bp.Probe([N], L, d, kind, dh)
            _, models[kind + '_test'] = bp.fit(models[kind], train, test, 150, 128, 2e-2)
    assert models['ha_test'] < 1e-3 and models['linear_test'] > 0.2  # HA fits, SA cannot

    def readout(kind):
        m = models[kind]
        return ia.read_attention(m.attn.state_dict(), m.attn.groups[0].cfg, kind, m.embs[0].weight.detach(),
                                 out_direction=m.head.weight[0].detach())[0]

    r = readout('ha')
    sym = r['M'] + r['M'].transpose(1, 2)
    d3 = ia.three_way_part(sym)
    top = {(a, min(b, c), max(b, c)) for (a, b, c), _ in ia.top_entries(d3, 2 * len(PLANTED))}
    assert top == set(PLANTED)
    target = ia.three_way_part(2 * tables[0].double())  # the target's own three-way part
    assert (d3 - target).abs().max() < 0.05
    # the read-out predicts the model's contrasts, and they are the planted ones
    gen = torch.Generator().manual_seed(9)
    for a, b, c in [*PLANTED, (0, 1, 4), (3, 2, 5), (1, 0, 2)]:
        filler = next(f for f in range(N) if f not in (a, b, c) and not any(p[0] == a and f in p for p in PLANTED))
        ctx = torch.randint(0, N, (L - 3,), generator=gen)
        e = torch.zeros(N, dtype=torch.float64)
        db, dc = e.clone(), e.clone()
        db[b], db[filler], dc[c], dc[filler] = 1, -1, 1, -1
        predicted = (db @ sym[a] @ dc).item()
        measured = contrast(models['ha'], a, b, c, filler, ctx)
        assert measured == pytest.approx(predicted, abs=1e-4)
        assert measured == pytest.approx(2.0 if (a, b, c) in PLANTED else 0.0, abs=0.1)
    # SA: the read-out holds pairs only, and the function shows no three-way interaction
    sa = readout('linear')
    assert 'T' not in sa and sa['C'].shape == (N, N)
    worst = max(abs(contrast(models['linear'], a, b, c, f, torch.randint(0, N, (L - 3,), generator=gen)))
                for a in range(N) for b in range(N) for c in range(N) for f in range(N)
                if len({b, c, f}) == 3)
    assert worst < 0.05 * 2.0


# -- the command line -------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def char_data(tmp_path_factory):
    d = tmp_path_factory.mktemp('char_data')
    rng = np.random.default_rng(0)
    itos = list('abcdefghijklmnop')
    p = np.arange(1, 17) ** 2.0  # 'p' the most frequent, 'a' the rarest
    rng.choice(16, 4000, p=p / p.sum()).astype(np.uint16).tofile(d / 'train.bin')
    rng.integers(0, 16, 600).astype(np.uint16).tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16, 'itos': itos,
                                             'val_documents': [300, 300]}))
    return d


@pytest.mark.slow
def test_command_line_on_a_trained_ha_checkpoint(tmp_path, char_data):
    """train.py writes the checkpoint (2 layers, HA); the read-out of layer 1 covers the 6 most
    frequent characters, lists triples and writes its figures."""
    out = tmp_path / 'ha'
    run(['train.py', '--device=cpu', '--n_layer=2', '--n_head=2', '--n_embd=16', '--block_size=8',
         '--batch_size=4', '--max_iters=2', '--eval_iters=1', '--eval_interval=2', '--log_interval=100',
         '--attention=ha', f'--data_dir={char_data}', f'--out_dir={out}'])
    r = run(['interactions.py', f'--out_dir={out}', '--layer=1', f'--data_dir={char_data}', '--top_n=6',
             '--top_k=4', f'--report_dir={tmp_path / "rep"}'])
    assert 'direct path' in r.stdout and 'three-way part' in r.stdout
    report = json.loads((tmp_path / 'rep' / 'interactions.json').read_text())
    assert [t['text'] for t in report['tokens']] == list('klmnop')
    assert report['attention'] == 'ha' and len(report['heads']) == 2
    head = report['heads'][0]
    assert np.array(head['T']).shape == (6, 6, 6) and len(head['top_triples']) == 4
    assert ' <- (' in head['top_triples'][0]['text'] and 0 <= head['three_way_share'] <= 1
    for name in ('layer1_head0.png', 'layer1_head0_three_way.png', 'layer1_head0_values.png', 'layer1_heads.png',
                 'layer1_offsets.png'):
        assert (tmp_path / 'rep' / name).exists()


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['linear', 'hfa_v2'])
def test_command_line_on_each_variant(tmp_path, char_data, kind):
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, bias=False, attention=kind)
    save_ckpt(tmp_path / kind, GPT(cfg), list('abcdefghijklmnop'), dataset='unused')
    run(['interactions.py', f'--out_dir={tmp_path / kind}', f'--data_dir={char_data}', '--figures=False',
         '--min_freq=0'])
    report = json.loads((tmp_path / kind / 'interactions' / 'interactions.json').read_text())
    head = report['heads'][1]
    assert np.array(head['C']).shape == (16, 16) and head['ranked_by'] == (
        'raw coefficient' if kind == 'linear' else 'query-centred coefficient')
    if kind == 'hfa_v2':
        assert np.array(head['factors']).shape == (2, 16, 16) and len(head['factor_top_pairs']) == 2


@pytest.mark.slow
def test_command_line_on_gpt2_weights(tmp_path):
    """init_from: a tiny GPT-2 written by transformers' save_pretrained (GPT-2's 50257 tokens);
    the read-out covers the 40 most frequent tokens of a data folder."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=32, vocab_size=50257)).save_pretrained(
        tmp_path / 'gpt2-tiny')
    data = tmp_path / 'data'
    data.mkdir()
    ids = np.random.default_rng(0).zipf(1.3, 20000) % 50257
    ids.astype(np.uint16).tofile(data / 'train.bin')
    (data / 'meta.json').write_text(json.dumps({'tokenizer': 'gpt2', 'vocab_size': 50257}))
    ia.main([f'--init_from={tmp_path / "gpt2-tiny"}', f'--data_dir={data}', '--top_n=40',
             f'--report_dir={tmp_path / "rep"}'])  # in this process: transformers is imported once
    report = json.loads((tmp_path / 'rep' / 'interactions.json').read_text())
    counts = np.bincount(ids, minlength=50257)
    assert sorted(t['id'] for t in report['tokens']) == sorted(np.argsort(-counts, kind='stable')[:40].tolist())
    assert report['attention'] == 'sa' and len(report['heads']) == 2
    assert np.array(report['heads'][0]['C']).shape == (40, 40)
    assert report['model_args']['bias'] is True  # GPT-2's biases enter the coefficients
    assert (tmp_path / 'rep' / 'layer0_heads.png').exists()
    # no data for a large vocabulary: refused, saying what to do
    with pytest.raises(ia.UserError, match='the vocabulary has 50257 tokens.*--data_dir'):
        ia.main([f'--init_from={tmp_path / "gpt2-tiny"}', f'--report_dir={tmp_path / "rep2"}'])


@pytest.mark.slow
def test_help_and_bad_inputs(tmp_path):
    """--help lists the flags; a bad input gives one line and exit status 2 (through the command
    line once), and each message says what to fix."""
    r = run(['interactions.py', '--help'])
    assert r.stdout.startswith('usage:') and 'positions' in r.stdout and 'min_freq' in r.stdout
    cfg = GPTConfig(vocab_size=4, block_size=4, n_layer=1, n_head=1, n_embd=4, attention='ha', ha_order=4)
    save_ckpt(tmp_path / 'ha4', GPT(cfg), list('abcd'))
    r = run(['interactions.py', f'--out_dir={tmp_path / "ha4"}', '--layer=3'], check=False)
    assert r.returncode == 2 and 'Traceback' not in r.stderr
    assert r.stderr == "error: layer=3 but the model has 1 layers (0..0)\n"
    truncated = (tmp_path / 'ha4' / 'ckpt.pt').read_bytes()
    (tmp_path / 'cut').mkdir()
    (tmp_path / 'cut' / 'ckpt.pt').write_bytes(truncated[:len(truncated) // 2])
    cases = [
        ([f'--out_dir={tmp_path / "none"}'], f"no checkpoint at {tmp_path / 'none' / 'ckpt.pt'}"),
        ([f'--out_dir={tmp_path / "cut"}'], "unreadable or truncated"),
        ([f'--out_dir={tmp_path / "ha4"}'], "the read-out handles HyperAttention of order 3"),
        ([f'--out_dir={tmp_path / "ha4"}', f'--data_dir={tmp_path}'], f"{tmp_path / 'train.bin'} not found"),
        ([f'--out_dir={tmp_path / "ha4"}', '--top_k=0'], "top_n must be >= 0"),
        (['--init_from=nothing'], "init_from must be 'resume'"),
    ]
    for args, message in cases:
        with pytest.raises(ia.UserError) as e:
            ia.main(args)
        assert message in str(e.value), (args, str(e.value))
    assert not (tmp_path / 'ha4' / 'interactions').exists()  # nothing written by a refused run


def test_figures_name_the_variant_once_and_progress_comes_first(tmp_path, monkeypatch, capsys):
    """An out_dir called 'sa' titled its figures 'sa (sa): layer 0 head 0 (sa)'; and the read-out
    said nothing until it had computed everything (40 s on a large vocabulary)."""
    cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8, bias=False, attention='sa')
    save_ckpt(tmp_path / 'sa', GPT(cfg), list('abcdefghijklmnop'))
    titles = []

    def said_first(*args):
        assert 'layer 0 (sa), 2 heads, 16 tokens' in capsys.readouterr().out  # before the computing starts
        return read_attention(*args)

    def record(panels, panel_titles, labels, axis_names, suptitle, path):
        titles.extend([*panel_titles, suptitle])
    read_attention = ia.read_attention
    monkeypatch.setattr(ia, 'read_attention', said_first)
    monkeypatch.setattr(ia, 'heatmaps', record)
    monkeypatch.setattr(ia, 'offset_figure', lambda profiles, heads, layer, name, path: titles.append(name))
    ia.main([f'--out_dir={tmp_path / "sa"}', '--min_freq=0'])
    assert 'writing figures to' in capsys.readouterr().out
    assert titles and 'sa: layer 0 head 0' in titles and 'sa: layer 0, every head' in titles
    assert not [t for t in titles if '(sa)' in t], titles
    assert ia.source_title('out-cpu', 'hfa_v1') == 'out-cpu (hfa_v1)' and ia.source_title('out-ha', 'ha') == 'out-ha'


def test_heatmap_names_every_token_readably():
    """84 tokens (the Shakespeare characters) on each axis: every one named, in 8-point type with
    room between labels (they were 5-point, touching, past 40 tokens)."""
    from experiments.common import plt
    labels = [ia.token_text(c) for c in "\n !\"&'(),-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz0123456789"][:84]
    fig = ia.heatmap_figure([torch.randn(84, 84)] * 4, ['a', 'b', 'c', 'd'], labels, ('query', 'key'), 'title')
    fig.canvas.draw()
    for ax in [a for a in fig.axes if a.images]:
        ticks = ax.get_xticklabels()
        assert [t.get_text() for t in ticks] == labels and min(t.get_fontsize() for t in ticks) >= 8
        height_pt = ax.get_window_extent().height * 72 / fig.dpi
        assert height_pt / 84 >= 1.1 * 8, height_pt / 84  # each label has its own line, with a gap
    plt.close(fig)


def test_a_nanogpt_checkpoint_is_read_with_its_meta(tmp_path, char_data):
    """A checkpoint without its tokenizer (nanoGPT's) is labelled through --meta; a meta of another
    vocabulary, found by the checkpoint's dataset name, is refused as in sample.py."""
    ckpt = torch.load(ROOT / 'tests' / 'fixtures' / 'nanogpt_ckpt.pt', weights_only=True)
    other = tmp_path / 'data20'
    other.mkdir()
    (other / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 20, 'itos': list('abcdefghijklmnopqrst')}))
    ckpt['config']['dataset'] = str(other)
    (tmp_path / 'nano').mkdir()
    torch.save(ckpt, tmp_path / 'nano' / 'ckpt.pt')
    with pytest.raises(ia.UserError, match=r"has a vocabulary of 16 tokens but .*data20/meta.json has 20 characters: "
                                           r"not the data it was trained on; give that data's meta: --meta="):
        ia.main([f'--out_dir={tmp_path / "nano"}', '--figures=False'])
    report = ia.main([f'--out_dir={tmp_path / "nano"}', f'--meta={char_data}', '--figures=False', '--min_freq=0'])
    assert [t['text'] for t in report['tokens']] == list('abcdefghijklmnop')
