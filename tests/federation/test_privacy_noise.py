"""Client-level DP of the secure sums (federation/privacy_noise.py): clipping, the weight cap and
sensitivity, each site's noise and their sum (statistical tests on seeded draws), and the privacy
accounting against dp-accounting itself and the exact Gaussian mechanism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event, privacy_accountant, rdp
from scipy.optimize import brentq
from scipy.stats import norm

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.privacy_noise import (
    NOISE_RTOL,
    clip_contribution,
    dp_weight,
    noise_for_epsilon,
    privacy_spent,
    sensitivity,
    site_noise,
)

# Draws of the statistical tests: the sample variance of n normal draws has relative standard
# error sqrt(2/n) (0.32% at n = 200,000); the tests allow 5 of them (a false failure would have
# probability 6e-7 for a random seed; the seeds are fixed, so the tests are deterministic).
DRAWS = 200_000
VAR_TOL = 5 * math.sqrt(2 / DRAWS)


# ------------------------------------------------------------------ clipping, weight, sensitivity
@pytest.mark.parametrize("length", [1, 3, 40, 10_000])
def test_a_long_vector_is_clipped_to_the_bound(length):
    rng = np.random.default_rng(length)
    for clip in (1.0, 0.37, 25.0):
        v = rng.normal(size=length) * 10 * clip + 2 * clip / math.sqrt(length)  # norm > clip
        out = clip_contribution(v, clip)
        assert out.values.dtype == np.float64 and out.values.shape == (length,)
        assert abs(np.linalg.norm(out.values) - clip) <= 1e-15 * clip
        assert out.scale == pytest.approx(clip / np.linalg.norm(v), rel=1e-15) and 0 < out.scale < 1
        np.testing.assert_allclose(out.values, v * out.scale, rtol=0, atol=0)


def test_a_vector_within_the_bound_is_untouched():
    v = np.array([0.6, -0.8, 0.0])  # norm exactly 1
    for clip in (1.0, 2.0):
        out = clip_contribution(v, clip)
        assert out.scale == 1.0 and np.array_equal(out.values, v) and out.values is not v
    out = clip_contribution([1, 2], 10)  # integers: float64 values
    assert out.values.dtype == np.float64 and out.values.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    ("values", "clip", "message"),
    [
        (np.ones((2, 2)), 1.0, "must be flat and non-empty, got shape (2, 2)"),
        (np.ones(0), 1.0, "must be flat and non-empty"),
        ([1.0, np.nan], 1.0, "non-finite entry"),
        ([1.0], 0.0, "clip must be a finite number > 0, got 0.0"),
        ([1.0], math.inf, "clip must be a finite number > 0"),
        ([1.0], True, "clip must be a finite number > 0"),
    ],
)
def test_clipping_refuses_bad_input(values, clip, message):
    with pytest.raises(ConfigError) as err:
        clip_contribution(values, clip)
    assert message in str(err.value)


def test_the_weight_is_the_capped_row_count_and_one_site_moves_a_sum_by_at_most_k_delta():
    assert dp_weight(50, 200) == 50.0 and dp_weight(500, 200) == 200.0 and dp_weight(0, 1) == 0.0
    assert isinstance(dp_weight(np.int64(7), 3), float) and dp_weight(np.int64(7), 3) == 3.0
    assert sensitivity(200, 1.5) == 300.0 and sensitivity(1, 0.25) == 0.25
    rng = np.random.default_rng(0)
    k, clip = 100, 2.0
    for _ in range(200):
        rows = int(rng.integers(1, 1000))
        v = rng.normal(size=int(rng.integers(1, 30))) * rng.uniform(0.01, 10)
        term = dp_weight(rows, k) * clip_contribution(v, clip).values
        assert np.linalg.norm(term) <= sensitivity(k, clip) * (1 + 1e-15)
    for bad in (-1, 2.0, True, None):
        with pytest.raises(ConfigError, match="rows must be an integer >= 0"):
            dp_weight(bad, 10)
    for bad in (0, 2.5, False):
        with pytest.raises(ConfigError, match="max_rows must be an integer >= 1"):
            sensitivity(bad, 1.0)
        with pytest.raises(ConfigError, match="max_rows must be an integer >= 1"):
            dp_weight(5, bad)
    with pytest.raises(ConfigError, match="clip must be a finite number > 0"):
        sensitivity(5, -1.0)


# ------------------------------------------------------------------ noise
def _check_variance(draws: np.ndarray, variance: float) -> None:
    """Sample mean within 5 standard errors of 0, sample variance within VAR_TOL of ``variance``."""
    assert abs(draws.mean()) <= 5 * math.sqrt(variance / draws.size)
    assert abs(draws.var() / variance - 1) <= VAR_TOL, draws.var() / variance


def test_a_sites_noise_has_std_z_s_over_sqrt_m_min():
    z, s, m_min = 1.3, sensitivity(50, 0.8), 4
    noise = site_noise(np.random.default_rng(1), DRAWS, z, s, m_min)
    assert noise.dtype == np.float64 and noise.shape == (DRAWS,)
    _check_variance(noise, (z * s) ** 2 / m_min)
    again = site_noise(np.random.default_rng(1), DRAWS, z, s, m_min)
    assert np.array_equal(noise, again)  # the generator alone decides the draws


@pytest.mark.parametrize(("sites", "m_min"), [(5, 5), (7, 5), (3, 3)])
def test_the_noise_of_the_sites_sums_to_at_least_the_mechanisms(sites, m_min):
    """``m >= m_min`` sites' noise sums to variance ``(m / m_min) (z K Delta)^2``; ``m_min`` of them: exactly the
    Gaussian mechanism's ``(z K Delta)^2``."""
    z, s = 0.9, sensitivity(120, 1.5)
    rngs = [np.random.default_rng(100 + i) for i in range(sites)]
    total = np.sum([site_noise(rng, DRAWS, z, s, m_min) for rng in rngs], axis=0)
    _check_variance(total, sites / m_min * (z * s) ** 2)


