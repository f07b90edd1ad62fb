"""Profiled objective, moment correction, joint UFM objective: derivatives and identities.

(docs/theory.md §2, §4, §8)
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from fedhead.ufm import (
    TargetMoments,
    closest_head,
    gram_step,
    joint_hessian,
    joint_objective,
    moment_correction,
    optimal_gram,
    optimal_loss,
    pack_joint,
    profiled_objective,
    proximal_term,
    psd_sqrt,
    scipy_callables,
    unpack_joint,
)


def _fd_grad_hess(f_val, f_grad, x, h=1e-6):
    """Central differences of a scalar function (gradient) and of its gradient (Hessian)."""
    n = x.size
    g = np.empty(n)
    H = np.empty((n, n))
    for k in range(n):
        e = np.zeros(n)
        e[k] = h
        g[k] = (f_val(x + e) - f_val(x - e)) / (2 * h)
        H[:, k] = (f_grad(x + e) - f_grad(x - e)) / (2 * h)
    return g, H


@pytest.mark.parametrize("C,P,rho", [(2, 2, 0.0), (3, 5, 0.0), (3, 4, 0.7)])
def test_profiled_derivatives_match_finite_differences(rng, helpers, C, P, rho):
    T = helpers.spd(rng, C, 0.3, 3)
    W = rng.normal(size=(C, P))
    ref = rng.normal(size=(C, P)) if rho else None
    f = lambda x: profiled_objective(x.reshape(C, P), T, 0.3, 0.2, rho=rho, w_ref=ref)  # noqa: E731
    v = f(W.ravel())
    g, H = _fd_grad_hess(lambda x: f(x).value, lambda x: f(x).grad.ravel(), W.ravel())
    np.testing.assert_allclose(v.grad.ravel(), g, atol=1e-8)
    np.testing.assert_allclose(v.hess, H, atol=1e-8)
    np.testing.assert_allclose(v.hess, v.hess.T, atol=0)
    # closed forms of value and gradient (docs/theory.md §4)
    A = W @ W.T + 0.3 * np.eye(C)
    Ai = np.linalg.inv(A)
    val = 0.15 * np.trace(T @ Ai) + 0.1 * np.sum(W * W) + (0.5 * rho * np.sum((W - ref) ** 2) if rho else 0)
    assert v.value == pytest.approx(val, rel=1e-13)
    Lam = 0.1 * np.eye(C) - 0.15 * Ai @ T @ Ai
    np.testing.assert_allclose(v.grad, 2 * Lam @ W + (rho * (W - ref) if rho else 0), atol=1e-13)
    assert profiled_objective(W, T, 0.3, 0.2, hessian=False).hess is None


def test_proximal_term(rng):
    W, R = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    v = proximal_term(W, R, 0.4)
    assert v.value == pytest.approx(0.2 * np.sum((W - R) ** 2), rel=1e-15)
    np.testing.assert_allclose(v.grad, 0.4 * (W - R), atol=0)
    np.testing.assert_allclose(v.hess, 0.4 * np.eye(6), atol=0)


def test_moment_correction_identity_and_derivatives(instance):
    for seed in range(8):
        inst = instance(seed, C=3, M=4)
        tm = inst.moments
        W = inst.rng.normal(size=(3, 5))
        for m in range(inst.M):
            Fm = profiled_objective(W, tm.covs[m], inst.lh, inst.lw)
            Cm = moment_correction(W, tm.covs[m], tm.sigma_cen, inst.lh)
            Fc = profiled_objective(W, tm.sigma_cen, inst.lh, inst.lw)
            assert Fm.value + Cm.value == pytest.approx(Fc.value, rel=1e-13)
            np.testing.assert_allclose(Fm.grad + Cm.grad, Fc.grad, atol=1e-13)
            np.testing.assert_allclose(Fm.hess + Cm.hess, Fc.hess, atol=1e-12)
    inst = instance(20, C=3, M=2)
    W = inst.rng.normal(size=(3, 4))
    f = lambda x: moment_correction(x.reshape(3, 4), inst.covs[0], inst.moments.sigma_cen, inst.lh, gamma=0.6)  # noqa: E731
    g, H = _fd_grad_hess(lambda x: f(x).value, lambda x: f(x).grad.ravel(), W.ravel())
    np.testing.assert_allclose(f(W.ravel()).grad.ravel(), g, atol=1e-8)
    np.testing.assert_allclose(f(W.ravel()).hess, H, atol=1e-8)


def test_partial_correction_optimal_gram(instance):
    inst = instance(3, C=3, M=3)
    tm = inst.moments
    for gamma in (0.0, 0.5, 0.9, 1.0):
        T = (1 - gamma) * tm.covs[1] + gamma * tm.sigma_cen
        G = optimal_gram(T, inst.lh, inst.lw)
        W = psd_sqrt(G)
        g = profiled_objective(W, tm.covs[1], inst.lh, inst.lw).grad
        g = g + moment_correction(W, tm.covs[1], tm.sigma_cen, inst.lh, gamma=gamma).grad
        assert np.abs(g).max() < 1e-12


def test_one_round_recovery_with_full_correction(instance):
    inst = instance(4, C=3, M=4)
    tm = inst.moments
    g_cen = optimal_gram(tm.sigma_cen, inst.lh, inst.lw)
    W = inst.rng.normal(size=(3, 6))
    # every corrected client has optimal Gram G_cen and selects Pi w.r.t. G_cen
    corrected = np.stack([optimal_gram(tm.covs[m] + (tm.sigma_cen - tm.covs[m]), inst.lh, inst.lw) for m in range(4)])
    np.testing.assert_allclose(corrected, np.broadcast_to(g_cen, corrected.shape), atol=1e-13)
    heads = closest_head(W, corrected)
    W1 = np.einsum("m,mcp->cp", tm.weights, heads)
    np.testing.assert_allclose(W1 @ W1.T, g_cen, atol=1e-12)
    np.testing.assert_allclose(gram_step(W @ W.T, corrected, tm.weights), g_cen, atol=1e-12)


# ------------------------------------------------------------------------------- joint objective


def _joint_setup(seed, C=2, P=3, N=5):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(C, P)), rng.normal(size=C), rng.normal(size=(N, P)), rng.normal(size=(N, C)), rng


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_joint_derivatives_match_finite_differences(rho):
    W, b, H, Y, rng = _joint_setup(0)
    C, P, N = 2, 3, 5
    ref = rng.normal(size=(C, P)) if rho else None
    f = lambda x: joint_objective(*unpack_joint(x, C, P, N), Y, 0.3, 0.2, rho=rho, w_ref=ref)  # noqa: E731
    x = pack_joint(W, b, H)
    g, Hn = _fd_grad_hess(lambda z: f(z).value, lambda z: f(z).grad_flat(), x)
    np.testing.assert_allclose(f(x).grad_flat(), g, atol=1e-8)
    Hx = joint_hessian(W, b, H, Y, 0.3, 0.2, rho=rho, w_ref=ref)
    np.testing.assert_allclose(Hx, Hn, atol=1e-8)
    # value by definition, docs/theory.md column convention Y_m = Y.T, H_m = H.T
    R = W @ H.T + b[:, None] - Y.T
    val = (np.sum(R**2) + 0.3 * np.sum(H**2)) / (2 * N) + 0.1 * np.sum(W**2)
    if rho:
        val += 0.5 * rho * np.sum((W - ref) ** 2)
    assert f(x).value == pytest.approx(val, rel=1e-14)
    Wb, bb, Hb = unpack_joint(x, C, P, N)
    np.testing.assert_array_equal(Wb, W), np.testing.assert_array_equal(bb, b), np.testing.assert_array_equal(Hb, H)


def test_joint_minimum_equals_optimal_loss(helpers):
    rng = np.random.default_rng(11)
    C, P, N, lh, lw = 2, 3, 12, 0.3, 0.2
    mu = rng.normal(size=C)
    sigma = helpers.spd(rng, C, 0.5, 2.0)
    Y = helpers.targets(rng, N, mu, sigma)
    tm = TargetMoments.from_targets([Y])
    np.testing.assert_allclose(tm.covs[0], sigma, atol=1e-13)
    Lstar = optimal_loss(sigma, lh, lw)
    # closed-form minimiser: W with Gram phi, b = mu, H rows = (Y - mu) A^{-1} W
    W = np.zeros((C, P))
    W[:, :C] = psd_sqrt(optimal_gram(sigma, lh, lw))
    H = (Y - mu) @ np.linalg.inv(W @ W.T + lh * np.eye(C)) @ W
    jv = joint_objective(W, mu, H, Y, lh, lw)
    assert jv.value == pytest.approx(Lstar, rel=1e-13)
    assert np.abs(jv.grad_flat()).max() < 1e-13
    # profiled value equals the joint value minimised over (b, H) at any W
    W2 = rng.normal(size=(C, P))
    H2 = (Y - mu) @ np.linalg.inv(W2 @ W2.T + lh * np.eye(C)) @ W2
    assert joint_objective(W2, mu, H2, Y, lh, lw).value == pytest.approx(
        profiled_objective(W2, sigma, lh, lw).value, rel=1e-13
    )
    # trust-exact on the joint objective from a random start reaches L*
    x0 = pack_joint(rng.normal(size=(C, P)), np.zeros(C), 0.1 * rng.normal(size=(N, P)))
    res = minimize(
        lambda x: joint_objective(*unpack_joint(x, C, P, N), Y, lh, lw).value,
        x0,
        jac=lambda x: joint_objective(*unpack_joint(x, C, P, N), Y, lh, lw).grad_flat(),
        hess=lambda x: joint_hessian(*unpack_joint(x, C, P, N), Y, lh, lw),
        method="trust-exact",
        options={"gtol": 1e-11},
    )
    assert res.fun == pytest.approx(Lstar, rel=1e-11)
    Wf, bf, _ = unpack_joint(res.x, C, P, N)
    np.testing.assert_allclose(Wf @ Wf.T, optimal_gram(sigma, lh, lw), atol=1e-7)
    np.testing.assert_allclose(bf, mu, atol=1e-7)


def test_penalised_profiled_trust_exact_tends_to_selection(helpers):
    rng = np.random.default_rng(5)
    C, P, lh, lw = 2, 3, 0.1, 0.1
    T = helpers.spd(rng, C, 0.5, 3.0)
    Gm = optimal_gram(T, lh, lw)
    Wt = rng.normal(size=(C, P))
    Pi = closest_head(Wt, Gm)
    x = Pi.ravel()
    errs = []
    for rho in (1e-2, 1e-3, 1e-4):
        fun, jac, hess = scipy_callables(lambda W, r=rho: profiled_objective(W, T, lh, lw, rho=r, w_ref=Wt), (C, P))
        res = minimize(fun, x, jac=jac, hess=hess, method="trust-exact", options={"gtol": 1e-13})
        x = res.x
        errs.append(np.linalg.norm(res.x.reshape(C, P) - Pi) / np.linalg.norm(Pi))
    assert errs[-1] < 1e-3 and errs[2] < errs[1] < errs[0]


def test_one_round_recovery_by_solving_corrected_proximal_problems(instance):
    """Independent check of docs/theory.md §8: every client minimises F(W; Sigma_m) + C_m(W) +
    rho/2 ||W - W_t||^2 numerically (trust-exact); the averaged head has Gram G_cen up to O(rho),
    although the uncorrected clients would not agree."""
    inst = instance(9, C=3, M=3)
    tm = inst.moments
    C, P = 3, 4
    g_cen = optimal_gram(tm.sigma_cen, inst.lh, inst.lw)
    Wt = inst.rng.normal(size=(C, P))
    Pi = closest_head(Wt, g_cen)
    errs = []
    for rho in (1e-3, 1e-4):
        heads = []
        for m in range(inst.M):

            def obj(W, m=m, rho=rho):
                F = profiled_objective(W, tm.covs[m], inst.lh, inst.lw, rho=rho, w_ref=Wt)
                Cm = moment_correction(W, tm.covs[m], tm.sigma_cen, inst.lh)
                return F._replace(value=F.value + Cm.value, grad=F.grad + Cm.grad, hess=F.hess + Cm.hess)

            fun, jac, hess = scipy_callables(obj, (C, P))
            res = minimize(fun, Pi.ravel(), jac=jac, hess=hess, method="trust-exact", options={"gtol": 1e-13})
            heads.append(res.x.reshape(C, P))
        W1 = np.einsum("m,mcp->cp", tm.weights, np.stack(heads))
        errs.append(np.linalg.norm(W1 @ W1.T - g_cen) / np.linalg.norm(g_cen))
        # every corrected client selected (nearly) the same head Pi_cen(W_t)
        assert max(np.linalg.norm(h - Pi) for h in heads) / np.linalg.norm(Pi) < 2 * rho
    # O(rho): the error drops tenfold with rho
    assert errs[1] < 3e-4 and errs[1] / errs[0] == pytest.approx(0.1, abs=0.02)
    # without the correction one round does not reach G_cen
    W_unc = np.einsum("m,mcp->cp", tm.weights, closest_head(Wt, optimal_gram(tm.covs, inst.lh, inst.lw)))
    assert np.linalg.norm(W_unc @ W_unc.T - g_cen) / np.linalg.norm(g_cen) > 1e-2


# ------------------------------------------------------------------ local_head: the nearby exact minimiser
def test_local_head_reaches_the_optimal_gram_and_the_proximal_stationary_point():
    """rho = 0: the head reached has the closed-form optimal Gram phi(T) (docs/theory.md §4);
    rho > 0: the gradient of F + rho/2 ||W - W_ref||^2 vanishes there and the trust-region Newton
    solve from the same start lands on the same head."""
    from scipy.optimize import minimize

    from fedhead import ufm

    rng = np.random.default_rng(3)
    C, P, lh, lw = 3, 8, 0.05, 0.02
    A = rng.normal(size=(C, C))
    T = A @ A.T + 0.5 * np.eye(C)
    W0 = 0.5 * rng.normal(size=(C, P))
    r = ufm.local_head(W0, T, lh, lw)
    assert r.converged
    G = r.head @ r.head.T
    np.testing.assert_allclose(G, ufm.optimal_gram(T, lh, lw), rtol=0, atol=1e-8)
    w_ref = 0.5 * rng.normal(size=(C, P))
    r = ufm.local_head(W0, T, lh, lw, rho=1e-2, w_ref=w_ref)
    val = ufm.profiled_objective(r.head, T, lh, lw, rho=1e-2, w_ref=w_ref)
    assert np.linalg.norm(val.grad) < 1e-8
    fun, jac, hess = ufm.scipy_callables(lambda W: ufm.profiled_objective(W, T, lh, lw, rho=1e-2, w_ref=w_ref), (C, P))
    newton = minimize(fun, W0.ravel(), jac=jac, hess=hess, method="trust-exact", options={"gtol": 1e-12})
    np.testing.assert_allclose(r.head, newton.x.reshape(C, P), rtol=0, atol=1e-7)
    assert r.value == pytest.approx(newton.fun, rel=1e-12)
