"""First-order displacement of the finite-step fixed point from ``G_within`` (docs/theory.md §9).

``psi``, its gradient in closed form, the displacement ``Delta`` and its eigenvalues for commuting
client covariances.
"""

from __future__ import annotations

import numpy as np

from ._validate import UFMInputError, as_float_array, as_positive_scalar, as_weights
from .closed_forms import _alpha, _phi
from .finite_steps import _check_common, _check_gram, _require_active_within
from .psd import sym


def _psi_parts(G, s, p, lh, lw):
    C = G.shape[-1]
    Ainv = np.linalg.inv(G + lh * np.eye(C))
    Ainv = 0.5 * (Ainv + Ainv.T)
    K = Ainv @ s @ Ainv  # (M, C, C)
    L = 0.5 * lw * np.eye(C) - 0.5 * lh * K
    return Ainv, K, L


def psi_value(G, sigmas, weights, lambda_h: float, lambda_w: float) -> float:
    """``psi(G) = 2 sum_m p_m Tr(Lambda_m(G) G Lambda_m(G))`` (docs/theory.md §9).

    ``Lambda_m(G) = lambda_W/2 I - lambda_H/2 A^{-1} Sigma_m A^{-1}``, ``A = G + lambda_H I``
    (docs/theory.md §4).

    Parameters
    ----------
    G : array_like, shape (C, C)
        Symmetric PSD Gram.
    sigmas : array_like, shape (M, C, C)
        Client covariances ``Sigma_m``.
    weights : array_like, shape (M,)
    lambda_h, lambda_w : float, > 0

    Returns
    -------
    float
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    G = _check_gram(G, s)
    _, _, L = _psi_parts(G, s, p, lh, lw)
    return float(2.0 * np.einsum("m,mij,jk,mki->", p, L, G, L))


def psi_gradient(G, sigmas, weights, lambda_h: float, lambda_w: float) -> np.ndarray:
    """Gradient of ``psi`` w.r.t. symmetric ``G`` in the Frobenius inner product (closed form).

    With ``A = G + lambda_H I``, ``K_m = A^{-1} Sigma_m A^{-1}``,
    ``d Lambda_m[X] = lambda_H/2 (A^{-1} X K_m + K_m X A^{-1})``, the directional derivative
    is ``d psi[X] = 2 sum_m p_m (2 Tr(d Lambda_m[X] G Lambda_m) + Tr(Lambda_m^2 X))``, so
    ``grad psi = sym(2 sum_m p_m [lambda_H (K_m G Lambda_m A^{-1} + A^{-1} G Lambda_m K_m)
    + Lambda_m^2])`` (docs/theory.md §9).

    Parameters
    ----------
    G, sigmas, weights, lambda_h, lambda_w
        As in [`psi_value`][fedhead.ufm.psi_value].

    Returns
    -------
    ndarray, shape (C, C)
        Symmetric.
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    G = _check_gram(G, s)
    return _psi_gradient(G, s, p, lh, lw)


def _psi_gradient(G, s, p, lh, lw):
    Ainv, K, L = _psi_parts(G, s, p, lh, lw)
    GL = G @ L
    term = lh * (K @ GL @ Ainv + Ainv @ GL @ K) + L @ L
    return sym(2.0 * np.einsum("m,mij->ij", p, term))


def displacement_delta(sigmas, weights, lambda_h: float, lambda_w: float) -> np.ndarray:
    """First-order fixed-point displacement ``Delta = 1/2 H^{-1}[grad psi(G_within)]`` (docs/theory.md §9).

    ``G_{eta,E} - G_within = eta (E - 1) Delta + O(h^2)``. ``H[X] = lambda_W/(2 alpha)
    (R^{-1} X + X R^{-1})`` with ``R = Sigma_within^{1/2}`` is inverted in the eigenbasis of
    ``R = V diag(r) V^T``: ``(V^T X V)_ij = (2 alpha / lambda_W) (V^T Y V)_ij / (1/r_i + 1/r_j)``.
    ``grad psi`` is the closed form of [`psi_gradient`][fedhead.ufm.psi_gradient].

    Parameters
    ----------
    sigmas : array_like, shape (M, C, C)
    weights : array_like, shape (M,)
    lambda_h, lambda_w : float

    Returns
    -------
    ndarray, shape (C, C)

    Raises
    ------
    NotFullyActiveError
        If ``lambda_min(Sigma_within) <= lambda_H lambda_W`` (``G_within`` would be clipped).
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    S = sym(np.einsum("m,mij->ij", p, s))
    w, V = np.linalg.eigh(S)
    _require_active_within(float(w[0]), lh, lw, "sigmas: Sigma_within = sum_m p_m Sigma_m")
    alpha = _alpha(lh, lw)
    g_within = _phi(S, lh, lw)
    Y = V.T @ _psi_gradient(g_within, s, p, lh, lw) @ V
    rinv = 1.0 / np.sqrt(w)
    X = (2.0 * alpha / lw) * Y / (rinv[:, None] + rinv[None, :])
    return sym(0.5 * V @ X @ V.T)


def commuting_delta(eigs, weights, lambda_h: float, lambda_w: float) -> np.ndarray:
    """Displacement in a common eigenbasis (docs/theory.md §9), commuting client covariances.

    ``Delta_i = s (s - 3/4 sqrt(lbar_i)) sum_m p_m (lambda_{m,i} / lbar_i - 1)^2`` with
    ``lbar_i = sum_m p_m lambda_{m,i}``, ``s = sqrt(lambda_H lambda_W)``.

    Parameters
    ----------
    eigs : array_like, shape (M, C)
        Client eigenvalues ``lambda_{m,i} > 0`` in the common eigenbasis.
    weights : array_like, shape (M,)
    lambda_h, lambda_w : float, > 0

    Returns
    -------
    ndarray, shape (C,)
        Eigenvalues of ``Delta`` in the same basis.

    Raises
    ------
    NotFullyActiveError
        If some ``lbar_i <= lambda_H lambda_W``.
    """
    lam = as_float_array("eigs", eigs, ndim=2)
    if np.any(lam <= 0):
        m, i = (int(v) for v in np.argwhere(lam <= 0)[0])
        raise UFMInputError(f"eigs: client {m} eigenvalue {i} is {float(lam[m, i])!r}; eigenvalues must be > 0")
    p = as_weights("weights", weights, lam.shape[0])
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    sq = np.sqrt(lh * lw)
    lbar = p @ lam
    i = int(np.argmin(lbar))
    _require_active_within(float(lbar[i]), lh, lw, f"eigs: eigenvalue {i} of Sigma_within (lbar_{i})")
    spread = p @ (lam / lbar - 1.0) ** 2
    return sq * (sq - 0.75 * np.sqrt(lbar)) * spread