def test_no_noise_multiplier_gives_zeros_and_bad_arguments_are_refused():
    rng = np.random.default_rng(0)
    assert np.array_equal(site_noise(rng, 4, 0.0, 3.0, 3), np.zeros(4))
    for args, message in [
        ((0, 1.0, 1.0, 3), "the noise length must be an integer >= 1, got 0"),
        ((3, -1.0, 1.0, 3), "noise_multiplier must be a finite number >= 0, got -1.0"),
        ((3, math.nan, 1.0, 3), "noise_multiplier must be a finite number >= 0"),
        ((3, 1.0, 0.0, 3), "sensitivity must be a finite number > 0, got 0.0"),
        ((3, 1.0, 1.0, 0), "min_sites must be an integer >= 1, got 0"),
    ]:
        with pytest.raises(ConfigError) as err:
            site_noise(rng, *args)
        assert message in str(err.value)


# ------------------------------------------------------------------ accounting
def test_no_noise_spends_infinity_and_no_release_spends_nothing():
    spent = privacy_spent(0.0, 10, 5, 1e-5)
    assert spent.epsilon == math.inf and spent.delta == 1e-5 and spent.num_releases == 10
    assert privacy_spent(2.0, 0, 5, 1e-5).epsilon == 0.0


def test_epsilon_falls_with_the_noise_and_grows_with_the_releases():
    eps_by_noise = [privacy_spent(z, 10, 8, 1e-5).epsilon for z in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)]
    assert all(a > b > 0 for a, b in zip(eps_by_noise, eps_by_noise[1:])), eps_by_noise
    eps_by_releases = [privacy_spent(2.0, t, 8, 1e-5).epsilon for t in (1, 2, 5, 21, 101)]
    assert all(a < b for a, b in zip(eps_by_releases, eps_by_releases[1:])), eps_by_releases
    eps_by_delta = [privacy_spent(2.0, 10, 8, d).epsilon for d in (1e-3, 1e-5, 1e-7)]
    assert all(a < b for a, b in zip(eps_by_delta, eps_by_delta[1:])), eps_by_delta


def _direct_epsilon(z: float, releases: int, delta: float) -> float:
    accountant = rdp.RdpAccountant(neighboring_relation=privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_event.GaussianDpEvent(z), releases)
    return accountant.get_epsilon(delta)


