"""Colliding agents on a ring: one linear self-attention layer learns a pairwise interaction.

[IA] Ustaomeroglu & Qu, ICML 2025, Section 7.1 (and App. B).

Data. A ring of N positions; a sequence holds L agents at positions n_1..n_L drawn
uniformly WITH replacement (our choice). Each agent is a disc of radius R, and its target
counts the agents it collides with, itself included (a constant -1 bias):

    y_i = - sum_{j=1..L} 1{ ringdist(n_i, n_j) <= 2R },   ringdist(a, b) = min(|a-b|, N-|a-b|)

Model. One linear self-attention layer, d = N, scalar output, no softmax, no mask:

    y_hat = (X C X^T) X W_V,        X = [x(n_1); ...; x(n_L)]  (L x N),  C: N x N,  W_V: N x 1

so y_hat_i = sum_j Ct[n_i, n_j] Wt[n_j] with Ct = P C P^T, Wt = P W_V (P: rows x(n)).
Computation trick (a change of basis, as [IA] Cor. B.3): for P P^T proportional to I, X C X^T = (P C P^T)[s][:, s]:
form the N x N matrix once per step and gather, instead of L x N products per sequence.
Gradients still reach C itself, so in the sinusoidal basis the learned C is C, not Ct.

Embeddings: one-hot (P = I) and sinusoidal
    p(n) = [1/sqrt2, sin(2 pi k n/N), cos(2 pi k n/N) for k = 1..N/2-1, cos(pi n)/sqrt2],
    p(m).p(n) = (N/2) delta_mn.

Devised ("hand-built") solutions that are exact:
    one-hot:    W_V = -1,  C[m, n] = 1{ringdist(m, n) <= 2R}
    sinusoidal: W_V = [-sqrt2, 0, ..., 0], C diagonal, C_00 = (4/N)(2R + 1/2),
                C_mumu = (2/N) sin((2 pi/N)(2R + 1/2) k) / sin((pi/N) k),  k = ceil(mu/2).

Functional equivalence [IA Cor. 4.9]: Ct[mu, nu] * Wt[nu] (elementwise) is the same for every
parameter set that generalises; we compare learned vs devised by their mean squared difference.

Initialisations: 'theory' C(0) = 0 and W_V(0) such that Wt(0) = x(n)^T W_V(0) = w0 > 0 for
every n (W_V = w0 * 1 for one-hot, w0 * sqrt2 * e_0 for sinusoidal); 'normal' all entries N(0,1).

Optimiser (our choice, recorded in results.json): full-batch L-BFGS with strong-Wolfe line
search on C and W_V together, float64. The loss is quadratic in C for fixed W_V, so a
quasi-Newton method converges far faster than Adam (one-hot, theory init: 1000 full-batch Adam steps
end at train MSE 4.1e-5, 200 L-BFGS iterations at 7.4e-11; results/colliding_agents_adam and
results/colliding_agents). Adam with cosine decay is available via --optim adam for comparison.
"""
import argparse
import math

import torch

from experiments.common import (RunRecord, Timer, load_results, md_table, print_tables, run_row, save_results,
                                savefig, sci, seed_all, plt, torch_threads)

# -----------------------------------------------------------------------------
# data


def ringdist(a, b, N):
    d = (a - b).abs() % N
    return torch.minimum(d, N - d)


def collision_matrix(N, R):
    """D[m, n] = 1{ringdist(m, n) <= 2R}: which ring positions collide."""
    n = torch.arange(N)
    return (ringdist(n[:, None], n[None, :], N) <= 2 * R).double()


def make_data(B, L, N, R, gen):
    """B sequences of L agent positions (uniform, with replacement) and their targets y (B, L)."""
    s = torch.randint(0, N, (B, L), generator=gen)
    D = collision_matrix(N, R)
    y = -D[s[:, :, None], s[:, None, :]].sum(-1)
    return s, y


# -----------------------------------------------------------------------------
# embeddings and the devised solutions


