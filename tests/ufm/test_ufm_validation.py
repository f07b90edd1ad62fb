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


def test_numerically_singular_inputs_are_not_positive_definite():
    """Rank-deficient Grams / heads whose rounding eigenvalue comes out slightly positive are
    rejected where positive definiteness is required (their inverse square root is garbage)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        B = rng.normal(size=(3, 2))
        G = B @ B.T  # rank 2; eigvalsh often returns a tiny positive smallest eigenvalue
        with pytest.raises(UFMInputError, match="not positive definite"):
            psd_inv_sqrt(G)
        with pytest.raises(UFMInputError, match="G: matrix is not positive definite"):
            gram_step(G, np.stack([np.eye(3), 2 * np.eye(3)]), [0.5, 0.5])
        W = rng.normal(size=(2, 1)) @ rng.normal(size=(1, 5))  # rank 1
        with pytest.raises(UFMInputError, match="does not have full row rank"):
            closest_head(W, SPD)
    # a well-conditioned but tiny matrix is still positive definite (the floor is relative)
    np.testing.assert_allclose(psd_inv_sqrt(1e-200 * np.eye(2)), 1e100 * np.eye(2), rtol=1e-12)


def test_section9_quantities_require_fully_active_sigma_within():
    from fedhead.ufm import commuting_delta, theta_min

    covs = np.stack([np.diag([1.0, 0.004]), np.diag([2.0, 0.006])])  # Sigma_within_22 = 0.005
    with pytest.raises(NotFullyActiveError, match=r"sigma_within: smallest eigenvalue 5\.0+e-03"):
        theta_min(covs.mean(0), 0.1, 0.1)
    with pytest.raises(NotFullyActiveError, match="Sigma_within"):
        displacement_delta(covs, [0.5, 0.5], 0.1, 0.1)
    with pytest.raises(NotFullyActiveError, match=r"eigenvalue 1 of Sigma_within.*1\.0+e-02"):
        commuting_delta([[1.0, 0.004], [2.0, 0.006]], [0.5, 0.5], 0.1, 0.1)
    assert theta_min(covs.mean(0), 0.01, 0.1) > 0  # threshold 1e-3 < 5e-3: inside the regime


def test_psi_and_gram_map_shape_mismatch():
    from fedhead.ufm import profiled_gram_map, psi_gradient, psi_value

    covs = np.stack([np.eye(3), 2 * np.eye(3)])
    for fn in (psi_value, psi_gradient):
        with pytest.raises(UFMInputError, match=r"G: shape \(2, 2\) does not match sigmas"):
            fn(SPD, covs, [0.5, 0.5], 0.1, 0.1)
    with pytest.raises(UFMInputError, match=r"G: shape \(2, 2\) does not match sigmas"):
        profiled_gram_map(SPD, covs, [0.5, 0.5], 0.1, 0.1, 0.1, 2)
    with pytest.raises(UFMInputError, match="weights sum"):
        psi_value(np.eye(3), covs, [0.5, 0.6], 0.1, 0.1)


# every public entry point that takes a matrix, with the argument name its error must carry;
# ``X`` is the bad matrix (single-matrix arguments) or a 2 x 2 stack with X at client 1
_W = np.array([[1.0, 0.2, 0.0], [0.0, 1.0, 0.3]])


def _stack(X):
    X = np.asarray(X, dtype=float)
    if X.shape != (2, 2):
        return np.stack([np.zeros_like(X), X])
    return np.stack([SPD, X])


def _entry_points():
    from fedhead.ufm import (
        displacement_delta,
        finite_step_fixed_point,
        profiled_gram_map,
        psi_value,
        selection_round,
        theta_min,
    )

    w2 = [0.5, 0.5]
    return {
        "optimal_gram T": (lambda X: optimal_gram(X, 0.1, 0.1), "T"),
        "optimal_loss T": (lambda X: optimal_loss(X, 0.1, 0.1), "T"),
        "bw_distance A": (lambda X: bw_distance(X, SPD), "A"),
        "bw_distance B": (lambda X: bw_distance(SPD, X), "B"),
        "transport_map G": (lambda X: transport_map(X, SPD), "G"),
        "transport_map G_target": (lambda X: transport_map(SPD, _stack(X)), "G_target at client 1"),
        "closest_head G_target": (lambda X: closest_head(_W, X), "G_target"),
        "gram_step grams": (lambda X: gram_step(SPD, _stack(X), w2), "grams at client 1"),
        "gram_recursion G0": (lambda X: gram_recursion(X, GRAMS, P3, 2), "G0"),
        "selection_round grams": (lambda X: selection_round(_W, _stack(X), w2), "grams at client 1"),
        "bw_barycenter grams": (lambda X: bw_barycenter(_stack(X), w2), "grams at client 1"),
        "bw_barycenter init": (lambda X: bw_barycenter(GRAMS, P3, init=X), "init"),
        "profiled_objective T": (lambda X: profiled_objective(_W, X, 0.1, 0.1), "T"),
        "moment_correction sigma_m": (lambda X: moment_correction(_W, X, SPD, 0.1), "sigma_m"),
        "moment_correction sigma_cen": (lambda X: moment_correction(_W, SPD, X, 0.1), "sigma_cen"),
        "check_fully_active covs": (lambda X: check_fully_active(_stack(X), 0.1, 0.1), "covs at client 1"),
        "TargetMoments covs": (
            lambda X: TargetMoments(w2, np.zeros((2, np.shape(X)[0])), _stack(X)),
            "covs at client 1",
        ),
        "theta_min sigma_within": (lambda X: theta_min(X, 0.1, 0.1), "sigma_within"),
        "psi_value G": (lambda X: psi_value(X, GRAMS[:2], w2, 0.1, 0.1), "G"),
        "psi_value sigmas": (lambda X: psi_value(SPD, _stack(X), w2, 0.1, 0.1), "sigmas at client 1"),
        "profiled_gram_map G": (lambda X: profiled_gram_map(X, GRAMS[:2], w2, 0.1, 0.1, 0.1, 2), "G"),
        "finite_step_fixed_point sigmas": (
            lambda X: finite_step_fixed_point(_stack(X), w2, 0.1, 0.1, 0.1, 2),
            "sigmas at client 1",
        ),
        "displacement_delta sigmas": (lambda X: displacement_delta(_stack(X), w2, 0.1, 0.1), "sigmas at client 1"),
    }


_BAD = {
    "non-square": (np.ones((2, 3)), "(not square|expected shape)"),
    "non-symmetric": (np.array([[1.0, 0.5], [0.2, 1.0]]), "not symmetric"),
    "nan": (np.array([[1.0, np.nan], [np.nan, 1.0]]), "non-finite value nan"),
    "inf": (np.array([[np.inf, 0.0], [0.0, 1.0]]), "non-finite value inf"),
    "indefinite": (np.array([[1.0, 0.0], [0.0, -0.5]]), "not positive (semi)?definite"),
}


@pytest.mark.parametrize("bad", list(_BAD))
@pytest.mark.parametrize("entry", list(_entry_points()))
def test_every_matrix_argument_rejects_bad_matrices(entry, bad):
    fn, where = _entry_points()[entry]
    X, what = _BAD[bad]
    if bad in ("nan", "inf", "non-square"):
        where = where.split(" at ")[0]  # caught by the array check, before the per-client check
    with pytest.raises(UFMInputError, match=rf"^{where}\b.*{what}"):
        fn(X)
