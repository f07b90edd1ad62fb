"""Finite local training: E profiled gradient steps of size eta per round (docs/theory.md §9).

Client m takes ``E`` full-batch gradient steps on ``F_m(W) = F(W; Sigma_m)`` from the
broadcast, ``W <- (I - 2 eta Lambda_m(W W^T)) W``, and the server averages the heads. Every
client's head stays ``K_m W`` with a ``C x C`` matrix ``K_m`` that depends on ``G = W W^T``
only, so the round is a map of Grams ``G -> Kbar G Kbar^T`` with ``Kbar = sum_m p_m K_m``;
:func:`profiled_gram_map` evaluates it with ``C x C`` arithmetic (rational in ``G``, so it
also accepts complex input, which :func:`gram_map_jacobian` uses for complex-step
differentiation).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ._validate import (
    ConvergenceWarning,
    NotFullyActiveError,
    UFMInputError,
    as_float_array,
    as_head,
    as_int,
    as_positive_scalar,
    as_spd,
    as_weights,
)
from .closed_forms import _alpha, _phi
from .psd import _sqrt, sym


def _t(A: np.ndarray) -> np.ndarray:
    """Plain transpose of the last two axes (no conjugation, for complex-step use)."""
    return np.swapaxes(A, -1, -2)


def _lambdas(Gc: np.ndarray, sigmas: np.ndarray, lh: float, lw: float) -> np.ndarray:
    """``Lambda_m(G_m) = lw/2 I - lh/2 A^{-1} Sigma_m A^{-1}``, ``A = G_m + lh I`` (batched)."""
    C = Gc.shape[-1]
    Ainv = np.linalg.inv(Gc + lh * np.eye(C))
    Ainv = 0.5 * (Ainv + _t(Ainv))
    L = 0.5 * lw * np.eye(C) - 0.5 * lh * (Ainv @ sigmas @ Ainv)
    return 0.5 * (L + _t(L))


def _check_common(sigmas, weights, lambda_h, lambda_w):
    s = as_spd("sigmas", sigmas, batch=True, label="client", strict=False)
    if s.ndim != 3:
        raise UFMInputError(f"sigmas: expected client covariances of shape (M, C, C), got {s.shape}")
    p = as_weights("weights", weights, s.shape[0])
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    return s, p, lh, lw


def _check_gram(G, s: np.ndarray) -> np.ndarray:
    """A symmetric PSD server Gram ``G`` (C, C) matching the client covariances ``s`` (M, C, C)."""
    G = as_spd("G", G, strict=False)
    if G.shape[-1] != s.shape[-1]:
        raise UFMInputError(f"G: shape {G.shape} does not match sigmas {s.shape}")
    return G


def _require_active_within(lmin: float, lh: float, lw: float, what: str) -> None:
    """docs/theory.md §9 expands around ``G_within = phi(Sigma_within)``: it needs ``lambda_min > lambda_H lambda_W``."""
    thr = lh * lw
    if not lmin > thr:
        raise NotFullyActiveError(
            f"{what}: smallest eigenvalue {lmin:.6e} <= lambda_H * lambda_W = {thr:.6e} "
            f"(margin {lmin - thr:.3e}); the docs/theory.md §9 expansion around G_within needs the fully active regime"
        )


def _check_steps(eta, E) -> tuple[float, int]:
    eta = as_positive_scalar("eta", eta)
    return eta, as_int("E", E, 1)


def profiled_round(W, sigmas, weights, lambda_h: float, lambda_w: float, eta: float, E: int) -> np.ndarray:
    """One federated round of profiled gradient steps (docs/theory.md §9), computed on the heads.

    Each client starts from the broadcast ``W`` and takes ``E`` steps
    ``W <- W - eta grad F(W; Sigma_m) = (I - 2 eta Lambda_m(W W^T)) W``; the server returns
    ``sum_m p_m W_m``.

    Parameters
    ----------
    W : array_like, shape (C, P)
        Broadcast head.
    sigmas : array_like, shape (M, C, C)
        Client covariances ``Sigma_m``.
    weights : array_like, shape (M,)
    lambda_h, lambda_w : float
    eta : float
        Step size ``> 0``.
    E : int
        Local steps ``>= 1``.

    Returns
    -------
    ndarray, shape (C, P)
        The averaged head.
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    W = as_head("W", W, c=s.shape[-1])
    eta, E = _check_steps(eta, E)
    Wm = np.broadcast_to(W, (s.shape[0],) + W.shape).copy()
    for _ in range(E):
        L = _lambdas(Wm @ _t(Wm), s, lh, lw)
        Wm = Wm - 2.0 * eta * (L @ Wm)
    return np.einsum("m,mcp->cp", p, Wm)


def _gram_map(G: np.ndarray, s: np.ndarray, p: np.ndarray, lh: float, lw: float, eta: float, E: int):
    """Kernel of :func:`profiled_gram_map`: returns ``(G', Kbar)``; accepts complex ``G``."""
    M, C = s.shape[0], s.shape[-1]
    I = np.eye(C)
    Gc = np.broadcast_to(G, (M, C, C)).copy()
    K = np.broadcast_to(I, (M, C, C)).astype(Gc.dtype)
    for _ in range(E):
        S = I - 2.0 * eta * _lambdas(Gc, s, lh, lw)
        K = S @ K
        Gc = S @ Gc @ S
        Gc = 0.5 * (Gc + _t(Gc))
    Kbar = np.einsum("m,mij->ij", p, K)
    Gn = Kbar @ G @ Kbar.T
    return 0.5 * (Gn + Gn.T), Kbar


