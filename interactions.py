"""
Read what an attention layer learned: its interaction coefficients in the token basis.

    python interactions.py --out_dir=out-cpu-ha --layer=0
    python interactions.py --out_dir=out-cpu-sa --positions=none --top_k=30
    python interactions.py --init_from=gpt2 --data_dir=data/openwebtext --top_n=200

[IA] (Ustaomeroglu & Qu, ICML 2025, arXiv 2506.06179) reads a linear self-attention layer
as a learner of pairwise interactions: the score of token a (query) reading token b (key)
is f(a, b) = x(a)^T C x(b) with C = W_Q W_K^T / sqrt(dh) (Theorem 3.1), and only the
products Ct[a, b] * Wt[b, k] of the coefficients and the values, Ct = x C x^T and
Wt = x W_V in the token basis, are pinned down by the data (Cor. 4.9). Here, per head of
one layer of a checkpoint (or of GPT-2's weights, init_from):

    sa, linear   C_h[a, b] = q_h(a) . k_h(b) / sqrt(dh)                       pairs
    hfa_v1/v2    F_h,s[a, b] = q_h,s(a) . k_h,s(b) / sqrt(dh), s = 1..A       factors
                 P_h[a, b] = prod_s F_h,s[a, b]      (the score the softmax sees, [IA] Def 5.1)
    ha (order 3) T_h[a, b, c] = sum_i q_h(a)_i k1_h(b)_i k2_h(c)_i / sqrt(dh)   triples ([IA] Def 6.1)
                 value coupling U_h[b, c] = |W_O,h (v1_h(b) * v2_h(c))|

with q, k, v the head's query, key and value streams of the layer's fused input projection
(c_attn, split as Heads.forward splits it), biases included, and each value read through the
head's columns of W_O (its size |W_O,h v_h(b)| is reported per key token).

The token vector x(a) is what the layer's attention reads for token a: by default the
layer's LayerNorm (ln_1) of the token embedding plus a position embedding, averaged over
the positions of the context:

    x(a) = mean_p LN(wte[a] + wpe[p])           positions='mean' (default), p < block_size

Why averaged, and why after the LayerNorm: every coefficient above is linear in each of its
token arguments, so with x(a) so averaged, C_h[a, b] (and T_h[a, b, c]) is exactly the mean,
over query and key positions drawn independently and uniformly, of the score the head
computes for token a at one position and token b at another; the average is exact, not an
approximation, and the LayerNorm is the one the layer applies. (The HFA product is not
linear in the key: it is averaged exactly through the Kronecker-lifted streams, so it is the
mean of the product, which differs from the product of the averaged factors shown beside it.)
The causal mask makes the key position depend on the query position; the uniform,
independent average ignores that. positions='none' drops wpe (LN(wte[a]) alone),
positions=P reads every token at position P; ln=False skips the LayerNorm ([IA]'s setting,
where the attention reads the embedding itself; exact only for a model without one).

Ranking. A softmax head (sa, hfa, ha with softmax) is unchanged by adding to the scores of
one query a constant that does not depend on the key, so for these the pairs (triples) are
ranked by the query-centred coefficient C_h[a, b] - mean_b' C_h[a, b'] (for HA, centred over
all key pairs (b, c)); linear heads are ranked by the raw coefficient, which multiplies the
value as it is. A pairwise head's ranked matrix splits into a key effect (its column means:
keys every query reads) and specific pairs (row and column means removed: the coupling of a
and b beyond what either does with every token). For HA the query-centred T_h[a] splits into
a part that depends on b alone, a part on c alone, and the rest, the three-way part

    T3_h[a, b, c] = T_h[a, b, c] - mean_c T_h[a, b, c] - mean_b T_h[a, b, c] + mean_bc T_h[a, b, c]

which is what no pairwise head can produce: if T3_h = 0, the joint softmax over (b, c) is
the product of two independent softmaxes over b and over c. three_way_share is its fraction
of the query-centred coefficient's sum of squares. Means are plain means over the tokens read.

Caveats. Layer 0 of a multi-layer model is read exactly in this basis; a later layer is
not: its input also holds every earlier layer's output, which depends on the context, and
x(a) here keeps only the embedding's direct path. A coefficient says which tokens a head
couples, not what the model predicts. Averaging positions hides what a head does by
position (a previous-token head reads as weak token structure), so two measures go with it,
per head: token_share, how much of the head's real score, for tokens at random positions,
the read-out explains (R^2; 1: tokens alone; the mean of four independent draws,
token_share_spread half their range), and offset_profile, the same read-out with the roles
of token and position swapped: the score by key offset d (key at i - d), averaged over tokens.

Writes to report_dir: interactions.json (everything: options, tokens with their counts in the
training data, per head the matrices, its top pairs or triples as readable strings), a
heatmap per head (layer<L>_head<h>.png; HFA also _factors.png; HA the slices T[a] of the
queries a with the strongest three-way part, _three_way.png the same slices of T3, and
_values.png), layer<L>_heads.png, every head of the layer on one colour scale,
and layer<L>_offsets.png, the score by key offset.

The read-out covers the tokens of the training data (its first freq_tokens tokens are
counted) with a frequency of at least min_freq, at most top_n of them, the most frequent: a
token seen a few times in training keeps an embedding shaped mostly by weight tying's output
gradient, and its coefficients, large and meaningless, would head every ranking.
"""

import glob
import json
import math
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nanohfa import interactions_seeds as seeds
from attention_kernels.hfa.pytorch import lift
from nanohfa.errors import UserError
from model import head_groups

# the options (out_dir, init_from, layer, positions, ...): settings.INTERACTIONS, which --help prints
AUTO_N_PAIRS, AUTO_N_TRIPLES = 256, 96
LN_EPS = 1e-5  # model.py's nn.LayerNorm default, as GPT-2's


