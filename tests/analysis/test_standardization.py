"""Standardisation from exchanged moments (fedhead/analysis/standardization.py) against the pooled rows."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.analysis.standardization import (
    StandardizationError,
    pooled_mean_std,
    pooled_standardization,
    standardized_moments,
)


def _sites(seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes, shifts = (17, 40, 25), (0.0, 3.0, -2.0)
    a = np.array([[2.0, 0.3, 0.0], [0.0, 50.0, 1.0], [0.0, 0.0, 0.01]])
    return [rng.normal(size=(n, 3)) @ a + s * np.array([1.0, 100.0, -0.5]) for n, s in zip(sizes, shifts)]


def _raw_moments(sites):
    counts = [y.shape[0] for y in sites]
    means = [y.mean(0) for y in sites]
    covs = [(y - y.mean(0)).T @ (y - y.mean(0)) / y.shape[0] for y in sites]
    return counts, means, covs


def test_pooled_statistics_and_standardised_moments_equal_the_pooled_rows():
    sites = _sites()
    pooled = np.concatenate(sites)
    counts, means, covs = _raw_moments(sites)
    st = pooled_standardization(counts, means, covs, means, [np.diag(c) for c in covs])
    np.testing.assert_allclose(st.target_offset, pooled.mean(0), rtol=0, atol=1e-12 * np.abs(pooled).max())
    np.testing.assert_allclose(st.target_scale, pooled.std(0), rtol=1e-12)
    np.testing.assert_allclose(st.input_scale, pooled.std(0), rtol=1e-12)
    mus, sigmas = standardized_moments(means, covs, st.target_offset, st.target_scale)
    start = 0
    for y, mu, sigma in zip(sites, mus, sigmas):
        z = (pooled[start : start + y.shape[0]] - pooled.mean(0)) / pooled.std(0)  # the pooled rows, standardised
        start += y.shape[0]
        np.testing.assert_allclose(mu, z.mean(0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(sigma, (z - z.mean(0)).T @ (z - z.mean(0)) / z.shape[0], rtol=0, atol=1e-12)
    z_all = (pooled - pooled.mean(0)) / pooled.std(0)
    weights = np.asarray(counts) / sum(counts)
    np.testing.assert_allclose(weights @ mus, 0.0, atol=1e-12)  # the pooled standardised mean is 0 ...
    total = sum(w * (s + np.outer(m, m)) for w, s, m in zip(weights, sigmas, mus))
    np.testing.assert_allclose(total, z_all.T @ z_all / z_all.shape[0], atol=1e-12)  # ... and the variance 1
    np.testing.assert_allclose(np.diag(total), 1.0, atol=1e-12)


def test_modes_none_and_site_and_refusals():
    sites = _sites(1)
    counts, means, covs = _raw_moments(sites)
    st = pooled_standardization(
        counts, means, covs, means, [np.diag(c) for c in covs], target_mode="none", input_mode="site"
    )
    np.testing.assert_array_equal(st.target_offset, np.zeros(3))
    np.testing.assert_array_equal(st.target_scale, np.ones(3))
    assert st.input_offset.size == 0 and st.input_scale.size == 0  # nothing pooled for the inputs
    d = st.to_dict()
    assert d["targets"]["mode"] == "none" and d["inputs"] == {"mode": "site", "offset": [], "scale": []}
    const = [c.copy() for c in covs]
    for c in const:
        c[1, :] = c[:, 1] = 0.0
    flat_means = [m * np.array([1.0, 0.0, 1.0]) for m in means]
    with pytest.raises(StandardizationError, match=r"target column\(s\) \[1\] are constant"):
        pooled_standardization(counts, flat_means, const)
    # a constant input is only centred
    _, scale = pooled_mean_std(counts, flat_means, [np.diag(c) for c in const])
    assert scale[1] == 0.0
    st = pooled_standardization(counts, means, covs, flat_means, [np.diag(c) for c in const])
    assert st.input_scale[1] == 1.0
    with pytest.raises(StandardizationError, match="input mode"):
        pooled_standardization(counts, means, covs, input_mode="global")


def test_pooled_offsets_and_scales_that_are_not_finite_are_refused_naming_columns_not_values():
    """A site whose sums overflowed (inf mean, NaN/inf variance) or pooled sums that overflow:
    refused, never the 'constant' message nor a standardisation to zeros; no value in the message."""
    from fedhead.analysis.standardization import check_offset_scale, float32_overflow

    counts, means, covs = _raw_moments(_sites())
    for bad_mean, bad_var in ((np.inf, 1.0), (1e308, np.inf), (1.0, np.nan)):
        m, c = [a.copy() for a in means], [a.copy() for a in covs]
        m[1][2], c[1][2, 2] = bad_mean, bad_var
        with pytest.raises(StandardizationError, match=r"target mean or standard deviation of column\(s\) \[2\]"):
            pooled_standardization(counts, m, c)
        x_mean, x_var = [np.array([0.0, 1.0])] * 3, [np.array([1.0, 1.0])] * 3
        x_mean[2] = np.array([0.0, bad_mean])
        x_var[2] = np.array([1.0, bad_var])
        with pytest.raises(StandardizationError, match=r"input mean or standard deviation of column\(s\) \[1\]"):
            pooled_standardization(counts, means, covs, x_mean, x_var)
    # finite per site, but the pooled sum of squares overflows
    with pytest.raises(StandardizationError, match=r"column\(s\) \[0\] is not finite") as info:
        pooled_standardization([2, 2], [[1e300, 0.0], [-1e300, 1.0]], [np.eye(2), np.eye(2)])
    assert "e+300" not in str(info.value) and "e300" not in str(info.value)
    st = pooled_standardization(counts, means, covs, [np.zeros(2)] * 3, [np.ones(2)] * 3)
    check_offset_scale(st.target_offset, st.target_scale, names=["a", "b", "c"])  # an honest one passes
    check_offset_scale(st.input_offset, st.input_scale, names=["u", "v"], what="input")
    with pytest.raises(StandardizationError, match=r"target mean or standard deviation of column\(s\) 'b'"):
        check_offset_scale([0.0, np.inf], [1.0, 1.0], names=["a", "b"])
    with pytest.raises(StandardizationError, match=r"input standard deviation of column\(s\) 'v' is not positive"):
        check_offset_scale([0.0, 0.0], [1.0, 0.0], names=["u", "v"], what="input")
    check_offset_scale([0.0, 0.0], [1.0, 0.0], positive=False)  # finiteness only
    assert float32_overflow([[1.0, 1e300], [2.0, 0.0]]).tolist() == [[False, True], [False, False]]  # beyond float32
    assert not float32_overflow((np.array([[1.0, 3.0]]) - [1.0, 2.0]) / [0.5, 4.0]).any()
    assert float32_overflow([np.nan, -np.inf, 3.5e38, 3.4e38]).tolist() == [True, True, True, False]
