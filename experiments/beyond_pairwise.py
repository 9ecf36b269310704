"""Beyond pairwise: synthetic tasks where [IA]'s theory names the winning attention block.

[IA] Ustaomeroglu & Qu, ICML 2025, Section 5 (HyperFeatureAttention, Def 5.1) and
Section 6 (HyperAttention, Def 6.1, App. F).
The attention layers are the project's own (model.make_attention), used non-causally and
WITHOUT softmax ('linear' forms), which is the setting of [IA]'s representation results.

(a) coupled features. Entities carry two discrete features a in [Na], b in [Nb];
        y_i = sum_j f1(a_i, a_j) * f2(b_i, b_j),      f1, f2 ~ N(0, 1) tables.
    One HFA layer (A = 2 score factors) writes this exactly: factor 1 reads a, factor 2
    reads b, the value is constant. One linear SA layer has a single bilinear score
    x_i^T C x_j, which with x = emb(a) + emb(b) cannot form the product (it would need
    d = Na * Nb features). Winner by theory: HFA.

(b) three-way interactions. Tokens s in [N];
        y_i = sum_{j,k} f(s_i, s_j, s_k) * w(s_j, s_k),
    with f a random table of CP-rank r and w a random matrix of rank r (our choice: low rank,
    so that one HA head with d_h >= r represents the target exactly; a generic N^3 table needs
    CP-rank ~ N^2 / 3). SA and HFA only sum over single positions j (pairwise scores), so they
    cannot form a sum over pairs (j, k) of a non-separable function. Winner by theory: HA.

Model around the attention layer: learned embedding of the discrete features (n_embd = d),
one attention layer (1 head), linear readout d -> 1; no residual, no MLP. Parameter counts
are matched across variants through the head width (attention params = d * d_h * (streams+1)).
Training: Adam, minibatches, cosine decay. Reported: test MSE / Var(y) (relative), mean +- std
over seeds.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

from experiments.common import (RunRecord, Timer, load_results, md_table, mean_std, print_tables, run_row,
                                save_results, savefig, sci, seed_all, plt, torch_threads)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model import GPTConfig, make_attention  # noqa: E402  (the project's attention classes)

# -----------------------------------------------------------------------------
# tasks


def coupled_task(B, L, Na, Nb, tables, gen):
    f1, f2 = tables
    a = torch.randint(0, Na, (B, L), generator=gen)
    b = torch.randint(0, Nb, (B, L), generator=gen)
    y = (f1[a[:, :, None], a[:, None, :]] * f2[b[:, :, None], b[:, None, :]]).sum(-1)
    return (a, b), y


def threeway_tables(N, rank, gen):
    U, V, Z = (torch.randn(N, rank, generator=gen) for _ in range(3))
    f = torch.einsum("ir,jr,kr->ijk", U, V, Z) / rank ** 0.5
    P, Q = torch.randn(N, rank, generator=gen), torch.randn(N, rank, generator=gen)
    w = P @ Q.T / rank ** 0.5
    return f, w


def threeway_task(B, L, N, tables, gen):
    f, w = tables
    s = torch.randint(0, N, (B, L), generator=gen)
    F = f[s[:, :, None, None], s[:, None, :, None], s[:, None, None, :]]  # (B, L, L, L)
    W = w[s[:, :, None], s[:, None, :]]                                  # (B, L, L)
    y = (F * W[:, None]).sum((-1, -2))
    return (s,), y

# -----------------------------------------------------------------------------
# model


class Probe(nn.Module):
    """embed discrete features -> one attention layer from model.py -> linear readout."""

    def __init__(self, vocab_sizes, L, d, kind, head_dim):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(n, d) for n in vocab_sizes)
        cfg = GPTConfig(block_size=L, n_embd=d, n_head=1, head_dim=head_dim, attention=kind,
                        causal=False, softmax=False, bias=False, dropout=0.0)
        self.attn = make_attention(cfg)
        self.head = nn.Linear(d, 1, bias=True)

    def forward(self, feats):
        x = sum(emb(f) for emb, f in zip(self.embs, feats))
        return self.head(self.attn(x))[..., 0]

    def n_attn_params(self):
        return sum(p.numel() for p in self.attn.parameters())


def attn_streams(kind):
    """q/k/v streams per head + 1 for W_O: attention params = d * d_h * this."""
    return {"linear": 4, "hfa_v1": 6, "ha": 6}[kind]


def matched_head_dim(kind, d, base_dh, base_kind="hfa_v1"):
    return round(base_dh * attn_streams(base_kind) / attn_streams(kind))

# -----------------------------------------------------------------------------
# training


def fit(model, train, test, steps, batch, lr):
    (feats, y), (tfeats, ty) = train, test
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    g = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (batch,), generator=g)
        loss = ((model([f[idx] for f in feats]) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        rel = lambda fs, t: (((model(fs) - t) ** 2).mean() / t.var()).item()  # noqa: E731
        return rel(feats, y), rel(tfeats, ty)


def compare(task, kinds, args, make_tables, make_data, vocab_sizes):
    res = {}
    for kind in kinds:
        dh = matched_head_dim(kind, args.d, args.base_dh)
        tr, te, params, secs = [], [], None, 0.0
        for seed in range(args.seeds):
            gen = seed_all(seed)
            tables = make_tables(gen)
            train, test = make_data(args.B, tables, gen), make_data(args.B_test, tables, gen)
            model = Probe(vocab_sizes, args.L, args.d, kind, dh)
            params = model.n_attn_params()
            with Timer() as t:
                a, b = fit(model, train, test, args.steps, args.batch, args.lr)
            tr.append(a), te.append(b)
            secs += t.seconds
        res[kind] = {"head_dim": dh, "attn_params": params, "train_rel_mse": mean_std(tr),
                     "test_rel_mse": mean_std(te), "seconds": round(secs, 1)}
        m, s = res[kind]["test_rel_mse"]["mean"], res[kind]["test_rel_mse"]["std"]
        print(f"{task:8s} {kind:7s} d_h {dh:3d} attn params {params:5d}  "
              f"test MSE/Var(y) {m:.3e} +- {s:.1e}", flush=True)
    return res


def figure(results):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (task, res) in zip(axes, results.items()):
        kinds = list(res)
        means = [res[k]["test_rel_mse"]["mean"] for k in kinds]
        stds = [res[k]["test_rel_mse"]["std"] for k in kinds]
        ax.bar(kinds, means, yerr=stds, color=["C0", "C1", "C2"][:len(kinds)], capsize=4)
        ax.set_yscale("log")
        ax.set_title(f"{task}: test MSE / Var(y)")
        for i, k in enumerate(kinds):
            ax.text(i, means[i], f"{res[k]['attn_params']} p", ha="center", va="bottom", fontsize=8)
    return fig


# -----------------------------------------------------------------------------
# the table of docs/interactions.md, section 3, generated from a results.json

LABELS = {"linear": "SA (linear)", "hfa_v1": "HFA (hfa_v1, linear)", "ha": "HA (order 3, linear)"}


def tables(results):
    """{name: markdown} of section 3: the run row, and each task x attention's relative MSE (mean ± std)."""
    pm = lambda r: f"{sci(r['mean'])} ± {sci(r['std'])}"  # noqa: E731
    rows = [[task.replace("_", " "), LABELS[kind], r["head_dim"], r["attn_params"], pm(r["train_rel_mse"]),
             pm(r["test_rel_mse"]), f"{r['seconds']:.1f}"]
            for task in ("coupled_features", "three_way") for kind, r in results[task].items()]
    header = ["task", "attention", "d_h", "attention params", "train MSE / Var(y)", "test MSE / Var(y)",
              f"time, {results['config']['seeds']} seeds (s)"]
    return {"run": run_row(results, "beyond pairwise"), "tasks": md_table(header, rows)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--Na", type=int, default=4)
    p.add_argument("--Nb", type=int, default=4)
    p.add_argument("--N", type=int, default=6, help="(b) vocabulary")
    p.add_argument("--rank", type=int, default=2, help="(b) CP-rank of f, rank of w")
    p.add_argument("--L", type=int, default=8)
    p.add_argument("--L3", type=int, default=6, help="(b) sequence length")
    p.add_argument("--d", type=int, default=16, help="n_embd")
    p.add_argument("--base_dh", type=int, default=8, help="HFA/HA head width; SA gets 1.5x")
    p.add_argument("--B", type=int, default=4000)
    p.add_argument("--B_test", type=int, default=1000)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="results/beyond_pairwise")
    p.add_argument("--tables", metavar="DIR", help="print docs/interactions.md's table from DIR/results.json")
    args = p.parse_args(argv)
    if args.tables:
        print_tables(tables(load_results(args.tables)))
        return None
    if args.quick:
        # seconds, yet long enough for each task's winner to show (tests/test_interactions.py)
        args.B, args.B_test, args.steps, args.seeds, args.lr = 600, 200, 200, 2, 1e-2

    with torch_threads(1):  # tiny tensors on a shared CPU: threads only add overhead
        run = RunRecord("experiments.beyond_pairwise", argv)
        results = {**run.header(), "config": vars(args).copy(),
                   "optimiser": f"Adam lr {args.lr}, cosine decay, {args.steps} steps, batch {args.batch}",
                   "attention": "model.make_attention, n_head=1, causal=False, softmax=False, bias=False"}
        coupled = lambda B, t, g: coupled_task(B, args.L, args.Na, args.Nb, t, g)  # noqa: E731
        tabs_a = lambda g: (torch.randn(args.Na, args.Na, generator=g),        # noqa: E731
                            torch.randn(args.Nb, args.Nb, generator=g))
        results["coupled_features"] = compare("coupled", ["linear", "hfa_v1"], args, tabs_a, coupled,
                                              [args.Na, args.Nb])
        threeway = lambda B, t, g: threeway_task(B, args.L3, args.N, t, g)  # noqa: E731
        tabs_b = lambda g: threeway_tables(args.N, args.rank, g)  # noqa: E731
        L_saved, args.L = args.L, args.L3
        results["three_way"] = compare("3-way", ["linear", "hfa_v1", "ha"], args, tabs_b, threeway,
                                       [args.N])
        args.L = L_saved
        savefig(figure({k: results[k] for k in ("coupled_features", "three_way")}), args.out,
                "ia_beyond_pairwise.png", run=run)
        results.update(run.stamp())
        save_results(args.out, results)
        return results


if __name__ == "__main__":
    main()
