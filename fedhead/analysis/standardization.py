"""Standardisation from exchanged moments (numpy only): no row leaves a client.

The pooled offsets and scales of targets and inputs from each client's raw moments, and the exact
moments of the standardised targets (derivation: docs/theory.md §3, "Standardised units").
Modes: targets ``pooled`` | ``none``; inputs ``pooled`` | ``site`` (each client its own mean and
std) | ``none``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "TARGET_MODES",
    "INPUT_MODES",
    "StandardizationError",
    "Standardization",
    "pooled_mean_std",
    "standardized_moments",
    "pooled_standardization",
    "nonfinite_columns",
    "check_offset_scale",
    "FLOAT32_MAX",
    "float32_overflow",
]

TARGET_MODES = ("pooled", "none")
INPUT_MODES = ("pooled", "site", "none")


class StandardizationError(ValueError):
    """The exchanged statistics cannot be standardised (a constant target, bad shapes)."""


@dataclass(frozen=True)
class Standardization:
    """What every client applies: ``y' = (y - target_offset) / target_scale`` and, for
    ``input_mode="pooled"``, ``x' = (x - input_offset) / input_scale`` (``site``: each client its
    own; ``none``: raw inputs; the input arrays are then empty)."""

    target_mode: str
    input_mode: str
    target_offset: np.ndarray  # (C,)
    target_scale: np.ndarray  # (C,)
    input_offset: np.ndarray  # (F,) or (0,)
    input_scale: np.ndarray  # (F,) or (0,)

    def to_dict(self) -> dict[str, Any]:
        """The results.json ``standardization`` object."""
        return {
            "targets": {
                "mode": self.target_mode,
                "offset": np.asarray(self.target_offset, dtype=float).tolist(),
                "scale": np.asarray(self.target_scale, dtype=float).tolist(),
            },
            "inputs": {
                "mode": self.input_mode,
                "offset": np.asarray(self.input_offset, dtype=float).tolist(),
                "scale": np.asarray(self.input_scale, dtype=float).tolist(),
            },
        }


def pooled_mean_std(counts, means, variances) -> tuple[np.ndarray, np.ndarray]:
    """Pooled per-coordinate mean and population standard deviation of all rows.

    ``counts`` ``(M,)``, ``means`` and ``variances`` ``(M, K)`` (each site's population
    variance). Exact up to rounding (law of total variance).
    """
    n = np.asarray(counts, dtype=np.float64)
    mu = np.asarray(means, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    if n.ndim != 1 or mu.shape != var.shape or mu.ndim != 2 or mu.shape[0] != n.shape[0]:
        raise StandardizationError(
            f"counts (M,), means and variances (M, K) expected, got {n.shape}, {mu.shape}, {var.shape}"
        )
    if np.any(n <= 0):
        raise StandardizationError(f"counts must be positive, got {n.tolist()}")
    p = n / n.sum()
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow gives inf: check_offset_scale refuses it
        mean = p @ mu
        pooled = p @ (var + (mu - mean) ** 2)
    return mean, np.sqrt(np.maximum(pooled, 0.0))


def standardized_moments(means, covs, offset, scale) -> tuple[np.ndarray, np.ndarray]:
    """``(mu' (M, C), Sigma' (M, C, C))`` of ``y' = (y - offset) / scale`` from the raw moments."""
    mu = np.asarray(means, dtype=np.float64)
    cov = np.asarray(covs, dtype=np.float64)
    o = np.asarray(offset, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    if np.any(~(s > 0)):
        raise StandardizationError(f"scales must be positive, got {s.tolist()}")
    inv = 1.0 / s
    return (mu - o) * inv, cov * inv[:, None] * inv[None, :]


def pooled_standardization(
    counts,
    target_means,
    target_covs,
    input_means=None,
    input_vars=None,
    *,
    target_mode: str = "pooled",
    input_mode: str = "pooled",
) -> Standardization:
    """The federation's standardisation from the clients' exchanged statistics.

    Targets: ``pooled`` (pooled mean and std; a constant target column is an error) or ``none``
    (offset 0, scale 1); offsets and scales that are not finite are refused
    ([`check_offset_scale`][fedhead.analysis.standardization.check_offset_scale]). Inputs
    (``(M, F)`` means and variances; ``None`` or ``F = 0`` for image inputs, which are never
    standardised here): ``pooled`` (a constant column is only centred),
    ``site`` or ``none`` (empty arrays: nothing pooled).
    """
    if target_mode not in TARGET_MODES:
        raise StandardizationError(f"target mode must be one of {TARGET_MODES}, got {target_mode!r}")
    if input_mode not in INPUT_MODES:
        raise StandardizationError(f"input mode must be one of {INPUT_MODES}, got {input_mode!r}")
    covs = np.asarray(target_covs, dtype=np.float64)
    c = covs.shape[-1]
    if target_mode == "pooled":
        t_off, t_scale = pooled_mean_std(counts, target_means, np.diagonal(covs, axis1=-2, axis2=-1))
        check_offset_scale(t_off, t_scale, positive=False)  # before the constant check: inf - inf is NaN
        bad = np.flatnonzero(~(t_scale > 0))
        if bad.size:
            raise StandardizationError(
                f"target column(s) {bad.tolist()} are constant over every client's training rows; "
                "they cannot be standardised"
            )
    else:
        t_off, t_scale = np.zeros(c), np.ones(c)
    empty = np.zeros(0)
    i_off, i_scale = empty, empty
    if input_mode == "pooled" and input_means is not None and np.asarray(input_means).size:
        i_off, i_scale = pooled_mean_std(counts, input_means, input_vars)
        check_offset_scale(i_off, i_scale, what="input", positive=False)  # before a NaN scale would become 1
        i_scale = np.where(i_scale > 0, i_scale, 1.0)
    return Standardization(target_mode, input_mode, t_off, t_scale, i_off, i_scale)


# --------------------------------------------------------------------------- finiteness
def nonfinite_columns(*arrays) -> list[int]:
    """The columns (last axis) where any of ``arrays`` holds a NaN or an infinity."""
    bad = np.zeros(0, dtype=bool)
    for a in arrays:
        a = np.asarray(a, dtype=np.float64)
        col = ~np.isfinite(a).reshape(-1, a.shape[-1]).all(axis=0) if a.size else np.zeros(a.shape[-1:], bool)
        bad = col if bad.size == 0 else bad | col
    return np.flatnonzero(bad).tolist()


def _columns(idx: Sequence[int], names: Sequence[str] | None) -> str:
    if names is not None and all(i < len(names) for i in idx):
        return ", ".join(repr(str(names[i])) for i in idx)
    return f"{list(idx)}"


def check_offset_scale(
    offset, scale, *, names: Sequence[str] | None = None, what: str = "target", positive: bool = True
) -> None:
    """Refuse an ``offset`` or ``scale`` ``(K,)`` that is not finite (a value or a sum of squares
    beyond float64) or, with ``positive``, a scale that is not positive.

    Parameters
    ----------
    offset, scale : array_like (K,)
        What ``(v - offset) / scale`` would use.
    names : sequence of str, optional
        The columns' names for the message (else their indices).
    what : str
        ``"target"`` or ``"input"``, for the message.
    positive : bool
        Also refuse a scale ``<= 0`` (False: finiteness only; the caller treats constant columns).

    Raises
    ------
    StandardizationError
        One line naming the columns, never a value (no row value leaves a site).
    """
    bad = nonfinite_columns(offset, scale)
    if bad:
        raise StandardizationError(
            f"the pooled {what} mean or standard deviation of column(s) {_columns(bad, names)} is not finite "
            "(values or their squares beyond float64): these columns cannot be standardised; check their values"
        )
    bad = np.flatnonzero(~(np.asarray(scale, dtype=np.float64) > 0)).tolist()
    if positive and bad:
        raise StandardizationError(
            f"the pooled {what} standard deviation of column(s) {_columns(bad, names)} is not positive: "
            "a constant column cannot be standardised"
        )


#: The largest magnitude float32 holds: the clients train, and an exported model's backbone runs, in float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def float32_overflow(z) -> np.ndarray:
    """Mask (the shape of ``z``) of standardised values that float32 cannot hold: beyond
    ``FLOAT32_MAX`` in magnitude, or not a number."""
    return ~(np.abs(np.asarray(z, dtype=np.float64)) <= FLOAT32_MAX)
