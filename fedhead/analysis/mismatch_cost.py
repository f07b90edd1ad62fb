"""The cost of mismatched coordinates (docs/theory.md §13), numpy only.

The two averages of round 1's trained heads (as trained, after alignment) and the weighted objectives they are compared
by; the clients' objectives come from `fedhead.train.mismatch_objectives`.
[`procrustes_rotation`][fedhead.analysis.mismatch_cost.procrustes_rotation] is the one implementation of the alignment
rotation (`fedhead.train.align` checks its inputs and calls it).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

__all__ = [
    "MISMATCH_ALIGNED",
    "MISMATCH_KEYS",
    "MISMATCH_LOCAL",
    "MISMATCH_REMOVED",
    "MISMATCH_TRAINED",
    "MismatchAverages",
    "MismatchCost",
    "MismatchInputError",
    "MismatchWarning",
    "mismatch_averages",
    "mismatch_cost",
    "procrustes_rotation",
    "removed_fraction",
]

#: Keys of the round-1 record (``RoundRecord.extra``, flattened into results.json ``rounds[1]``).
MISMATCH_LOCAL = "mismatch_objective_local"
MISMATCH_TRAINED = "mismatch_objective_trained"
MISMATCH_ALIGNED = "mismatch_objective_aligned"
MISMATCH_REMOVED = "mismatch_removed"
MISMATCH_KEYS = (MISMATCH_LOCAL, MISMATCH_TRAINED, MISMATCH_ALIGNED, MISMATCH_REMOVED)


class MismatchInputError(ValueError):
    """Bad input to the mismatch computation; the message names the argument."""


class MismatchWarning(UserWarning):
    """The removed fraction is undefined (the trained average costs nothing over the local models)."""


# ------------------------------------------------------------------------------ Procrustes
def _row_space(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD restricted to the numerical rank: ``U (C, r)``, ``s (r,)``, ``V (P, r)``."""
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    tol = (s[0] if s.size else 0.0) * max(w.shape) * np.finfo(np.float64).eps
    r = int(np.sum(s > tol))
    return u[:, :r], s[:r], vt[:r].T


def _complement(basis: np.ndarray) -> np.ndarray:
    """Orthonormal basis ``(P, P - r)`` of the orthogonal complement of the columns of ``basis`` ``(P, r)``."""
    q, _ = np.linalg.qr(basis, mode="complete")
    return q[:, basis.shape[1] :]