def embedding(N, kind):
    """Rows are x(n). one-hot: P P^T = I; sinusoidal: P P^T = (N/2) I."""
    if kind == "onehot":
        return torch.eye(N, dtype=torch.float64)
    assert kind == "sinusoidal" and N % 2 == 0, "sinusoidal embedding needs even N"
    n = torch.arange(N, dtype=torch.float64)
    cols = [torch.full((N,), 1 / math.sqrt(2), dtype=torch.float64)]
    for k in range(1, N // 2):
        cols += [torch.sin(2 * math.pi * k * n / N), torch.cos(2 * math.pi * k * n / N)]
    cols.append(torch.cos(math.pi * n) / math.sqrt(2))
    return torch.stack(cols, dim=1)


def devised(N, R, kind):
    """Hand-built (C, W_V) that reproduce the target exactly."""
    if kind == "onehot":
        return collision_matrix(N, R), -torch.ones(N, 1, dtype=torch.float64)
    a = 2 * R + 0.5
    diag = torch.empty(N, dtype=torch.float64)
    diag[0] = 4 / N * a
    for mu in range(1, N):
        k = math.ceil(mu / 2)
        diag[mu] = 2 / N * math.sin(2 * math.pi / N * a * k) / math.sin(math.pi / N * k)
    W = torch.zeros(N, 1, dtype=torch.float64)
    W[0] = -math.sqrt(2)
    return torch.diag(diag), W


# -----------------------------------------------------------------------------
# the model: one linear self-attention layer with d = N and scalar output


class LinearSA(torch.nn.Module):
    def __init__(self, P, init="theory", w0=1.0, gen=None):
        super().__init__()
        N = P.shape[0]
        self.register_buffer("P", P)
        if init == "theory":
            C = torch.zeros(N, N, dtype=P.dtype)
            # W_V with P W_V = w0 * 1, valid because P P^T = alpha I
            alpha = (P[0] @ P[0]).item()
            W = P.T @ torch.full((N, 1), w0, dtype=P.dtype) / alpha
        elif init == "normal":
            C = torch.randn(N, N, generator=gen, dtype=P.dtype)
            W = torch.randn(N, 1, generator=gen, dtype=P.dtype)
        else:
            raise ValueError(init)
        self.C = torch.nn.Parameter(C)
        self.W = torch.nn.Parameter(W)

    def effective(self):
        """Ct = P C P^T and Wt = P W_V: the parameters as functions of positions."""
        return self.P @ self.C @ self.P.T, (self.P @ self.W)[:, 0]

    def interaction(self):
        """M[mu, nu] = Ct[mu, nu] * Wt[nu]: what every generalising solution shares."""
        Ct, Wt = self.effective()
        return Ct * Wt[None, :]

    def forward(self, s, flat_idx=None):
        """Gather trick: y_hat_i = sum_j M[s_i, s_j]. flat_idx = s_i * N + s_j may be cached."""
        if flat_idx is None:
            flat_idx = pair_index(s, self.P.shape[0])
        return self.interaction().reshape(-1)[flat_idx].sum(-1)

    def forward_dense(self, s):
        """The literal formula (X C X^T) X W_V, for checking the trick."""
        X = self.P[s]
        return ((X @ self.C @ X.transpose(1, 2)) @ X @ self.W)[..., 0]


def pair_index(s, N):
    return s[:, :, None] * N + s[:, None, :]


def set_params(model, C, W):
    with torch.no_grad():
        model.C.copy_(C)
        model.W.copy_(W)
    return model


# -----------------------------------------------------------------------------
# training


def train(model, s, y, steps, optim="lbfgs", lr=0.05, log_every=50):
    """Full-batch training of C and W_V on MSE; returns the loss history [(step, mse)]."""
    idx = pair_index(s, model.P.shape[0])
    history = []
    if optim == "lbfgs":
        opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=steps, history_size=50,
                                line_search_fn="strong_wolfe", tolerance_grad=1e-14,
                                tolerance_change=1e-16)
        evals = [0]

        def closure():
            opt.zero_grad()
            loss = ((model(s, idx) - y) ** 2).mean()
            loss.backward()
            if evals[0] % log_every == 0:
                history.append((evals[0], loss.item()))
            evals[0] += 1
            return loss
        opt.step(closure)
        history.append((evals[0], mse(model, s, y, idx)))
        return history
    assert optim == "adam"
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for step in range(steps):
        loss = ((model(s, idx) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % log_every == 0:
            history.append((step, loss.item()))
    history.append((steps, mse(model, s, y, idx)))
    return history


@torch.no_grad()
def mse(model, s, y, idx=None):
    return ((model(s, idx) - y) ** 2).mean().item()


@torch.no_grad()
def equivalence_gap(model, N, R, kind):
    """Mean squared difference between learned and devised Ct * Wt."""
    ref = set_params(LinearSA(model.P), *devised(N, R, kind)).interaction()
    return ((model.interaction() - ref) ** 2).mean().item()


# -----------------------------------------------------------------------------
# one run and its figure


def run_one(args, kind, init, gen, data, tests):
    P = embedding(args.N, kind)
    model = LinearSA(P, init=init, w0=args.w0, gen=gen)
    s, y = data
    with Timer() as t:
        hist = train(model, s, y, args.steps, optim=args.optim, lr=args.lr)
    res = {
        "embedding": kind, "init": init, "train_seconds": round(t.seconds, 2),
        "train_mse": mse(model, s, y),
        "test_mse": {str(L): mse(model, *tests[L]) for L in tests},
        "equivalence_msd": equivalence_gap(model, args.N, args.R, kind),
        "loss_history": hist,
    }
    return model, res


def figure(model, kind, args):
    """Devised C, learned C, devised Ct*Wt, learned Ct*Wt (cf. [IA] Fig. 2-3); each devised/learned
    pair shares one colour scale, so the two panels compare by eye."""
    ref = set_params(LinearSA(model.P), *devised(args.N, args.R, kind))
    # the sinusoidal C is diagonal with small entries: zoom in so the structure is visible
    k = args.N if kind == "onehot" else min(args.N, 40)
    zoom = "" if k == args.N else f" [:{k}, :{k}]"
    coord = "ring position" if kind == "onehot" else "embedding coordinate"
    pairs = [((f"devised C{zoom}", ref.C[:k, :k]), (f"learned C{zoom}", model.C[:k, :k]), (coord, coord)),
             (("devised Ct*Wt", ref.interaction()), ("learned Ct*Wt", model.interaction()),
              ("position of agent i", "position of agent j"))]
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.6), layout="constrained")
    for p, (a, b, (rows, cols)) in enumerate(pairs):
        mats = [a[1].detach().numpy(), b[1].detach().numpy()]
        v = max(abs(m).max() for m in mats)
        for ax, (title, _), A in zip(axes[2 * p:2 * p + 2], (a, b), mats):
            im = ax.imshow(A, cmap="RdBu_r", vmin=-v, vmax=v)
            ax.set(title=f"{kind}: {title}", xlabel=f"{cols} (column)", ylabel=f"{rows} (row)")
        fig.colorbar(im, ax=list(axes[2 * p:2 * p + 2]), shrink=0.8, label="one scale for both panels")
    return fig


