"""Pure server-side reply validation, averaging and moment aggregation (numpy only).

The Flower strategies (``strategies/``) compute on the server with this module,
[`fedhead.analysis.diagnosis`][fedhead.analysis.diagnosis] (the diagnosis before training) and
[`fedhead.federation.tracking`][fedhead.federation.tracking] (reference
Grams and per-round measurements), so everything can be tested with plain arrays. No torch, no flwr.

Conventions: float64; heads ``W`` ``(C, P)``, biases ``(C,)``; stacks over clients carry a
leading axis ``M``; Grams ``(C, C)``. Aggregation weights are ``p_m = N_m / N`` (theory.md §1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedhead import ufm
from fedhead.federation.protocol import LOCAL_EPOCHS, OBJECTIVE_GAP, TRAINED_GAP, is_private_state


class ReplyError(ValueError):
    """A client reply is malformed: the message names the node (and partition) and the field."""

    def __init__(self, node_id: int | str, what: str):
        self.node_id = node_id
        super().__init__(f"invalid reply from client node {node_id}: {what}")


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


#: The largest count a reply may carry: integers above 2^53 are not exact in float64 (where the
#: weights are computed); no site holds that many rows.
MAX_COUNT = 2.0**53


def validate_count(count: Any, *, node_id: int | str) -> int:
    """Check that a reported sample count ``N_m`` is a positive integer and return it."""
    try:
        value = float(count)
    except (TypeError, ValueError) as exc:
        raise ReplyError(node_id, f"sample count {count!r} is not a number") from exc
    if not np.isfinite(value) or value <= 0 or value != int(value):
        raise ReplyError(node_id, f"sample count must be a positive integer, got {count!r}")
    if value > MAX_COUNT:
        raise ReplyError(node_id, f"sample count {value:.3g} is beyond any data set (above 2^53)")
    return int(value)


def validate_array(array: Any, shape: tuple[int, ...] | None, *, node_id: int | str, name: str) -> np.ndarray:
    """Return ``array`` as float64 after checking its shape (if given) and finiteness."""
    arr = np.asarray(array, dtype=np.float64)
    if shape is not None and arr.shape != tuple(shape):
        raise ReplyError(node_id, f"{name} has shape {arr.shape}, expected {tuple(shape)}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ReplyError(node_id, f"{name} has {bad} non-finite entries (NaN/inf)")
    return arr


def check_magnitude(
    array: np.ndarray, bound: float | None, *, node_id: int | str, name: str, rule: str = "trust.max_abs"
) -> np.ndarray:
    """``array`` when every entry's magnitude is at most ``bound`` (None: no bound); else
    [`ReplyError`][fedhead.federation.aggregation.ReplyError] naming the ``rule`` (the value is not quoted)."""
    if bound is not None and array.size and float(np.max(np.abs(array))) > bound:
        raise ReplyError(node_id, f"{name} exceeds the magnitude bound {bound:g} ({rule})")
    return array


def validate_head(
    weight: Any,
    bias: Any,
    count: Any,
    *,
    node_id: int | str,
    shape: tuple[int, int],
    max_abs: float | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Validate one uploaded head ``(W~_m (C,P), b~_m (C,), N_m)``, entries at most ``max_abs`` in
    magnitude; raise [`ReplyError`][fedhead.federation.aggregation.ReplyError]."""
    c, p = shape
    w = check_magnitude(
        validate_array(weight, (c, p), node_id=node_id, name="head weight"),
        max_abs,
        node_id=node_id,
        name="head weight",
    )
    b = check_magnitude(
        validate_array(bias, (c,), node_id=node_id, name="head bias"), max_abs, node_id=node_id, name="head bias"
    )
    return w, b, validate_count(count, node_id=node_id)