def _exact_gaussian_epsilon(z: float, releases: int, delta: float) -> float:
    """The exact epsilon of ``releases`` Gaussian releases (one Gaussian mechanism of noise multiplier
    ``z / sqrt(T)``; Balle and Wang 2018, Theorem 8): the root of
    ``Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s) = delta``."""
    s = z / math.sqrt(releases)

    def excess(eps: float) -> float:
        return norm.cdf(0.5 / s - eps * s) - math.exp(eps) * norm.cdf(-0.5 / s - eps * s) - delta

    return brentq(excess, 0.0, 500.0, xtol=1e-14)


@pytest.mark.parametrize(
    ("z", "releases", "sites", "delta"), [(0.8, 1, 3, 1e-5), (1.7, 21, 10, 1e-6), (5.0, 401, 50, 1e-5)]
)
def test_epsilon_is_dp_accountings_and_lies_between_the_exact_and_the_classic_bound(z, releases, sites, delta):
    spent = privacy_spent(z, releases, sites, delta)
    assert spent.accounting_method == "rdp" and spent.num_releases == releases and spent.delta == delta
    assert spent.epsilon == pytest.approx(_direct_epsilon(z, releases, delta), rel=1e-12, abs=1e-12)
    # RDP of the Gaussian is alpha T / (2 z^2); the classic conversion eps <= rdp + log(1/delta)/(alpha - 1)
    # (Mironov 2017) is looser than dp-accounting's, and no accountant beats the exact mechanism's epsilon
    orders = rdp.RdpAccountant().orders
    classic = min(a * releases / (2 * z**2) + math.log(1 / delta) / (a - 1) for a in orders)
    exact = _exact_gaussian_epsilon(z, releases, delta)
    assert exact < spent.epsilon <= classic, (exact, spent.epsilon, classic)
    assert spent.epsilon < 1.25 * exact  # and RDP is near it for Gaussians


def test_the_population_does_not_amplify():
    assert privacy_spent(1.5, 10, 3, 1e-5).epsilon == privacy_spent(1.5, 10, 300, 1e-5).epsilon


def test_a_delta_of_one_site_or_more_is_warned_about():
    with pytest.warns(UserWarning, match=r"delta=0.25 is at least 1/sites \(1/4\)"):
        privacy_spent(1.0, 3, 4, 0.25)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1.0, -1, 5, 1e-5), "releases must be an integer >= 0, got -1"),
        ((1.0, 2.0, 5, 1e-5), "releases must be an integer >= 0"),
        ((1.0, 3, 0, 1e-5), "sites must be an integer >= 1, got 0"),
        ((1.0, 3, 5, 0.0), "delta must be a number in (0, 1), got 0.0"),
        ((1.0, 3, 5, 1.0), "delta must be a number in (0, 1)"),
        ((-0.1, 3, 5, 1e-5), "noise_multiplier must be a finite number >= 0"),
    ],
)
def test_accounting_refuses_bad_arguments(args, message):
    with pytest.raises(ConfigError) as err:
        privacy_spent(*args)
    assert message in str(err.value)


@pytest.mark.parametrize(("epsilon", "releases"), [(0.5, 1), (1.0, 21), (4.0, 21), (10.0, 101), (8.0, 1)])
def test_the_noise_for_an_epsilon_spends_at_most_it(epsilon, releases):
    z = noise_for_epsilon(epsilon, releases, 10, 1e-5)
    spent = privacy_spent(z, releases, 10, 1e-5).epsilon
    assert spent <= epsilon and spent == pytest.approx(epsilon, rel=1e-5)
    assert privacy_spent(z * (1 - 2 * NOISE_RTOL), releases, 10, 1e-5).epsilon > epsilon  # the smallest such z


def test_the_noise_for_an_epsilon_refuses_bad_targets():
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ConfigError, match="epsilon must be a finite number > 0"):
            noise_for_epsilon(bad, 10, 5, 1e-5)
    with pytest.raises(ConfigError, match="releases must be >= 1"):
        noise_for_epsilon(1.0, 0, 5, 1e-5)
