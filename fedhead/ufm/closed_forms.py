"""Closed forms of the profiled problem (docs/theory.md §3-4): phi, L*, the fully active check."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import NotFullyActiveError, UFMInputError, as_float_array, as_head, as_positive_scalar, as_spd
from .moments import TargetMoments
from .psd import sym


def _alpha(lambda_h: float, lambda_w: float) -> float:
    return float(np.sqrt(lambda_h / lambda_w))


def _phi(T: np.ndarray, lambda_h: float, lambda_w: float) -> np.ndarray:
    """Kernel of [`optimal_gram`][fedhead.ufm.optimal_gram] (no validation)."""
    w, V = np.linalg.eigh(sym(T))
    g = np.maximum(_alpha(lambda_h, lambda_w) * np.sqrt(np.maximum(w, 0.0)) - lambda_h, 0.0)
    return sym((V * g[..., None, :]) @ np.swapaxes(V, -1, -2))


def optimal_gram(T, lambda_h: float, lambda_w: float) -> np.ndarray:
    """Optimal head Gram ``phi(T)`` of the profiled objective ``F(.; T)`` (docs/theory.md §4).

    ``phi(T) = alpha T^{1/2} - lambda_H I`` with ``alpha = sqrt(lambda_H / lambda_W)`` in the
    fully active regime ``lambda_min(T) > lambda_H lambda_W``. Outside it, the eigenvalues
    ``alpha sqrt(s_i) - lambda_H`` that would be negative are set to zero, which is the exact
    minimiser of ``F`` over PSD Grams (check the regime with [`check_fully_active`][fedhead.ufm.check_fully_active]).

    Parameters
    ----------
    T : array_like, shape (..., C, C)
        Symmetric PSD target covariance(s).
    lambda_h, lambda_w : float
        Feature and head penalties, > 0.

    Returns
    -------
    ndarray, shape (..., C, C)
    """
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    T = as_spd("T", T, batch=True, strict=False)
    return _phi(T, lh, lw)


def optimal_features(W, Y, lambda_h: float) -> np.ndarray:
    """Optimal features for a given head: ``H = W^T A^{-1} (Y - mu 1^T)`` (theory.md §4), as rows.

    For fixed ``W`` the local objective is a ridge problem in the features and the bias; its
    minimiser is ``b = mu`` and ``H = W^T A^{-1} (Y - mu 1^T)`` with ``A = W W^T + lambda_H I``,
    whose value profiled over ``H`` is ``F(W; Sigma)``. Rows are samples here: the result is
    ``(Y - 1 mu^T) A^{-1} W``.

    Parameters
    ----------
    W : array_like, shape (C, P)
        Head weight.
    Y : array_like, shape (N, C)
        Targets (rows are samples); centred here with their own mean ``mu``.
    lambda_h : float
        ``lambda_H > 0``.

    Returns
    -------
    ndarray, shape (N, P)
        The optimal feature of each sample; their mean is zero.
    """
    lh = as_positive_scalar("lambda_h", lambda_h)
    W = as_head("W", W)
    Y = as_float_array("Y", Y, ndim=2)
    if Y.shape[1] != W.shape[0]:
        raise UFMInputError(f"optimal_features: Y has {Y.shape[1]} target columns but W has {W.shape[0]} rows")
    if Y.shape[0] == 0:
        raise UFMInputError("optimal_features: Y has no samples")
    A = W @ W.T + lh * np.eye(W.shape[0])
    return np.linalg.solve(A, (Y - Y.mean(0)).T).T @ W


def optimal_loss(T, lambda_h: float, lambda_w: float) -> np.ndarray | float:
    """Optimal local loss ``L*`` for target covariance ``T`` (docs/theory.md §4).

    ``L* = sum_{s_i > lH lW} (sqrt(lH lW s_i) - lH lW / 2) + 1/2 sum_{s_i <= lH lW} s_i`` with
    ``s_i`` the eigenvalues of ``T``; valid also outside the fully active regime.

    Parameters
    ----------
    T : array_like, shape (..., C, C)
    lambda_h, lambda_w : float

    Returns
    -------
    float or ndarray of shape (...)
    """
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    T = as_spd("T", T, batch=True, strict=False)
    s = np.maximum(np.linalg.eigvalsh(T), 0.0)
    thr = lh * lw
    val = np.where(s > thr, np.sqrt(thr * s) - 0.5 * thr, 0.5 * s).sum(axis=-1)
    return float(val) if np.ndim(val) == 0 else val


class FullyActiveReport(NamedTuple):
    """Result of [`check_fully_active`][fedhead.ufm.check_fully_active].

    Attributes
    ----------
    margins : ndarray, shape (M,)
        ``lambda_min(Sigma_m) - lambda_H lambda_W`` (all > 0 when the check passes).
    min_eigs : ndarray, shape (M,)
        ``lambda_min(Sigma_m)``.
    threshold : float
        ``lambda_H lambda_W``.
    """

    margins: np.ndarray
    min_eigs: np.ndarray
    threshold: float

    @property
    def ratios(self) -> np.ndarray:
        """``lambda_min(Sigma_m) / (lambda_H lambda_W)`` (the margin factor kappa), shape (M,)."""
        return self.min_eigs / self.threshold


def fully_active_margins(moments, lambda_h: float, lambda_w: float) -> FullyActiveReport:
    """``lambda_min(Sigma_m) - lambda_H lambda_W`` for every client (theory.md §3), without raising.

    The one computation of the fully active margins;
    [`check_fully_active`][fedhead.ufm.check_fully_active] raises on it.

    Parameters
    ----------
    moments : TargetMoments or array_like of shape (M, C, C)
        Client moments, or the client covariances directly.
    lambda_h, lambda_w : float

    Returns
    -------
    FullyActiveReport
        ``margins (M,)``, ``min_eigs (M,)`` and ``threshold = lambda_H lambda_W``.
    """
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    if isinstance(moments, TargetMoments):
        covs = np.asarray(moments.covs)
    else:
        covs = as_spd("covs", moments, batch=True, label="client", strict=False)
        if covs.ndim != 3:
            raise UFMInputError(f"covs: expected shape (M, C, C), got {covs.shape}")
    min_eigs = np.linalg.eigvalsh(covs)[:, 0]
    thr = lh * lw
    return FullyActiveReport(margins=min_eigs - thr, min_eigs=min_eigs, threshold=thr)


def check_fully_active(moments, lambda_h: float, lambda_w: float) -> FullyActiveReport:
    """Check ``lambda_min(Sigma_m) > lambda_H lambda_W`` for every client (docs/theory.md §3).

    Parameters
    ----------
    moments : TargetMoments or array_like of shape (M, C, C)
        Client moments, or the client covariances directly.
    lambda_h, lambda_w : float

    Returns
    -------
    FullyActiveReport
        As [`fully_active_margins`][fedhead.ufm.fully_active_margins].

    Raises
    ------
    NotFullyActiveError
        Naming the first violating client, its smallest eigenvalue and ``lambda_H lambda_W``.
    """
    rep = fully_active_margins(moments, lambda_h, lambda_w)
    margins, min_eigs, thr = rep
    bad = np.flatnonzero(margins <= 0)
    if bad.size:
        m = int(bad[0])
        raise NotFullyActiveError(
            f"client {m} is not fully active: smallest eigenvalue of Sigma_{m} is {min_eigs[m]:.6e} "
            f"<= lambda_H * lambda_W = {thr:.6e} (margin {margins[m]:.3e}); "
            f"{bad.size} of {margins.shape[0]} clients violate lambda_min(Sigma_m) > lambda_H lambda_W"
        )
    return rep


def corrected_covariance(sigma_m, sigma_cen, gamma: float) -> np.ndarray:
    """The covariance a client with moment correction ``gamma C_m`` effectively fits (theory.md §8).

    ``Sigma_m^gamma = (1 - gamma) Sigma_m + gamma Sigma_cen``; ``gamma = 0`` gives ``Sigma_m``,
    ``gamma = 1`` gives ``Sigma_cen``. This is the one place the formula is written.

    Parameters
    ----------
    sigma_m : array_like, shape (C, C) or (M, C, C)
        Client covariance(s) ``Sigma_m``.
    sigma_cen : array_like, shape (C, C), or None
        Pooled covariance ``Sigma_cen``; may be None only when ``gamma == 0``.
    gamma : float in [0, 1]
        Correction strength.

    Returns
    -------
    ndarray, shape like ``sigma_m``, float64
    """
    g = float(gamma)
    if not (np.isfinite(g) and 0.0 <= g <= 1.0):
        raise UFMInputError(f"gamma: the correction strength must lie in [0, 1], got {gamma!r}")
    sig = np.asarray(sigma_m, dtype=np.float64)
    if g == 0.0:
        return sig
    if sigma_cen is None:
        raise UFMInputError("sigma_cen: required when gamma > 0")
    cen = np.asarray(sigma_cen, dtype=np.float64)
    return (1.0 - g) * sig + g * cen
