"""Gram and head metrics of docs/theory.md §11 (numpy, on top of [`fedhead.ufm`][fedhead.ufm]).

Measured Grams ``G`` and references ``G_ref`` are ``(..., C, C)``; leading axes broadcast.
"""

from __future__ import annotations

import numpy as np

from fedhead.ufm import UFMInputError
from fedhead.ufm._validate import as_float_array, as_weights

__all__ = ["direction_error", "relative_error", "selection_distance", "trajectory_error"]


def _pair(G, G_ref) -> tuple[np.ndarray, np.ndarray]:
    G = as_float_array("G", G, min_ndim=2)
    R = as_float_array("G_ref", G_ref, min_ndim=2)
    if G.shape[-2:] != R.shape[-2:]:
        raise UFMInputError(f"G {G.shape} and G_ref {R.shape} have different matrix shapes")
    try:
        np.broadcast_shapes(G.shape, R.shape)
    except ValueError as exc:
        raise UFMInputError(f"G {G.shape} and G_ref {R.shape} do not broadcast") from exc
    return G, R


def _out(x: np.ndarray):
    return float(x) if np.ndim(x) == 0 else x


def relative_error(G, G_ref) -> float | np.ndarray:
    """Relative error ``e_F(G, G_ref) = ||G - G_ref||_F / ||G_ref||_F`` (docs/theory.md §11).

    Parameters
    ----------
    G, G_ref : array_like, shape (..., C, C)
        ``G_ref`` must be nonzero.

    Returns
    -------
    float or ndarray of shape (...)
    """
    G, R = _pair(G, G_ref)
    nr = np.linalg.norm(R, axis=(-2, -1))
    if np.any(nr == 0):
        raise UFMInputError("G_ref: reference matrix is zero; the relative error is undefined")
    return _out(np.linalg.norm(G - R, axis=(-2, -1)) / nr)


def direction_error(G, G_ref) -> float | np.ndarray:
    """Direction error ``d(G, G_ref) = || G/||G||_F - G_ref/||G_ref||_F ||_F`` (docs/theory.md §11).

    Parameters
    ----------
    G, G_ref : array_like, shape (..., C, C)
        Both nonzero.

    Returns
    -------
    float or ndarray of shape (...), in ``[0, 2]``
    """
    G, R = _pair(G, G_ref)
    ng = np.linalg.norm(G, axis=(-2, -1), keepdims=True)
    nr = np.linalg.norm(R, axis=(-2, -1), keepdims=True)
    if np.any(ng == 0) or np.any(nr == 0):
        raise UFMInputError("direction_error: G or G_ref is the zero matrix; its direction is undefined")
    return _out(np.linalg.norm(G / ng - R / nr, axis=(-2, -1)))


def selection_distance(heads, targets, weights) -> float:
    """Selection distance ``delta_t = sum_m p_m ||W~_m - Pi_m(W_t)||_F`` (docs/theory.md §11).

    Parameters
    ----------
    heads : array_like, shape (M, C, P)
        Trained local heads ``W~_{m,t}``.
    targets : array_like, shape (M, C, P)
        Selected heads ``Pi_m(W_t)``, e.g. ``fedhead.ufm.closest_head(W_t, grams)``.
    weights : array_like, shape (M,)
        Positive weights summing to one.

    Returns
    -------
    float
    """
    Hd = as_float_array("heads", heads, ndim=3)
    Tg = as_float_array("targets", targets, ndim=3)
    if Hd.shape != Tg.shape:
        raise UFMInputError(f"heads {Hd.shape} and targets {Tg.shape} must have the same (M, C, P) shape")
    p = as_weights("weights", weights, Hd.shape[0])
    return float(p @ np.linalg.norm(Hd - Tg, axis=(-2, -1)))


def trajectory_error(grams, recursion) -> float:
    """Trajectory error: median over rounds ``1..T`` of ``e_F(G_t, recursion_t)`` (docs/theory.md §11).

    Parameters
    ----------
    grams : array_like, shape (T + 1, C, C)
        Measured server Grams ``G_0..G_T`` of a run.
    recursion : array_like, shape (T + 1, C, C)
        Exact docs/theory.md §6 recursion from the run's own ``G_0`` (``fedhead.ufm.gram_recursion``).

    Returns
    -------
    float
    """
    G = as_float_array("grams", grams, ndim=3)
    R = as_float_array("recursion", recursion, ndim=3)
    if G.shape != R.shape:
        raise UFMInputError(f"grams {G.shape} and recursion {R.shape} must have the same (T+1, C, C) shape")
    if G.shape[0] < 2:
        raise UFMInputError(f"grams: need at least rounds 0 and 1 (T >= 1), got {G.shape[0]} Gram(s)")
    return float(np.median(relative_error(G[1:], R[1:])))