# -----------------------------------------------------------------------------
# the heads of one layer, read from parameter names and shapes

def attention_weights(sd, cfg, kind):
    """[(group kind, softmax, q, k, v weights and biases as (streams, heads, dh, n_embd) and
    (streams, heads, dh)), ...] and W_O (n_embd, n_head * dh), from the layer's state dict
    (names relative to the layer's attention: 'groups.<g>.c_attn.weight', 'c_proj.weight'). The
    groups are model.py's (head_groups), in c_proj's order; a group's c_attn produces its streams
    as (stream, head, dh), queries, keys, values (Heads.forward)."""
    if kind == 'ha' and cfg.ha_order != 3:
        raise UserError(f"the read-out handles HyperAttention of order 3; this layer has ha_order={cfg.ha_order}")
    dh, d = cfg.dh, cfg.n_embd
    groups = []
    for g, (gkind, h, nq, nk, nv, softmax) in enumerate(head_groups(cfg, kind)):
        w = sd.get(f'groups.{g}.c_attn.weight')
        streams = nq + nk + nv
        if w is None or tuple(w.shape) != (streams * h * dh, d):
            raise UserError(f"head group {g} ({gkind}, {h} heads of width {dh}) should have c_attn.weight of shape "
                            f"{(streams * h * dh, d)}, found {None if w is None else tuple(w.shape)}: "
                            f"this checkpoint's layout is not the one this read-out knows")
        b = sd.get(f'groups.{g}.c_attn.bias')
        w = w.double().view(streams, h, dh, d)
        b = torch.zeros(streams, h, dh, dtype=torch.float64) if b is None else b.double().view(streams, h, dh)
        groups.append(dict(kind=gkind, heads=h, softmax=softmax, split=(nq, nk, nv), w=w, b=b))
    wo = sd['c_proj.weight'].double()
    if tuple(wo.shape) != (d, sum(g['heads'] for g in groups) * dh):
        raise UserError(f"c_proj.weight has shape {tuple(wo.shape)}, expected {(d, cfg.n_head * dh)}")
    return groups, wo


# -----------------------------------------------------------------------------
# token vectors: what the layer's attention reads for each token

