"""Checks of the clients' replies on the server (numpy only): every count, array, head and moment a
reply carries is validated here before the server uses it. A failed check raises
[`ReplyError`][fedhead.federation.reply_checks.ReplyError] naming the node and the field, which drops
the client (the failure policy of ``strategies/``).

Conventions as in [`fedhead.federation.aggregation`][fedhead.federation.aggregation]: float64; heads
``W`` ``(C, P)``, biases ``(C,)``; Grams ``(C, C)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ReplyError(ValueError):
    """A client reply is malformed: the message names the node (and partition) and the field."""

    def __init__(self, node_id: int | str, what: str):
        self.node_id = node_id
        super().__init__(f"invalid reply from client node {node_id}: {what}")


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
    [`ReplyError`][fedhead.federation.reply_checks.ReplyError] naming the ``rule`` (the value is not quoted)."""
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
    magnitude; raise [`ReplyError`][fedhead.federation.reply_checks.ReplyError]."""
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
