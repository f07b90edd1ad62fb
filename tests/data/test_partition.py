"""Leading-eigenvector partition and designed groups (docs/theory.md §10)."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.data import DataError
from fedhead.data.partition import designed_partition, eigen_partition, leading_direction


def _targets(n=1000, c=3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(c, c))
    return rng.normal(size=(n, c)) @ a + np.array([0.5, -0.2, 0.1])[:c]


def test_leading_direction_matches_svd_of_uncentred_targets():
    y = _targets()
    v = leading_direction(y)
    # independent solver: top right singular vector of Y is the top eigenvector of Y^T Y / N
    vt = np.linalg.svd(y, full_matrices=False)[2][0]
    assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-14)
    assert abs(abs(v @ vt) - 1.0) < 1e-12
    assert v[np.argmax(np.abs(v))] > 0  # sign convention


def test_second_moment_is_uncentred():
    # large mean along e1, large spread along e2: centred covariance would pick e2,
    # the uncentred second moment (E y1^2 = 100 > E y2^2 = 9) picks e1
    rng = np.random.default_rng(1)
    y = np.column_stack([10.0 + 0.1 * rng.standard_normal(4000), 3.0 * rng.standard_normal(4000)])
    v = leading_direction(y)
    assert abs(v[0]) > 0.999
    cov_top = np.linalg.eigh(np.cov(y.T))[1][:, -1]
    assert abs(cov_top[1]) > 0.99  # the centred answer really differs


@pytest.mark.parametrize("n,m", [(1000, 4), (1001, 4), (12000, 8), (9, 3)])
def test_equal_sizes_and_ordering(n, m):
    y = _targets(n)
    part = eigen_partition(y, m)
    sizes = np.bincount(part.train, minlength=m)
    assert sizes.sum() == n and sizes.max() - sizes.min() <= (0 if n % m == 0 else 1)
    z = y @ part.direction
    for k in range(m - 1):
        assert z[part.train == k].max() <= z[part.train == k + 1].min()
    np.testing.assert_allclose(part.intervals[:, 0], [z[part.train == k].min() for k in range(m)])
    np.testing.assert_allclose(part.intervals[:, 1], [z[part.train == k].max() for k in range(m)])
    # every client's indices ascending and disjoint, covering everything
    allidx = np.concatenate([part.indices(k) for k in range(m)])
    assert np.array_equal(np.sort(allidx), np.arange(n))


def test_clients_have_distinct_moments():
    y = _targets(4000)
    part = eigen_partition(y, 4)
    means = np.stack([y[part.train == k].mean(0) for k in range(4)])
    covs = np.stack([np.cov(y[part.train == k].T, bias=True) for k in range(4)])
    proj = means @ part.direction
    assert np.all(np.diff(proj) > 0.3)  # means strictly increase along v
    for a in range(4):
        for b in range(a + 1, 4):
            assert np.linalg.norm(means[a] - means[b]) > 0.3
    # covariances differ: variance along v is smaller in the middle clients than at the ends
    var_v = np.einsum("i,mij,j->m", part.direction, covs, part.direction)
    assert var_v[0] > 2 * var_v[1] and var_v[3] > 2 * var_v[2]
    # and every client keeps full-rank covariance (other directions untouched)
    assert np.all(np.linalg.eigvalsh(covs)[:, 0] > 1e-3)


def test_test_samples_go_to_nearest_interval():
    t = np.array([0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0])
    y = np.column_stack([t, np.zeros_like(t)])
    y_test = np.column_stack([[-5.0, 1.5, 4.0, 8.0, 6.5, 20.0, 12.0], np.zeros(7)])
    part = eigen_partition(y, 2, y_test)
    np.testing.assert_allclose(part.intervals, [[0, 3], [10, 13]])
    # -5 below all -> 0; 1.5 inside 0; 4 nearer 0 (1 vs 6); 8 nearer 1 (5 vs 2);
    # 6.5 is 3.5 from both intervals -> tie -> lower id 0; 20 -> 1; 12 inside 1
    assert part.test.tolist() == [0, 0, 0, 1, 0, 1, 1]
    assert part.indices(1, test=True).tolist() == [3, 5, 6]


def test_deterministic_ties_and_errors():
    y = np.ones((8, 2))  # all projections equal: stable sort keeps index order
    part = eigen_partition(y, 4)
    assert part.train.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(DataError, match="cannot split 3"):
        eigen_partition(np.ones((3, 2)), 4)
    with pytest.raises(DataError, match="num_clients"):
        eigen_partition(np.ones((3, 2)), 0)
    with pytest.raises(DataError, match="test targets"):
        eigen_partition(np.ones((8, 2)), 2, np.ones((3, 3)))
    with pytest.raises(DataError, match=r"\(N, C\) array, got shape \(8,\)"):
        eigen_partition(np.ones(8), 2)
    with pytest.raises(DataError, match="training targets contain non-finite"):
        eigen_partition(np.array([[1.0, np.nan]] * 4), 2)
    with pytest.raises(DataError, match="test targets contain non-finite"):
        eigen_partition(np.ones((8, 2)), 2, np.array([[np.inf, 0.0]]))


def test_designed_partition():
    g = np.array([0, 1, 2, 3, 3, 2, 1, 0])
    part = designed_partition(g, 4, np.array([1, 1, 0]))
    assert part.train.tolist() == g.tolist() and part.test.tolist() == [1, 1, 0]
    assert part.direction is None and part.n_clients == 4
    with pytest.raises(DataError, match="num_clients=8"):
        designed_partition(g, 8)
    with pytest.raises(DataError, match="test groups"):
        designed_partition(g, 4, np.array([4]))
