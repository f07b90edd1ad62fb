"""Diagnosis of a federation before training, from the exchanged moments alone (numpy only).

[`diagnose`][fedhead.analysis.diagnosis.diagnose] turns [`fedhead.ufm.TargetMoments`][fedhead.ufm.TargetMoments] into a
[`Diagnosis`][fedhead.analysis.diagnosis.Diagnosis]: the fully active margins (theory.md §3), the gap ``G_cen - G_star``
and its three-term decomposition (theory.md §7), whether the barycenter ``G_star`` converged, and a one-line
recommendation that says what each remedy does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from fedhead import ufm


def _key(name: str) -> dict[str, str]:
    """Field metadata: the key of the field in [`Diagnosis.to_dict`][fedhead.analysis.diagnosis.Diagnosis.to_dict]
    (results.json)."""
    return {"key": name}


@dataclass(frozen=True)
class Diagnosis:
    """What the theory predicts for a federation, from the exchanged statistics alone.

    A new field is one declaration: [`to_dict`][fedhead.analysis.diagnosis.Diagnosis.to_dict] is generated
    from the fields (the JSON key is the field name unless its metadata names another; NaN floats become
    ``None``).

    Attributes
    ----------
    margins : ndarray (M,)
        ``lambda_min(Sigma_m) - lambda_H lambda_W``; positive means fully active (theory.md §3).
    threshold : float
        ``lambda_H lambda_W``.
    fully_active : bool
    rel_gap : float
        ``||G_cen - G_star||_F / ||G_cen||_F``.
    gap_trace : float
        ``Tr(G_cen - G_star) = Tr M_mu + Tr M_Sigma + Tr M_A`` (theory.md §7).
    trace_mu, trace_sigma, trace_a : float
        ``Tr M_mu``, ``Tr M_Sigma``, ``Tr M_A``.
    share_mu, share_sigma, share_a : float
        ``Tr M_x / Tr(G_cen - G_star)`` (0 when the gap vanishes).
    bw_variance : float
        ``sum_m p_m d_BW^2(G_star, G_m) = Tr M_A``.
    recommendation : str
        One line drawn from the numbers above.
    barycenter_converged : bool or None
        Whether the fixed-point iteration for ``G_star`` reached its tolerance (None outside the
        fully active regime, where ``G_star`` is not computed). When False every quantity built
        on ``G_star`` is approximate; the recommendation, the log and results.json say so.
    barycenter_residual : float
        Relative step of the last barycenter iteration (NaN outside the regime).
    barycenter_iters : int
        Barycenter iterations used (0 outside the regime).
    outlier_scores : ndarray (M,) or None
        How far each site's covariance lies from the others' (BW distance) relative to the
        federation's spread
        ([`fedhead.analysis.consistency.outlier_scores`][fedhead.analysis.consistency.outlier_scores];
        None with fewer than three sites or before the server computed them).
    flags : tuple of str
        One line per site whose replies disagree with what the theory says an honest site sends
        (``trust.flag_outlier``); a flag names the site and the figure, it does not drop it.
    absent : str or None
        Why the per-site quantities are absent (``privacy.mode=secure``: the server holds only sums;
        [`pooled_diagnosis`][fedhead.analysis.diagnosis.pooled_diagnosis]); None when they are computed.
    """

    margins: np.ndarray
    threshold: float
    fully_active: bool
    rel_gap: float
    gap_trace: float
    trace_mu: float = field(metadata=_key("trace_m_mu"))
    trace_sigma: float = field(metadata=_key("trace_m_sigma"))
    trace_a: float = field(metadata=_key("trace_m_a"))
    share_mu: float = field(metadata=_key("share_m_mu"))
    share_sigma: float = field(metadata=_key("share_m_sigma"))
    share_a: float = field(metadata=_key("share_m_a"))
    bw_variance: float
    recommendation: str
    barycenter_converged: bool | None = None
    barycenter_residual: float = float("nan")
    barycenter_iters: int = 0
    outlier_scores: np.ndarray | None = None
    flags: tuple[str, ...] = ()
    absent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (undefined, i.e. NaN, quantities become ``None``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                v = v.tolist()
            elif isinstance(v, float):
                v = v if np.isfinite(v) else None
            elif isinstance(v, tuple):
                v = list(v)
            out[f.metadata.get("key", f.name)] = v
        return out

    def format(self) -> str:
        """A few human-readable lines (console, log, TensorBoard text)."""
        if self.absent is not None:
            return "\n".join(
                [
                    f"fully active: {self.fully_active} ({self.recommendation})",
                    f"per-site diagnosis absent: {self.absent}",
                    *(f"FLAG: {flag}" for flag in self.flags),
                ]
            )
        margins = ", ".join(f"{m:.4g}" for m in self.margins)
        lines = [
            f"fully active margins lambda_min(Sigma_m) - lH*lW (threshold {self.threshold:.3g}): [{margins}]",
            f"relative gap ||G_cen - G_star||_F / ||G_cen||_F = {self.rel_gap:.4g}",
            f"Tr(G_cen - G_star) = {self.gap_trace:.4g}: mean term M_mu {100 * self.share_mu:.1f}%, "
            f"covariance term M_Sigma {100 * self.share_sigma:.1f}%, "
            f"alignment term M_A {100 * self.share_a:.1f}%",
            f"BW variance sum p_m d_BW^2(G_star, G_m) = {self.bw_variance:.4g}",
        ]
        if self.barycenter_converged is False:
            lines.append(
                f"WARNING: the barycenter G_star did not converge (residual {self.barycenter_residual:.3g} "
                f"after {self.barycenter_iters} iterations); G_star and the gap terms are approximate"
            )
        lines.extend(f"FLAG: {flag}" for flag in self.flags)
        lines.append(f"recommendation: {self.recommendation}")
        return "\n".join(lines)


def pooled_diagnosis(threshold: float, fully_active: bool, passing: int, sites: int, reason: str) -> Diagnosis:
    """The diagnosis of a server that holds only sums (``privacy.mode=secure``): the regime as the sites
    report it of themselves (``passing`` of ``sites`` have a positive margin), every per-site quantity
    absent (``margins`` empty, the gap terms NaN) for ``reason``."""
    note = f"{passing} of {sites} sites report a positive margin of their own"
    return _without_gap(np.zeros(0), float(threshold), bool(fully_active), note, absent=reason)


def _without_gap(
    margins: np.ndarray, threshold: float, fully_active: bool, recommendation: str, absent: str | None = None
) -> Diagnosis:
    """A diagnosis whose gap quantities are undefined (NaN): outside the regime, or per-site values absent."""
    nan = float("nan")
    return Diagnosis(
        margins=margins,
        threshold=threshold,
        fully_active=fully_active,
        rel_gap=nan,
        gap_trace=nan,
        trace_mu=nan,
        trace_sigma=nan,
        trace_a=nan,
        share_mu=nan,
        share_sigma=nan,
        share_a=nan,
        bw_variance=nan,
        recommendation=recommendation,
        absent=absent,
    )


def recommend(
    fully_active: bool,
    margins: np.ndarray,
    rel_gap: float,
    shares: tuple[float, float, float],
    *,
    small_gap: float = 1e-2,
) -> str:
    """One-line advice from the margins, the relative gap and the three trace shares.

    The remedies do different things: the moment correction (``gamma = 1``) makes every client fit
    ``Sigma_cen``, so the federation's fixed point becomes ``G_cen``; client-wise centring removes
    the mean term by changing the centralised reference to ``G_within`` (it does not move
    ``G_star`` toward ``G_cen``).
    """
    if not fully_active:
        worst = int(np.argmin(margins))
        return (
            f"client {worst} is outside the fully active regime (margin {margins[worst]:.3g}): "
            "the closed forms do not hold; lower lambda_h * lambda_w or rescale its targets"
        )
    if rel_gap < small_gap:
        return (
            f"the federation is nearly homogeneous (relative gap {rel_gap:.2g}): proximal head "
            "averaging already ends close to centralised training"
        )
    s_mu, s_sig, s_a = shares
    top = int(np.argmax(shares))
    correction = (
        "the moment correction (corrected_proximal) makes every client fit Sigma_cen, so the fixed point becomes G_cen"
    )
    if top == 0:
        return (
            f"the mean term dominates ({100 * s_mu:.0f}% of the gap): {correction}; client-wise "
            "centring instead changes the centralised reference to G_within (it removes the mean "
            "term from the target, it does not move G_star toward G_cen)"
        )
    if top == 1:
        return (
            f"the covariance term dominates ({100 * s_sig:.0f}% of the gap): {correction}; "
            "client-wise centring only changes the reference to G_within and keeps this term"
        )
    return (
        f"the alignment term dominates ({100 * s_a:.0f}% of the gap, client optima differ by "
        f"rotation): only {correction}; client-wise centring only changes the reference to G_within"
    )


def _not_converged_note(gap: ufm.GapDecomposition) -> str:
    return (
        f"the barycenter G_star did not converge (residual {gap.barycenter_residual:.3g} after "
        f"{gap.barycenter_iters} iterations): G_star and the gap terms are approximate; "
    )


def diagnose(
    moments: ufm.TargetMoments, lambda_h: float, lambda_w: float, *, warn_outside_regime: bool = True
) -> tuple[Diagnosis, ufm.GapDecomposition | None]:
    """Diagnose a federation before training from its moments alone.

    Returns the [`Diagnosis`][fedhead.analysis.diagnosis.Diagnosis] and the
    [`fedhead.ufm.GapDecomposition`][fedhead.ufm.GapDecomposition] it came from
    (``g_star, g_cen, g_within, grams, m_mu, m_sigma, m_a, ...``; theory.md §7). Outside the fully active regime the
    closed forms do not hold: the margins and the recommendation are still reported (with a ``UserWarning`` unless
    ``warn_outside_regime=False``, for a caller that reports the regime itself), the gap quantities are NaN and the
    decomposition is None. A barycenter that did not converge keeps its
    [`fedhead.ufm.ConvergenceWarning`][fedhead.ufm.ConvergenceWarning] and is flagged in the diagnosis
    (``barycenter_converged=False``, format and recommendation).
    """
    report = ufm.fully_active_margins(moments, lambda_h, lambda_w)
    margins = np.asarray(report.margins)
    threshold = float(report.threshold)
    fully_active = bool(np.all(margins > 0))
    nan = float("nan")
    if not fully_active:
        if warn_outside_regime:
            warnings.warn(
                f"clients {np.flatnonzero(margins <= 0).tolist()} violate the fully active condition "
                f"lambda_min(Sigma_m) > lambda_H lambda_W = {threshold:.3g} (margins {margins.tolist()})",
                stacklevel=2,
            )
        return _without_gap(margins, threshold, False, recommend(False, margins, nan, (nan, nan, nan))), None
    gap = ufm.gap_decomposition(moments, lambda_h, lambda_w)
    rel_gap = float(gap.rel_gap)
    t_mu, t_sig, t_a = (float(t) for t in gap.traces)
    share_mu, share_sigma, share_a = (float(s) for s in gap.trace_shares)
    shares = (share_mu, share_sigma, share_a)
    advice = recommend(True, margins, rel_gap, shares)
    if not gap.barycenter_converged:
        advice = _not_converged_note(gap) + advice
    diag = Diagnosis(
        margins=margins,
        threshold=threshold,
        fully_active=True,
        rel_gap=rel_gap,
        gap_trace=t_mu + t_sig + t_a,
        trace_mu=t_mu,
        trace_sigma=t_sig,
        trace_a=t_a,
        share_mu=share_mu,
        share_sigma=share_sigma,
        share_a=share_a,
        bw_variance=float(gap.bw_variance),
        recommendation=advice,
        barycenter_converged=bool(gap.barycenter_converged),
        barycenter_residual=float(gap.barycenter_residual),
        barycenter_iters=int(gap.barycenter_iters),
    )
    return diag, gap
