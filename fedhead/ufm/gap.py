"""Gap between federated and centralised training (docs/theory.md §7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validate import UFMInputError, as_positive_scalar
from .barycenter import _bw_barycenter
from .bw import _bw_distance
from .closed_forms import _phi, check_fully_active
from .moments import TargetMoments
from .psd import _sqrt, sym


@dataclass(frozen=True, eq=False)
class GapDecomposition:
    """``G_cen - G_star = M_mu + M_Sigma + M_A`` (docs/theory.md §7).

    Attributes
    ----------
    g_star : ndarray, shape (C, C)
        BW barycenter of the client optimal Grams (fixed point of exact selection).
    g_cen : ndarray, shape (C, C)
        ``phi(Sigma_cen)``, the centralised optimal Gram.
    g_within : ndarray, shape (C, C)
        ``phi(Sigma_within)``.
    grams : ndarray, shape (M, C, C)
        Client optimal Grams ``G_m = phi(Sigma_m)``.
    m_mu : ndarray, shape (C, C)
        Mean term ``G_cen - G_within = alpha (Sigma_cen^{1/2} - Sigma_within^{1/2})``.
    m_sigma : ndarray, shape (C, C)
        Covariance term ``G_within - sum_m p_m G_m``.
    m_a : ndarray, shape (C, C)
        Alignment term ``sum_m p_m G_m - G_star``.
    bw_variance : float
        ``sum_m p_m d_BW^2(G_star, G_m)`` (equals ``Tr M_A``).
    pairwise_dispersion : float
        ``D = sum_{m<n} p_m p_n d_BW^2(G_m, G_n)`` (``D <= Tr M_A <= 2 D``).
    barycenter_iters : int
        Fixed-point iterations used for ``g_star``.
    barycenter_converged : bool
        Whether the barycenter iteration reached its tolerance; when False ``g_star`` is the last iterate
        (a [`ConvergenceWarning`][fedhead.ufm.ConvergenceWarning] was issued) and every quantity built on
        it is approximate.
    barycenter_residual : float
        ``||G_{k+1} - G_k||_F / ||G_k||_F`` of the last barycenter step.
    """

    g_star: np.ndarray
    g_cen: np.ndarray
    g_within: np.ndarray
    grams: np.ndarray
    m_mu: np.ndarray
    m_sigma: np.ndarray
    m_a: np.ndarray
    bw_variance: float
    pairwise_dispersion: float
    barycenter_iters: int
    barycenter_converged: bool = True
    barycenter_residual: float = 0.0

    @property
    def total(self) -> np.ndarray:
        """``G_cen - G_star`` (= ``m_mu + m_sigma + m_a``), shape (C, C)."""
        return self.g_cen - self.g_star

    @property
    def rel_gap(self) -> float:
        """``||G_cen - G_star||_F / ||G_cen||_F``."""
        return float(np.linalg.norm(self.total) / np.linalg.norm(self.g_cen))

    @property
    def traces(self) -> np.ndarray:
        """``(Tr M_mu, Tr M_Sigma, Tr M_A)``, shape (3,)."""
        return np.array([np.trace(self.m_mu), np.trace(self.m_sigma), np.trace(self.m_a)])

    @property
    def trace_shares(self) -> np.ndarray:
        """Traces divided by ``Tr(G_cen - G_star)``, shape (3,).

        All zero when the gap is zero to rounding (``Tr(G_cen - G_star) <= 1e-12 Tr G_cen``).
        """
        t = self.traces
        s = t.sum()
        return t / s if s > 1e-12 * np.trace(self.g_cen) else np.zeros(3)


def gap_decomposition(
    moments: TargetMoments, lambda_h: float, lambda_w: float, *, tol: float = 1e-13, max_iter: int = 10_000
) -> GapDecomposition:
    """Three-term decomposition of the gap ``G_cen - G_star`` (docs/theory.md §7).

    Parameters
    ----------
    moments : TargetMoments
        Client moments and weights.
    lambda_h, lambda_w : float
        Penalties; the fully active regime is checked ([`NotFullyActiveError`][fedhead.ufm.NotFullyActiveError]).
    tol, max_iter
        Passed to the barycenter iteration.

    Returns
    -------
    GapDecomposition
    """
    if not isinstance(moments, TargetMoments):
        raise UFMInputError(f"moments: expected a TargetMoments, got {type(moments).__name__}")
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    check_fully_active(moments, lh, lw)
    p = np.asarray(moments.weights)
    grams = _phi(np.asarray(moments.covs), lh, lw)
    g_cen = _phi(moments.sigma_cen, lh, lw)
    g_within = _phi(moments.sigma_within, lh, lw)
    g_avg = sym(np.einsum("m,mij->ij", p, grams))
    R = np.einsum("m,mij->ij", p, _sqrt(grams))
    bary = _bw_barycenter(grams, p, sym(R @ R), float(tol), int(max_iter))
    g_star = bary.gram
    bw_var = float(p @ (_bw_distance(g_star, grams) ** 2))
    d2 = _bw_distance(grams[:, None], grams[None, :]) ** 2
    disp = float(0.5 * (p @ d2 @ p))  # sum over m < n, diagonal is zero
    return GapDecomposition(
        g_star=g_star,
        g_cen=g_cen,
        g_within=g_within,
        grams=grams,
        m_mu=g_cen - g_within,
        m_sigma=g_within - g_avg,
        m_a=g_avg - g_star,
        bw_variance=bw_var,
        pairwise_dispersion=disp,
        barycenter_iters=bary.n_iter,
        barycenter_converged=bool(bary.converged),
        barycenter_residual=float(bary.residual),
    )
