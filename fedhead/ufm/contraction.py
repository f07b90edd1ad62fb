"""Contraction of the finite-step Gram map near its fixed point (docs/theory.md §9).

The Jacobian of the round map on symmetric matrices (complex-step differentiation), its spectral
radius, and the rate ``theta_min`` the theory predicts.
"""

from __future__ import annotations

import numpy as np

from ._validate import as_positive_scalar, as_spd
from .finite_steps import _check_common, _check_gram, _check_steps, _gram_map, _require_active_within


def _sym_basis(C: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    iu, ju = np.triu_indices(C)
    B = np.zeros((iu.size, C, C))
    B[np.arange(iu.size), iu, ju] = 1.0
    B[np.arange(iu.size), ju, iu] = 1.0
    return B, iu, ju


def gram_map_jacobian(G, sigmas, weights, lambda_h: float, lambda_w: float, eta: float, E: int) -> np.ndarray:
    """Jacobian of the Gram map of [`profiled_gram_map`][fedhead.ufm.profiled_gram_map] on symmetric matrices.

    Coordinates are the upper-triangle entries ``X_ij, i <= j`` (basis ``E_ii`` and
    ``E_ij + E_ji``); its eigenvalues are those of the linear map on symmetric matrices.
    Computed by complex-step differentiation, ``J e_k = Im g(G + i h B_k) / h`` with
    ``h = 1e-30 max(1, ||G||)`` (the map is rational in ``G``), which is exact to rounding (no
    subtractive cancellation, unlike central differences).

    Parameters
    ----------
    G : array_like, shape (C, C)
        Server Gram where the Jacobian is taken (symmetric PSD).
    sigmas, weights, lambda_h, lambda_w, eta, E
        As in [`profiled_round`][fedhead.ufm.profiled_round].

    Returns
    -------
    ndarray, shape (C(C+1)/2, C(C+1)/2)
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    G = _check_gram(G, s)
    eta, E = _check_steps(eta, E)
    C = G.shape[0]
    B, iu, ju = _sym_basis(C)
    h = 1e-30 * max(1.0, float(np.linalg.norm(G)))
    J = np.empty((B.shape[0], B.shape[0]))
    for k in range(B.shape[0]):
        gk, _ = _gram_map(G + 1j * h * B[k], s.astype(complex), p, lh, lw, eta, E)
        J[:, k] = gk.imag[iu, ju] / h
    return J


def jacobian_spectral_radius(G, sigmas, weights, lambda_h: float, lambda_w: float, eta: float, E: int) -> float:
    """Spectral radius of [`gram_map_jacobian`][fedhead.ufm.gram_map_jacobian] at ``G`` (e.g. the fixed point
    ``G_{eta,E}``).

    docs/theory.md §9: ``1 - 2 h theta_min + O(h^2)`` at the fixed point, ``h = eta E``. Arguments as in
    [`gram_map_jacobian`][fedhead.ufm.gram_map_jacobian].

    Returns
    -------
    float
        ``max |eig(J)|``.
    """
    J = gram_map_jacobian(G, sigmas, weights, lambda_h, lambda_w, eta, E)
    return float(np.abs(np.linalg.eigvals(J)).max())


def theta_min(sigma_within, lambda_h: float, lambda_w: float) -> float:
    """``theta_min = 2 lambda_W (1 - sqrt(lambda_H lambda_W / lambda_min(Sigma_within)))`` (docs/theory.md §9).

    Parameters
    ----------
    sigma_within : array_like, shape (C, C)
        Symmetric positive definite ``Sigma_within``.
    lambda_h, lambda_w : float, > 0

    Returns
    -------
    float
        In ``(0, 2 lambda_W)``.

    Raises
    ------
    NotFullyActiveError
        If ``lambda_min(Sigma_within) <= lambda_H lambda_W`` (the formula would be <= 0).
    """
    S = as_spd("sigma_within", sigma_within, strict=True)
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    lmin = float(np.linalg.eigvalsh(S)[0])
    _require_active_within(lmin, lh, lw, "sigma_within")
    return 2.0 * lw * (1.0 - np.sqrt(lh * lw / lmin))
