"""TargetMoments, phi, L* and the fully active check (docs/theory.md §3-4)."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.ufm import (
    NotFullyActiveError,
    TargetMoments,
    check_fully_active,
    optimal_gram,
    optimal_loss,
    profiled_objective,
    psd_inv_sqrt,
    psd_power,
    psd_sqrt,
)


def test_from_targets_matches_definitions(rng, helpers):
    ys = [rng.normal(size=(n, 3)) * [1, 2, 0.5] + rng.normal(size=3) for n in (20, 35, 50)]
    tm = TargetMoments.from_targets(ys)
    N = sum(len(y) for y in ys)
    np.testing.assert_allclose(tm.weights, [20 / N, 35 / N, 50 / N], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(tm.counts, [20, 35, 50])
    for m, y in enumerate(ys):
        np.testing.assert_allclose(tm.means[m], y.mean(0), atol=1e-14)
        np.testing.assert_allclose(tm.covs[m], np.cov(y.T, bias=True), atol=1e-13)
    pooled = np.concatenate(ys)
    # centralised covariance by the server formula equals the pooled population covariance
    np.testing.assert_allclose(tm.sigma_cen, np.cov(pooled.T, bias=True), atol=1e-13)
    np.testing.assert_allclose(tm.sigma_cen, tm.sigma_within + tm.sigma_mu, atol=1e-13)
    np.testing.assert_allclose(tm.mean_global, pooled.mean(0), atol=1e-14)
    assert tm.n_clients == 3 and tm.dim == 3


def test_from_stats_round_trip_and_custom_weights(rng):
    ys = [rng.normal(size=(n, 2)) + m for m, n in enumerate((10, 30))]
    a = TargetMoments.from_targets(ys)
    b = TargetMoments.from_stats(a.counts, a.means, a.covs)
    for f in ("weights", "means", "covs", "sigma_cen", "sigma_within", "sigma_mu", "mean_global"):
        np.testing.assert_allclose(getattr(a, f), getattr(b, f), atol=1e-15)
    c = TargetMoments.from_stats(a.counts, a.means, a.covs, weights=[0.5, 0.5])
    np.testing.assert_allclose(c.sigma_cen, c.sigma_within + c.sigma_mu, atol=1e-14)
    np.testing.assert_allclose(c.sigma_within, 0.5 * (a.covs[0] + a.covs[1]), atol=1e-15)


def test_moments_are_frozen_and_read_only(rng):
    tm = TargetMoments.from_targets([rng.normal(size=(5, 2)), rng.normal(size=(6, 2))])
    with pytest.raises(AttributeError):
        tm.weights = np.array([0.5, 0.5])
    with pytest.raises(ValueError):
        tm.covs[0, 0, 0] = 1.0


def test_psd_helpers(rng, helpers):
    A = np.stack([helpers.spd(rng, 4, 0.1, 5.0) for _ in range(3)])
    S = psd_sqrt(A)
    np.testing.assert_allclose(S @ S, A, atol=1e-13)
    assert np.all(np.linalg.eigvalsh(S) > 0)
    np.testing.assert_allclose(psd_inv_sqrt(A) @ S, np.broadcast_to(np.eye(4), A.shape), atol=1e-12)
    np.testing.assert_allclose(psd_power(A, 1.5), S @ S @ S, atol=1e-12)
    np.testing.assert_allclose(psd_power(A, -1.0), np.linalg.inv(A), atol=1e-12)
    # a singular PSD matrix has a square root
    v = rng.normal(size=(3, 1))
    np.testing.assert_allclose(psd_sqrt(v @ v.T) @ psd_sqrt(v @ v.T), v @ v.T, atol=1e-13)


def test_optimal_gram_closed_form_and_stationarity(instance):
    inst = instance(1, C=4, M=3, lam=0.2)
    lh, lw = inst.lh, inst.lw
    G = optimal_gram(inst.covs, lh, lw)  # batched
    alpha = np.sqrt(lh / lw)
    for m in range(inst.M):
        np.testing.assert_allclose(G[m], alpha * psd_sqrt(inst.covs[m]) - lh * np.eye(4), atol=1e-13)
        # gradient of F vanishes at any head with Gram phi(Sigma_m), Lambda_T(phi(T)) = 0
        W = psd_sqrt(G[m]) @ np.linalg.qr(np.random.default_rng(m).normal(size=(6, 6)))[0][:4]
        val = profiled_objective(W, inst.covs[m], lh, lw)
        assert np.abs(val.grad).max() < 1e-12
        assert val.value == pytest.approx(optimal_loss(inst.covs[m], lh, lw), rel=1e-13)


def test_optimal_gram_minimises_F_trust_exact(instance):
    from scipy.optimize import minimize

    from fedhead.ufm import scipy_callables

    inst = instance(7, C=3, M=2, lam=0.3)
    T = inst.covs[0]
    fun, jac, hess = scipy_callables(lambda W: profiled_objective(W, T, inst.lh, inst.lw), (3, 5))
    x0 = np.random.default_rng(0).normal(size=15)
    res = minimize(fun, x0, jac=jac, hess=hess, method="trust-exact", options={"gtol": 1e-12})
    W = res.x.reshape(3, 5)
    np.testing.assert_allclose(W @ W.T, optimal_gram(T, inst.lh, inst.lw), atol=1e-9)
    assert res.fun == pytest.approx(optimal_loss(T, inst.lh, inst.lw), rel=1e-12)


def test_optimal_loss_outside_regime_and_clipped_gram():
    lh, lw = 1.0, 0.5  # threshold 0.5
    T = np.diag([2.0, 0.2])
    thr = lh * lw
    expect = (np.sqrt(thr * 2.0) - thr / 2) + 0.2 / 2
    assert optimal_loss(T, lh, lw) == pytest.approx(expect, rel=1e-14)
    G = optimal_gram(T, lh, lw)
    np.testing.assert_allclose(G, np.diag([np.sqrt(2.0) * np.sqrt(2.0) - 1.0, 0.0]), atol=1e-14)
    # the clipped Gram attains L*: F at W = G^{1/2}
    assert profiled_objective(psd_sqrt(G), T, lh, lw).value == pytest.approx(expect, rel=1e-14)


def test_check_fully_active_report_and_error(instance):
    inst = instance(2, lam=0.1)
    rep = check_fully_active(inst.moments, inst.lh, inst.lw)
    np.testing.assert_allclose(rep.min_eigs, np.linalg.eigvalsh(inst.covs)[:, 0], atol=1e-15)
    np.testing.assert_allclose(rep.margins, rep.min_eigs - 0.01, atol=1e-15)
    assert rep.threshold == pytest.approx(0.01)
    np.testing.assert_allclose(rep.ratios, rep.min_eigs / 0.01)
    covs = inst.covs.copy()
    covs[2] = np.diag([1.0, 2.0, 0.005])
    with pytest.raises(NotFullyActiveError, match=r"client 2.*5\.0+e-03.*1\.0+e-02"):
        check_fully_active(covs, inst.lh, inst.lw)
    assert issubclass(NotFullyActiveError, ValueError)


def test_out_of_regime_phi_and_loss_against_trust_exact(helpers):
    """Independent solver for the out-of-regime branch: trust-exact on F(W; T) over (C, P) heads
    reaches L* and the clipped Gram when some eigenvalues of T are below lambda_H lambda_W."""
    from scipy.optimize import minimize

    from fedhead.ufm import scipy_callables

    rng = np.random.default_rng(3)
    lh, lw = 0.5, 0.4  # threshold 0.2
    Q = helpers.orthogonal(rng, 3)
    s = np.array([2.0, 0.1, 0.05])
    T = (Q * s) @ Q.T
    thr = lh * lw
    expect = np.sqrt(thr * 2.0) - thr / 2 + 0.5 * (0.1 + 0.05)
    assert optimal_loss(T, lh, lw) == pytest.approx(expect, rel=1e-14)
    fun, jac, hess = scipy_callables(lambda W: profiled_objective(W, T, lh, lw), (3, 4))
    res = minimize(fun, rng.normal(size=12), jac=jac, hess=hess, method="trust-exact", options={"gtol": 1e-12})
    assert res.fun == pytest.approx(expect, rel=1e-12)
    W = res.x.reshape(3, 4)
    G = optimal_gram(T, lh, lw)
    np.testing.assert_allclose(G, (Q * [np.sqrt(lh / lw) * np.sqrt(2.0) - lh, 0, 0]) @ Q.T, atol=1e-14)
    # the zero eigen-directions are approached at rate sqrt(gtol): compare loosely, but the
    # value (above) is tight
    np.testing.assert_allclose(W @ W.T, G, atol=1e-6)
