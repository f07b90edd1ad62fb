"""Bures-Wasserstein geometry and the closest-head selection rule (docs/theory.md §5)."""

from __future__ import annotations

import numpy as np

from ._validate import UFMInputError, as_head, as_spd
from .psd import _sqrt, _sqrt_and_inv_sqrt, sym


def _bw_distance(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Kernel of [`bw_distance`][fedhead.ufm.bw_distance] (no validation, broadcasting)."""
    X = _sqrt(A)
    Y = _sqrt(B)
    X, Y = np.broadcast_arrays(X, Y)
    U, _, Vt = np.linalg.svd(np.swapaxes(Y, -1, -2) @ X)
    Q = U @ Vt
    return np.linalg.norm(X - Y @ Q, axis=(-2, -1))


def bw_distance(A, B) -> np.ndarray | float:
    """Bures-Wasserstein distance ``d_BW(A, B)`` (not squared), docs/theory.md §5.

    ``d_BW^2(A, B) = Tr A + Tr B - 2 Tr (A^{1/2} B A^{1/2})^{1/2}``. Computed without
    cancellation as ``min_Q ||A^{1/2} - B^{1/2} Q||_F`` over orthogonal ``Q`` (orthogonal
    Procrustes by SVD of ``B^{1/2} A^{1/2}``), so ``d_BW(A, A)`` is zero to rounding.

    Parameters
    ----------
    A, B : array_like, shape (..., C, C)
        Symmetric PSD matrices; leading axes broadcast.

    Returns
    -------
    float or ndarray of shape (...)
    """
    A = as_spd("A", A, batch=True, strict=False)
    B = as_spd("B", B, batch=True, strict=False)
    if A.shape[-1] != B.shape[-1]:
        raise UFMInputError(f"bw_distance: A is {A.shape[-2:]} but B is {B.shape[-2:]}")
    try:
        np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    except ValueError as exc:
        raise UFMInputError(f"bw_distance: leading axes of A {A.shape} and B {B.shape} do not broadcast") from exc
    d = _bw_distance(A, B)
    return float(d) if np.ndim(d) == 0 else d


def bw_distance_squared(A, B) -> np.ndarray | float:
    """Squared Bures-Wasserstein distance ``d_BW^2(A, B)`` (docs/theory.md §5); see
    [`bw_distance`][fedhead.ufm.bw_distance].

    Parameters
    ----------
    A, B : array_like, shape (..., C, C)

    Returns
    -------
    float or ndarray of shape (...)
    """
    d = bw_distance(A, B)
    return d * d


def _transport_map(G: np.ndarray, G_target: np.ndarray) -> np.ndarray:
    """Kernel of [`transport_map`][fedhead.ufm.transport_map] (no validation; ``G_target`` may be batched)."""
    Gh, Gih = _sqrt_and_inv_sqrt(G)
    return sym(Gih @ _sqrt(Gh @ G_target @ Gh) @ Gih)


def transport_map(G, G_target) -> np.ndarray:
    """Optimal transport map ``T_{G_target}(G) = G^{-1/2} (G^{1/2} Gt G^{1/2})^{1/2} G^{-1/2}`` (docs/theory.md §5).

    The symmetric PSD matrix ``T`` with ``T G T = G_target``.

    Parameters
    ----------
    G : array_like, shape (C, C)
        Symmetric positive definite source Gram.
    G_target : array_like, shape (C, C) or (M, C, C)
        Symmetric PSD target Gram(s).

    Returns
    -------
    ndarray, shape like ``G_target``
    """
    G = as_spd("G", G, strict=True)
    Gt = as_spd("G_target", G_target, batch=True, label="client", strict=False)
    if Gt.shape[-1] != G.shape[-1]:
        raise UFMInputError(f"transport_map: G is {G.shape} but G_target is {Gt.shape}")
    return _transport_map(G, Gt)


def _closest_head(W: np.ndarray, G_target: np.ndarray) -> np.ndarray:
    return _transport_map(W @ W.T, G_target) @ W


def closest_head(W, G_target) -> np.ndarray:
    """Selection rule ``Pi(W) = T_{G_target}(W W^T) W`` (docs/theory.md §5).

    The head with Gram ``G_target`` closest to ``W`` in Frobenius norm; ``||Pi(W) - W||_F =
    d_BW(W W^T, G_target)``.

    Parameters
    ----------
    W : array_like, shape (C, P)
        Broadcast head with full row rank (``W W^T`` positive definite), ``P >= C``.
    G_target : array_like, shape (C, C) or (M, C, C)
        Target Gram(s) (e.g. client optimal Grams ``G_m``).

    Returns
    -------
    ndarray, shape (C, P) or (M, C, P)
    """
    W = as_head("W", W, full_rank=True)
    Gt = as_spd("G_target", G_target, batch=True, label="client", strict=False)
    if Gt.shape[-1] != W.shape[0]:
        raise UFMInputError(f"closest_head: W has C = {W.shape[0]} rows but G_target is {Gt.shape}")
    return _closest_head(W, Gt)
