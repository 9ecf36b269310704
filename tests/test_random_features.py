"""Tests for experiments/random_features.py (our reconstruction of [RF])."""

import json
import math

import numpy as np
import pytest
import torch

_dtype = torch.get_default_dtype()
from experiments import random_features as rf  # noqa: E402  (sets float64 as the default dtype)

torch.set_default_dtype(_dtype)  # ...which must not reach the other test modules


@pytest.fixture(autouse=True, scope='module')
def float64_default():
    """The experiment runs in float64; only this module's tests see that default."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _inputs(n=5, N=3, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0, X = rf.sample_inputs(n, N, d, g)
    return x0, X, g


def test_inputs_on_unit_sphere():
    x0, X, _ = _inputs()
    assert torch.allclose(x0.norm(dim=-1), torch.ones(5))
    assert torch.allclose(X.norm(dim=-1), torch.ones(5, 3))


def test_rfa_features_match_loops():
    x0, X, g = _inputs()
    for biased in (False, True):
        for const in (False, True):
            W = rf.rfa_weights(4, 3, biased, g, const)
            phi = rf.rfa_features(x0, X, W, const).numpy()
            n, N, d = X.shape
            D = d + 1 if const else d
            ref = np.zeros((n, 4 * D))
            for a in range(n):
                t0 = list(x0[a].tolist()) + ([1.0] if const else [])
                for m in range(4):
                    for i in range(N):
                        ti = list(X[a, i].tolist()) + ([1.0] if const else [])
                        s = sum(t0[j] * W[m, j, k].item() * ti[k] for j in range(D) for k in range(D))
                        for k in range(D):
                            ref[a, m * D + k] += max(s, 0.0) * ti[k] / N
            assert np.allclose(phi, ref, atol=1e-12)


def test_brfa_mean_is_identity_on_sphere_coords():
    g = torch.Generator().manual_seed(1)
    W = rf.rfa_weights(20000, 3, True, g)  # mean over many heads ~ E[W]
    mean = W.mean(0)
    expect = torch.zeros(4, 4)
    expect[:3, :3] = torch.eye(3)
    assert torch.allclose(mean, expect, atol=0.03)


def test_rfmlp_features_match_loops():
    x0, X, g = _inputs()
    A = rf.rfmlp_weights(6, X.shape[1], X.shape[2], g)
    phi = rf.rfmlp_features(x0, X, A)
    for a in range(x0.shape[0]):
        z = x0[a].tolist() + X[a].reshape(-1).tolist() + [1.0]
        for k in range(6):
            pre = sum(A[k, j].item() * z[j] for j in range(len(z)))
            assert math.isclose(phi[a, k].item(), max(pre, 0.0), abs_tol=1e-12)


def test_targets_permutation_invariant_and_defined():
    x0, X, g = _inputs(n=7, N=5, d=4)
    beta = rf.sample_sphere((), 4, g)
    perm = torch.randperm(5, generator=g)
    dots = torch.einsum("nd,nkd->nk", x0, X)
    for t in rf.TARGETS:
        y = rf.target_values(t, x0, X, beta)
        assert torch.allclose(y, rf.target_values(t, x0, X[:, perm], beta))
    assert torch.allclose(rf.target_values("dot3", x0, X, beta), (dots ** 3).mean(1))


def test_ridge_matches_lstsq_primal_and_dual():
    g = torch.Generator().manual_seed(2)
    for n, p in ((30, 8), (8, 30)):  # primal (p < n) and dual (p > n) branches
        Phi = torch.randn(n, p, generator=g)
        Y = torch.randn(n, 2, generator=g)
        for lam in (1e-3, 1.0):
            w = rf.ridge_solve(Phi, Y, lam).numpy()
            aug = np.vstack([Phi.numpy(), math.sqrt(lam) * np.eye(p)])
            rhs = np.vstack([Y.numpy(), np.zeros((p, 2))])
            ref = np.linalg.lstsq(aug, rhs, rcond=None)[0]
            assert np.allclose(w, ref, atol=1e-9)


def test_fit_select_picks_small_ridge_for_noiseless_and_large_for_noise():
    g = torch.Generator().manual_seed(3)
    Phi = torch.randn(200, 10, generator=g)
    y_clean = Phi @ torch.randn(10, 1, generator=g)
    y_noise = torch.randn(200, 1, generator=g)  # pure noise: shrinking to 0 is best
    W, lams = rf.fit_select(Phi, torch.cat([y_clean, y_noise], 1), [10.0 ** k for k in range(-7, 3)])
    assert lams[0] < lams[1]
    assert torch.allclose(W[:, 0], torch.linalg.lstsq(Phi, y_clean).solution[:, 0], atol=1e-4)


def test_target_in_rfa_span_is_fit():
    g = torch.Generator().manual_seed(4)
    d, N, M, n, n_test = 3, 4, 5, 200, 200  # M*D = 20 features << n
    x0, X = rf.sample_inputs(n + n_test, N, d, g)
    W = rf.rfa_weights(M, d, False, g)
    phi = rf.rfa_features(x0, X, W)
    v_star = torch.randn(M * (d + 1), 1, generator=g)
    y = phi @ v_star  # f(x_0, X; v*) exactly
    w, _ = rf.fit_select(phi[:n], y[:n], [1e-10])
    err = rf.normalised_error(phi[n:] @ w, y[n:])[0]
    assert err < 1e-8
    # and a target outside the span is not fit this well (the check can fail)
    y_out = rf.target_values("dot2", x0, X, rf.sample_sphere((), d, g))[:, None]
    w2, _ = rf.fit_select(phi[:n], y_out[:n], [1e-10])
    assert rf.normalised_error(phi[n:] @ w2, y_out[n:])[0] > 1e-3


def test_samples_to_reach():
    assert math.isclose(rf.samples_to_reach([10, 100], [1.0, 0.0], 0.5), math.sqrt(10 * 100))
    assert rf.samples_to_reach([10, 100], [1.0, 0.9], 0.5) == float("inf")


def test_cli_quick(tmp_path):
    out = tmp_path / "rf"
    rf.main(["--quick", "--out", str(out), "--seeds", "2"])
    res = json.loads((out / "results.json").read_text())
    assert {"config", "results", "claims", "wall_time_s", "note"} <= set(res)
    claims = res["claims"]
    assert len(claims) == 3
    for c in claims.values():
        assert isinstance(c["holds"], bool)
    cfg = res["config"]
    curve = res["results"]["by_N"][str(cfg["N_main"])]["RFA"]["dot2"]
    assert len(curve["mean"]) == len(cfg["ns"]) and all(e >= 0 for e in curve["mean"])
    assert set(res["results"]["by_N"]) == {str(N) for N in cfg["Ns"]}
    pngs = sorted(p.name for p in out.glob("rf_*.png"))
    assert "rf_error_vs_n.png" in pngs
    assert (out / "rf_error_vs_n.png").stat().st_size > 10_000
