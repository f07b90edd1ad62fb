"""Pure server-side averaging and moment aggregation (numpy only).

The Flower strategies (``strategies/``) compute on the server with this module, the reply checks
([`fedhead.federation.reply_checks`][fedhead.federation.reply_checks]), the local fit
([`fedhead.federation.local_fit`][fedhead.federation.local_fit]),
[`fedhead.analysis.diagnosis`][fedhead.analysis.diagnosis] (the diagnosis before training) and
[`fedhead.federation.tracking`][fedhead.federation.tracking] (reference Grams and per-round
measurements), so everything can be tested with plain arrays. No torch, no flwr.

Conventions: float64; heads ``W`` ``(C, P)``, biases ``(C,)``; stacks over clients carry a
leading axis ``M``; Grams ``(C, C)``. Aggregation weights are ``p_m = N_m / N`` (theory.md §1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedhead import ufm
from fedhead.federation.local_fit import LOCAL_GAP_THRESHOLD, LocalFit, local_fit
from fedhead.federation.protocol import is_private_state
from fedhead.federation.reply_checks import (
    ReplyError,
    check_magnitude,
    validate_array,
    validate_count,
    validate_head,
    validate_moments,
)

#: The strategies read the reply checks and the local fit beside the averaging (``agg.ReplyError``).
__all__ = [
    "LOCAL_GAP_THRESHOLD",
    "ClippedUpdates",
    "HeadAverage",
    "LocalFit",
    "ReplyError",
    "aggregate_moments",
    "aggregation_weights",
    "average_heads",
    "average_states",
    "capped_shares",
    "capped_sites",
    "check_magnitude",
    "clip_updates",
    "effective_covariances",
    "local_fit",
    "validate_array",
    "validate_count",
    "validate_head",
    "validate_moments",
    "weighted_mean",
]


# --------------------------------------------------------------------------------------------
# averaging
# --------------------------------------------------------------------------------------------


def aggregation_weights(counts: Sequence[float] | np.ndarray) -> np.ndarray:
    """``p_m = N_m / N`` for positive counts ``(M,)``."""
    n = np.asarray(counts, dtype=np.float64)
    if n.ndim != 1 or n.size == 0:
        raise ValueError(f"counts must be a non-empty vector, got shape {n.shape}")
    if np.any(~np.isfinite(n)) or np.any(n <= 0):
        raise ValueError(f"counts must be positive, got {n.tolist()}")
    return n / n.sum()


def capped_shares(counts: Sequence[float] | np.ndarray, max_share: float | None) -> np.ndarray:
    """Aggregation weights ``p_m = N_m / N`` with no site above ``max_share`` (water-filling).

    Parameters
    ----------
    counts : array_like, shape (M,)
        Positive sample counts ``N_m``.
    max_share : float or None
        Cap on every ``p_m``; None, or fewer than three sites: no cap (``N_m / N`` exactly).

    Returns
    -------
    ndarray, shape (M,)
        ``p_m = min(max_share, s N_m)`` with ``s`` such that the weights sum to one: capped sites
        get ``max_share``, the others share the rest in proportion to their counts. When the cap
        does not bind this is ``N_m / N`` bit for bit; when ``M max_share <= 1`` every site gets ``1/M``.
    """
    p = aggregation_weights(counts)
    if max_share is None or p.size < 3 or float(p.max()) <= max_share:
        return p
    n = np.asarray(counts, dtype=np.float64)
    if p.size * max_share <= 1.0:
        return np.full(p.size, 1.0 / p.size)
    capped = np.zeros(p.size, dtype=bool)
    while True:
        free = ~capped
        rest = 1.0 - max_share * np.count_nonzero(capped)
        q = np.where(capped, max_share, rest * n / n[free].sum())
        over = free & (q > max_share)
        if not over.any():
            return q
        capped |= over


def capped_sites(moments: ufm.TargetMoments) -> np.ndarray:
    """Mask ``(M,)`` of the sites whose weight in ``moments`` is below their share of the rows
    ``N_m / N``: where [`capped_shares`][fedhead.federation.aggregation.capped_shares]' cap bound."""
    plain = aggregation_weights(np.asarray(moments.counts))
    return np.asarray(moments.weights) < plain * (1 - 1e-12)


