"""Bures-Wasserstein geometry, selection rule, recursion and barycenter (docs/theory.md §5-6)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes

from fedhead.ufm import (
    ConvergenceWarning,
    bw_barycenter,
    bw_distance,
    bw_distance_squared,
    closest_head,
    gram_recursion,
    gram_step,
    psd_sqrt,
    selection_round,
    transport_map,
)


def _d2_trace_formula(A, B):
    Ah = psd_sqrt(A)
    return np.trace(A) + np.trace(B) - 2 * np.trace(psd_sqrt(Ah @ B @ Ah))


def test_bw_distance_metric_axioms(rng, helpers):
    mats = [helpers.spd(rng, 4, 0.05, 4.0) for _ in range(6)]
    for A in mats:
        assert bw_distance(A, A) < 1e-14
    for A in mats:
        for B in mats:
            assert bw_distance(A, B) == pytest.approx(bw_distance(B, A), abs=1e-14)
            assert bw_distance(A, B) ** 2 == pytest.approx(_d2_trace_formula(A, B), abs=1e-12)
            for Cm in mats:
                assert bw_distance(A, Cm) <= bw_distance(A, B) + bw_distance(B, Cm) + 1e-13
    # commuting case: d = ||A^{1/2} - B^{1/2}||_F
    Q = helpers.orthogonal(rng, 4)
    a, b = rng.uniform(0.1, 3, 4), rng.uniform(0.1, 3, 4)
    A, B = (Q * a) @ Q.T, (Q * b) @ Q.T
    assert bw_distance(A, B) == pytest.approx(np.linalg.norm(np.sqrt(a) - np.sqrt(b)), rel=1e-12)
    # batching broadcasts over leading axes
    stack = np.stack(mats)
    np.testing.assert_allclose(bw_distance(stack, mats[0]), [bw_distance(m, mats[0]) for m in mats], atol=1e-15)
    np.testing.assert_allclose(bw_distance_squared(mats[1], mats[2]), bw_distance(mats[1], mats[2]) ** 2)


def test_transport_map_pushes_forward(rng, helpers):
    G, Gt = helpers.spd(rng, 3, 0.2, 3), helpers.spd(rng, 3, 0.2, 3)
    T = transport_map(G, Gt)
    np.testing.assert_allclose(T, T.T, atol=0)
    assert np.all(np.linalg.eigvalsh(T) > 0)
    np.testing.assert_allclose(T @ G @ T, Gt, atol=1e-12)
    batch = transport_map(G, np.stack([Gt, G]))
    np.testing.assert_allclose(batch[0], T, atol=1e-15)
    np.testing.assert_allclose(batch[1], np.eye(3), atol=1e-12)


@pytest.mark.parametrize("C,P", [(2, 2), (3, 5), (4, 8)])
def test_closest_head_feasible_and_optimal(rng, helpers, C, P):
    W = rng.normal(size=(C, P))
    Gt = helpers.spd(rng, C, 0.2, 3)
    Pi = closest_head(W, Gt)
    np.testing.assert_allclose(Pi @ Pi.T, Gt, atol=1e-12)  # feasible
    dist = np.linalg.norm(Pi - W)
    assert dist == pytest.approx(bw_distance(W @ W.T, Gt), abs=1e-12)
    # independent solver: every head with Gram Gt is [Gt^{1/2}, 0] Q, Q orthogonal (P x P)
    A = np.zeros((C, P))
    A[:, :C] = psd_sqrt(Gt)
    R, _ = orthogonal_procrustes(A, W)
    np.testing.assert_allclose(A @ R, Pi, atol=1e-10)
    assert np.linalg.norm(A @ R - W) == pytest.approx(dist, abs=1e-12)
    # no farther than random factors G^{1/2} Q
    for _ in range(50):
        Q = helpers.orthogonal(rng, P)
        assert dist <= np.linalg.norm(A @ Q - W) + 1e-12


def test_commuting_barycenter_closed_form(rng, helpers):
    Q = helpers.orthogonal(rng, 4)
    lam = rng.uniform(0.1, 4.0, (5, 4))
    grams = np.einsum("ij,mj,kj->mik", Q, lam, Q)
    p = rng.dirichlet(np.ones(5))
    expect = (Q * (p @ np.sqrt(lam)) ** 2) @ Q.T
    res = bw_barycenter(grams, p, init=np.eye(4))
    assert res.converged and res.residual < 1e-13
    np.testing.assert_allclose(res.gram, expect, atol=1e-12)


def test_barycenter_fixed_point_equation_and_minimality(rng, helpers):
    grams = np.stack([helpers.spd(rng, 3, 0.2, 4) for _ in range(4)])
    p = rng.dirichlet(2 * np.ones(4))
    res = bw_barycenter(grams, p)
    assert res.converged and res.n_iter >= 1
    G = res.gram
    Gh = psd_sqrt(G)
    np.testing.assert_allclose(np.einsum("m,mij->ij", p, psd_sqrt(Gh @ grams @ Gh)), G, atol=1e-12)
    # zero mean displacement: sum p_m T_m(G*) = I
    np.testing.assert_allclose(np.einsum("m,mij->ij", p, transport_map(G, grams)), np.eye(3), atol=1e-12)
    obj = lambda X: p @ (bw_distance(X, grams) ** 2)  # noqa: E731
    f0 = obj(G)
    for _ in range(20):
        E = rng.normal(size=(3, 3)) * 1e-3
        assert obj(G + E @ E.T + 1e-3 * (E + E.T)) >= f0 - 1e-13
    # start independence
    res2 = bw_barycenter(grams, p, init=10 * np.eye(3))
    np.testing.assert_allclose(res2.gram, G, atol=1e-11)


def test_recursion_converges_to_barycenter_and_matches_heads(rng, helpers):
    grams = np.stack([helpers.spd(rng, 3, 0.2, 4) for _ in range(3)])
    p = np.array([0.2, 0.3, 0.5])
    G0 = helpers.spd(rng, 3, 0.1, 2)
    traj = gram_recursion(G0, grams, p, 40)
    assert traj.shape == (41, 3, 3)
    np.testing.assert_allclose(traj[0], G0, atol=0)
    np.testing.assert_allclose(traj[1], gram_step(G0, grams, p), atol=0)
    np.testing.assert_allclose(traj[-1], bw_barycenter(grams, p).gram, atol=1e-11)
    # head-level round: sum p_m Pi_m(W) has Gram gram_step(W W^T)
    W = rng.normal(size=(3, 6))
    W1 = selection_round(W, grams, p)
    np.testing.assert_allclose(W1, np.einsum("m,mcp->cp", p, closest_head(W, grams)), atol=1e-12)
    np.testing.assert_allclose(W1 @ W1.T, gram_step(W @ W.T, grams, p), atol=1e-12)
    # one round with identical targets lands on the target
    np.testing.assert_allclose(gram_step(G0, np.stack([grams[0]] * 3), p), grams[0], atol=1e-12)


def test_barycenter_nonconvergence_warns(rng, helpers):
    grams = np.stack([helpers.spd(rng, 3, 0.2, 4) for _ in range(3)])
    p = np.ones(3) / 3
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        res = bw_barycenter(grams, p, init=100 * np.eye(3), max_iter=2)
    assert not res.converged and res.n_iter == 2 and res.residual >= 1e-13
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bw_barycenter(grams, p).converged
