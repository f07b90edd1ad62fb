"""Gap decomposition G_cen - G_star = M_mu + M_Sigma + M_A (docs/theory.md §7)."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.ufm import (
    NotFullyActiveError,
    TargetMoments,
    UFMInputError,
    bw_barycenter,
    bw_distance,
    closest_head,
    gap_decomposition,
    optimal_gram,
    psd_sqrt,
)

PSD_TOL = 1e-12


@pytest.mark.parametrize("seed,C,M", [(0, 2, 2), (1, 3, 4), (2, 5, 8), (3, 8, 3)])
def test_terms_psd_and_sum(instance, seed, C, M):
    inst = instance(seed, C=C, M=M, lam=0.1, lo=0.25, hi=3.0)
    gd = gap_decomposition(inst.moments, inst.lh, inst.lw)
    tm = inst.moments
    alpha = np.sqrt(inst.lh / inst.lw)
    np.testing.assert_allclose(gd.g_cen, optimal_gram(tm.sigma_cen, inst.lh, inst.lw), atol=1e-14)
    np.testing.assert_allclose(gd.grams, optimal_gram(tm.covs, inst.lh, inst.lw), atol=1e-14)
    np.testing.assert_allclose(gd.g_star, bw_barycenter(gd.grams, tm.weights).gram, atol=1e-12)
    np.testing.assert_allclose(gd.m_mu + gd.m_sigma + gd.m_a, gd.g_cen - gd.g_star, atol=1e-13)
    np.testing.assert_allclose(gd.total, gd.g_cen - gd.g_star, atol=0)
    np.testing.assert_allclose(gd.m_mu, alpha * (psd_sqrt(tm.sigma_cen) - psd_sqrt(tm.sigma_within)), atol=1e-13)
    np.testing.assert_allclose(
        gd.m_sigma,
        alpha * (psd_sqrt(tm.sigma_within) - np.einsum("m,mij->ij", tm.weights, psd_sqrt(tm.covs))),
        atol=1e-13,
    )
    scale = np.linalg.norm(gd.g_cen)
    for term in (gd.m_mu, gd.m_sigma, gd.m_a):
        np.testing.assert_allclose(term, term.T, atol=0)
        assert np.linalg.eigvalsh(term)[0] >= -PSD_TOL * scale
    # M_A = sum p (U*_m - W*)(U*_m - W*)^T with U*_m = Pi_m(W*)
    Ws = psd_sqrt(gd.g_star)
    U = closest_head(Ws, gd.grams)
    D = U - Ws
    np.testing.assert_allclose(gd.m_a, np.einsum("m,mij,mkj->ik", tm.weights, D, D), atol=1e-11)
    # Tr M_A = BW variance, D <= Tr M_A <= 2D
    assert np.trace(gd.m_a) == pytest.approx(gd.bw_variance, rel=1e-9, abs=1e-13)
    p = tm.weights
    disp = sum(p[m] * p[n] * bw_distance(gd.grams[m], gd.grams[n]) ** 2 for m in range(M) for n in range(m + 1, M))
    assert gd.pairwise_dispersion == pytest.approx(disp, rel=1e-12)
    assert disp - 1e-12 <= gd.bw_variance <= 2 * disp + 1e-12
    if M == 2:
        assert gd.bw_variance == pytest.approx(disp, rel=1e-9)
    assert gd.rel_gap == pytest.approx(np.linalg.norm(gd.total) / np.linalg.norm(gd.g_cen))
    np.testing.assert_allclose(gd.trace_shares.sum(), 1.0, atol=1e-12)
    np.testing.assert_allclose(gd.traces, [np.trace(gd.m_mu), np.trace(gd.m_sigma), np.trace(gd.m_a)])


def test_two_clients_trace_equals_dispersion(instance):
    for seed in range(5):
        inst = instance(100 + seed, C=3, M=2)
        gd = gap_decomposition(inst.moments, inst.lh, inst.lw)
        assert np.trace(gd.m_a) == pytest.approx(gd.pairwise_dispersion, rel=1e-9)


def test_zero_gap_iff_equal_moments(instance):
    inst = instance(5, C=3, M=4)
    same_cov = np.broadcast_to(inst.covs[0], inst.covs.shape)
    same_mean = np.broadcast_to(inst.means[0], inst.means.shape)
    eq = gap_decomposition(TargetMoments(inst.weights, same_mean, same_cov), inst.lh, inst.lw)
    for term in (eq.m_mu, eq.m_sigma, eq.m_a):
        assert np.abs(term).max() < 1e-13
    assert eq.bw_variance < 1e-24 and eq.pairwise_dispersion < 1e-24
    np.testing.assert_array_equal(eq.trace_shares, np.zeros(3))
    # equal covariances, different means: only the mean term
    only_mu = gap_decomposition(TargetMoments(inst.weights, inst.means, same_cov), inst.lh, inst.lw)
    assert np.abs(only_mu.m_sigma).max() < 1e-13 and np.abs(only_mu.m_a).max() < 1e-13
    assert np.linalg.eigvalsh(only_mu.m_mu)[-1] > 1e-3
    # equal means, different covariances: no mean term, both others nonzero
    only_cov = gap_decomposition(TargetMoments(inst.weights, same_mean, inst.covs), inst.lh, inst.lw)
    assert np.abs(only_cov.m_mu).max() < 1e-13
    assert np.trace(only_cov.m_sigma) > 1e-3 and np.trace(only_cov.m_a) > 1e-3
    full = gap_decomposition(inst.moments, inst.lh, inst.lw)
    assert full.rel_gap > 1e-2


def test_gap_requires_fully_active_and_moments(instance):
    inst = instance(6, C=2, M=3)
    covs = inst.covs.copy()
    covs[1] = np.diag([1.0, 0.001])
    with pytest.raises(NotFullyActiveError, match="client 1"):
        gap_decomposition(TargetMoments(inst.weights, inst.means, covs), inst.lh, inst.lw)
    with pytest.raises(UFMInputError, match="TargetMoments"):
        gap_decomposition(inst.covs, inst.lh, inst.lw)