@dataclass(frozen=True)
class ClippedUpdates:
    """Heads after [`clip_updates`][fedhead.federation.aggregation.clip_updates]: ``weight (M, C, P)``,
    ``bias (M, C)`` and each site's factor ``scale (M,)`` (1 where the update was within the bound)."""

    weight: np.ndarray
    bias: np.ndarray
    scale: np.ndarray


def clip_updates(
    weights: np.ndarray, biases: np.ndarray, broadcast: tuple[np.ndarray, np.ndarray], max_norm: float
) -> ClippedUpdates:
    """Scale each site's update ``U_m = [W~_m - W_t, b~_m - b_t]`` to Frobenius norm at most ``max_norm``.

    Parameters
    ----------
    weights : ndarray, shape (M, C, P)
    biases : ndarray, shape (M, C)
    broadcast : (ndarray (C, P), ndarray (C,))
        The head ``(W_t, b_t)`` the round started from.
    max_norm : float
        The bound ``c > 0``.

    Returns
    -------
    ClippedUpdates
        ``W_t + s_m (W~_m - W_t)``, ``b_t + s_m (b~_m - b_t)`` with ``s_m = min(1, c / ||U_m||_F)``.
    """
    w = np.asarray(weights, dtype=np.float64)
    b = np.asarray(biases, dtype=np.float64)
    w0, b0 = (np.asarray(a, dtype=np.float64) for a in broadcast)
    dw, db = w - w0[None], b - b0[None]
    norms = np.sqrt(np.einsum("mcp,mcp->m", dw, dw) + np.einsum("mc,mc->m", db, db))
    scale = np.minimum(1.0, max_norm / np.maximum(norms, np.finfo(np.float64).tiny))
    return ClippedUpdates(w0[None] + scale[:, None, None] * dw, b0[None] + scale[:, None] * db, scale)


@dataclass(frozen=True)
class HeadAverage:
    """Result of head averaging: ``W = sum p_m W~_m`` ``(C,P)``, ``b = sum p_m b~_m`` ``(C,)``."""

    weight: np.ndarray
    bias: np.ndarray
    weights: np.ndarray  # p_m (M,)


def average_heads(weights: np.ndarray, biases: np.ndarray, counts: Sequence[float] | np.ndarray) -> HeadAverage:
    """Average uploaded heads with weights ``N_m / N`` (theory.md §1; capped weights:
    pass [`capped_shares`][fedhead.federation.aggregation.capped_shares] as ``counts``).

    Parameters
    ----------
    weights : ndarray, shape (M, C, P)
        Uploaded head weights ``W~_m``.
    biases : ndarray, shape (M, C)
        Uploaded head biases ``b~_m``.
    counts : array_like, shape (M,)
        Sample counts ``N_m`` (or any positive weights; normalised to sum to one).

    Returns
    -------
    HeadAverage
        ``(W_{t+1}, b_{t+1}) = sum_m p_m (W~_m, b~_m)`` and the weights ``p``; the sum runs in an
        order independent of the clients' numbering (bit-for-bit invariant under permutation).
    """
    w = np.asarray(weights, dtype=np.float64)
    b = np.asarray(biases, dtype=np.float64)
    p = aggregation_weights(counts)
    if w.ndim != 3 or b.ndim != 2 or w.shape[0] != p.size or b.shape[:2] != w.shape[:2]:
        raise ValueError(f"heads (M,C,P)={w.shape}, biases (M,C)={b.shape} and counts (M,)={p.shape} disagree")
    # summed in a canonical order (weight, then the head's bytes): the average is the same bit for
    # bit however the clients are numbered (a simulation numbers sites by file order, a
    # deployment by their files' keys)
    order = sorted(range(p.size), key=lambda m: (p[m], w[m].tobytes(), b[m].tobytes()))
    return HeadAverage(np.einsum("m,mcp->cp", p[order], w[order]), np.einsum("m,mc->c", p[order], b[order]), p)