def validate_moments(
    count: Any,
    mean: Any,
    cov: Any,
    *,
    node_id: int | str,
    dim: int | None = None,
    tol: float = 1e-8,
    max_abs: float | None = None,
) -> tuple[int, np.ndarray, np.ndarray]:
    """Validate one client's exchanged statistics ``(N_m, mu_m (C,), Sigma_m (C,C))``.

    ``Sigma_m`` must be symmetric and positive semi-definite up to ``tol`` (relative to its
    largest entry). With ``max_abs``, every ``|mu_m|`` entry and ``sqrt(lambda_max(Sigma_m))`` (a
    standard deviation) must be at most ``max_abs``. Returns the values as ``(int, float64, float64)``.
    """
    n = validate_count(count, node_id=node_id)
    mu = validate_array(mean, None, node_id=node_id, name="target mean mu_m")
    if mu.ndim != 1:
        raise ReplyError(node_id, f"target mean mu_m must be a vector, got shape {mu.shape}")
    c = dim if dim is not None else mu.shape[0]
    if mu.shape != (c,):
        raise ReplyError(node_id, f"target mean mu_m has shape {mu.shape}, expected {(c,)}")
    check_magnitude(mu, max_abs, node_id=node_id, name="target mean mu_m")
    sigma = validate_array(cov, (c, c), node_id=node_id, name="target covariance Sigma_m")
    scale = max(1.0, float(np.max(np.abs(sigma))))
    asym = float(np.max(np.abs(sigma - sigma.T)))
    if asym > tol * scale:
        raise ReplyError(node_id, f"target covariance Sigma_m is not symmetric (max |S - S^T| = {asym:.3g})")
    eigs = np.linalg.eigvalsh(0.5 * (sigma + sigma.T))
    if float(eigs[0]) < -tol * scale:
        raise ReplyError(
            node_id, f"target covariance Sigma_m is not positive semi-definite (lambda_min = {float(eigs[0]):.3g})"
        )
    if max_abs is not None and float(eigs[-1]) > max_abs * max_abs:
        raise ReplyError(
            node_id, f"target covariance Sigma_m exceeds the magnitude bound {max_abs:g}^2 (trust.max_abs)"
        )
    return n, mu, 0.5 * (sigma + sigma.T)


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
    ([`validate_moments`][fedhead.federation.aggregation.validate_moments]); the weights are
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


#: Relative local objective gap above which the theory's references (which assume every client
#: at its local optimum) are not yet meaningful for a round.
LOCAL_GAP_THRESHOLD = 1e-2


@dataclass(frozen=True)
class LocalFit:
    """How close each client's local training came to its optimum in one round (docs/theory.md §11).

    Attributes
    ----------
    objective_gaps : list of float
        ``(L_m - L*_m) / L*_m`` per client (partition order), the original objective.
    trained_gaps : list of float
        The same for the objective each client minimised (``L_m + gamma C_m``; equal to
        ``objective_gaps`` without correction). For corrected clients this is the one that says
        whether local training converged: ``L_m`` is not minimised there.
    local_epochs : list of int
        Epochs each client ran (fewer than ``E`` when it stopped at ``local_tol``).
    """

    objective_gaps: list[float]
    trained_gaps: list[float]
    local_epochs: list[int]

    @property
    def max_trained_gap(self) -> float:
        return max(self.trained_gaps)


def local_fit(metrics: Sequence[Mapping[str, Any]], node_ids: Sequence[int | str]) -> LocalFit:
    """Read and validate the local-fit metrics of the training replies (one per client, in order).

    Each reply must carry finite ``objective_gap`` and ``trained_gap`` (>= -1e-6: a model cannot
    beat its closed-form optimum by more than rounding) and an integer ``local_epochs`` >= 0.
    """
    gaps, trained, epochs = [], [], []
    for m, node in zip(metrics, node_ids, strict=True):
        for key in (OBJECTIVE_GAP, TRAINED_GAP, LOCAL_EPOCHS):
            if key not in m:
                raise ReplyError(node, f"training reply lacks the metric '{key}'")
        for key, out in ((OBJECTIVE_GAP, gaps), (TRAINED_GAP, trained)):
            v = float(validate_array(m[key], (), node_id=node, name=key))
            if v < -1e-6:
                raise ReplyError(node, f"{key} = {v:.3g} is below zero: the model beats its closed-form optimum")
            out.append(v)
        e = m[LOCAL_EPOCHS]
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0:
            raise ReplyError(node, f"{LOCAL_EPOCHS} must be an integer >= 0, got {e!r}")
        epochs.append(int(e))
    return LocalFit(objective_gaps=gaps, trained_gaps=trained, local_epochs=epochs)


def weighted_mean(values: Sequence[float], counts: Sequence[float]) -> float:
    """``sum_m N_m v_m / sum_m N_m`` (clients weighted by evaluated sample counts, theory.md §11)."""
    v = np.asarray(values, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if v.shape != n.shape or v.size == 0 or np.any(n <= 0):
        raise ValueError(f"values {v.shape} and positive counts {n.shape} must match")
    return float(np.dot(v, n) / n.sum())
