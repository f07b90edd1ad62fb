"""Gram and head metrics of docs/theory.md §11 (fedhead.analysis.metrics)."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.analysis.metrics import direction_error, relative_error, selection_distance, trajectory_error
from fedhead.ufm import UFMInputError, bw_barycenter, closest_head, gram_recursion


def _spd(rng, C):
    X = rng.normal(size=(C, C + 2))
    return X @ X.T / (C + 2) + 0.1 * np.eye(C)


def test_relative_and_direction_error_known_values():
    G_ref = np.diag([3.0, 4.0])
    assert relative_error(G_ref, G_ref) == 0.0
    assert relative_error(np.zeros((2, 2)), G_ref) == pytest.approx(1.0)
    assert relative_error(np.diag([3.0, 4.5]), G_ref) == pytest.approx(0.1, rel=1e-15)
    # direction error ignores scale, is 0 for parallel and sqrt(2) for orthogonal Grams
    assert direction_error(7.3 * G_ref, G_ref) == pytest.approx(0.0, abs=1e-15)
    assert direction_error(np.diag([1.0, 0.0]), np.diag([0.0, 1.0])) == pytest.approx(np.sqrt(2.0), rel=1e-15)
    stack = np.stack([G_ref, 2 * G_ref, np.diag([3.0, 4.5])])
    np.testing.assert_allclose(relative_error(stack, G_ref), [0.0, 1.0, 0.1], atol=1e-15)
    np.testing.assert_allclose(direction_error(stack, G_ref)[:2], [0.0, 0.0], atol=1e-15)


def test_metric_errors():
    with pytest.raises(UFMInputError, match="reference matrix is zero"):
        relative_error(np.eye(2), np.zeros((2, 2)))
    with pytest.raises(UFMInputError, match="zero matrix"):
        direction_error(np.zeros((2, 2)), np.eye(2))
    with pytest.raises(UFMInputError, match="different matrix shapes"):
        relative_error(np.eye(2), np.eye(3))
    with pytest.raises(UFMInputError, match="non-finite"):
        relative_error(np.full((2, 2), np.nan), np.eye(2))
    with pytest.raises(UFMInputError, match="same"):
        selection_distance(np.ones((2, 2, 3)), np.ones((2, 2, 4)), [0.5, 0.5])
    with pytest.raises(UFMInputError, match="weights sum"):
        selection_distance(np.ones((2, 2, 3)), np.ones((2, 2, 3)), [0.5, 0.6])
    with pytest.raises(UFMInputError, match="T >= 1"):
        trajectory_error(np.ones((1, 2, 2)), np.ones((1, 2, 2)))


def test_selection_distance_zero_for_exact_selection_and_weighted_sum():
    rng = np.random.default_rng(0)
    grams = np.stack([_spd(rng, 3) for _ in range(4)])
    p = np.array([0.1, 0.2, 0.3, 0.4])
    W = rng.normal(size=(3, 5))
    targets = closest_head(W, grams)
    assert selection_distance(targets, targets, p) == 0.0
    offsets = rng.normal(size=targets.shape)
    expect = sum(p[m] * np.linalg.norm(offsets[m]) for m in range(4))
    assert selection_distance(targets + offsets, targets, p) == pytest.approx(expect, rel=1e-14)


def test_trajectory_error_median_over_rounds_one_to_T():
    rng = np.random.default_rng(1)
    grams = np.stack([_spd(rng, 2) for _ in range(3)])
    p = np.ones(3) / 3
    rec = gram_recursion(np.eye(2), grams, p, 5)
    assert trajectory_error(rec, rec) == 0.0
    measured = rec.copy()
    factors = [100.0, 1.1, 1.2, 1.3, 1.4, 1.5]  # round 0 is ignored
    measured *= np.array(factors)[:, None, None]
    assert trajectory_error(measured, rec) == pytest.approx(0.3, rel=1e-12)
    # error of a run that sits at the barycenter, against the recursion
    star = bw_barycenter(grams, p).gram
    flat = np.broadcast_to(star, rec.shape)
    assert trajectory_error(flat, rec) == pytest.approx(
        np.median([np.linalg.norm(star - rec[t]) / np.linalg.norm(rec[t]) for t in range(1, 6)]), rel=1e-12
    )
