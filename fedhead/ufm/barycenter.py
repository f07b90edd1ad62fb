"""Dynamics under exact selection and the Bures-Wasserstein barycenter (docs/theory.md §6)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ._validate import (
    ConvergenceWarning,
    UFMInputError,
    as_head,
    as_int,
    as_positive_scalar,
    as_spd,
    as_weights,
    pd_floor,
)
from .psd import _sqrt, _sqrt_and_inv_sqrt, sym


def _validate_grams(grams, weights) -> tuple[np.ndarray, np.ndarray]:
    g = as_spd("grams", grams, batch=True, label="client", strict=False)
    if g.ndim != 3:
        raise UFMInputError(f"grams: expected shape (M, C, C), got {g.shape}")
    w = as_weights("weights", weights, g.shape[0])
    return g, w


def _gram_step(G: np.ndarray, grams: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Kernel of [`gram_step`][fedhead.ufm.gram_step] (no validation)."""
    Gh, Gih = _sqrt_and_inv_sqrt(G)
    inner = np.einsum("m,mij->ij", weights, _sqrt(Gh @ grams @ Gh))
    return sym(Gih @ inner @ inner @ Gih)


def gram_step(G, grams, weights) -> np.ndarray:
    """One round of the exact-selection Gram recursion (docs/theory.md §6).

    ``G' = G^{-1/2} [sum_m p_m (G^{1/2} G_m G^{1/2})^{1/2}]^2 G^{-1/2}`` (= ``S G S`` with
    ``S = sum_m p_m T_m(G)``).

    Parameters
    ----------
    G : array_like, shape (C, C)
        Current server Gram, symmetric positive definite.
    grams : array_like, shape (M, C, C)
        Client optimal Grams ``G_m`` (symmetric PSD).
    weights : array_like, shape (M,)
        Positive weights summing to one.

    Returns
    -------
    ndarray, shape (C, C)
    """
    grams, weights = _validate_grams(grams, weights)
    G = as_spd("G", G, strict=True)
    if G.shape[-1] != grams.shape[-1]:
        raise UFMInputError(f"gram_step: G is {G.shape} but grams are {grams.shape}")
    return _gram_step(G, grams, weights)


def gram_recursion(G0, grams, weights, n_rounds: int) -> np.ndarray:
    """Trajectory ``G_0, ..., G_T`` of the exact-selection recursion (docs/theory.md §6).

    Parameters
    ----------
    G0 : array_like, shape (C, C)
        Initial Gram, symmetric positive definite.
    grams : array_like, shape (M, C, C)
    weights : array_like, shape (M,)
    n_rounds : int
        ``T >= 0``.

    Returns
    -------
    ndarray, shape (T + 1, C, C)
    """
    grams, weights = _validate_grams(grams, weights)
    G = as_spd("G0", G0, strict=True)
    if G.shape[-1] != grams.shape[-1]:
        raise UFMInputError(f"gram_recursion: G0 is {G.shape} but grams are {grams.shape}")
    n_rounds = as_int("n_rounds", n_rounds, 0)
    out = np.empty((n_rounds + 1,) + G.shape)
    out[0] = G
    for t in range(n_rounds):
        out[t + 1] = _gram_step(out[t], grams, weights)
    return out


def selection_round(W, grams, weights) -> np.ndarray:
    """Head after one round of exact selection: ``W' = sum_m p_m Pi_m(W) = S(W W^T) W`` (docs/theory.md §6).

    Parameters
    ----------
    W : array_like, shape (C, P)
        Broadcast head with full row rank.
    grams : array_like, shape (M, C, C)
    weights : array_like, shape (M,)

    Returns
    -------
    ndarray, shape (C, P)
    """
    grams, weights = _validate_grams(grams, weights)
    W = as_head("W", W, c=grams.shape[-1], full_rank=True)
    G = W @ W.T
    Gh, Gih = _sqrt_and_inv_sqrt(G)
    S = Gih @ np.einsum("m,mij->ij", weights, _sqrt(Gh @ grams @ Gh)) @ Gih
    return sym(S) @ W


@dataclass(frozen=True, eq=False)
class BarycenterResult:
    """Result of [`bw_barycenter`][fedhead.ufm.bw_barycenter].

    Attributes
    ----------
    gram : ndarray, shape (C, C)
        The barycenter ``G_star`` (last iterate).
    n_iter : int
        Number of fixed-point steps taken.
    residual : float
        ``||G_{k+1} - G_k||_F / ||G_k||_F`` of the last step.
    converged : bool
        ``residual < tol``.
    """

    gram: np.ndarray
    n_iter: int
    residual: float
    converged: bool


def _bw_barycenter(grams, weights, init, tol, max_iter) -> BarycenterResult:
    G = init
    residual = np.inf
    k = 0
    for k in range(1, max_iter + 1):
        G_new = _gram_step(G, grams, weights)
        residual = float(np.linalg.norm(G_new - G) / np.linalg.norm(G))
        G = G_new
        if residual < tol:
            return BarycenterResult(gram=G, n_iter=k, residual=residual, converged=True)
    warnings.warn(
        f"bw_barycenter did not converge: residual {residual:.3e} >= tol {tol:.1e} after {k} iterations",
        ConvergenceWarning,
        stacklevel=3,
    )
    return BarycenterResult(gram=G, n_iter=k, residual=residual, converged=False)


def bw_barycenter(grams, weights, *, init=None, tol: float = 1e-13, max_iter: int = 10_000) -> BarycenterResult:
    """Bures-Wasserstein barycenter ``G_star = argmin_X sum_m p_m d_BW^2(X, G_m)`` (docs/theory.md §6).

    Fixed-point iteration of the exact-selection recursion
    ``G <- G^{-1/2} [sum_m p_m (G^{1/2} G_m G^{1/2})^{1/2}]^2 G^{-1/2}`` until the relative
    step ``||G_{k+1} - G_k||_F / ||G_k||_F`` is below ``tol``; the limit satisfies
    ``G_star = sum_m p_m (G_star^{1/2} G_m G_star^{1/2})^{1/2}``. A
    [`ConvergenceWarning`][fedhead.ufm.ConvergenceWarning] is issued when ``max_iter`` steps do not reach ``tol``.

    Parameters
    ----------
    grams : array_like, shape (M, C, C)
        Symmetric PSD Grams (positive definite in the fully active regime).
    weights : array_like, shape (M,)
        Positive weights summing to one.
    init : array_like, shape (C, C), optional
        Positive definite start; default ``(sum_m p_m G_m^{1/2})^2`` (exact when the ``G_m``
        commute).
    tol : float
    max_iter : int

    Returns
    -------
    BarycenterResult
    """
    grams, weights = _validate_grams(grams, weights)
    tol = as_positive_scalar("tol", tol)
    max_iter = as_int("max_iter", max_iter, 1)
    if init is None:
        R = np.einsum("m,mij->ij", weights, _sqrt(grams))
        init = sym(R @ R)
        w_init = np.linalg.eigvalsh(init)
        if w_init[0] <= pd_floor(w_init[-1], init.shape[-1]):
            raise UFMInputError(
                "grams: default start (sum_m p_m G_m^{1/2})^2 is singular; pass a positive definite init"
            )
    else:
        init = as_spd("init", init, strict=True)
        if init.shape[-1] != grams.shape[-1]:
            raise UFMInputError(f"init: shape {init.shape} does not match grams {grams.shape}")
    return _bw_barycenter(grams, weights, init, tol, int(max_iter))