def token_inputs(sd, cfg, layer, tokens, positions='mean', ln=True, chunk_elems=1 << 24):
    """The vectors the layer's attention reads for each token, per position: an iterator of
    (P_chunk, N, n_embd) float64 tensors whose union over chunks is every position averaged
    (positions='mean': 0..block_size-1), or a single (1, N, n_embd) tensor."""
    wte = sd['transformer.wte.weight'].double()[tokens]
    wpe = sd['transformer.wpe.weight'].double()
    if positions == 'mean':
        pos = torch.arange(wpe.size(0))
    elif positions == 'none':
        pos = None
    else:
        try:
            p = int(positions)
        except ValueError:
            raise UserError(f"positions must be 'mean', 'none' or a position number, not {positions!r}")
        if not 0 <= p < wpe.size(0):
            raise UserError(f"positions={p} is outside the context 0..{wpe.size(0) - 1}")
        pos = torch.tensor([p])
    norm = layer_norm(sd, layer, ln)

    if pos is None:
        yield norm(wte)[None]
        return
    step = max(1, chunk_elems // max(1, wte.numel()))
    for i in range(0, len(pos), step):
        yield norm(wte[None] + wpe[pos[i:i + step], None])


def layer_norm(sd, layer, ln=True):
    """The layer's ln_1 as a function (the identity with ln=False), in float64."""
    w, b = sd.get(f'transformer.h.{layer}.ln_1.weight'), sd.get(f'transformer.h.{layer}.ln_1.bias')

    def norm(x):
        if not ln:
            return x
        return F.layer_norm(x, x.shape[-1:], None if w is None else w.double(),
                            None if b is None else b.double(), LN_EPS)
    return norm


def mean_streams(groups, inputs, budget=1 << 24):
    """Per head group, the mean over the inputs' positions of each stream (streams, heads, N, dh),
    in one pass over the position chunks. For an HFA group (A score factors) also the mean of
    the row-wise Kronecker product of its A query streams and of its A key streams (heads, N,
    dh^A), and of the Hadamard product of its value streams: the exact position averages of
    the product score and of hfa_v2's value."""
    acc = [dict(sum=0, q_lift=0, k_lift=0, v_prod=0) for _ in groups]
    count = 0
    for x in inputs:  # (P, N, d)
        count += x.size(0)
        for g, a in zip(groups, acc):
            nq, nk, nv = g['split']
            s = torch.einsum('pnd,shkd->pshnk', x, g['w']) + g['b'][None, :, :, None]  # (P, streams, h, N, dh)
            a['sum'] = a['sum'] + s.sum(0)
            if g['kind'] in ('hfa_v1', 'hfa_v2'):
                step = max(1, budget // (s[0, 0].numel() * s.size(-1) ** (nq - 1)))
                for i in range(0, s.size(0), step):  # the lifted streams are dh^(A-1) times wider
                    c = s[i:i + step]
                    a['q_lift'] = a['q_lift'] + lift(c[:, :nq].movedim(1, 0)).sum(0)
                    a['k_lift'] = a['k_lift'] + lift(c[:, nq:nq + nk].movedim(1, 0)).sum(0)
                    a['v_prod'] = a['v_prod'] + c[:, nq + nk:].prod(1).sum(0)
    out = []
    for g, a in zip(groups, acc):
        nq, nk, nv = g['split']
        mean = a['sum'] / count
        out.append(dict(q=mean[:nq], k=mean[nq:nq + nk], v=mean[nq + nk:],
                        **{key: a[key] / count for key in ('q_lift', 'k_lift', 'v_prod')}))
    return out


# -----------------------------------------------------------------------------
# the coefficients of each head

def query_centred(c):
    """Subtract, for every query (dim 0), the mean over its keys (all other dims)."""
    return c - c.reshape(c.size(0), -1).mean(1).view(-1, *[1] * (c.dim() - 1))


def three_way_part(t):
    """T3[a, b, c] = T - mean_c T - mean_b T + mean_bc T, per query a: the part of a trilinear
    score that is not a sum of a (query, key-1) and a (query, key-2) term."""
    return t - t.mean(2, keepdim=True) - t.mean(1, keepdim=True) + t.mean((1, 2), keepdim=True)


def read_attention(sd, cfg, kind, inputs, out_direction=None):
    """The interaction coefficients of every head of one attention layer.

    sd: the layer's attention state dict ('groups.<g>.c_attn.weight', 'c_proj.weight', ...);
    cfg: its GPTConfig; kind: its variant; inputs: the token vectors it reads, a (N, n_embd)
    tensor or an iterable of (P, N, n_embd) chunks averaged over P (token_inputs).
    out_direction: an n_embd vector u; when given, each head's value is also read as the
    scalar u . W_O,h v_h(b) (Wt in [IA] Cor. 4.9's notation) and the effective coefficient
    M = C * Wt (pairs: M[a, b] = C[a, b] Wt[b]; HA: M[a, b, c] = T[a, b, c] Wt[b, c]) returned:
    the products every parameter set that computes the same function shares.
    Returns a list of per-head dicts of float64 tensors."""
    if torch.is_tensor(inputs):
        inputs = [inputs.double()[None] if inputs.dim() == 2 else inputs.double()]
    groups, wo = attention_weights(sd, cfg, kind)
    dh, heads, h0 = cfg.dh, [], 0
    scale = dh ** -0.5
    for g, m in zip(groups, mean_streams(groups, inputs)):
        hfa = g['kind'] in ('hfa_v1', 'hfa_v2')
        for h in range(g['heads']):
            wo_h = wo[:, (h0 + h) * dh:(h0 + h + 1) * dh]  # (n_embd, dh)
            r = dict(head=h0 + h, kind=g['kind'], softmax=g['softmax'])
            if g['kind'] == 'ha':
                q, k1, v1 = m['q'][0, h], m['k'][0, h], m['v'][0, h]
                k2, v2 = (k1, v1) if m['k'].size(0) == 1 else (m['k'][1, h], m['v'][1, h])
                r['T'] = torch.einsum('ai,bi,ci->abc', q, k1, k2) * scale
                pair_value = v1[:, None, :] * v2[None, :, :] @ wo_h.T  # (N, N, n_embd)
                r['value_norm'] = pair_value.norm(dim=-1)
                ranked = query_centred(r['T']) if g['softmax'] else r['T']
                r['ranked'], r['T3'] = ranked, three_way_part(r['T'])
                denom = query_centred(r['T']).square().sum()
                r['three_way_share'] = (r['T3'].square().sum() / denom).item() if denom > 0 else 0.0
                if out_direction is not None:
                    r['Wt'] = pair_value @ out_direction.double()
                    r['M'] = r['T'] * r['Wt'][None]
            else:
                if hfa:
                    A = g['split'][0]
                    r['factors'] = torch.stack([m['q'][s, h] @ m['k'][s, h].T * scale for s in range(A)])
                    r['C'] = m['q_lift'][h] @ m['k_lift'][h].T * scale ** A
                    value = (m['v_prod'][h] if g['kind'] == 'hfa_v2' else m['v'][0, h]) @ wo_h.T
                else:
                    r['C'] = m['q'][0, h] @ m['k'][0, h].T * scale
                    value = m['v'][0, h] @ wo_h.T  # (N, n_embd)
                r['value_norm'] = value.norm(dim=-1)
                r['ranked'] = query_centred(r['C']) if g['softmax'] else r['C']
                r['key_effect'] = r['ranked'].mean(0)  # how much every query reads key b, beyond the mean
                r['specific'] = r['ranked'] - r['ranked'].mean(1, keepdim=True) - r['key_effect'][None, :] \
                    + r['key_effect'].mean()  # the coupling of a and b beyond what a and b do with every token
                if out_direction is not None:
                    r['Wt'] = value @ out_direction.double()
                    r['M'] = r['C'] * r['Wt'][None, :]
            heads.append(r)
        h0 += g['heads']
    return heads


def token_share(sd, cfg, layer, tokens, heads, ln=True, per_query=32, per_key=4, seed=0):
    """How much of each head's real score the position-averaged read-out explains: for every
    read token as a query at `per_query` positions and as a key at `per_key` positions (drawn
    uniformly and independently), the R^2 of the read-out's coefficient against the score the
    head computes at those positions (both query-centred for a softmax head). 1: the score
    depends on the tokens alone; near 0: on their positions (a positional head, which the
    token read-out cannot show). HA: a quarter of the query positions, half the key positions."""
    kind = cfg.layer_attentions()[layer]
    gen = torch.Generator().manual_seed(seed)
    if kind == 'ha':
        per_query, per_key = max(1, per_query // 4), max(1, per_key // 2)
    wte, wpe = sd['transformer.wte.weight'].double(), sd['transformer.wpe.weight'].double()
    norm = layer_norm(sd, layer, ln)

    def draw(m):  # every token m times, each at a random position
        t = torch.arange(len(tokens)).repeat(m)
        return t, norm(wte[torch.as_tensor(tokens)[t]] + wpe[torch.randint(0, wpe.size(0), (len(t),), generator=gen)])

    (tq, xq), (tk, xk) = draw(per_query), draw(per_key)
    prefix = f'transformer.h.{layer}.attn.'
    groups, _ = attention_weights({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}, cfg, kind)
    q_side, k_side = mean_streams(groups, [xq[None]]), mean_streams(groups, [xk[None]])
    scale, shares, i = cfg.dh ** -0.5, [], 0
    for g, mq, mk in zip(groups, q_side, k_side):
        for h in range(g['heads']):
            r = heads[i]
            if 'T' in r:
                k2 = mk['k'][-1, h]  # the second key stream (the first when K/V are shared)
                score = torch.einsum('as,bs,cs->abc', mq['q'][0, h], mk['k'][0, h], k2) * scale
                read = r['T'][tq][:, tk][:, :, tk]
            else:
                score = math.prod(mq['q'][s, h] @ mk['k'][s, h].T * scale for s in range(g['split'][0]))
                read = r['C'][tq][:, tk]
            if r['softmax']:
                score, read = query_centred(score), query_centred(read)
            else:
                score, read = score - score.mean(), read - score.mean()
            shares.append(1 - ((score - read) ** 2).sum().item() / max((score ** 2).sum().item(), 1e-300))
            i += 1
    return shares


def offset_profile(sd, cfg, layer, tokens, ln=True, max_offset=32):
    """What each head does by position, averaged over tokens: the roles of token and position
    swapped. x(p) = mean_a LN(wte[a] + wpe[p]) over the read tokens (exact for the bilinear and
    trilinear scores, and through the lift for HFA's product, as for positions='mean'); the
    score of query position i for the key at i - d, query-centred over the keys i can see
    (causal, within attn_window) for a softmax head, then averaged over i: a profile over the
    offsets d the head can see, at most max_offset (HA: over the offset pairs (d1, d2) within
    ha_window1 x ha_window2, centred over the pairs shown). A previous-token head peaks at
    d = 1. Returns one tensor per head."""
    kind = cfg.layer_attentions()[layer]
    norm = layer_norm(sd, layer, ln)
    wte, wpe = sd['transformer.wte.weight'].double()[torch.as_tensor(tokens)], sd['transformer.wpe.weight'].double()
    P = wpe.size(0)
    step = max(1, (1 << 24) // wpe.numel())
    chunks = (norm(wte[i:i + step, None] + wpe[None]) for i in range(0, len(tokens), step))  # (tokens, P, d)
    prefix = f'transformer.h.{layer}.attn.'
    groups, _ = attention_weights({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}, cfg, kind)
    i = torch.arange(P)

    def offsets(window):  # key positions i - d for the offsets d a head sees, and which exist
        d = torch.arange(min(max_offset, window or P, P))
        return (i[:, None] - d[None]).clamp(min=0), i[:, None] >= d[None]

    scale, profiles = cfg.dh ** -0.5, []
    for g, m in zip(groups, mean_streams(groups, list(chunks))):
        for h in range(g['heads']):
            if g['kind'] == 'ha':
                (back1, ok1), (back2, ok2) = offsets(cfg.ha_window1), offsets(cfg.ha_window2)
                t = torch.einsum('is,ias,ibs->iab', m['q'][0, h], m['k'][0, h][back1], m['k'][-1, h][back2]) * scale
                ok = ok1[:, :, None] & ok2[:, None, :]
                if g['softmax']:
                    t = t - (t * ok).sum((1, 2), keepdim=True) / ok.sum((1, 2), keepdim=True)
                profiles.append((t * ok).sum(0) / ok.sum(0))
                continue
            if g['kind'] in ('hfa_v1', 'hfa_v2'):
                c = m['q_lift'][h] @ m['k_lift'][h].T * scale ** g['split'][0]
            else:
                c = m['q'][0, h] @ m['k'][0, h].T * scale
            window = cfg.attn_window if cfg.causal else 0
            if g['softmax']:  # centred over the keys each query sees
                seen = (i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :] < window) if window else True)
                c = c - (c * seen).sum(1, keepdim=True) / seen.sum(1, keepdim=True)
            back, ok = offsets(window)
            profiles.append((c.gather(1, back) * ok).sum(0) / ok.sum(0))
    return profiles


# -----------------------------------------------------------------------------
# readable tops

def token_text(s):
    """A token as it reads in a list or on an axis: whitespace made visible."""
    return s.replace(' ', '\u2423').replace('\n', '\\n').replace('\t', '\\t').replace('\r', '\\r') or '\u2205'


def top_entries(x, k, largest=True):
    """The k largest (or smallest) entries of x: [(index tuple, value)]."""
    flat = x.reshape(-1)
    vals, idx = flat.topk(min(k, flat.numel()), largest=largest)
    return [(tuple(int(i) for i in np.unravel_index(j.item(), tuple(x.shape))), v.item()) for j, v in zip(idx, vals)]


def describe_head(r, labels, k):
    """Top pairs (a -> b: query a reads key b) or triples (a <- (b, c)) as dicts with text."""
    def pair(ix, v):
        a, b = labels[ix[0]], labels[ix[1]]
        return dict(query=a, key=b, value=v, text=f"{a} -> {b}  {v:+.4g}")

    def triple(ix, v):
        a, b, c = (labels[i] for i in ix)
        return dict(query=a, key1=b, key2=c, value=v, text=f"{a} <- ({b}, {c})  {v:+.4g}")

    if 'T' in r:
        out = dict(top_triples=[triple(*e) for e in top_entries(r['ranked'], k)],
                   bottom_triples=[triple(*e) for e in top_entries(r['ranked'], k, largest=False)],
                   top_three_way=[triple(*e) for e in top_entries(r['T3'], k)],
                   strongest_value_pairs=[dict(key1=labels[i[0]], key2=labels[i[1]], value=v,
                                               text=f"({labels[i[0]]}, {labels[i[1]]})  {v:.4g}")
                                          for i, v in top_entries(r['value_norm'], k)])
    else:
        out = dict(top_pairs=[pair(*e) for e in top_entries(r['ranked'], k)],
                   bottom_pairs=[pair(*e) for e in top_entries(r['ranked'], k, largest=False)],
                   top_keys=[dict(key=labels[i[0]], value=v, text=f"{labels[i[0]]}  {v:+.4g}")
                             for i, v in top_entries(r['key_effect'], min(k, 10))],
                   top_specific_pairs=[pair(*e) for e in top_entries(r['specific'], k)])
        if 'factors' in r:
            out['factor_top_pairs'] = [[pair(*e) for e in top_entries(f, k)] for f in r['factors']]
    return out


# -----------------------------------------------------------------------------
# figures: one colour scale per figure

LABELLED_MAX = 100  # up to this many tokens an axis names each one; past it the matrix alone is shown
TICK_INCHES = 0.14  # room per labelled token: 8-point labels, punctuation included, do not touch


def heatmap_figure(panels, titles, labels, axis_names, suptitle):
    """Panels of equal-shape matrices side by side on one symmetric colour scale; each token named
    on both axes (up to LABELLED_MAX), the panel sized so that its labels are readable."""
    from experiments.common import plt
    n, N = len(panels), len(labels)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    side = 1.5 + N * TICK_INCHES if N <= LABELLED_MAX else 2.5 + N * 0.06
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols + 1.2, side * rows + 0.6), squeeze=False,
                             layout='constrained')
    v = max(float(p.abs().max()) for p in panels) or 1.0
    for ax, p, title in zip(axes.flat, panels, titles):
        im = ax.imshow(p.numpy(), cmap='RdBu_r', vmin=-v, vmax=v, interpolation='nearest')
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(axis_names[0])
        ax.set_xlabel(axis_names[1])
        if N <= LABELLED_MAX:
            ax.set_xticks(range(N), labels, fontsize=8, rotation=90)
            ax.set_yticks(range(N), labels, fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis('off')
    fig.colorbar(im, ax=axes, shrink=0.6, label='coefficient (one scale for every panel)')
    fig.suptitle(suptitle, fontsize=11)
    return fig


def heatmaps(panels, titles, labels, axis_names, suptitle, path):
    from experiments.common import plt
    fig = heatmap_figure(panels, titles, labels, axis_names, suptitle)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def source_title(name, kind):
    """The figures' name for the model read: its run's name, with the layer's attention unless
    the name already says it (an out_dir called 'sa' gave 'sa (sa)')."""
    return name if name == kind or name.endswith((f'-{kind}', f'_{kind}')) else f"{name} ({kind})"


def strongest_queries(r, n=4):
    """The queries whose three-way part holds the largest entries."""
    return r['T3'].flatten(1).max(1).values.topk(min(n, r['T3'].size(0))).indices.tolist()


def write_figures(heads, labels, layer, name, folder):
    """Every heatmap of one layer; name: source_title's. A head's attention is named only where the
    layer mixes kinds (HFA + SA heads): otherwise the name says it."""
    paths, centred = [], lambda r: ' (query-centred)' if r['softmax'] else ''
    mixed = len({r['kind'] for r in heads}) > 1
    kind_of = lambda r: f" ({r['kind']})" if mixed else ''
    for r in heads:
        h = r['head']
        base = Path(folder) / f"layer{layer}_head{h}"
        print(f"  writing figures of head {h} ...", flush=True)
        if 'T' in r:
            qs = strongest_queries(r)
            paths.append(heatmaps([r['ranked'][a] for a in qs], [f"query {labels[a]}" for a in qs], labels,
                                  ('key 1 (b)', 'key 2 (c)'),
                                  f"{name}: layer {layer} head {h}, T[a, b, c]{centred(r)} for the queries a "
                                  f"with the strongest three-way part", f"{base}.png"))
            paths.append(heatmaps([r['T3'][a] for a in qs], [f"query {labels[a]}" for a in qs], labels,
                                  ('key 1 (b)', 'key 2 (c)'),
                                  f"{name}: layer {layer} head {h}, three-way part T3[a, b, c] (main effects "
                                  f"of b and of c removed)", f"{base}_three_way.png"))
            paths.append(heatmaps([r['value_norm']], ['|W_O,h (v1(b) * v2(c))|'], labels, ('key 1 (b)', 'key 2 (c)'),
                                  f"{name}: layer {layer} head {h}, value coupling", f"{base}_values.png"))
        else:
            if 'factors' in r:
                paths.append(heatmaps(list(r['factors']), [f"factor {s + 1}" for s in range(len(r['factors']))],
                                      labels, ('query token (a)', 'key token (b)'),
                                      f"{name}: layer {layer} head {h}{kind_of(r)}, "
                                      f"score factors q_s(a).k_s(b)/sqrt(dh)",
                                      f"{base}_factors.png"))
            what = 'product of the factors' if 'factors' in r else 'C[a, b]'
            paths.append(heatmaps([r['ranked']], [f"{what}{centred(r)}"], labels, ('query token (a)', 'key token (b)'),
                                  f"{name}: layer {layer} head {h}{kind_of(r)}", f"{base}.png"))
    panels, titles = [], []
    for r in heads:
        if 'T' in r:
            a = strongest_queries(r, 1)[0]
            panels.append(r['ranked'][a])
            titles.append(f"head {r['head']}: query {labels[a]}, T[{labels[a]}, b, c]{centred(r)}")
        else:
            panels.append(r['ranked'])
            titles.append(f"head {r['head']}{kind_of(r)}{centred(r)}")
    axis = ('key 1 (b)', 'key 2 (c)') if all('T' in r for r in heads) else ('query token (a)', 'key token (b)')
    print("  writing the figure of every head ...", flush=True)
    paths.append(heatmaps(panels, titles, labels, axis, f"{name}: layer {layer}, every head",
                          Path(folder) / f"layer{layer}_heads.png"))
    return paths


def offset_figure(profiles, heads, layer, name, path):
    """Score by key offset, averaged over tokens: one line per pairwise head, or for HA one
    panel per head over the offset pair (d1, d2), on one colour scale."""
    from experiments.common import plt
    if profiles[0].dim() == 2:
        D = profiles[0].size(0)
        return heatmaps(profiles, [f"head {r['head']}" for r in heads], [str(d) for d in range(D)],
                        ('key 1 offset d1 (key at i - d1)', 'key 2 offset d2'),
                        f"{name}: layer {layer}, score by key offsets, averaged over tokens", path)
    fig, ax = plt.subplots(figsize=(6.5, 3.8), layout='constrained')
    for r, prof in zip(heads, profiles):
        mixed = len({h['kind'] for h in heads}) > 1
        what = [r['kind']] * mixed + ['query-centred'] * r['softmax']
        ax.plot(range(len(prof)), prof.numpy(), marker='o', ms=3,
                label=f"head {r['head']}" + (f" ({', '.join(what)})" if what else ''))
    ax.axhline(0, color='grey', lw=0.6)
    ax.set(xlabel='key offset d (query at i reads the key at i - d)', ylabel='score, averaged over tokens',
           title=f"{name}: layer {layer}, score by key offset")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -----------------------------------------------------------------------------
# loading

def load_source(out_dir, init_from, meta=''):
    """(state dict, GPTConfig, tokenizer meta, dataset name or None, a name for titles); the
    checkpoint (ours or nanoGPT's) and GPT-2's weights are read as train.py reads them, and a
    checkpoint's tokens as sample.py reads them (meta: --meta, for a checkpoint that carries none)."""
    from nanohfa import checkpoint
    from model import GPTConfig
    if checkpoint.init_kind(init_from, ('resume', 'gpt2')) == 'resume':
        path = Path(out_dir) / 'ckpt.pt'
        ckpt = checkpoint.load_checkpoint(path, "train first (python train.py ...) or set --out_dir")
        cfg = GPTConfig.from_dict(ckpt['model_args'])
        labels = checkpoint.checkpoint_meta(ckpt, path, meta, gpt2_fallback=False) or {}  # none found: ids as numbers
        return ckpt['model'], cfg, labels, ckpt.get('dataset'), Path(out_dir).name
    model = checkpoint.load_gpt2(init_from)
    return model.state_dict(), model.config, {'tokenizer': 'gpt2'}, None, Path(init_from).name


def token_labels(meta, vocab_size):
    """Readable text of every token id (ids past the tokenizer's vocabulary: '#id')."""
    from nanohfa import tokenizer as tok
    try:
        enc = tok.from_meta(meta) if meta.get('tokenizer') else None
    except UserError as e:
        print(f"note: token ids shown as numbers ({e})")
        enc = None
    n = getattr(enc, 'vocab_size', 0)
    return [token_text(enc.decode([i])) if i < n else f"#{i}" for i in range(vocab_size)]


def token_counts(folder, vocab_size, limit):
    """Occurrences of every token id in the first `limit` tokens of folder/train.bin (0: all)."""
    data = np.memmap(Path(folder) / 'train.bin', dtype=np.uint16, mode='r')
    data = data[:limit] if limit else data
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, len(data), 1 << 26):
        c = np.bincount(data[i:i + (1 << 26)], minlength=vocab_size)
        if len(c) > vocab_size:
            raise UserError(f"{folder}/train.bin holds token ids up to {len(c) - 1}, past this model's vocabulary "
                            f"of {vocab_size}: the data is not the model's; set --data_dir")
        counts += c
    return counts


