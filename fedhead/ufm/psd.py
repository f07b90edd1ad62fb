"""Symmetric / PSD matrix functions: symmetrise, then ``eigh`` (never a general ``sqrtm``).

All functions act on the last two axes and batch over any leading axes ``(..., C, C)``.
The public helpers validate their input; the underscored kernels are for inner loops.
"""

from __future__ import annotations

import numpy as np

from ._validate import UFMInputError, as_spd


def sym(A) -> np.ndarray:
    """Symmetric part ``(A + A^T) / 2`` over the last two axes (no validation).

    Parameters
    ----------
    A : array_like, shape (..., C, C)

    Returns
    -------
    ndarray, shape (..., C, C)
    """
    A = np.asarray(A)
    return 0.5 * (A + np.swapaxes(A, -1, -2))


def _eig_fn(A: np.ndarray, fn) -> np.ndarray:
    """``V diag(fn(w)) V^T`` with ``(w, V) = eigh(sym(A))`` (batched, no validation)."""
    w, V = np.linalg.eigh(sym(A))
    return sym((V * fn(w)[..., None, :]) @ np.swapaxes(V, -1, -2))


def _sqrt(A: np.ndarray) -> np.ndarray:
    """PSD square root, negative rounding eigenvalues clipped to zero (no validation)."""
    return _eig_fn(A, lambda w: np.sqrt(np.maximum(w, 0.0)))


def _inv_sqrt(A: np.ndarray) -> np.ndarray:
    """Inverse PSD square root of a positive definite matrix (no validation)."""
    return _eig_fn(A, lambda w: 1.0 / np.sqrt(w))


def _sqrt_and_inv_sqrt(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(A^{1/2}, A^{-1/2})`` from one eigendecomposition (no validation)."""
    w, V = np.linalg.eigh(sym(A))
    Vt = np.swapaxes(V, -1, -2)
    r = np.sqrt(w)
    return sym((V * r[..., None, :]) @ Vt), sym((V * (1.0 / r)[..., None, :]) @ Vt)


def psd_sqrt(A) -> np.ndarray:
    """PSD square root ``A^{1/2}``.

    Parameters
    ----------
    A : array_like, shape (..., C, C)
        Symmetric positive semidefinite (up to rounding).

    Returns
    -------
    ndarray, shape (..., C, C)
        The unique PSD ``X`` with ``X X = A``; eigenvalues below zero by rounding are clipped.
    """
    return _sqrt(as_spd("A", A, batch=True, strict=False))


def psd_inv_sqrt(A) -> np.ndarray:
    """Inverse square root ``A^{-1/2}`` of a symmetric positive definite matrix (docs/theory.md notation).

    Parameters
    ----------
    A : array_like, shape (..., C, C)
        Symmetric positive definite (smallest eigenvalue above ``C eps lambda_max``).

    Returns
    -------
    ndarray, shape (..., C, C)
        ``V diag(w^{-1/2}) V^T`` with ``(w, V) = eigh(sym(A))``.
    """
    return _inv_sqrt(as_spd("A", A, batch=True, strict=True))


def psd_power(A, p: float) -> np.ndarray:
    """Matrix power ``A^p = V diag(w^p) V^T`` of a symmetric PSD matrix through ``eigh``.

    Parameters
    ----------
    A : array_like, shape (..., C, C)
        ``p > 0``: symmetric positive semidefinite; ``p <= 0``: positive definite.
    p : float
        Finite exponent.

    Returns
    -------
    ndarray, shape (..., C, C)
    """
    p = float(p)
    if not np.isfinite(p):
        raise UFMInputError(f"p: exponent must be finite, got {p!r}")
    if p > 0:
        a = as_spd("A", A, batch=True, strict=False)
        return _eig_fn(a, lambda w: np.maximum(w, 0.0) ** p)
    a = as_spd("A", A, batch=True, strict=True)
    return _eig_fn(a, lambda w: w**p)
