"""Row-level differential privacy of the exchange: the discrete Gaussian sampler, the sensitivities, the
noise shares on the secure sum's grid, the accountant, and three sites' pooled covariance."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest

from fedhead.analysis.constraints import ConfigError
from fedhead.federation import discrete_gaussian as dg
from fedhead.federation import row_privacy as rp
from fedhead.federation.ring_encoding import RingFixedPoint


def test_bernoulli_exp_matches_exp():
    rng = random.Random(1)
    for gamma in (Fraction(1, 3), Fraction(3, 2)):
        hits = sum(dg.bernoulli_exp(rng, gamma) for _ in range(20000))
        p = math.exp(-float(gamma))
        assert abs(hits / 20000 - p) < 4 * math.sqrt(p * (1 - p) / 20000)


def test_discrete_gaussian_pmf_and_moments():
    rng = random.Random(7)
    draws = np.array(dg.discrete_gaussians(rng, Fraction(1), 20000))
    support = np.arange(-12, 13)
    pmf = np.exp(-(support**2) / 2.0)
    pmf /= pmf.sum()
    for x in (0, 1, -1, 2):
        p = pmf[x + 12]
        assert abs(np.mean(draws == x) - p) < 4 * math.sqrt(p * (1 - p) / draws.size)
    var = float(pmf @ support**2)  # slightly below 1 for the discrete Gaussian of parameter 1
    assert abs(draws.var() - var) < 4 * var * math.sqrt(2 / draws.size)
    big = np.array(dg.discrete_gaussians(rng, Fraction(10**12), 20000), dtype=np.float64)
    assert abs(big.mean()) < 4e6 / math.sqrt(big.size)
    assert abs(big.var() / 1e12 - 1) < 4 * math.sqrt(2 / big.size)


def test_sum_gap():
    assert dg.sum_gap(1.0, 1) == 0.0
    assert dg.sum_gap(1.0, 2) == pytest.approx(10 * math.exp(-(math.pi**2)))
    assert dg.sum_gap(1e6, 10) == 0.0
    with pytest.raises(ConfigError):
        dg.sum_gap(0.1, 3)


def test_svec_is_an_isometry():
    a = np.random.default_rng(0).normal(size=(4, 4))
    a = a + a.T
    assert np.linalg.norm(rp.svec(a)) == pytest.approx(np.linalg.norm(a))
    np.testing.assert_array_equal(rp.unsvec(rp.svec(a), 4), a)
    assert rp.release_length(4) == rp.svec(a).size + 5


def test_one_row_moves_the_scaled_release_by_at_most_one():
    rng = np.random.default_rng(3)
    clip, dim = 2.0, 3
    y = rng.normal(size=(50, dim)) * 3
    base = rp.row_statistics(y, clip)
    scales = rp.noise_scales(dim, clip)
    for extra in (np.array([[10.0, 0, 0]]), np.array([[0.1, 0.2, 0.0]])):
        moved = (rp.row_statistics(np.vstack([y, extra]), clip) - base) / scales
        norm = min(1.0, float(np.linalg.norm(extra)) / clip)  # a clipped row moves it by exactly 1
        expected = math.sqrt(sum(w * norm ** (2 * k) for k, w in enumerate(rp.BLOCK_SHARES)))
        assert np.linalg.norm(moved) == pytest.approx(expected)
    assert np.linalg.norm(rp.clip_rows(y, clip), axis=1).max() <= clip * (1 + 1e-12)
    assert rp.sensitivities(clip) == (1.0, 2.0, 4.0)


def test_shares_sum_to_the_target_variance_on_the_grid():
    rng = random.Random(11)
    dim, clip, z = 1, 1.5, 0.7
    zeros = np.zeros(rp.release_length(dim))
    sums = np.array(
        [
            sum(rp.site_share(zeros, dim, clip=clip, noise_multiplier=z, min_sites=3, rng=rng) for _ in range(3))
            for _ in range(2000)
        ]
    )
    ratio = sums.var(axis=0) / (z * rp.noise_scales(dim, clip)) ** 2
    np.testing.assert_allclose(ratio, 1.0, atol=4 * math.sqrt(2 / 2000))
    grid = sums * 2.0**rp.GRID_BITS
    np.testing.assert_array_equal(grid, np.round(grid))  # exact multiples of the grid step
    ring = RingFixedPoint(bound=1e6, frac_bits=24, words=2)
    np.testing.assert_array_equal(ring.decode(ring.encode(sums[0])), sums[0])  # the ring carries them exactly


def test_accountant_matches_dp_accounting():
    z, later = 3.0, [5.0, 5.0]
    ours = rp.row_privacy_spent(z, later, 30000, 1e-6)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z))
    acc.compose(dp_accounting.GaussianDpEvent(2.5), 2)
    assert ours == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
    zr = rp.noise_for_row_epsilon(1.0, 4, 3.0, 30000, 1e-6)
    assert rp.row_privacy_spent(rp.effective_noise(zr, 4, 3.0), [], 30000, 1e-6) <= 1.0
    assert rp.row_privacy_spent(0.0, [], 10, 1e-6) == 0.0


def test_three_sites_pooled_covariance_within_the_predicted_error():
    gen, rng = np.random.default_rng(5), random.Random(5)
    dim, clip, rows = 4, 6.0, 3000
    sites = [gen.normal(size=(rows, dim)) @ np.diag([1.0, 0.8, 0.6, 0.4]) + 0.2 * m for m in range(3)]
    true = np.cov(np.vstack(sites).T, bias=True)
    z = rp.noise_for_row_epsilon(1.0, dim, clip, 3 * rows, 1e-6)
    shares = [
        rp.site_share(rp.row_statistics(y, clip), dim, clip=clip, noise_multiplier=z, min_sites=3, rng=rng)
        for y in sites
    ]
    total = np.sum(shares, axis=0)
    pooled = rp.pooled_moments(total, dim)
    second = z * rp.noise_scales(dim, clip)[-1] / (3 * rows)  # the second moments' noise per svec entry
    predicted = second * math.sqrt(dim * (dim + 1) / 2)  # RMS Frobenius error of the covariance
    assert np.linalg.norm(pooled.cov - true) < 4 * predicted
    assert pooled.count == pytest.approx(3 * rows, abs=6 * z * rp.noise_scales(dim, clip)[0])


def test_refusals():
    with pytest.raises(ConfigError):
        rp.pooled_moments(np.array([-1.0, 0.0, 0.0]), 1)
    with pytest.raises(ConfigError):
        rp.clip_rows(np.array([[np.nan]]), 1.0)
    with pytest.raises(ConfigError):
        rp.site_share(np.zeros(2), 1, clip=1.0, noise_multiplier=1.0, min_sites=3, rng=random.Random(0))