def average_states(
    states: Sequence[Mapping[str, np.ndarray]],
    counts: Sequence[int] | np.ndarray,
    *,
    node_ids: Sequence[int | str] | None = None,
) -> dict[str, np.ndarray]:
    """Weighted average of full model states, excluding BatchNorm running statistics.

    Parameters
    ----------
    states : sequence of mappings name -> ndarray
        One state per client; every client must send the same names and shapes.
    counts : array_like, shape (M,)
        Sample counts ``N_m``; the weights are ``N_m / N``.
    node_ids : sequence, optional
        Client ids used in error messages.

    Returns
    -------
    dict
        ``name -> sum_m p_m state_m[name]`` (float64) for every shared (non-private) name.
    """
    p = aggregation_weights(counts)
    if len(states) != p.size:
        raise ValueError(f"{len(states)} states but {p.size} counts")
    ids = list(node_ids) if node_ids is not None else list(range(len(states)))
    names = sorted(k for k in states[0] if not is_private_state(k))
    out: dict[str, np.ndarray] = {}
    for k in names:
        out[k] = np.zeros(np.shape(states[0][k]), dtype=np.float64)
    for state, weight, node in zip(states, p, ids, strict=True):
        shared = sorted(k for k in state if not is_private_state(k))
        if shared != names:
            missing = sorted(set(names) - set(shared))
            extra = sorted(set(shared) - set(names))
            raise ReplyError(
                node, f"model state names differ from the first client's (missing {missing[:5]}, extra {extra[:5]})"
            )
        for k in names:
            arr = validate_array(state[k], out[k].shape, node_id=node, name=f"model state {k!r}")
            out[k] += weight * arr
    return out


def weighted_mean(values: Sequence[float], counts: Sequence[float]) -> float:
    """``sum_m N_m v_m / sum_m N_m`` (clients weighted by evaluated sample counts, theory.md §11)."""
    v = np.asarray(values, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if v.shape != n.shape or v.size == 0 or np.any(n <= 0):
        raise ValueError(f"values {v.shape} and positive counts {n.shape} must match")
    return float(np.dot(v, n) / n.sum())


# --------------------------------------------------------------------------------------------
# moment exchange
# --------------------------------------------------------------------------------------------


def aggregate_moments(
    counts: Sequence[int],
    means: Sequence[np.ndarray],
    covs: Sequence[np.ndarray],
    *,
    node_ids: Sequence[int | str] | None = None,
    max_share: float | None = None,
) -> ufm.TargetMoments:
    """Build [`fedhead.ufm.TargetMoments`][fedhead.ufm.TargetMoments] from the exchanged ``(N_m, mu_m, Sigma_m)``.

    Every client's statistics are validated first
    ([`validate_moments`][fedhead.federation.reply_checks.validate_moments]); the weights are
    ``N_m / N`` so that ``Sigma_cen = (1/N) sum N_m (Sigma_m + mu_m mu_m^T) - mu_g mu_g^T``
    (theory.md §3), capped at ``max_share``
    ([`capped_shares`][fedhead.federation.aggregation.capped_shares]).
    """
    ids = list(node_ids) if node_ids is not None else list(range(len(counts)))
    if not (len(counts) == len(means) == len(covs) == len(ids)) or len(counts) < 2:
        raise ValueError(
            f"moment exchange needs at least 2 clients with one (N, mu, Sigma) each; got "
            f"{len(counts)} counts, {len(means)} means, {len(covs)} covariances"
        )
    dim = int(np.asarray(means[0]).reshape(-1).shape[0])
    checked = [
        validate_moments(n, mu, s, node_id=i, dim=dim) for n, mu, s, i in zip(counts, means, covs, ids, strict=True)
    ]
    n = np.array([c[0] for c in checked], dtype=np.float64)
    mu = np.stack([c[1] for c in checked])
    sig = np.stack([c[2] for c in checked])
    return ufm.TargetMoments.from_stats(n, mu, sig, weights=capped_shares(n, max_share))


def effective_covariances(moments: ufm.TargetMoments, gamma: float = 0.0) -> np.ndarray:
    """Covariances each client effectively fits, [`fedhead.ufm.corrected_covariance`][fedhead.ufm.corrected_covariance]
    (theory.md §8).

    Returns shape ``(M, C, C)``; ``gamma = 0`` gives the plain ``Sigma_m``.
    """
    return ufm.corrected_covariance(
        np.asarray(moments.covs, dtype=np.float64), np.asarray(moments.sigma_cen)[None], gamma
    )
