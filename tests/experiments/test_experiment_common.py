"""Tests of the suite's generators and solvers against closed forms of fedhead.ufm."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead import ufm
from fedhead.experiments.common import (
    loglog_slope,
    matched_samples,
    random_head,
    random_orthogonal,
    random_spd,
    rel_err,
)
from fedhead.experiments.solvers import (
    JointState,
    adam_joint,
    joint_prox_solve,
    lbfgs_profiled,
    prox_profiled_solve,
    ridge_features,
)


def test_random_orthogonal_and_spd():
    rng = np.random.default_rng(0)
    Q = random_orthogonal(5, rng)
    np.testing.assert_allclose(Q.T @ Q, np.eye(5), atol=1e-13)
    S = random_spd(4, 2.0, 5.0, rng)
    w = np.linalg.eigvalsh(S)
    assert np.all((w >= 2.0 - 1e-12) & (w <= 5.0 + 1e-12))
    W = random_head(3, 6, 0.7, 1.5, rng)
    sv = np.linalg.svd(W, compute_uv=False)
    assert W.shape == (3, 6) and np.all((sv >= 0.7 - 1e-12) & (sv <= 1.5 + 1e-12))


def test_matched_samples_exact_moments():
    rng = np.random.default_rng(1)
    mean = np.array([1.0, -2.0, 0.5])
    cov = random_spd(3, 0.3, 3.0, rng)
    Y = matched_samples(mean, cov, 7, rng)
    mom = ufm.TargetMoments.from_targets([Y])
    np.testing.assert_allclose(mom.means[0], mean, atol=1e-13)
    np.testing.assert_allclose(mom.covs[0], cov, atol=1e-12)
    with pytest.raises(ValueError, match="n > C"):
        matched_samples(mean, cov, 3, rng)


def test_prox_profiled_solve_selects_closest_head():
    rng = np.random.default_rng(2)
    C, P, lam = 3, 5, 1.0
    cov = random_spd(C, 2.0, 5.0, rng)
    Wt = random_head(C, P, 0.7, 1.5, rng)
    G_m = ufm.optimal_gram(cov, lam, lam)
    pi = ufm.closest_head(Wt, G_m)
    errs = []
    W = Wt.copy()
    rhos = [1e-2, 1e-3, 1e-4, 1e-5]
    for rho in rhos:
        r = prox_profiled_solve(W, Wt, cov, lam, lam, rho)
        assert r.grad_norm < 1e-11
        W = r.x
        errs.append(rel_err(W, pi))
    assert errs[-1] < 1e-4
    assert abs(loglog_slope(rhos, errs) - 1.0) < 0.02


def test_prox_with_correction_matches_corrected_closed_form():
    rng = np.random.default_rng(3)
    C, lam = 3, 1.0
    covs = np.stack([random_spd(C, 2.0, 5.0, rng) for _ in range(3)])
    mom = ufm.TargetMoments(weights=np.array([0.2, 0.3, 0.5]), means=rng.standard_normal((3, C)), covs=covs)
    W0 = random_head(C, C, 0.7, 1.5, rng)
    for gamma in (1.0, 0.5):
        target = ufm.optimal_gram((1 - gamma) * covs[0] + gamma * mom.sigma_cen, lam, lam)
        r = prox_profiled_solve(
            ufm.closest_head(W0, target), W0, covs[0], lam, lam, 1e-9, gamma=gamma, sigma_cen=mom.sigma_cen
        )
        np.testing.assert_allclose(r.x @ r.x.T, target, atol=1e-7)


def test_lbfgs_profiled_reaches_optimal_gram():
    rng = np.random.default_rng(4)
    cov = random_spd(2, 2.0, 5.0, rng)
    r = lbfgs_profiled(rng.standard_normal((2, 3)), cov, 1.0, 1.0)
    np.testing.assert_allclose(r.x @ r.x.T, ufm.optimal_gram(cov, 1.0, 1.0), atol=1e-7)


def test_ridge_features_zero_feature_gradient():
    rng = np.random.default_rng(5)
    Y = rng.standard_normal((9, 2))
    W = rng.standard_normal((2, 4))
    b = rng.standard_normal(2)
    H = ridge_features(W, b, Y, 0.3)
    jv = ufm.joint_objective(W, b, H, Y, 0.3, 0.2)
    assert H.shape == (9, 4)
    assert np.abs(jv.grad_h).max() < 1e-14


def test_joint_prox_equals_profiled_prox():
    """min over (b, H) of the joint objective is F(W; Sigma): both proximal solves give one head."""
    rng = np.random.default_rng(6)
    C, P, N, lam, rho = 2, 3, 12, 1.0, 1e-2
    mean = rng.standard_normal(C)
    cov = random_spd(C, 2.0, 5.0, rng)
    Y = matched_samples(mean, cov, N, rng)
    Wt = random_head(C, P, 0.7, 1.5, rng)
    st, r = joint_prox_solve(JointState(Wt, mean, ridge_features(Wt, mean, Y, lam)), Y, Wt, lam, lam, rho)
    assert r.grad_norm < 1e-11
    prof = prox_profiled_solve(Wt, Wt, cov, lam, lam, rho).x
    np.testing.assert_allclose(st.W, prof, atol=1e-10)
    np.testing.assert_allclose(st.b, mean, atol=1e-10)


def test_adam_joint_decreases_loss_and_snapshots():
    rng = np.random.default_rng(7)
    Y = matched_samples(np.zeros(2), np.diag([2.0, 3.0]), 10, rng)
    W = rng.standard_normal((2, 2))
    start = JointState(W, np.zeros(2), ridge_features(W, np.zeros(2), Y, 0.1))
    final, snaps = adam_joint(start, Y, 0.1, 0.1, lr=0.02, steps=30, snapshots=(0, 10, 30))
    assert sorted(snaps) == [0, 10, 30]
    np.testing.assert_array_equal(snaps[0].W, W)
    np.testing.assert_array_equal(snaps[30].W, final.W)
    f0 = ufm.joint_objective(*start, Y, 0.1, 0.1).value
    f1 = ufm.joint_objective(*final, Y, 0.1, 0.1).value
    assert f1 < f0