def choose_tokens(counts, vocab_size, n, min_freq=0.0):
    """The n most frequent tokens of the data with a frequency of at least min_freq (all tokens
    if there are no data), in id order."""
    if counts is None:
        if vocab_size > n:
            raise UserError(f"the vocabulary has {vocab_size} tokens, more than the {n} this read-out covers, and "
                            f"there are no training data to pick the most frequent ones: set --data_dir "
                            f"(a prepared folder with train.bin) or --top_n={vocab_size}")
        return list(range(vocab_size))
    seen = np.flatnonzero((counts > 0) & (counts >= min_freq * counts.sum()))
    order = seen[np.argsort(-counts[seen], kind='stable')][:n]
    return sorted(int(i) for i in order)


def select_tokens(data_dir, dataset, vocab_size, n, min_freq, freq_tokens):
    """(token ids read, their counts in the training data or None) from data_dir, or else the
    checkpoint's dataset under data/."""
    folder = Path(data_dir) if data_dir else (Path(__file__).resolve().parent / 'data' / dataset if dataset else None)
    counts = None
    if folder is not None and (folder / 'train.bin').exists():
        counts = token_counts(folder, vocab_size, freq_tokens)
    elif data_dir:
        raise UserError(f"{folder / 'train.bin'} not found; prepare the data or point --data_dir at a prepared folder")
    else:
        print(f"note: no training data found ({folder or 'the weights name no dataset'}); reading every token")
    return choose_tokens(counts, vocab_size, n, min_freq), counts


