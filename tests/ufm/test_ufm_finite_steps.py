"""Finite local training with profiled gradient steps (docs/theory.md §9)."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.ufm import (
    ConvergenceWarning,
    UFMInputError,
    commuting_delta,
    displacement_delta,
    finite_step_fixed_point,
    gram_map_jacobian,
    jacobian_spectral_radius,
    optimal_gram,
    profiled_gram_map,
    profiled_objective,
    profiled_round,
    psd_sqrt,
    psi_gradient,
    psi_value,
    theta_min,
)


def _within(inst):
    return optimal_gram(inst.moments.sigma_within, inst.lh, inst.lw)


def test_profiled_round_is_gradient_descent_and_gram_map(instance):
    inst = instance(0, C=3, M=4)
    W = inst.rng.normal(size=(3, 5))
    eta, E = 0.05, 6
    heads = []
    for m in range(inst.M):
        Wm = W.copy()
        for _ in range(E):
            Wm = Wm - eta * profiled_objective(Wm, inst.covs[m], inst.lh, inst.lw, hessian=False).grad
        heads.append(Wm)
    expect = np.einsum("m,mcp->cp", inst.weights, np.stack(heads))
    W1 = profiled_round(W, inst.covs, inst.weights, inst.lh, inst.lw, eta, E)
    np.testing.assert_allclose(W1, expect, atol=1e-13)
    step = profiled_gram_map(W @ W.T, inst.covs, inst.weights, inst.lh, inst.lw, eta, E)
    np.testing.assert_allclose(step.kbar @ W, W1, atol=1e-13)
    np.testing.assert_allclose(step.gram, W1 @ W1.T, atol=1e-13)


def test_single_step_fixed_point_is_g_within(instance):
    inst = instance(1, C=3, M=4)
    w0 = inst.rng.normal(size=(3, 6))
    res = finite_step_fixed_point(inst.covs, inst.weights, inst.lh, inst.lw, 0.2, 1, w0=w0)
    assert res.converged and res.residual < 1e-13 and res.n_rounds > 10
    np.testing.assert_allclose(res.gram, _within(inst), atol=1e-10)
    np.testing.assert_allclose(res.head @ res.head.T, res.gram, atol=1e-12)
    assert res.head.shape == (3, 6)


def test_small_h_displacement_matches_delta(instance):
    inst = instance(2, C=3, M=4, lo=0.5, hi=3.0)
    D = displacement_delta(inst.covs, inst.weights, inst.lh, inst.lw)
    assert np.abs(D).max() > 1e-3
    g_within = _within(inst)
    E = 3
    dev = []
    for eta in (0.08, 0.04, 0.02):
        res = finite_step_fixed_point(inst.covs, inst.weights, inst.lh, inst.lw, eta, E)
        assert res.converged
        pred = eta * (E - 1) * D
        dev.append(np.linalg.norm(res.gram - g_within - pred) / np.linalg.norm(pred))
    # relative deviation is O(h): halves with eta
    assert dev[-1] < 0.01
    assert dev[1] / dev[0] == pytest.approx(0.5, abs=0.05) and dev[2] / dev[1] == pytest.approx(0.5, abs=0.05)


def test_commuting_delta_equals_general_delta(instance, helpers):
    rng = np.random.default_rng(3)
    C, M, lh, lw = 3, 4, 0.1, 0.1
    Q = helpers.orthogonal(rng, C)
    lam = rng.uniform(0.5, 3.0, (M, C))
    p = rng.dirichlet(2 * np.ones(M))
    sig = np.einsum("ij,mj,kj->mik", Q, lam, Q)
    Di = commuting_delta(lam, p, lh, lw)
    D = displacement_delta(sig, p, lh, lw)
    np.testing.assert_allclose(Q.T @ D @ Q, np.diag(Di), atol=1e-14)
    # direct formula
    s, lbar = np.sqrt(lh * lw), p @ lam
    np.testing.assert_allclose(Di, s * (s - 0.75 * np.sqrt(lbar)) * (p @ (lam / lbar - 1) ** 2), rtol=1e-14)
    # and the commuting fixed point moves by eta (E - 1) Delta_i
    eta, E = 0.01, 4
    res = finite_step_fixed_point(sig, p, lh, lw, eta, E)
    disp = np.diag(Q.T @ (res.gram - optimal_gram(np.einsum("m,mij->ij", p, sig), lh, lw)) @ Q)
    np.testing.assert_allclose(disp / (eta * (E - 1) * Di), 1.0, atol=0.03)


def test_psi_gradient_matches_finite_differences(instance, helpers):
    inst = instance(4, C=3, M=3)
    G = helpers.spd(inst.rng, 3, 0.3, 2.0)
    grad = psi_gradient(G, inst.covs, inst.weights, inst.lh, inst.lw)
    np.testing.assert_allclose(grad, grad.T, atol=0)
    h = 1e-6
    for _ in range(5):
        X = inst.rng.normal(size=(3, 3))
        X = X + X.T
        fd = (
            psi_value(G + h * X, inst.covs, inst.weights, inst.lh, inst.lw)
            - psi_value(G - h * X, inst.covs, inst.weights, inst.lh, inst.lw)
        ) / (2 * h)
        assert np.sum(grad * X) == pytest.approx(fd, rel=1e-7, abs=1e-12)
    # psi vanishes to second order where every Lambda_m vanishes (identical clients)
    same = np.broadcast_to(inst.covs[0], inst.covs.shape)
    assert psi_value(optimal_gram(inst.covs[0], inst.lh, inst.lw), same, inst.weights, inst.lh, inst.lw) < 1e-28


def test_jacobian_and_contraction_rate(instance):
    inst = instance(5, C=3, M=4, lo=0.5, hi=3.0)
    th = theta_min(inst.moments.sigma_within, inst.lh, inst.lw)
    lmin = np.linalg.eigvalsh(inst.moments.sigma_within)[0]
    assert th == pytest.approx(2 * inst.lw * (1 - np.sqrt(inst.lh * inst.lw / lmin)), rel=1e-15)
    E = 4
    # complex-step Jacobian agrees with central differences
    G = _within(inst)
    J = gram_map_jacobian(G, inst.covs, inst.weights, inst.lh, inst.lw, 0.01, E)
    iu, ju = np.triu_indices(3)
    eps = 1e-6
    for k in range(6):
        B = np.zeros((3, 3))
        B[iu[k], ju[k]] = B[ju[k], iu[k]] = 1.0
        gp = profiled_gram_map(G + eps * B, inst.covs, inst.weights, inst.lh, inst.lw, 0.01, E).gram
        gm = profiled_gram_map(G - eps * B, inst.covs, inst.weights, inst.lh, inst.lw, 0.01, E).gram
        np.testing.assert_allclose(J[:, k], ((gp - gm) / (2 * eps))[iu, ju], atol=1e-8)
    D = displacement_delta(inst.covs, inst.weights, inst.lh, inst.lw)
    ratios = []
    for h in (1e-2, 2e-3):
        eta = h / E
        # start at the first-order prediction; the fixed point is needed to O(h^2) only
        w0 = psd_sqrt(G + eta * (E - 1) * D)
        fp = finite_step_fixed_point(inst.covs, inst.weights, inst.lh, inst.lw, eta, E, w0=w0, tol=1e-10)
        assert fp.converged
        rho = jacobian_spectral_radius(fp.gram, inst.covs, inst.weights, inst.lh, inst.lw, eta, E)
        ratios.append((1 - rho) / (2 * h * th))
    assert abs(ratios[1] - 1) < 5e-3 and abs(ratios[1] - 1) < abs(ratios[0] - 1)


def test_finite_step_errors_and_warnings(instance):
    inst = instance(6, C=2, M=3)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        res = finite_step_fixed_point(
            inst.covs, inst.weights, inst.lh, inst.lw, 0.01, 2, w0=np.eye(2) * 3, max_rounds=3
        )
    assert not res.converged and res.n_rounds == 3
    with pytest.raises(UFMInputError, match="diverged"):
        finite_step_fixed_point(inst.covs, inst.weights, inst.lh, inst.lw, 1e4, 3, w0=np.eye(2) * 3)
    with pytest.raises(UFMInputError, match="E: must be an integer >= 1, got 0"):
        profiled_round(np.eye(2), inst.covs, inst.weights, inst.lh, inst.lw, 0.1, 0)
    with pytest.raises(UFMInputError, match="eta"):
        profiled_round(np.eye(2), inst.covs, inst.weights, inst.lh, inst.lw, -0.1, 2)
    with pytest.raises(UFMInputError, match="eigs: client 1 eigenvalue 0"):
        commuting_delta([[1.0, 2.0], [0.0, 1.0]], [0.5, 0.5], 0.1, 0.1)