class GramMapStep(NamedTuple):
    """Result of :func:`profiled_gram_map`.

    Attributes
    ----------
    gram : ndarray, shape (C, C)
        Next server Gram ``Kbar G Kbar^T``.
    kbar : ndarray, shape (C, C)
        Head multiplier: the averaged head is ``Kbar W``.
    """

    gram: np.ndarray
    kbar: np.ndarray


def profiled_gram_map(G, sigmas, weights, lambda_h: float, lambda_w: float, eta: float, E: int) -> GramMapStep:
    """The round of :func:`profiled_round` as a map of server Grams (docs/theory.md §9).

    Client m's head after ``E`` steps is ``K_m W`` with ``K_m = S_{E-1} ... S_0``,
    ``S_k = I - 2 eta Lambda_m(G_{m,k})``, ``G_{m,k+1} = S_k G_{m,k} S_k``, ``G_{m,0} = G``;
    the next Gram is ``Kbar G Kbar^T``, ``Kbar = sum_m p_m K_m``.

    Parameters
    ----------
    G : array_like, shape (C, C)
        Server Gram (symmetric PSD).
    sigmas, weights, lambda_h, lambda_w, eta, E
        As in :func:`profiled_round`.

    Returns
    -------
    GramMapStep
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    G = _check_gram(G, s)
    eta, E = _check_steps(eta, E)
    g, k = _gram_map(G, s, p, lh, lw, eta, E)
    return GramMapStep(g, k)


@dataclass(frozen=True, eq=False)
class FiniteStepResult:
    """Result of :func:`finite_step_fixed_point`.

    Attributes
    ----------
    gram : ndarray, shape (C, C)
        Fixed server Gram ``G_{eta,E}`` (last iterate).
    head : ndarray, shape (C, P)
        Server head after the last round (its Gram is ``gram``).
    n_rounds : int
        Rounds run.
    residual : float
        ``||G_{t+1} - G_t||_F / ||G_t||_F`` of the last round.
    converged : bool
        ``residual < tol``.
    """

    gram: np.ndarray
    head: np.ndarray
    n_rounds: int
    residual: float
    converged: bool


def finite_step_fixed_point(
    sigmas,
    weights,
    lambda_h: float,
    lambda_w: float,
    eta: float,
    E: int,
    *,
    w0=None,
    tol: float = 1e-13,
    max_rounds: int = 100_000,
) -> FiniteStepResult:
    """Iterate profiled rounds until the server Gram stops moving (docs/theory.md §9).

    Rounds ``W <- Kbar(W W^T) W`` (see :func:`profiled_gram_map`) from ``w0`` until
    ``||G_{t+1} - G_t||_F / ||G_t||_F < tol`` or ``max_rounds``; a
    :class:`ConvergenceWarning` is issued if ``tol`` is not reached. For ``E = 1`` the limit is
    ``G_within``.

    Parameters
    ----------
    sigmas, weights, lambda_h, lambda_w, eta, E
        As in :func:`profiled_round`.
    w0 : array_like, shape (C, P), optional
        Starting head; default ``G_within^{1/2}`` (``P = C``).
    tol : float
    max_rounds : int

    Returns
    -------
    FiniteStepResult

    Raises
    ------
    UFMInputError
        If the iteration diverges (``eta`` too large for the local gradient steps).
    """
    s, p, lh, lw = _check_common(sigmas, weights, lambda_h, lambda_w)
    eta, E = _check_steps(eta, E)
    tol = as_positive_scalar("tol", tol)
    max_rounds = as_int("max_rounds", max_rounds, 1)
    if w0 is None:
        W = _sqrt(_phi(np.einsum("m,mij->ij", p, s), lh, lw))
    else:
        W = as_head("w0", w0, c=s.shape[-1])
    G = sym(W @ W.T)
    residual = np.inf
    t = 0
    for t in range(1, int(max_rounds) + 1):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            try:
                G_new, Kbar = _gram_map(G, s, p, lh, lw, eta, E)
            except np.linalg.LinAlgError:
                G_new = np.full_like(G, np.nan)
            size = float(np.linalg.norm(G_new))
        if not np.isfinite(size):
            raise UFMInputError(
                f"eta: the profiled rounds diverged at round {t} (eta = {eta!r}, E = {E}); use a smaller step"
            )
        W = Kbar @ W
        residual = float(np.linalg.norm(G_new - G) / np.linalg.norm(G))
        G = G_new
        if residual < tol:
            return FiniteStepResult(G, W, t, residual, True)
    warnings.warn(
        f"finite_step_fixed_point did not converge: residual {residual:.3e} >= tol {tol:.1e} after {t} rounds "
        f"(eta = {eta!r}, E = {E})",
        ConvergenceWarning,
        stacklevel=2,
    )
    return FiniteStepResult(G, W, t, residual, False)


def _sym_basis(C: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    iu, ju = np.triu_indices(C)
    B = np.zeros((iu.size, C, C))
    B[np.arange(iu.size), iu, ju] = 1.0
    B[np.arange(iu.size), ju, iu] = 1.0
    return B, iu, ju


def gram_map_jacobian(G, sigmas, weights, lambda_h: float, lambda_w: float, eta: float, E: int) -> np.ndarray:
    """Jacobian of the Gram map of :func:`profiled_gram_map` on symmetric matrices.

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
        As in :func:`profiled_round`.

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
    """Spectral radius of :func:`gram_map_jacobian` at ``G`` (e.g. the fixed point ``G_{eta,E}``).

    docs/theory.md §9: ``1 - 2 h theta_min + O(h^2)`` at the fixed point, ``h = eta E``. Arguments as in
    :func:`gram_map_jacobian`.

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
        As in :func:`psi_value`.

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
    ``grad psi`` is the closed form of :func:`psi_gradient`.

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
