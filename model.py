"""
A GPT language model whose attention block is chosen by one flag.

    attention = 'sa'      softmax self-attention (the baseline)
                'linear'  linear self-attention, the softmax removed      [IA] Eq. 1
                'hfa_v1'  HyperFeatureAttention, plain values             [IA] Def 5.1
                'hfa_v2'  HyperFeatureAttention, Hadamard-product values  [IA] Def E.2
                'ha'      HyperAttention (order 3 by default)             [IA] Def 6.1, F.1

[IA] M. Ustaomeroglu, G. Qu, "A Theoretical Study of (Hyper) Self-Attention through
the Lens of Interactions", ICML 2025, arXiv 2506.06179. Their "HyperAttention" is a
higher-order attention, not the LSH long-context method of Han et al. (ICLR 2024).

Layout: a layer is a few groups of heads (which ones: `head_groups`; `Heads` subclasses, one
per variant) whose outputs are concatenated and mixed by one output projection W_O
(`Attention`). Every group owns one fused input projection that produces its query/key/value
streams, so the shared machinery (projection, head split, KV cache, W_O) is written once and
each variant only says how its heads mix keys into values: the formula in its docstring and
one call into attention_kernels/, which holds every way of computing it.
"""

import math
import os
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.utils.checkpoint
from torch.nn import functional as F

import attention_kernels
from attention_kernels import ha, hfa, linear, sa
from attention_kernels.masks import mean_visible

ATTENTIONS = ('sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha')


