"""Closed-form client math of one round and the per-round seed rule (numpy only).

* [`exact_head`][fedhead.train.exact_head]: the theory's rule ``Pi_m(W_t)`` (the ``exact``
  procedure) instead of training.
* [`head_distances`][fedhead.train.head_distances]: where a returned head lies relative to the
  broadcast and to ``Pi_m(W_t)``.
* [`round_seed`][fedhead.train.round_seed]: the seed of a client's minibatch permutations in one round.

The (corrected) covariance a client fits is [`fedhead.ufm.corrected_covariance`][fedhead.ufm.corrected_covariance].
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedhead import ufm


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """Seed of client ``partition_id``'s minibatch permutations in round ``server_round``.

    ``seed * 1_000_003 + 1_009 * server_round + partition_id``: distinct per client and round for
    the client counts and round numbers used, and reproducible from the run seed.
    """
    return int(seed) * 1_000_003 + 1_009 * int(server_round) + int(partition_id)


def target_moments(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``mu_m (C,)`` and ``Sigma_m (C, C)`` of a client's targets ``y (N_m, C)`` (theory.md §3)."""
    moments = ufm.TargetMoments.from_targets([np.asarray(y, dtype=np.float64)])
    return np.asarray(moments.means[0]), np.asarray(moments.covs[0])


def exact_head(
    mu: np.ndarray,
    sigma: np.ndarray,
    broadcast: np.ndarray,
    sigma_cen: np.ndarray | None,
    *,
    gamma: float,
    centered: bool,
    lambda_h: float,
    lambda_w: float,
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``Pi_m(W_t)`` from the client's (corrected) optimal Gram, its bias and objective gaps (theory.md §4-5, §8).

    Parameters
    ----------
    mu, sigma : ndarray (C,), (C, C)
        The client's target mean and covariance ([`target_moments`][fedhead.train.target_moments]).
    broadcast : ndarray (C, P)
        ``W_t``.
    sigma_cen : ndarray (C, C) or None
        ``Sigma_cen`` (required when ``gamma > 0``).
    gamma : float
        Correction strength; the client fits ``phi((1 - gamma) Sigma_m + gamma Sigma_cen)``.
    centered : bool
        Client-wise centring (bias 0 instead of ``mu_m``).
    lambda_h, lambda_w : float

    Returns
    -------
    weight : ndarray (C, P)
        ``Pi_m(W_t) = argmin_{W W^T = G_m} ||W - W_t||_F``.
    bias : ndarray (C,)
        ``mu_m``, or zeros when centred.
    gap : float
        ``(L_m(W~) - L*_m) / L*_m`` on the client's own (uncorrected) objective.
    trained_gap : float
        The same for the objective the client minimises, ``F(W; (1 - gamma) Sigma_m + gamma
        Sigma_cen)``: zero up to rounding, since ``W~`` is its optimum.
    """
    target = ufm.corrected_covariance(sigma, sigma_cen, gamma) if sigma_cen is not None else sigma
    weight = ufm.closest_head(broadcast, ufm.optimal_gram(target, lambda_h, lambda_w))
    bias = np.zeros_like(mu) if centered else mu
    value = ufm.profiled_objective(weight, sigma, lambda_h, lambda_w, hessian=False).value
    best = float(ufm.optimal_loss(sigma, lambda_h, lambda_w))
    trained = ufm.profiled_objective(weight, target, lambda_h, lambda_w, hessian=False).value
    trained_best = float(ufm.optimal_loss(target, lambda_h, lambda_w))
    return weight, bias, (value - best) / best, (trained - trained_best) / trained_best


class HeadDistances(NamedTuple):
    """Distances of a returned head ``W~`` (see [`head_distances`][fedhead.train.head_distances])."""

    to_broadcast: float  # ||W~ - W_t||_F
    to_selection: float  # ||W~ - Pi_m(W_t)||_F
    relative_to_selection: float  # ||W~ - Pi_m(W_t)||_F / ||Pi_m(W_t)||_F


def head_distances(
    sigma: np.ndarray,
    broadcast: np.ndarray,
    weight: np.ndarray,
    sigma_cen: np.ndarray | None,
    *,
    gamma: float,
    lambda_h: float,
    lambda_w: float,
) -> HeadDistances:
    """Distances of a returned head ``W~ (C, P)`` to ``W_t`` and to ``Pi_m(W_t)`` (theory.md §5, §11).

    ``Pi_m`` is the closest optimal head of the client's (corrected) objective; ``sigma`` is the
    client's ``Sigma_m (C, C)``.
    """
    target = ufm.corrected_covariance(sigma, sigma_cen, gamma) if sigma_cen is not None else sigma
    pi = ufm.closest_head(broadcast, ufm.optimal_gram(target, lambda_h, lambda_w))
    return HeadDistances(
        to_broadcast=float(np.linalg.norm(weight - broadcast)),
        to_selection=float(np.linalg.norm(weight - pi)),
        relative_to_selection=float(np.linalg.norm(weight - pi) / np.linalg.norm(pi)),
    )
