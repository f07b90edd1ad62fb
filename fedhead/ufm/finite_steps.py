"""Finite local training: E profiled gradient steps of size eta per round (docs/theory.md §9).

[`profiled_gram_map`][fedhead.ufm.finite_steps.profiled_gram_map] evaluates one round as a map
of Grams (why it is one: docs/theory.md §9) and
[`finite_step_fixed_point`][fedhead.ufm.finite_steps.finite_step_fixed_point] iterates it to the
fixed point ``G_{eta,E}``; the checks and the round kernel are shared with `.contraction` and
`.displacement`.
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
    as_head,
    as_int,
    as_positive_scalar,
    as_spd,
    as_weights,
)
from .closed_forms import _phi
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
    """docs/theory.md §9 expands around ``G_within = phi(Sigma_within)``.

    It needs ``lambda_min > lambda_H lambda_W``.
    """
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
    """Kernel of [`profiled_gram_map`][fedhead.ufm.profiled_gram_map]: returns ``(G', Kbar)``; accepts complex ``G``."""
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
    """Result of [`profiled_gram_map`][fedhead.ufm.profiled_gram_map].

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
    """The round of [`profiled_round`][fedhead.ufm.profiled_round] as a map of server Grams (docs/theory.md §9).

    Client m's head after ``E`` steps is ``K_m W`` with ``K_m = S_{E-1} ... S_0``,
    ``S_k = I - 2 eta Lambda_m(G_{m,k})``, ``G_{m,k+1} = S_k G_{m,k} S_k``, ``G_{m,0} = G``;
    the next Gram is ``Kbar G Kbar^T``, ``Kbar = sum_m p_m K_m``.

    Parameters
    ----------
    G : array_like, shape (C, C)
        Server Gram (symmetric PSD).
    sigmas, weights, lambda_h, lambda_w, eta, E
        As in [`profiled_round`][fedhead.ufm.profiled_round].

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
    """Result of [`finite_step_fixed_point`][fedhead.ufm.finite_step_fixed_point].

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

    Rounds ``W <- Kbar(W W^T) W`` (see [`profiled_gram_map`][fedhead.ufm.profiled_gram_map]) from ``w0``
    until ``||G_{t+1} - G_t||_F / ||G_t||_F < tol`` or ``max_rounds``; a
    [`ConvergenceWarning`][fedhead.ufm.ConvergenceWarning] is issued if ``tol`` is not reached. For ``E =
    1`` the limit is ``G_within``.

    Parameters
    ----------
    sigmas, weights, lambda_h, lambda_w, eta, E
        As in [`profiled_round`][fedhead.ufm.profiled_round].
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