def procrustes_rotation(weight: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Orthogonal ``Q`` ``(P, P)`` minimising ``||weight Q - target||_F`` (docs/theory.md §5).

    ``weight`` and ``target`` are finite ``(C, P)`` float arrays (unchecked here; see
    [`fedhead.train.align.procrustes_rotation`][fedhead.train.procrustes_rotation]). Among the minimisers, the one
    closest to the identity on the complement of the two row spaces; computed in their joint span (``O(P C^2)`` work).
    The method is described in [`fedhead.train.align`][fedhead.train.align].
    """
    w = np.asarray(weight, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    p = w.shape[1]
    u1, s1, v1 = _row_space(w)
    u2, s2, v2 = _row_space(t)
    k = (s1[:, None] * (u1.T @ u2)) * s2[None, :]  # (r1, r2) = V1^T W^T T V2
    r = min(k.shape)
    if r == 0:  # a zero head: any rotation is optimal
        return np.eye(p)
    a, _, bt = np.linalg.svd(k)
    ua = v1 @ a[:, :r]  # (P, r)
    vb = v2 @ bt[:r].T  # (P, r)
    # Everything happens in the joint span S (P, k <= 2r) of the two row spaces: outside it both
    # completions contain the whole complement, on which the closest-to-identity factor is I.
    # So Q = I + S (Q_s - I) S^T with the (k, k) solution Q_s of the problem in S-coordinates.
    span = _row_space(np.concatenate([ua, vb], axis=1).T)[2]  # (P, k) orthonormal
    ua_s, vb_s = span.T @ ua, span.T @ vb  # (k, r)
    q_s = ua_s @ vb_s.T
    if r < span.shape[1]:
        u_perp, v_perp = _complement(ua_s), _complement(vb_s)
        ux, _, vxt = np.linalg.svd(u_perp.T @ v_perp)
        q_s += u_perp @ (ux @ vxt) @ v_perp.T
    return np.eye(p) + span @ (q_s - np.eye(span.shape[1])) @ span.T


# ------------------------------------------------------------------------------ the two averages
@dataclass(frozen=True)
class MismatchAverages:
    """The two averages of the same trained heads
    ([`mismatch_averages`][fedhead.analysis.mismatch_cost.mismatch_averages]).

    Attributes
    ----------
    weights : ndarray (M,)
        ``p_m = N_m / N``.
    trained_weight, aligned_weight : ndarray (C, P)
        ``W_bar = sum p_m W~_m`` and ``W_bar_a = sum p_m W~_m Q_m``.
    bias : ndarray (C,)
        ``b_bar = sum p_m b~_m`` (both averages).
    rotations : ndarray (M, P, P)
        ``Q_m`` (client ``m``'s aligned backbone has features ``Q_m^T h``).
    """

    weights: np.ndarray
    trained_weight: np.ndarray
    aligned_weight: np.ndarray
    bias: np.ndarray
    rotations: np.ndarray


def _weights(counts: np.ndarray, m: int) -> np.ndarray:
    n = np.asarray(counts, dtype=np.float64)
    if n.shape != (m,) or not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise MismatchInputError(f"counts must be {m} positive sample counts, got {np.asarray(counts)!r}")
    return n / n.sum()


def mismatch_averages(
    heads: np.ndarray, biases: np.ndarray, counts: np.ndarray, broadcast: np.ndarray
) -> MismatchAverages:
    """Average the trained heads as they are and after aligning each to ``broadcast``.

    Parameters
    ----------
    heads : ndarray (M, C, P)
        The trained heads ``W~_m`` (before any alignment).
    biases : ndarray (M, C)
        Their biases ``b~_m``.
    counts : ndarray (M,)
        Sample counts ``N_m`` (weights ``p_m = N_m / N``).
    broadcast : ndarray (C, P)
        The head ``W_t`` the clients started the round from.
    """
    w = np.asarray(heads, dtype=np.float64)
    b = np.asarray(biases, dtype=np.float64)
    t = np.asarray(broadcast, dtype=np.float64)
    if w.ndim != 3 or w.shape[0] < 1:
        raise MismatchInputError(f"heads must be (M, C, P) with M >= 1, got shape {w.shape}")
    m, c, _ = w.shape
    if b.shape != (m, c):
        raise MismatchInputError(f"biases must be (M, C) = {(m, c)}, got {b.shape}")
    if t.shape != w.shape[1:]:
        raise MismatchInputError(f"broadcast must be (C, P) = {w.shape[1:]}, got {t.shape}")
    for name, a in (("heads", w), ("biases", b), ("broadcast", t)):
        if not np.all(np.isfinite(a)):
            raise MismatchInputError(f"{name} has non-finite entries")
    p = _weights(counts, m)
    rotations = np.stack([procrustes_rotation(w_m, t) for w_m in w])
    aligned = np.einsum("m,mcp,mpq->cq", p, w, rotations)
    return MismatchAverages(
        weights=p, trained_weight=np.einsum("m,mcp->cp", p, w), aligned_weight=aligned, bias=p @ b, rotations=rotations
    )


# ------------------------------------------------------------------------------ the cost
@dataclass(frozen=True)
class MismatchCost:
    """Weighted objectives ``sum_m p_m L_m`` and the fraction of the excess alignment removes.

    ``removed`` is [`removed_fraction`][fedhead.analysis.mismatch_cost.removed_fraction] of the three sums (``None``
    when undefined).
    """

    local: float
    trained: float
    aligned: float
    removed: float | None

    def to_extra(self) -> dict[str, float | None]:
        """The round record's entries (results.json ``rounds[1]``)."""
        return {
            MISMATCH_LOCAL: self.local,
            MISMATCH_TRAINED: self.trained,
            MISMATCH_ALIGNED: self.aligned,
            MISMATCH_REMOVED: self.removed,
        }

    def line(self) -> str:
        """One log line."""
        removed = "undefined" if self.removed is None else f"{self.removed:.3f}"
        return (
            f"mismatch cost (round 1): objective of the local models {self.local:.6g}, of the average "
            f"as trained {self.trained:.6g}, after alignment {self.aligned:.6g}; alignment removes "
            f"{removed} of the excess"
        )


def removed_fraction(local: float, trained: float, aligned: float, *, rtol: float = 1e-9) -> float | None:
    """``(trained - aligned) / (trained - local)``: the fraction of the averaging's excess
    objective that alignment removes (1: all of it, 0: none, < 0: alignment made it worse).

    ``None`` (with a [`MismatchWarning`][fedhead.analysis.mismatch_cost.MismatchWarning]) when the denominator is not
    above ``rtol * max(|trained|, |local|, tiny)``: the trained average costs (numerically) nothing.
    """
    vals = (float(local), float(trained), float(aligned))
    if not all(math.isfinite(v) for v in vals):
        raise MismatchInputError(
            f"objectives must be finite, got local={local!r}, trained={trained!r}, aligned={aligned!r}"
        )
    denom = vals[1] - vals[0]
    scale = max(abs(vals[0]), abs(vals[1]), np.finfo(np.float64).tiny)
    if abs(denom) <= rtol * scale:
        warnings.warn(
            f"mismatch_removed is undefined: the trained average's objective {vals[1]:.6g} equals the local "
            f"models' {vals[0]:.6g} (difference {denom:.3g}); recorded as null",
            MismatchWarning,
            stacklevel=2,
        )
        return None
    return (vals[1] - vals[2]) / denom


def mismatch_cost(
    local: np.ndarray, trained: np.ndarray, aligned: np.ndarray, counts: np.ndarray, *, rtol: float = 1e-9
) -> MismatchCost:
    """Weighted objectives of the three models and [`removed_fraction`][fedhead.analysis.mismatch_cost.removed_fraction]
    of their sums.

    Parameters
    ----------
    local, trained, aligned : ndarray (M,)
        Each client's objective ``L_m`` of its own trained local model, of ``(W_bar, b_bar)`` with
        its trained backbone, and of ``(W_bar_a, b_bar)`` with its aligned backbone.
    counts : ndarray (M,)
        Sample counts (weights ``p_m = N_m / N`` over these clients).
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in (local, trained, aligned)]
    m = arrays[0].shape[0] if arrays[0].ndim == 1 else -1
    for name, a in zip(("local", "trained", "aligned"), arrays):
        if a.shape != (m,) or m < 1:
            raise MismatchInputError(f"{name} must be one objective per client (M,), got shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise MismatchInputError(f"{name} has non-finite objectives: {a}")
    p = _weights(counts, m)
    l_loc, l_tr, l_al = (float(p @ a) for a in arrays)
    return MismatchCost(local=l_loc, trained=l_tr, aligned=l_al, removed=removed_fraction(l_loc, l_tr, l_al, rtol=rtol))
