"""Every bad-input case of the math core raises a UFMInputError that says what and where."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.ufm import (
    NotFullyActiveError,
    TargetMoments,
    UFMInputError,
    bw_barycenter,
    bw_distance,
    check_fully_active,
    closest_head,
    displacement_delta,
    gram_recursion,
    gram_step,
    joint_objective,
    moment_correction,
    optimal_gram,
    optimal_loss,
    profiled_objective,
    psd_inv_sqrt,
    psd_sqrt,
    transport_map,
)

SPD = np.array([[2.0, 0.3], [0.3, 1.0]])
GRAMS = np.stack([SPD, 2 * SPD, np.eye(2)])
P3 = np.ones(3) / 3


def test_error_hierarchy():
    assert issubclass(UFMInputError, ValueError)
    assert issubclass(NotFullyActiveError, UFMInputError)


@pytest.mark.parametrize(
    "bad,match",
    [
        (np.ones((2, 3)), "not square"),
        (np.array([[1.0, 0.5], [0.4, 1.0]]), r"not symmetric: max\|A - A\^T\| = 1\.000e-01"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), r"non-finite value nan at index \(0, 1\)"),
        (np.array([[np.inf, 0.0], [0.0, 1.0]]), r"non-finite value inf at index \(0, 0\)"),
        (np.array([[1.0, 0.0], [0.0, -1.0]]), "not positive definite: smallest eigenvalue -1"),
        (np.array([[1.0, 0.0], [0.0, 0.0]]), "not positive definite"),
        (np.ones(3), "expected 2 axes"),
        ("abc", "cannot be read"),
    ],
)
def test_bad_matrix_for_pd_argument(bad, match):
    with pytest.raises(UFMInputError, match=match):
        transport_map(bad, SPD)
    with pytest.raises(UFMInputError, match="G:"):
        gram_step(bad, GRAMS, P3)


def test_symmetry_tolerance_is_relative():
    A = SPD * 1e6
    A2 = A.copy()
    A2[0, 1] += 1e-6  # relative 5e-13: rounding, accepted
    np.testing.assert_allclose(psd_sqrt(A2) @ psd_sqrt(A2), 0.5 * (A2 + A2.T), rtol=1e-12)
    A2[0, 1] += 1e-3  # relative 5e-10: rejected
    with pytest.raises(UFMInputError, match="not symmetric"):
        psd_sqrt(A2)


def test_batched_errors_name_the_client():
    bad = GRAMS.copy()
    bad[2] = np.array([[1.0, 0.0], [0.0, -0.5]])
    with pytest.raises(UFMInputError, match=r"grams at client 2: matrix is not positive semidefinite.*-5\.0+e-01"):
        bw_barycenter(bad, P3)
    bad = GRAMS.copy()
    bad[1, 0, 1] = 5.0
    with pytest.raises(UFMInputError, match="grams at client 1: matrix is not symmetric"):
        gram_step(SPD, bad, P3)
    with pytest.raises(UFMInputError, match="A at index 1: matrix is not positive definite"):
        psd_inv_sqrt(np.stack([SPD, -SPD]))


@pytest.mark.parametrize(
    "w,match",
    [
        ([0.5, 0.5], "expected 3 weights"),
        ([0.5, 0.6, -0.1], "weight of client 2 is -0.1"),
        ([0.5, 0.5, 0.0], "weight of client 2 is 0.0"),
        ([0.3, 0.3, 0.3], "weights sum to 0.9"),
        ([1 / 3, 1 / 3, 1 / 3 + 1e-9], "not 1"),
        ([np.nan, 0.5, 0.5], "non-finite"),
    ],
)
def test_bad_weights(w, match):
    with pytest.raises(UFMInputError, match=match):
        bw_barycenter(GRAMS, w)
    with pytest.raises(UFMInputError, match=match):
        TargetMoments(weights=w, means=np.zeros((3, 2)), covs=GRAMS)


def test_mismatched_shapes():
    with pytest.raises(UFMInputError, match="G_target"):
        transport_map(SPD, np.eye(3))
    with pytest.raises(UFMInputError, match="grams"):
        gram_step(np.eye(3), GRAMS, P3)
    with pytest.raises(UFMInputError, match="grams: expected shape"):
        bw_barycenter(SPD, [1.0])
    with pytest.raises(UFMInputError, match="do not broadcast"):
        bw_distance(GRAMS, GRAMS[:2])
    with pytest.raises(UFMInputError, match="B is"):
        bw_distance(SPD, np.eye(3))
    with pytest.raises(UFMInputError, match="P = 1 < C = 2"):
        closest_head(np.ones((2, 1)), SPD)
    with pytest.raises(UFMInputError, match="does not have full row rank"):
        closest_head(np.ones((2, 3)), SPD)
    with pytest.raises(UFMInputError, match="T: shape"):
        profiled_objective(np.ones((3, 4)), SPD, 0.1, 0.1)
    with pytest.raises(UFMInputError, match="w_ref: a reference head is required"):
        profiled_objective(np.ones((2, 4)), SPD, 0.1, 0.1, rho=0.1)
    with pytest.raises(UFMInputError, match="w_ref: shape"):
        profiled_objective(np.ones((2, 4)), SPD, 0.1, 0.1, rho=0.1, w_ref=np.ones((2, 3)))
    with pytest.raises(UFMInputError, match="sigma_cen: shape"):
        moment_correction(np.ones((2, 4)), SPD, np.eye(3), 0.1)
    W, b = np.ones((2, 3)), np.zeros(2)
    with pytest.raises(UFMInputError, match=r"Y: expected \(N, 2\)"):
        joint_objective(W, b, np.ones((5, 3)), np.ones((5, 3)), 0.1, 0.1)
    with pytest.raises(UFMInputError, match=r"H: expected features of shape \(N, P\) = \(5, 3\)"):
        joint_objective(W, b, np.ones((3, 5)), np.ones((5, 2)), 0.1, 0.1)
    with pytest.raises(UFMInputError, match=r"b: expected shape \(2,\)"):
        joint_objective(W, np.zeros(3), np.ones((5, 3)), np.ones((5, 2)), 0.1, 0.1)
    with pytest.raises(UFMInputError, match="n_rounds"):
        gram_recursion(SPD, GRAMS, P3, -1)
    with pytest.raises(UFMInputError, match="sigmas: expected client covariances"):
        displacement_delta(SPD, [1.0], 0.1, 0.1)


def test_bad_scalars():
    with pytest.raises(UFMInputError, match="lambda_h: must be finite and > 0, got 0.0"):
        optimal_gram(SPD, 0.0, 0.1)
    with pytest.raises(UFMInputError, match="lambda_w: must be finite and > 0, got nan"):
        optimal_loss(SPD, 0.1, float("nan"))
    with pytest.raises(UFMInputError, match="rho"):
        profiled_objective(np.ones((2, 2)), SPD, 0.1, 0.1, rho=-1.0, w_ref=np.ones((2, 2)))
    with pytest.raises(UFMInputError, match="tol"):
        bw_barycenter(GRAMS, P3, tol=0)
    with pytest.raises(UFMInputError, match="max_iter: must be an integer >= 1, got 0"):
        bw_barycenter(GRAMS, P3, max_iter=0)
    with pytest.raises(UFMInputError, match="max_iter: must be an integer >= 1, got 2.5"):
        bw_barycenter(GRAMS, P3, max_iter=2.5)
    with pytest.raises(UFMInputError, match="n_rounds: must be an integer >= 0, got None"):
        gram_recursion(SPD, GRAMS, P3, None)


def test_moment_constructor_errors():
    with pytest.raises(UFMInputError, match=r"targets\[1\]: has 3 target columns, client 0 has 2"):
        TargetMoments.from_targets([np.ones((4, 2)), np.ones((4, 3))])
    with pytest.raises(UFMInputError, match=r"targets\[0\]: contains a non-finite value nan at index \(1, 0\)"):
        y = np.ones((4, 2))
        y[1, 0] = np.nan
        TargetMoments.from_targets([y, np.ones((3, 2))])
    with pytest.raises(UFMInputError, match="client 1 has no samples"):
        TargetMoments.from_targets([np.ones((4, 2)), np.ones((0, 2))])
    with pytest.raises(UFMInputError, match="sequence of"):
        TargetMoments.from_targets(np.ones((4, 2)))
    with pytest.raises(UFMInputError, match=r"covs: expected shape \(3, 2, 2\)"):
        TargetMoments.from_stats([1, 2, 3], np.zeros((3, 2)), GRAMS[:2])
    with pytest.raises(UFMInputError, match="counts: client 1 has count 0"):
        TargetMoments.from_stats([1, 0, 3], np.zeros((3, 2)), GRAMS)
    with pytest.raises(UFMInputError, match="counts: client 2 has count 2.5"):
        TargetMoments.from_stats([1, 2, 2.5], np.zeros((3, 2)), GRAMS)
    covs = GRAMS.copy()
    covs[1] = -covs[1]
    with pytest.raises(UFMInputError, match="covs at client 1: matrix is not positive semidefinite"):
        TargetMoments.from_stats([1, 2, 3], np.zeros((3, 2)), covs)


def test_not_fully_active_message():
    tm = TargetMoments.from_stats([10, 10], np.zeros((2, 2)), np.stack([np.eye(2), np.diag([1.0, 0.004])]))
    with pytest.raises(NotFullyActiveError) as err:
        check_fully_active(tm, 0.1, 0.1)
    msg = str(err.value)
    assert "client 1" in msg and "4.000000e-03" in msg and "1.000000e-02" in msg and "margin" in msg