# -----------------------------------------------------------------------------
# several checkpoints (seeds of one variant): each read as one, then matched across seeds

def checkpoint_dirs(out_dir):
    """'a,b,c' or a glob ('runs/sa/seed*') -> the checkpoint folders, in order; None for one folder."""
    if ',' not in out_dir and not glob.has_magic(out_dir):
        return None
    parts = [p for p in out_dir.split(',') if p]
    dirs = []
    for p in parts:
        found = sorted(glob.glob(p)) if glob.has_magic(p) else [p]
        dirs += [d for d in found if os.path.isdir(d)]
    missing = [d for d in dirs if not (Path(d) / 'ckpt.pt').exists()]
    if missing:
        raise UserError(f"no ckpt.pt in {', '.join(missing)}; give folders that train.py wrote")
    if len(dirs) < 2:
        raise UserError(f"--out_dir={out_dir} names {len(dirs)} checkpoint folder(s); give two or more "
                        f"(a comma list or a glob) to compare seeds, or one folder for one model")
    return dirs


def read_seeds(o, dirs, argv=()):
    """Several checkpoints of one variant (seeds): read each as main reads one, then match their
    heads and report what recurs (interactions_seeds.py)."""
    loaded = [load_source(d, 'resume', o['meta']) for d in dirs]
    cfg0 = loaded[0][1]
    same = [k for k in cfg0.__dataclass_fields__ if k not in ('dropout',)]
    for d, (_, cfg, *_rest) in zip(dirs[1:], loaded[1:]):
        diff = [k for k in same if getattr(cfg, k) != getattr(cfg0, k)]
        if diff:
            what = ', '.join(f"{k}: {getattr(cfg, k)!r} vs {getattr(cfg0, k)!r}" for k in diff[:3])
            raise UserError(f"{d} is another model than {dirs[0]} ({what}); give seeds of one variant")
    # seeds compare one training recipe: a checkpoint of a run still training is another model
    iters = [torch.load(Path(d) / 'ckpt.pt', map_location='cpu', weights_only=True, mmap=True).get('iter_num')
             for d in dirs]
    if len(set(iters)) > 1:
        what = ', '.join(f"{Path(d).name} {i}" for d, i in zip(dirs, iters))
        raise UserError(f"the checkpoints are at different iterations ({what}); a run still training? "
                        f"give checkpoints of the same length")
    kinds = cfg0.layer_attentions()
    if not 0 <= o['layer'] < len(kinds):
        raise UserError(f"layer={o['layer']} but the model has {len(kinds)} layers (0..{len(kinds) - 1})")
    kind = kinds[o['layer']]
    n = o['top_n'] or (AUTO_N_TRIPLES if kind == 'ha' else AUTO_N_PAIRS)
    _, _, meta, dataset, _ = loaded[0]
    tokens, _ = select_tokens(o['data_dir'], dataset, cfg0.vocab_size, n, o['min_freq'], o['freq_tokens'])
    all_labels = token_labels(meta, cfg0.vocab_size)
    labels = [all_labels[i] for i in tokens]
    prefix = f'transformer.h.{o["layer"]}.attn.'
    seeds_heads, measures = [], []
    for i, (d, (sd, cfg, *_rest)) in enumerate(zip(dirs, loaded)):
        print(f"reading {d} ({i + 1} of {len(dirs)}): layer {o['layer']} ({kind}), {len(tokens)} tokens", flush=True)
        inputs = token_inputs(sd, cfg, o['layer'], torch.tensor(tokens), o['positions'], o['ln'])
        layer_sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        heads = read_attention(layer_sd, cfg, kind, inputs)
        seeds_heads.append(heads)
        shares = None  # as for one model: measured only where positions are averaged; two draws
        if o['positions'] == 'mean':
            shares = [float(x) for x in np.mean([token_share(sd, cfg, o['layer'], tokens, heads, o['ln'], seed=j)
                                                 for j in range(2)], 0)]
        measures.append(dict(token_share=shares,
                             offset_profile=offset_profile(sd, cfg, o['layer'], tokens, o['ln'])))
    report = seeds.seed_stability(seeds_heads, labels, k=o['top_k'], measures=measures)
    report.update(command='python interactions.py ' + ' '.join(shlex.quote(a) for a in argv), iterations=iters[0],
                  sources=[str(Path(d) / 'ckpt.pt') for d in dirs], layer=o['layer'], attention=kind,
                  tokens=[all_labels[t] for t in tokens])
    for line in seeds.stability_lines(report, [Path(d).name for d in dirs]):
        print(line)
    out = Path(o['report_dir']) if o['report_dir'] else Path(dirs[0]).parent / f"interactions-seeds-layer{o['layer']}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / 'seeds.json'
    tmp = path.with_suffix('.json.tmp')
    tmp.write_text(json.dumps(report, indent=1))
    os.replace(tmp, path)
    if o['figures']:
        seeds.class_block_figure(report, out / f"seeds_layer{o['layer']}_class_blocks.png")
    print(f"wrote {path}" + (f" and {out}/seeds_layer{o['layer']}_class_blocks.png" if o['figures'] else ''))
    return report