def length_figure(results):
    """The headline: test MSE against the test length L, for every run (all trained at one L)."""
    cfg = results["config"]
    fig, ax = plt.subplots(figsize=(6.6, 4.3))
    for run in results["runs"]:
        lengths = sorted(run["test_mse"], key=int)
        ax.plot([int(L) for L in lengths], [run["test_mse"][L] for L in lengths],
                "-" if run["init"] == "theory" else "--", marker="o", ms=4,
                label=f"{run['embedding']}, {run['init']} init")
    ax.axhline(1e-7, color="k", lw=0.8, ls="-.", label="[IA] reported, ~1e-7")
    ax.axvline(cfg["L"], color="grey", lw=0.8, ls=":")
    ax.text(cfg["L"], 0.5, f" trained at L = {cfg['L']}", color="grey", fontsize=8,
            transform=ax.get_xaxis_transform())
    ax.set(yscale="log", xlabel="test sequence length L (agents)", ylabel="test MSE",
           title=f"Length generalisation, colliding agents (N = {cfg['N']}, R = {cfg['R']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -----------------------------------------------------------------------------
# the tables of docs/interactions.md, section 1, generated from a results.json


# what [IA] reports (captions; the main text says 1e-4 for the equivalence), beside our runs
REPORTED = ("*reported [IA]*", "theory", "-> 0", "~1e-7", "~1e-5 (1e-4 in text)", "< 600 (target)")


def tables(results):
    """{name: markdown} of section 1: the run row, and the runs' table (train and test MSE at every
    test length, the Ct*Wt difference, train time) with [IA]'s reported row, Var(y), the optimiser."""
    runs = results["runs"]
    lengths = sorted(runs[0]["test_mse"], key=int)
    header = ["embedding", "init", "train MSE"] + [f"test L={L}" for L in lengths] + ["Ct*Wt MSD", "train time (s)"]
    rows = [[r["embedding"], r["init"], sci(r["train_mse"])] + [sci(r["test_mse"][L]) for L in lengths]
            + [sci(r["equivalence_msd"]), f"{r['train_seconds']:.0f}"] for r in runs]
    name, init, train, test, msd, time = REPORTED
    rows.append([name, init, train] + [test] * len(lengths) + [msd, time])
    label = "colliding agents" + (f", {results['config']['optim']}" if results["config"]["optim"] != "lbfgs" else "")
    return {"run": run_row(results, label),
            "runs": md_table(header, rows) + f"\n\nVar(y) on the training set: {results['target_var']:.2f}. "
                                              f"Optimiser: {results['optimiser']}."}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--N", type=int, default=360)
    p.add_argument("--R", type=int, default=5)
    p.add_argument("--L", type=int, default=20)
    p.add_argument("--B", type=int, default=20000, help="training sequences (full batch)")
    p.add_argument("--B_test", type=int, default=2000)
    p.add_argument("--test_lengths", default="2,5,10,20,30,40")
    p.add_argument("--steps", type=int, default=200, help="L-BFGS iterations or Adam steps")
    p.add_argument("--optim", default="lbfgs", choices=["lbfgs", "adam"])
    p.add_argument("--lr", type=float, default=0.05, help="Adam only (cosine decay)")
    p.add_argument("--w0", type=float, default=1.0, help="theory init: x(n)^T W_V(0) = w0")
    p.add_argument("--embeddings", default="onehot,sinusoidal")
    p.add_argument("--inits", default="theory,normal")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave default)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds")
    p.add_argument("--out", default="results/colliding_agents")
    p.add_argument("--tables", metavar="DIR", help="print docs/interactions.md's tables from DIR/results.json")
    args = p.parse_args(argv)
    if args.tables:
        print_tables(tables(load_results(args.tables)))
        return None
    if args.quick:
        args.N, args.R, args.L, args.B, args.B_test, args.steps = 24, 1, 6, 600, 200, 60
    with torch_threads(args.threads):
        run = RunRecord("experiments.colliding_agents", argv)
        gen = seed_all(args.seed)
        data = make_data(args.B, args.L, args.N, args.R, gen)
        lengths = [int(x) for x in args.test_lengths.split(",")]
        tests = {L: make_data(args.B_test, L, args.N, args.R, gen) for L in lengths}
        results = {**run.header(), "config": vars(args).copy(),
                   "optimiser": (f"full-batch L-BFGS (strong Wolfe, history 50), {args.steps} iterations, float64"
                                 if args.optim == "lbfgs" else
                                 f"full-batch Adam lr {args.lr}, cosine decay, {args.steps} steps, float64"),
                   "target_var": data[1].var().item(), "runs": []}
        for kind in args.embeddings.split(","):
            for init in args.inits.split(","):
                model, res = run_one(args, kind, init, gen, data, tests)
                results["runs"].append(res)
                print(f"{kind:10s} {init:6s} train {res['train_mse']:.2e} "
                      f"test {' '.join(f'L{L}:{v:.1e}' for L, v in res['test_mse'].items())} "
                      f"equiv {res['equivalence_msd']:.2e} ({res['train_seconds']} s)", flush=True)
                if init == "theory":
                    savefig(figure(model, kind, args), args.out, f"ia_colliding_{kind}.png", run=run)
                save_results(args.out, results)  # after every run: long jobs keep partial results
        savefig(length_figure(results), args.out, "ia_colliding_length.png", run=run)
        results.update(run.stamp())
        save_results(args.out, results)
        return results


if __name__ == "__main__":
    main()
