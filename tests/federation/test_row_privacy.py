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
    assert rp.release_length(4) == 2 * rp.svec(a).size + 5


def _blocks(release: np.ndarray, dim: int) -> list[np.ndarray]:
    half = dim * (dim + 1) // 2
    return np.split(release, [1, 1 + dim, 1 + dim + half])


def test_one_row_moves_each_block_by_at_most_its_sensitivity():
    """Adding or removing one row (clipped or not) moves each block of a site's release by at most the stated
    sensitivity, so the scaled release moves by at most 1 (the Gaussian mechanism's sensitivity)."""
    rng = np.random.default_rng(3)
    clip, dim = 2.0, 3
    assert rp.sensitivities(clip) == (1.0, 2.0, 4.0, math.sqrt(17) * 4.0)
    scales = rp.noise_scales(dim, clip)
    worst = np.zeros(4)
    for trial in range(300):
        n = int(rng.integers(1, 40))
        y = rng.normal(size=(n, dim)) * rng.choice([0.3, 3.0]) + rng.normal(size=dim) * rng.choice([0.0, 5.0])
        extra = rng.normal(size=(1, dim)) * rng.choice([0.1, 1.0, 10.0])
        if trial == 0:  # the worst case of the between-means block: the row opposite the site's clipped mean
            y, extra = np.tile([[clip, 0.0, 0.0]], (n, 1)), np.array([[-clip, 0.0, 0.0]])
        base, moved = rp.row_statistics(y, clip), rp.row_statistics(np.vstack([y, extra]), clip)
        change = [float(np.linalg.norm(a - b)) for a, b in zip(_blocks(moved, dim), _blocks(base, dim), strict=True)]
        worst = np.maximum(worst, np.array(change) / np.array(rp.sensitivities(clip)))
        assert np.linalg.norm((moved - base) / scales) <= 1.0 + 1e-12
    assert np.all(worst <= 1.0 + 1e-12)
    assert worst[:3] == pytest.approx(1.0, abs=1e-9)  # count, sums and second moments: a clipped row is the bound
    assert worst[3] > 0.6  # the between-means block: 3 C^2 of the sqrt(17) C^2 bound is reached
    assert np.linalg.norm(rp.clip_rows(y, clip), axis=1).max() <= clip * (1 + 1e-12)


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
    zr = rp.noise_for_row_epsilon(1.0, 30000, 1e-6)
    assert rp.row_privacy_spent(rp.exchange_event(zr)[0], [], 30000, 1e-6) <= 1.0
    assert rp.exchange_event(zr) == (zr, 1)
    assert rp.drawn_noise(zr, 4, 3.0) > zr  # the sites draw more, for the grid's rounding
    assert rp.row_privacy_spent(0.0, [], 10, 1e-6) == 0.0


def test_three_sites_pooled_covariance_within_the_predicted_error():
    gen, rng = np.random.default_rng(5), random.Random(5)
    dim, clip, rows = 4, 6.0, 3000
    sites = [gen.normal(size=(rows, dim)) @ np.diag([1.0, 0.8, 0.6, 0.4]) + 0.2 * m for m in range(3)]
    true = np.cov(np.vstack(sites).T, bias=True)
    within = sum(np.cov(y.T, bias=True) for y in sites) / 3
    z = rp.noise_for_row_epsilon(1.0, 3 * rows, 1e-6)
    shares = [rp.site_release(y, clip=clip, noise_multiplier=z, min_sites=3, sites=3, rng=rng) for y in sites]
    total = np.sum(shares, axis=0)
    pooled = rp.pooled_moments(total, dim)
    scales = rp.noise_scales(dim, clip)
    half = dim * (dim + 1) // 2
    second = rp.drawn_noise(z, dim, clip) * scales[1 + dim] / (3 * rows)  # the second moments' noise per entry
    predicted = second * math.sqrt(half)  # RMS Frobenius error of the covariance
    assert np.linalg.norm(pooled.cov - true) < 4 * predicted
    between = rp.drawn_noise(z, dim, clip) * scales[-1] / (3 * rows)
    assert np.linalg.norm(pooled.within - within) < 4 * math.hypot(second, between) * math.sqrt(half)
    assert pooled.count == pytest.approx(3 * rows, abs=6 * z * scales[0])


def test_refusals():
    with pytest.raises(ConfigError):
        rp.pooled_moments(np.array([-1.0, 0.0, 0.0]), 1)
    with pytest.raises(ConfigError):
        rp.clip_rows(np.array([[np.nan]]), 1.0)
    with pytest.raises(ConfigError):
        rp.site_share(np.zeros(2), 1, clip=1.0, noise_multiplier=1.0, min_sites=3, rng=random.Random(0))