# -----------------------------------------------------------------------------

def rounded(x, digits=6):
    """Tensors -> nested lists of floats at `digits` significant digits (the JSON's precision)."""
    if torch.is_tensor(x):
        a = x.detach().cpu().numpy()
        return np.vectorize(lambda v: float(f'{v:.{digits}g}'), otypes=[float])(a).tolist() if a.size else a.tolist()
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x


def head_report(r, labels, top_k, share, spread, profile):
    """One head's entry of interactions.json: its tops as text, its measures, its matrices."""
    tops = describe_head(r, labels, top_k)
    tops['top_offsets'] = [dict(offset=list(ix) if len(ix) > 1 else ix[0], value=v,
                                text=f"{ix[0] if len(ix) == 1 else ix}  {v:+.3g}")
                           for ix, v in top_entries(profile, 3)]
    entry = dict(head=r['head'], kind=r['kind'], softmax=r['softmax'],
                 ranked_by='query-centred coefficient' if r['softmax'] else 'raw coefficient',
                 token_share=share, token_share_spread=spread, three_way_share=r.get('three_way_share'),
                 **tops, offset_profile=rounded(profile))
    for key in ('C', 'factors', 'T', 'value_norm', 'key_effect', 'specific'):  # T3: three_way_part(T)
        if key in r:
            entry[key] = rounded(r[key])
    return entry