@dataclass
class GPTConfig:
    """What each field means and accepts: settings.py, where every setting is documented once
    (TRAIN's 'model' and 'attention' sections, printed by `python train.py --help`; MODEL_ONLY
    for gelu, softmax and causal, which train.py does not take). The defaults are GPT-2 124M's."""
    block_size: int = 1024
    vocab_size: int = 50304     # GPT-2's 50257 padded up to a multiple of 64
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True           # as GPT-2 (train.py's default is False, as nanoGPT's)
    gelu: str = 'exact'
    attention: str = 'sa'       # one of ATTENTIONS
    attn_layers: str = ''
    head_dim: int = 0
    causal: bool = True
    softmax: bool = True
    linear_norm: bool = False
    hfa_order: int = 2
    n_hfa_head: int = -1
    hfa_kron: str = 'auto'
    ha_order: int = 3
    ha_share_kv: bool = False
    ha_window1: int = 0
    ha_window2: int = 0
    ha_form: str = 'auto'       # order-3 HA's PyTorch form: 'auto', 'windowed' or 'blockwise'
    attn_window: int = 0
    kernel: str = 'auto'        # one of attention_kernels.KERNELS
    kernel_check: bool = True

    def __post_init__(self):
        for kind in {self.attention, *self.layer_attentions()}:
            if kind not in ATTENTIONS:
                raise ValueError(f"unknown attention {kind!r}; valid: {', '.join(ATTENTIONS)}")
        if self.attn_layers and len(self.layer_attentions()) != self.n_layer:
            raise ValueError(f"attn_layers names {len(self.layer_attentions())} layers "
                             f"but n_layer={self.n_layer}; give one variant per layer")
        if not self.head_dim and self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"change one of them or set head_dim")
        if self.gelu not in ('exact', 'tanh'):
            raise ValueError(f"gelu must be 'exact' or 'tanh', not {self.gelu!r}")
        if self.n_hfa_head > self.n_head:
            raise ValueError(f"n_hfa_head={self.n_hfa_head} exceeds n_head={self.n_head}")
        if self.hfa_order < 1 or self.ha_order < 2:
            raise ValueError("hfa_order must be >= 1 and ha_order >= 2")
        if min(self.ha_window1, self.ha_window2, self.attn_window, self.head_dim) < 0:
            raise ValueError("ha_window1, ha_window2, attn_window and head_dim must be >= 0 (0: full / default)")
        if not self.causal and (self.ha_window1 or self.ha_window2 or self.attn_window):
            raise ValueError("ha_window1, ha_window2 and attn_window are causal windows (the last w positions up to "
                             "the query) and causal=False has none; set them to 0, or causal=True")
        if self.attn_window and set(self.layer_attentions()) == {'ha'}:
            raise ValueError("attn_window applies to sa, linear and hfa heads and this model has none; "
                             "window HyperAttention with ha_window1 / ha_window2")
        if self.ha_form not in ('auto', 'windowed', 'blockwise'):
            raise ValueError(f"ha_form must be 'auto', 'windowed' or 'blockwise', not {self.ha_form!r}")
        if self.ha_form == 'windowed' and not (self.causal and self.ha_window1 and self.ha_window2):
            raise ValueError("ha_form='windowed' computes HA with both slots windowed; set ha_window1 and ha_window2 "
                             "(causal=True), or use ha_form='auto'")
        if self.hfa_kron not in ('auto', 'on', 'off'):
            raise ValueError(f"hfa_kron must be 'auto', 'on' or 'off', not {self.hfa_kron!r}")
        if self.kernel not in attention_kernels.KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(attention_kernels.KERNELS)}, not {self.kernel!r}")

    def layer_attentions(self):
        if self.attn_layers:
            return [s.strip() for s in self.attn_layers.split(',')]
        return [self.attention] * self.n_layer

    @property
    def dh(self):
        return self.head_dim or self.n_embd // self.n_head

    @classmethod
    def from_dict(cls, d):
        """Build from a dict that may hold other keys (a training config, an old checkpoint)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# -----------------------------------------------------------------------------
# groups of heads: which a layer has (head_groups), then one class per variant

class HeadGroup(NamedTuple):
    kind: str       # what its heads compute: 'sa', 'linear', 'hfa_v1', 'hfa_v2' or 'ha' (their class: HEADS)
    heads: int
    n_q: int        # query, key and value streams per head: c_attn's output, in this order
    n_k: int
    n_v: int
    softmax: bool


def head_groups(cfg, kind):
    """The groups of heads of one layer of variant `kind`, in the order their outputs enter W_O.
    A layer has one group, except HFA with n_hfa_head < n_head: SA heads, then HFA heads.
    softmax=False drops every softmax, so SA heads are then linear heads."""
    H, A = cfg.n_head, cfg.hfa_order
    pairwise = 'sa' if cfg.softmax else 'linear'  # the heads of a layer that are neither HFA nor HA
    if kind in ('sa', 'linear'):
        g = pairwise if kind == 'sa' else 'linear'
        return [HeadGroup(g, H, 1, 1, 1, g == 'sa')]
    if kind in ('hfa_v1', 'hfa_v2'):
        n_hfa = H if cfg.n_hfa_head < 0 else cfg.n_hfa_head
        groups = [HeadGroup(pairwise, H - n_hfa, 1, 1, 1, cfg.softmax)] if n_hfa < H else []
        return groups + ([HeadGroup(kind, n_hfa, A, A, A if kind == 'hfa_v2' else 1, cfg.softmax)] if n_hfa else [])
    if kind == 'ha':
        n = 1 if cfg.ha_share_kv else cfg.ha_order - 1  # shared: one key and one value stream in every slot
        return [HeadGroup('ha', H, 1, n, n, cfg.softmax)]
    raise ValueError(f"unknown attention {kind!r}; valid: {', '.join(ATTENTIONS)}")


def kernel_heads(cfg):
    """The model's heads as the attention kernels see them, as plain data: one dict per group
    of heads of every layer (its family, heads, query streams, softmax) with the settings the
    kernels read (head size, causal, windows, linear's norm, HA's order and shared keys).
    train.py gives them to the kernel preflight: attention_kernels/ knows nothing of this file."""
    family = {'sa': 'sa', 'linear': 'linear', 'hfa_v1': 'hfa', 'hfa_v2': 'hfa', 'ha': 'ha'}
    return [dict(family=family[g.kind], heads=g.heads, factors=g.n_q, softmax=g.softmax, head_size=cfg.dh,
                 causal=cfg.causal, window=cfg.attn_window if cfg.causal else 0, norm=cfg.linear_norm,
                 order=cfg.ha_order, windows=[cfg.ha_window1, cfg.ha_window2] if cfg.causal else [0, 0],
                 shared=cfg.ha_share_kv, form=cfg.ha_form)
            for layer in cfg.layer_attentions() for g in head_groups(cfg, layer)]


class Heads(nn.Module):
    """A group of heads with one fused input projection x -> (queries, keys, values).

    `group` (a HeadGroup) gives the number of heads and of query, key and value streams per
    head. Subclasses implement `mix(q, k, v, offset)`: q is (n_q, B, H, Tq, dh), k (n_k, B, H,
    Tk, dh), v (n_v, B, H, Tk, dh); it returns (B, H, Tq, dh). Queries sit at positions
    offset..offset+Tq-1, keys at 0..Tk-1 (Tk > Tq when decoding from a cache). How a
    family is computed (SDPA, Triton, PyTorch forms) is attention_kernels/'s choice.
    """

    def __init__(self, cfg, group):
        super().__init__()
        self.cfg, self.h, self.dh = cfg, group.heads, cfg.dh
        self.n_q, self.n_k, self.n_v = group.n_q, group.n_k, group.n_v
        self.n_streams = self.n_q + self.n_k + self.n_v
        self.c_attn = nn.Linear(cfg.n_embd, self.n_streams * self.h * self.dh, bias=cfg.bias)
        self.dropout = cfg.dropout
        attention_kernels.prepare(cfg.kernel)

    def forward(self, x, kv=None, offset=0):
        B, T, _ = x.shape
        s = self.c_attn(x).view(B, T, self.n_streams, self.h, self.dh)
        # split, then permute: the backward then concatenates straight into c_attn's layout
        q, k, v = (t.permute(2, 0, 3, 1, 4) for t in s.split([self.n_q, self.n_k, self.n_v], dim=2))
        if kv is not None:  # decoding: append this step's keys and values to the cache
            if 'k' in kv:
                k, v = torch.cat([kv['k'], k], dim=3), torch.cat([kv['v'], v], dim=3)
            kv['k'], kv['v'] = k, v
        return self.mix(q, k, v, offset)

    @property
    def window(self):
        """attn_window: query i reads i - w < j <= i (a causal notion; 0: every key)."""
        return self.cfg.attn_window if self.cfg.causal else 0

    @property
    def drop(self):
        """Attention-weight dropout probability: 0 outside training."""
        return self.dropout if self.training else 0.0

    def mix_flops(self, T):
        """Forward FLOPs per token, per head, of mixing keys into values (no projections)."""
        raise NotImplementedError


class SoftmaxHeads(Heads):
    """Softmax self-attention: head_i = sum_{j<=i} softmax_j(q_i . k_j / sqrt(dh)) v_j.
    Fused kernels through torch's scaled_dot_product_attention. With attn_window = w the
    sum runs over the last w positions only, i - w < j <= i (sliding-window attention)."""

    def mix(self, q, k, v, offset):  # squeeze, not q[0]: its backward copies into zeros
        return sa.attention(q.squeeze(0), k.squeeze(0), v.squeeze(0), offset, self.cfg.causal, self.window,
                            self.drop, self.cfg.kernel)

    def mix_flops(self, T):
        return 4 * self.dh * mean_visible(T, self.cfg.causal, self.window)


class LinearHeads(Heads):
    """Linear self-attention [IA Eq. 1]: the softmax removed, nothing else,
        head_i = sum_{j<=i} (q_i . k_j / sqrt(dh)) v_j.
    Our choice: with linear_norm=True the sum is divided by the number of visible keys
    (i + 1, or the window), which keeps activations O(1) for long contexts; off by default.
    With the Triton kernel (attention_kernels/linear/) no T x T matrix is formed."""

    def mix(self, q, k, v, offset):
        return linear.attention(q.squeeze(0), k.squeeze(0), v.squeeze(0), offset, self.cfg.causal, self.window,
                                self.cfg.linear_norm, self.drop, self.cfg.kernel, self.cfg.kernel_check)

    def mix_flops(self, T):
        return 4 * self.dh * mean_visible(T, self.cfg.causal, self.window)


class HFAHeads(Heads):
    """HyperFeatureAttention [IA Def 5.1, Def E.2], A = hfa_order factors per head:
        scores = prod_a (Q_a K_a^T / sqrt(dh))        (product of logits, never of probabilities)
        head   = softmax(causal_mask(scores)) V       (one softmax, after the product)
    hfa_v1: V = X W_V (one value projection).   hfa_v2: V = prod_a X W_V^(a) (Hadamard).
    Our choice: each factor is scaled by 1/sqrt(dh) so the product has unit-order variance
    at initialisation ([IA] writes no scaling).
    Paths (attention_kernels/hfa/): a Triton kernel that multiplies the A score tiles inside
    one flash-attention loop (softmax, A <= 4, no T x T tensor at any dh); else SDPA on
    row-wise Kronecker-lifted queries/keys of width dh^A, exact and fused, while dh^A is small
    (hfa_kron='auto'); else the scores materialised."""

    def mix(self, q, k, v, offset):
        # hfa_v1: its one value stream, squeezed (prod's backward checks for zeros); hfa_v2: the Hadamard product
        v = v.squeeze(0) if len(v) == 1 else v.prod(0)
        return hfa.attention(q, k, v, offset, self.cfg.causal, self.window, self.cfg.softmax,
                             self.cfg.hfa_kron, self.drop, self.cfg.kernel, self.cfg.kernel_check)

    def mix_flops(self, T):
        A = self.n_q  # A score matmuls, A - 1 elementwise products, one value matmul
        return (2 * A * self.dh + (A - 1) + 2 * self.dh) * mean_visible(T, self.cfg.causal, self.window)


class HAHeads(Heads):
    """HyperAttention of order n = ha_order [IA Def 6.1, App. F]; for n = 3, per head:
        logit[i, j1, j2] = sum_s Q[i,s] K1[j1,s] K2[j2,s] / sqrt(dh)       (trilinear)
        A[i]             = softmax over all pairs (j1, j2) with j1 <= i and j2 <= i
        head[i]          = sum_{j1,j2} A[i, j1, j2] V1[j1] * V2[j2]         (elementwise)
    Order n: n - 1 keys, one joint softmax over (n-1)-tuples, value = product of n - 1 values.
    Our choices: the causal rule above (ordered pairs, position 0 sees only (0, 0));
    [IA]'s third value factor folds into W_O; ha_share_kv=True ties K2 = K1 and V2 = V1;
    windows restrict j1 to the last ha_window1 and j2 to the last ha_window2 positions
    (2-simplicial attention, Roy et al. 2025; for order >= 4 the slots beyond the second are
    full). Order 3 runs blockwise with an online softmax (attention_kernels/ha/): no T x T x T
    tensor. Order >= 4 uses the materialising reference.
    Dropout on the attention weights is not applied here (the kernel never forms them); the
    residual dropout after W_O is."""

    window = 0  # HA has its own windows, ha_window1 and ha_window2; attn_window is not one

    def mix(self, q, k, v, offset):  # shared keys and values: one stream (k, v of size 1) in every slot
        c = self.cfg
        return ha.attention(q.squeeze(0), k, v, offset, c.causal, c.ha_order, (c.ha_window1, c.ha_window2),
                            c.softmax, c.kernel, c.kernel_check, c.ha_form)

    def mix_flops(self, T):
        c, n = self.cfg, self.cfg.ha_order - 1
        windows = [c.ha_window1, c.ha_window2] + [0] * (n - 2)
        tuples = sum(math.prod(min(i + 1, w or T) if c.causal else T for w in windows[:n])
                     for i in range(T)) / T
        return 4 * self.dh * tuples  # logits and values: about 2 dh FLOPs each per tuple


HEADS = {'sa': SoftmaxHeads, 'linear': LinearHeads, 'hfa_v1': HFAHeads, 'hfa_v2': HFAHeads, 'ha': HAHeads}


class Attention(nn.Module):
    """One attention layer: its groups of heads (head_groups), concatenated, then W_O."""

    def __init__(self, cfg, kind):
        super().__init__()
        self.groups = nn.ModuleList(HEADS[g.kind](cfg, g) for g in head_groups(cfg, kind))
        self.c_proj = nn.Linear(cfg.n_head * cfg.dh, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, kv=None, offset=0):
        B, T, _ = x.shape
        ys = [g(x, None if kv is None else kv.setdefault(i, {}), offset) for i, g in enumerate(self.groups)]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=1)  # (B, H, T, dh); one group: no copy
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.c_proj(y))

    def mix_flops(self, T):
        return sum(g.h * g.mix_flops(T) for g in self.groups)


def make_attention(cfg, kind=None):
    """A stand-alone attention layer (B, T, n_embd) -> (B, T, n_embd), e.g. for experiments."""
    return Attention(cfg, kind or cfg.attention)


# -----------------------------------------------------------------------------
# the transformer

class MLP(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.approximate = 'tanh' if cfg.gelu == 'tanh' else 'none'

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(nn.Module):

    def __init__(self, cfg, kind):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = Attention(cfg, kind)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, kv=None, offset=0):
        x = x + self.attn(self.ln_1(x), kv, offset)
        return x + self.mlp(self.ln_2(x))


class KVCache:
    """Keys and values of the tokens seen so far, per layer and head group."""

    def __init__(self, n_layer):
        self.pos = 0
        self.layers = [{} for _ in range(n_layer)]


class GPT(nn.Module):
    activation_checkpointing = False  # train.py's setting: recompute each block in the backward

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, kind) for kind in config.layer_attentions()]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding=True):
        """Parameter count; the position embedding is left out by default, as nanoGPT
        (the token embedding is tied to lm_head, so it is counted once)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, T=None):
        """Training FLOPs (forward + backward = 3 x forward) per token at context T:
        6 per weight of every matmul (lm_head included) plus 3 x the attention mixing."""
        T = T or self.config.block_size
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        mixing = sum(block.attn.mix_flops(T) for block in self.transformer.h)
        return 6 * matmul + 3 * mixing

    def forward(self, idx, targets=None, cache=None):
        B, T = idx.shape
        offset = cache.pos if cache is not None else 0
        if offset + T > self.config.block_size:
            raise ValueError(f"sequence of length {offset + T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(offset, offset + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for i, block in enumerate(self.transformer.h):
            if self.activation_checkpointing and torch.is_grad_enabled() and cache is None:
                # keep only the block's input; its activations are recomputed in the backward
                # (with the same dropout masks: the RNG state is saved and restored)
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, None if cache is None else cache.layers[i], offset)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.pos += T
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        else:  # inference: only the last position is needed
            logits, loss = self.lm_head(x[:, [-1], :]), None
        return logits, loss

    @classmethod
    def from_pretrained(cls, name_or_folder, override_args=None):
        """GPT-2 weights from Hugging Face: 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' (from the
        Hub or its cache) or a folder written by transformers' save_pretrained. The architecture is
        the checkpoint's (softmax attention, biases, tanh GELU, its vocabulary and context); only
        dropout may be overridden, as in nanoGPT. HF's Conv1D weights are (in, out): transposed."""
        override_args = override_args or {}
        if set(override_args) - {'dropout'}:
            raise ValueError(f"only dropout can be overridden, not {', '.join(sorted(set(override_args) - {'dropout'}))}")
        if not os.path.isdir(name_or_folder):
            from nanohfa import hub
            hub.online()  # offline: transformers reads only its cache, at once, instead of retrying
        from transformers import GPT2LMHeadModel
        from transformers.utils import logging as hf_logging
        bars_were_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            hf = GPT2LMHeadModel.from_pretrained(name_or_folder)
        finally:
            if bars_were_on:
                hf_logging.enable_progress_bar()
        c = hf.config
        unsupported = {'activation_function': (c.activation_function, ('gelu_new', 'gelu_pytorch_tanh', 'gelu')),
                       'n_inner': (c.n_inner, (None, 4 * c.n_embd)),
                       'scale_attn_by_inverse_layer_idx': (c.scale_attn_by_inverse_layer_idx, (False,)),
                       'reorder_and_upcast_attn': (c.reorder_and_upcast_attn, (False,)),
                       'layer_norm_epsilon': (c.layer_norm_epsilon, (1e-5,)),
                       'tie_word_embeddings': (getattr(c, 'tie_word_embeddings', True), (True,))}
        for key, (value, ok) in unsupported.items():
            if value not in ok:
                raise ValueError(f"{name_or_folder} has {key}={value!r}, which this GPT does not implement")
        config = GPTConfig(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, block_size=c.n_positions,
                           vocab_size=c.vocab_size, bias=True, attention='sa',
                           gelu='exact' if c.activation_function == 'gelu' else 'tanh',
                           dropout=override_args.get('dropout', 0.0))
        model = cls(config)
        ours = model.state_dict()
        theirs = {k.replace('.attn.c_attn.', '.attn.groups.0.c_attn.'): v for k, v in hf.state_dict().items()
                  if not k.endswith(('.attn.bias', '.attn.masked_bias'))}  # causal-mask buffers, not weights
        if set(theirs) != set(ours):
            raise ValueError(f"{name_or_folder}: parameter names differ from GPT-2's "
                             f"({', '.join(sorted(set(theirs) ^ set(ours))[:3])} ...)")
        conv1d = ('attn.groups.0.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
        with torch.no_grad():
            for k, v in theirs.items():
                ours[k].copy_(v.t() if k.endswith(conv1d) else v)
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; weight decay on 2-D weights (matmuls, embeddings) only, not on biases and norms."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{'params': [p for p in params if p.dim() >= 2], 'weight_decay': weight_decay},
                  {'params': [p for p in params if p.dim() < 2], 'weight_decay': 0.0}]
        fused = device_type == 'cuda'
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Sample max_new_tokens continuations of idx (B, T); temperature 0 takes the most likely
        token at every step (greedy). With use_cache, keys and values
        are kept between steps while the sequence fits in block_size; past that the context
        is cropped to the last block_size tokens and recomputed, as without a cache."""
        cache = KVCache(self.config.n_layer) if use_cache else None
        for _ in range(max_new_tokens):
            if cache is not None and idx.size(1) <= self.config.block_size:
                logits, _ = self(idx[:, cache.pos:], cache=cache)
            else:
                logits, _ = self(idx[:, -self.config.block_size:])
            if temperature == 0:  # greedy: the most likely token
                idx = torch.cat((idx, logits[:, -1, :].argmax(-1, keepdim=True)), dim=1)
                continue
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('inf')
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx
