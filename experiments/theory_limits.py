"""Where the theory's guarantees stop: non-versatile data and the genotype-phenotype task.

[IA] Ustaomeroglu & Qu, ICML 2025: Section 4 (versatility), App. B.2 (genotype-phenotype).
Model throughout: one linear self-attention layer over one-hot tokens,
y_hat_i = sum_j Ct[s_i, s_j] Wt[s_j] = sum_j M[s_i, s_j]  (see colliding_agents.py).

(a) Versatility. Linear SA is linear in M, and for an element mu the data constrain the row
M[mu, :] only through the count vectors c(seq) of the sequences that contain mu. [IA] needs
these to span R^N ("versatile"). If every training sequence holds the SAME multiset S, each row
sees one count vector, so there is a large null space: two parameter sets can both fit the
training set exactly and still disagree on held-out sequences. We show it twice:
  - algebraically: the min-norm least-squares M, and min-norm + a null-space direction;
  - by training: two (C, W_V) trained from different initialisations to zero train error.
The target is a generic pairwise interaction y_i = sum_j F[s_i, s_j], F ~ N(0, 1) (N x N),
which one linear SA layer represents exactly (C = F, W_V = 1). The control uses random
multisets (uniform with replacement): both solutions then agree on held-out data.

(b) Genotype-phenotype ([IA] App. B.2; [IA] does not give the exact target, so ours is):
  - N alleles; a sequence is L DISTINCT alleles (each allele at most once), uniform;
  - a random activation dictionary D: allele mu has a list D(mu) of 1..k_max other alleles, or
    an empty list (n_always of them) meaning "always active";
  - target per position: y_i = 1 if D(s_i) is empty or some allele of D(s_i) is in the
    sequence, else 0.
Models, trained either at one length L_train ('fixed') or on a range of lengths ('range'),
and tested at lengths 2..16:
  - 'linear_sa':      y_hat = (X C X^T) X W_V,                     W_V: N x 1
  - 'linear_sa_relu': y_hat = a^T ReLU((X C X^T) X W_V + b) + a0,  W_V: N x m (a ReLU dense layer)
Why linear SA fails: with alleles at most once and fixed length, every count vector c has
c_mu = 1 and sum(c) = L_train, so the row M[mu, :] is only known up to t (1 - L_train e_mu).
An always-active allele needs sum_j M[mu, s_j] = 1 at every length; the fitted row mixes
e_mu (right) with 1 / L_train (wrong elsewhere). Training on a range of lengths removes that
null direction. "Any of k >= 2 activators" is not linear in the counts, so linear SA cannot fit
it at any length; the ReLU layer can represent it exactly (min(1, n) = ReLU(n) - ReLU(n - 1)).
"""
import argparse
import json
import os

import torch

from experiments.colliding_agents import LinearSA, train
from experiments.common import (RunRecord, Timer, load_results, md_table, mean_std, print_tables, run_row,
                                save_results, savefig, sci, seed_all, plt, torch_threads)

# -----------------------------------------------------------------------------
# (a) non-versatile data


def pairwise_target(s, F):
    return F[s[:, :, None], s[:, None, :]].sum(-1)


def design(s, N):
    """Phi[(b, i), s_i * N + nu] = count of nu in sequence b: y_hat = Phi @ vec(M)."""
    B, L = s.shape
    counts = torch.zeros(B, N, dtype=torch.float64).scatter_add_(
        1, s, torch.ones(B, L, dtype=torch.float64))
    Phi = torch.zeros(B * L, N * N, dtype=torch.float64)
    rows = torch.arange(B * L)
    cols = s.reshape(-1, 1) * N + torch.arange(N)
    Phi[rows[:, None], cols] = counts.repeat_interleave(L, dim=0)
    return Phi


def fixed_multiset_data(B, S, gen):
    """Every sequence is a shuffle of the same multiset S."""
    S = torch.as_tensor(S)
    return torch.stack([S[torch.randperm(len(S), generator=gen)] for _ in range(B)])


def versatility(args, gen):
    N, L = args.N_a, args.L_a
    F = torch.randn(N, N, generator=gen, dtype=torch.float64)
    test_s = torch.randint(0, N, (args.B_test, L), generator=gen)
    test_y = pairwise_target(test_s, F)
    S = torch.randint(0, N, (L,), generator=gen)  # one multiset for the whole training set
    sets = {"same_multiset": fixed_multiset_data(args.B_a, S, gen),
            "random_multisets": torch.randint(0, N, (args.B_a, L), generator=gen)}
    out = {"multiset": S.tolist()}
    for name, s in sets.items():
        y = pairwise_target(s, F)
        # algebra: min-norm solution, then add a unit null-space direction of the design
        Phi = design(s, N)
        M0 = torch.linalg.pinv(Phi) @ y.reshape(-1)
        _, sv, Vh = torch.linalg.svd(Phi, full_matrices=True)
        rank = int((sv > 1e-8 * sv[0]).sum())
        null = Vh[rank:]  # basis of the null space (empty if versatile)
        M1 = M0 + (null[0] * args.null_scale if len(null) else 0)
        alg = {}
        for tag, M in [("min_norm", M0), ("min_norm_plus_null", M1)]:
            pred_tr = (Phi @ M).reshape(y.shape)
            pred_te = (design(test_s, N) @ M).reshape(test_y.shape)
            alg[tag] = {"train_mse": ((pred_tr - y) ** 2).mean().item(),
                        "test_mse": ((pred_te - test_y) ** 2).mean().item()}
        # training: two inits, same data, same optimiser
        models = []
        for k in range(2):
            m = LinearSA(torch.eye(N, dtype=torch.float64))
            if k == 1:  # a second, randomly perturbed theory-style init
                with torch.no_grad():
                    m.C.add_(args.init_scale * torch.randn(N, N, generator=gen, dtype=torch.float64))
            train(m, s, y, args.steps_a)
            models.append(m)
        with torch.no_grad():
            tr = [((m(s) - y) ** 2).mean().item() for m in models]
            te = [((m(test_s) - test_y) ** 2).mean().item() for m in models]
            gap = ((models[0](test_s) - models[1](test_s)) ** 2).mean().item()
        out[name] = {"design_rank": rank, "n_params_M": N * N, "null_dim": N * N - rank,
                     "algebraic": alg,
                     "trained": {"train_mse": tr, "test_mse": te, "heldout_disagreement_msd": gap}}
        print(f"(a) {name:17s} rank {rank}/{N * N}  trained: train {tr[0]:.1e},{tr[1]:.1e} "
              f"test {te[0]:.2e},{te[1]:.2e}  disagreement {gap:.2e}", flush=True)
    out["target_var_test"] = test_y.var().item()
    return out

# -----------------------------------------------------------------------------
# (b) genotype-phenotype


def activation_dictionary(N, n_always, k_max, gen):
    """D[mu] = list of activators of mu (never mu itself); the first n_always lists are empty."""
    D = []
    for mu in range(N):
        if mu < n_always:
            D.append([])
            continue
        k = int(torch.randint(1, k_max + 1, (1,), generator=gen))
        others = torch.tensor([a for a in range(N) if a != mu])
        D.append(others[torch.randperm(N - 1, generator=gen)[:k]].tolist())
    return D


def genotype_data(B, L, N, D, gen):
    s = torch.stack([torch.randperm(N, generator=gen)[:L] for _ in range(B)])
    present = torch.zeros(B, N, dtype=torch.bool).scatter_(1, s, True)
    A = torch.zeros(N, N, dtype=torch.bool)  # A[mu, nu]: nu activates mu
    for mu, acts in enumerate(D):
        A[mu, acts] = True
    always = torch.tensor([len(acts) == 0 for acts in D])
    active = always[None, :] | (present.double() @ A.double().T > 0)  # (B, N): is mu active
    y = torch.gather(active, 1, s).double()
    return s, y


class LinearSAReLU(torch.nn.Module):
    """y_hat = a^T ReLU((X C X^T) X W_V + b) + a0, one-hot X: linear SA then a ReLU dense layer.
    Init: C small, W_V ~ 1, biases b > 0 so that every unit starts alive (h = 0 at C = 0)."""

    def __init__(self, N, m, gen):
        super().__init__()
        dt = torch.float64
        self.C = torch.nn.Parameter(0.01 * torch.randn(N, N, generator=gen, dtype=dt))
        self.W = torch.nn.Parameter(1 + 0.1 * torch.randn(N, m, generator=gen, dtype=dt))
        self.b = torch.nn.Parameter(0.1 + torch.rand(m, generator=gen, dtype=dt))
        self.a = torch.nn.Parameter(torch.randn(m, generator=gen, dtype=dt) / m ** 0.5)
        self.a0 = torch.nn.Parameter(torch.zeros((), dtype=dt))

    def forward(self, s):
        A = self.C[s[:, :, None], s[:, None, :]]           # (B, L, L) gather trick, P = I
        h = A @ self.W[s]                                    # (B, L, m)
        return torch.relu(h + self.b) @ self.a + self.a0


def group_loss(model, groups):
    """MSE over all tokens of a list of (s, y) groups, one group per sequence length."""
    n = sum(y.numel() for _, y in groups)
    return sum(((model(s) - y) ** 2).sum() for s, y in groups) / n


def fit_groups(model, groups, steps, optim, lr=0.01):
    if optim == "lbfgs":
        opt = torch.optim.LBFGS(model.parameters(), max_iter=steps, history_size=50,
                                line_search_fn="strong_wolfe", tolerance_grad=1e-14,
                                tolerance_change=1e-16)

        def closure():
            opt.zero_grad()
            loss = group_loss(model, groups)
            loss.backward()
            return loss
        opt.step(closure)
        return
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        loss = group_loss(model, groups)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


@torch.no_grad()
def split_mse(model, groups, n_always):
    """MSE over all tokens, over always-active alleles' tokens, and over the others."""
    err = torch.cat([((model(s) - y) ** 2).reshape(-1) for s, y in groups])
    always = torch.cat([(s < n_always).reshape(-1) for s, _ in groups])
    return {"all": err.mean().item(),
            "always_active": err[always].mean().item() if always.any() else None,
            "others": err[~always].mean().item()}


def run_genotype(args, n_always, regime_lengths, gen):
    """One seed: a fresh dictionary, data and inits; both models, both regimes."""
    N, lengths = args.N_b, [int(x) for x in args.test_lengths_b.split(",")]
    D = activation_dictionary(N, n_always, args.k_max, gen)
    tests = {L: [genotype_data(args.B_test, L, N, D, gen)] for L in lengths}
    out = {}
    for regime, Ls in regime_lengths.items():
        groups = [genotype_data(args.B_b // len(Ls), L, N, D, gen) for L in Ls]
        for name in ("linear_sa", "linear_sa_relu"):
            with Timer() as t:
                if name == "linear_sa":
                    model = LinearSA(torch.eye(N, dtype=torch.float64))
                    fit_groups(model, groups, args.steps_b_lbfgs, "lbfgs")
                else:
                    model = LinearSAReLU(N, args.hidden, gen)
                    fit_groups(model, groups, args.steps_b_adam, "adam", args.lr_b)
            out[regime, name] = {"train": split_mse(model, groups, n_always),
                                 "test": {str(L): split_mse(model, tests[L], n_always)
                                          for L in lengths},
                                 "seconds": t.seconds, "dictionary": D}
    return out


def aggregate(rs, Ls):
    """Mean (and std) over seeds of each split of each length."""
    def stat(get):
        vals = [get(r) for r in rs]
        return (None, None) if vals[0] is None else (mean_std(vals)["mean"], mean_std(vals)["std"])
    agg = {"train_lengths": Ls, "seconds": round(sum(r["seconds"] for r in rs), 1),
           "train": {}, "test": {}, "per_seed": rs}
    for split in ("all", "always_active", "others"):
        agg["train"][split], agg["train"][split + "_std"] = stat(lambda r: r["train"][split])
    for L in rs[0]["test"]:
        agg["test"][L] = {}
        for split in ("all", "always_active", "others"):
            m, sd = stat(lambda r: r["test"][L][split])
            agg["test"][L][split], agg["test"][L][split + "_std"] = m, sd
    return agg


def genotype(args, gen):
    """Two dictionaries (with / without always-active alleles) x two training-length regimes
    (one fixed length / a range of lengths) x two models, each over seeds_b seeds."""
    regimes = {"fixed": [args.L_b], "range": [int(x) for x in args.L_b_range.split(",")]}
    out = {}
    for n_always in (0, args.n_always):
        per_seed = [run_genotype(args, n_always, regimes, torch.Generator().manual_seed(100 + k))
                    for k in range(args.seeds_b)]
        res = {"regimes": {}}
        for regime, Ls in regimes.items():
            res["regimes"][regime] = {}
            for name in ("linear_sa", "linear_sa_relu"):
                r = aggregate([ps[regime, name] for ps in per_seed], Ls)
                res["regimes"][regime][name] = r
                print(f"(b) always-active={n_always} train L={regime:5s} {name:15s} "
                      f"train {r['train']['all']:.1e} test "
                      + " ".join(f"L{L}:{v['all']:.1e}" for L, v in r["test"].items()), flush=True)
        out[f"n_always_{n_always}"] = res
    return out


def figure(gp, args):
    keys = list(gp)
    regimes = list(gp[keys[0]]["regimes"])
    fig, axes = plt.subplots(len(regimes), len(keys), figsize=(11, 7), sharey=True, squeeze=False)
    for col, key in enumerate(keys):
        for row, regime in enumerate(regimes):
            ax = axes[row, col]
            for i, (name, r) in enumerate(gp[key]["regimes"][regime].items()):
                Ls = [int(L) for L in r["test"]]
                m = [max(v["all"], 1e-12) for v in r["test"].values()]
                low = [min(v["all_std"], 0.9 * x) for v, x in zip(r["test"].values(), m)]
                ax.errorbar(Ls, m, yerr=[low, [v["all_std"] for v in r["test"].values()]],
                            fmt="o-", color=f"C{i}", label=name, capsize=3)
                if r["test"][str(Ls[0])]["always_active"] is not None:
                    ax.semilogy(Ls, [max(v["always_active"], 1e-16) for v in r["test"].values()],
                                "x--", color=f"C{i}", label=f"{name} (always-active tokens)")
            for L in r["train_lengths"]:
                ax.axvline(L, color="gray", lw=0.6)
            ax.set_yscale("log")
            ax.set_title(f"{key.replace('_', ' ')}, train lengths {regime}", fontsize=10)
            ax.legend(fontsize=7)
        axes[-1, col].set_xlabel("test length L (grey: training lengths)")
    for row in range(len(regimes)):
        axes[row, 0].set_ylabel("test MSE")
    return fig


# -----------------------------------------------------------------------------
# the tables of docs/interactions.md, section 2, generated from a results.json


def tables(results):
    """{name: markdown} of section 2: the run row; (a) the versatility table with Var(y) and the
    multiset; (b) test MSE over all tokens, and over the always-active alleles' tokens."""
    v = results["versatility"]
    rows = []
    for key in ("same_multiset", "random_multisets"):
        r = v[key]
        t, alg = r["trained"], r["algebraic"]
        rows.append([key.replace("_", " "), f"{r['design_rank']} / {r['n_params_M']}",
                     ", ".join(map(sci, t["train_mse"])), ", ".join(map(sci, t["test_mse"])),
                     sci(t["heldout_disagreement_msd"]),
                     f"{sci(alg['min_norm']['train_mse'])} / {sci(alg['min_norm']['test_mse'])}",
                     f"{sci(alg['min_norm_plus_null']['train_mse'])} / {sci(alg['min_norm_plus_null']['test_mse'])}"])
    versatility = md_table(["training data", "rank of design / N^2", "train MSE (init 1, init 2)",
                            "test MSE (init 1, init 2)", "held-out disagreement (MSD)", "min-norm M: train / test",
                            "min-norm + null: train / test"], rows)
    versatility += f"\n\nVar(y) on held-out data: {v['target_var_test']:.2f}; the multiset: {v['multiset']}."

    gp = results["genotype_phenotype"]
    first = next(iter(gp.values()))["regimes"]
    lengths = list(next(iter(first["fixed"].values()))["test"])
    span = lambda r: f"{min(r['train_lengths'])}-{max(r['train_lengths'])}"  # noqa: E731
    all_rows, always_rows = [], []
    for key, res in gp.items():
        n_always = int(key.rsplit("_", 1)[1])
        for regime, models in res["regimes"].items():
            for name, r in models.items():
                all_rows.append([n_always, f"{regime} {span(r)}", name, sci(r["train"]["all"])]
                                + [sci(r["test"][L]["all"]) for L in lengths])
                if n_always:
                    always_rows.append([f"{regime} {span(r)}", name]
                                       + [f"{sci(r['test'][L]['always_active'])} ± {sci(r['test'][L]['always_active_std'])}"
                                          for L in lengths])
    Ls = [f"L={L}" for L in lengths]
    return {"run": run_row(results, "theory limits"),
            "versatility": versatility,
            "genotype_all_tokens": md_table(["always-active alleles", "train lengths", "model", "train MSE"] + Ls, all_rows),
            "genotype_always_active": md_table(["train lengths", "model"] + Ls, always_rows)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--N_a", type=int, default=12, help="(a) vocabulary size")
    p.add_argument("--L_a", type=int, default=6)
    p.add_argument("--B_a", type=int, default=300)
    p.add_argument("--steps_a", type=int, default=300)
    p.add_argument("--init_scale", type=float, default=0.5, help="(a) C(0) noise of the 2nd model")
    p.add_argument("--null_scale", type=float, default=3.0, help="(a) size of the null direction")
    p.add_argument("--N_b", type=int, default=24, help="(b) number of alleles")
    p.add_argument("--L_b", type=int, default=6, help="(b) the fixed training length")
    p.add_argument("--L_b_range", default="3,4,5,6,7,8", help="(b) the ranged training lengths")
    p.add_argument("--B_b", type=int, default=2000)
    p.add_argument("--test_lengths_b", default="2,3,4,6,8,10,12,16")
    p.add_argument("--n_always", type=int, default=2)
    p.add_argument("--k_max", type=int, default=2, help="(b) activators per allele: 1..k_max")
    p.add_argument("--hidden", type=int, default=16, help="(b) ReLU units")
    p.add_argument("--steps_b_lbfgs", type=int, default=300)
    p.add_argument("--steps_b_adam", type=int, default=1500)
    p.add_argument("--lr_b", type=float, default=0.02)
    p.add_argument("--seeds_b", type=int, default=3, help="(b) seeds (dictionary, data, init)")
    p.add_argument("--B_test", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--replot", action="store_true", help="redraw the figure from OUT/results.json")
    p.add_argument("--out", default="results/theory_limits")
    p.add_argument("--tables", metavar="DIR", help="print docs/interactions.md's tables from DIR/results.json")
    args = p.parse_args(argv)
    if args.tables:
        print_tables(tables(load_results(args.tables)))
        return None
    if args.replot:
        with open(os.path.join(args.out, "results.json")) as f:
            results = json.load(f)
        args.L_b = results["config"]["L_b"]
        savefig(figure(results["genotype_phenotype"], args), args.out, "ia_genotype_phenotype.png",
                run=RunRecord.of(results))  # the same numbers: the figure keeps the run's command and id
        return results
    if args.quick:
        args.N_a, args.L_a, args.B_a, args.steps_a = 6, 3, 60, 80
        args.N_b, args.L_b, args.B_b, args.B_test = 10, 4, 200, 100
        args.test_lengths_b, args.steps_b_lbfgs, args.steps_b_adam = "2,4,6", 30, 60
        args.L_b_range, args.seeds_b = "3,4", 1
    with torch_threads(1):  # tiny tensors on a shared CPU: threads only add overhead
        run = RunRecord("experiments.theory_limits", argv)
        gen = seed_all(args.seed)
        results = {**run.header(), "config": vars(args).copy(),
                   "optimiser": "linear SA: full-batch L-BFGS (strong Wolfe), C(0)=0, W_V(0)=1; "
                                "ReLU model: full-batch Adam, cosine decay",
                   "versatility": versatility(args, gen)}
        gp = genotype(args, gen)
        results["genotype_phenotype"] = gp
        savefig(figure(gp, args), args.out, "ia_genotype_phenotype.png", run=run)
        results.update(run.stamp())
        save_results(args.out, results)
        return results


if __name__ == "__main__":
    main()