def main(argv=None):
    from nanohfa import configurator
    from nanohfa import settings
    o = configurator.load(settings.defaults(settings.INTERACTIONS), sys.argv[1:] if argv is None else argv,
                          configurator.help_text(settings.INTERACTIONS, 'interactions.py', __doc__))
    settings.check(settings.INTERACTIONS, o)
    if o['init_from'] == 'resume':  # several checkpoints (seeds of one variant): what recurs across them
        dirs = checkpoint_dirs(o['out_dir'])
        if dirs:
            return read_seeds(o, dirs, sys.argv[1:] if argv is None else argv)
    sd, cfg, meta, dataset, name = load_source(o['out_dir'], o['init_from'], o['meta'])
    kinds = cfg.layer_attentions()
    if not 0 <= o['layer'] < len(kinds):
        raise UserError(f"layer={o['layer']} but the model has {len(kinds)} layers (0..{len(kinds) - 1})")
    kind = kinds[o['layer']]
    three_way = kind == 'ha'
    n = o['top_n'] or (AUTO_N_TRIPLES if three_way else AUTO_N_PAIRS)
    if o['top_n'] < 0 or o['top_k'] < 1:
        raise UserError("top_n must be >= 0 (0: automatic) and top_k >= 1")

    print(f"{name}: reading layer {o['layer']} ({kind}); counting tokens in the training data ...", flush=True)
    tokens, counts = select_tokens(o['data_dir'], dataset, cfg.vocab_size, n, o['min_freq'], o['freq_tokens'])
    all_labels = token_labels(meta, cfg.vocab_size)
    labels = [all_labels[i] for i in tokens]
    covered = None if counts is None else counts[tokens].sum() / max(1, counts.sum())
    print(f"{name}: layer {o['layer']} ({kind}), {cfg.n_head} heads, {len(tokens)} tokens"
          + (f" ({100 * covered:.2f}% of the counted training tokens)" if covered is not None else '')
          + f", positions={o['positions']}, ln={o['ln']}", flush=True)
    if o['layer'] > 0:
        print(f"note: layer {o['layer']} is read through the embedding's direct path only; its real input also "
              f"holds the earlier layers' outputs")

    print(f"  coefficients of every {'triple' if three_way else 'pair'} ...", flush=True)
    prefix = f'transformer.h.{o["layer"]}.attn.'
    layer_sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    inputs = token_inputs(sd, cfg, o['layer'], torch.tensor(tokens), o['positions'], o['ln'])
    heads = read_attention(layer_sd, cfg, kind, inputs)
    shares = [(None, None)] * len(heads)
    if o['positions'] == 'mean':  # four independent draws: their mean, and half their range
        print("  token share: the read-out against the real scores, 4 draws ...", flush=True)
        draws = np.array([token_share(sd, cfg, o['layer'], tokens, heads, o['ln'], seed=i) for i in range(4)])
        shares = list(zip(draws.mean(0), (draws.max(0) - draws.min(0)) / 2))
    print("  scores by key offset ...", flush=True)
    offsets = offset_profile(sd, cfg, o['layer'], tokens, o['ln'])

    out = Path(o['report_dir']) if o['report_dir'] else (
        Path(o['out_dir']) / 'interactions' if o['init_from'] == 'resume' else Path(f"interactions-{name}"))
    out.mkdir(parents=True, exist_ok=True)
    report = dict(source=str(Path(o['out_dir']) / 'ckpt.pt') if o['init_from'] == 'resume' else o['init_from'],
                  layer=o['layer'], attention=kind,
                  options={k: o[k] for k in ('positions', 'ln', 'top_n', 'min_freq', 'top_k', 'freq_tokens')},
                  model_args={k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
                  precision='matrices at 6 significant digits; an HA head\'s three-way part is three_way_part(T)',
                  tokens=[dict(id=t, text=all_labels[t], count=None if counts is None else int(counts[t]))
                          for t in tokens],
                  coverage=covered, heads=[])
    for r, (share, spread), prof in zip(heads, shares, offsets):
        entry = head_report(r, labels, o['top_k'], share, spread, prof)
        report['heads'].append(entry)
        lead = entry.get('top_triples') or entry['top_pairs']
        extra = f", token share {share:.2f} +- {spread:.2f}" if share is not None else ''
        extra += f", three-way share {r['three_way_share']:.2f}" if 'three_way_share' in r else ''
        print(f"head {r['head']} ({r['kind']}{extra}): " + ';  '.join(e['text'] for e in lead[:5]))
        print("  strongest offsets (key i - d): " + ';  '.join(e['text'] for e in entry['top_offsets']))
        if 'top_three_way' in entry:
            print("  three-way part: " + ';  '.join(e['text'] for e in entry['top_three_way'][:5]))
        else:
            print("  keys read by every query: " + ';  '.join(e['text'] for e in entry['top_keys'][:5]))
            print("  specific pairs: " + ';  '.join(e['text'] for e in entry['top_specific_pairs'][:5]))
    path = out / 'interactions.json'
    tmp = path.with_suffix('.json.tmp')
    tmp.write_text(json.dumps(report, separators=(',', ':')))
    os.replace(tmp, path)
    if o['figures']:
        print(f"writing figures to {out} ...", flush=True)
        write_figures(heads, labels, o['layer'], source_title(name, kind), out)
        offset_figure(offsets, heads, o['layer'], source_title(name, kind), out / f"layer{o['layer']}_offsets.png")
    print(f"wrote {path}" + (f" and figures to {out}" if o['figures'] else ''))
    return report


if __name__ == '__main__':
    main()
