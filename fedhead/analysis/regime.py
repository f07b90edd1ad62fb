"""The fully active regime policy (docs/theory.md §3): margins report and the start-of-run guard (numpy only).

The theory assumes ``lambda_min(Sigma_m) > lambda_H lambda_W`` for every client ``m`` (client target covariances in the
standardised units the run uses). [`client_margins`][fedhead.analysis.regime.client_margins] reports it;
[`ensure_fully_active`][fedhead.analysis.regime.ensure_fully_active] refuses to start a run outside that regime unless
explicitly allowed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from fedhead.ufm import NotFullyActiveError, TargetMoments, fully_active_margins

__all__ = ["MarginReport", "OutsideRegimeError", "OutsideRegimeWarning", "client_margins", "ensure_fully_active"]


class OutsideRegimeError(NotFullyActiveError):
    """A data set / partition violates the fully active regime and no override was given.

    A ``ValueError`` (through [`fedhead.ufm.NotFullyActiveError`][fedhead.ufm.NotFullyActiveError]); both the driver (on
    the data) and the server (on the exchanged moments) raise it.
    """


class OutsideRegimeWarning(UserWarning):
    """A run starts outside the fully active regime because the override allowed it."""


@dataclass(frozen=True, eq=False)
class MarginReport:
    """Per-client fully active margins.

    Attributes
    ----------
    name : str
        Data-set name.
    counts : ndarray, shape (M,)
        Training samples ``N_m``.
    min_eigs : ndarray, shape (M,)
        ``lambda_min(Sigma_m)``.
    threshold : float
        ``lambda_H lambda_W``.
    margins : ndarray, shape (M,)
        ``lambda_min(Sigma_m) - lambda_H lambda_W``.
    """

    name: str
    counts: np.ndarray
    min_eigs: np.ndarray
    threshold: float
    margins: np.ndarray
    lambda_h: float
    lambda_w: float

    @property
    def ok(self) -> bool:
        """True when every client is fully active."""
        return bool(np.all(self.margins > 0))

    @property
    def ratios(self) -> np.ndarray:
        """``lambda_min(Sigma_m) / (lambda_H lambda_W)``, shape (M,)."""
        return self.min_eigs / self.threshold

    @property
    def violating(self) -> list[int]:
        return [int(m) for m in np.flatnonzero(self.margins <= 0)]

    def table(self) -> str:
        """Plain-text table (one row per client) for command-line output."""
        lines = [
            f"fully active check for {self.name}: lambda_H * lambda_W = {self.threshold:.3e} "
            f"(lambda_H={self.lambda_h:g}, lambda_W={self.lambda_w:g})",
            f"{'client':>6} {'N_m':>7} {'lambda_min':>12} {'margin':>12} {'ratio':>10}  status",
        ]
        for m in range(self.counts.size):
            status = "ok" if self.margins[m] > 0 else "OUTSIDE REGIME"
            lines.append(
                f"{m:>6} {int(self.counts[m]):>7} {self.min_eigs[m]:>12.4e} "
                f"{self.margins[m]:>12.4e} {self.ratios[m]:>10.3g}  {status}"
            )
        return "\n".join(lines)


def _moments(data) -> TargetMoments:
    """``data`` itself, or ``data.moments()`` (a [`fedhead.data.FederatedData`][fedhead.data.FederatedData])."""
    return data if isinstance(data, TargetMoments) else data.moments()


def client_margins(data, lambda_h: float, lambda_w: float, *, name: str = "") -> MarginReport:
    """Report ``lambda_min(Sigma_m)`` against ``lambda_H lambda_W`` for every client (no raise).

    ``data`` is a [`fedhead.ufm.TargetMoments`][fedhead.ufm.TargetMoments] or anything with a ``moments()`` method
    (a [`fedhead.data.FederatedData`][fedhead.data.FederatedData]). The margins are
    [`fedhead.ufm.fully_active_margins`][fedhead.ufm.fully_active_margins].
    """
    mom = _moments(data)
    name = name or getattr(data, "name", "")
    rep = fully_active_margins(mom, lambda_h, lambda_w)
    min_eigs, thr = np.asarray(rep.min_eigs), float(rep.threshold)
    counts = np.asarray(mom.counts) if mom.counts is not None else np.full(mom.n_clients, np.nan)
    return MarginReport(
        name=name,
        counts=counts,
        min_eigs=min_eigs,
        threshold=thr,
        margins=min_eigs - thr,
        lambda_h=float(lambda_h),
        lambda_w=float(lambda_w),
    )


def ensure_fully_active(
    data,
    lambda_h: float,
    lambda_w: float,
    allow_outside_regime: bool = False,
) -> MarginReport:
    """Return the margins; refuse (raise [`OutsideRegimeError`][fedhead.analysis.regime.OutsideRegimeError]) outside the
    regime.

    With ``allow_outside_regime=True`` a violation only emits an
    [`OutsideRegimeWarning`][fedhead.analysis.regime.OutsideRegimeWarning].
    """
    rep = client_margins(data, lambda_h, lambda_w)
    if rep.ok:
        return rep
    bad = rep.violating
    worst = int(bad[int(np.argmin(rep.margins[bad]))])
    what = f"data set {rep.name}" if rep.name else "the federation"
    msg = (
        f"{what} with {rep.counts.size} clients is outside the theory's fully "
        f"active regime: {len(bad)} client(s) {bad} have lambda_min(Sigma_m) <= lambda_H * "
        f"lambda_W = {rep.threshold:.4e} (worst: client {worst}, lambda_min = "
        f"{rep.min_eigs[worst]:.4e}, margin {rep.margins[worst]:.3e}). The closed forms and "
        "targets of docs/theory.md §4-9 do not hold there."
    )
    if not allow_outside_regime:
        raise OutsideRegimeError(
            msg + " To run anyway (an experiment outside the theory) set "
            "dataset.allow_outside_regime=true; otherwise use fewer clients or smaller "
            "lambda_H, lambda_W."
        )
    warnings.warn(msg + " Continuing because dataset.allow_outside_regime=true.", OutsideRegimeWarning, stacklevel=2)
    return rep
