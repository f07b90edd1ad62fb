"""Reference Grams of a run and the per-round server measurements (theory.md §11; numpy only).

[`reference_targets`][fedhead.federation.tracking.reference_targets] collects the Grams a procedure is measured against
(``G_star``, ``G_cen``, ``G_within``, the corrected barycenter of a partial correction, the client Grams the recursion
uses); [`RoundTracker`][fedhead.federation.tracking.RoundTracker] measures every aggregated head against them and runs
the exact recursion (theory.md §6) alongside; [`fedhead.results.rounds.RoundRecord`][fedhead.results.rounds.RoundRecord]
(declared in the results layer, with results.json's schema) is one round's measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fedhead import ufm
from fedhead.analysis import metrics
from fedhead.analysis.metrics import direction_error, relative_error
from fedhead.analysis.procedure import reference_name
from fedhead.federation.aggregation import effective_covariances
from fedhead.federation.local_fit import LocalFit
from fedhead.results.rounds import RoundRecord, json_value

__all__ = ["Targets", "RoundRecord", "RoundTracker", "reference_targets", "selected_heads"]


@dataclass(frozen=True)
class Targets:
    """Reference Grams of a run, from training-target moments, weights and penalties only.

    ``client_grams`` ``(M,C,C)`` are the optimal Grams the procedure's clients fit (``phi(Sigma_m)``, or
    ``phi((1-gamma) Sigma_m + gamma Sigma_cen)`` when corrected); the exact recursion and the selection
    distance use them. ``reference`` names the endpoint the procedure should reach (``"star"``, ``"cen"``,
    ``"corrected"`` or ``"within"``, see
    [`fedhead.analysis.procedure.reference_name`][fedhead.analysis.procedure.reference_name]).
    ``g_corrected`` is the BW barycenter of the corrected ``client_grams`` for a partial correction
    ``0 < gamma < 1`` (the fixed point of exact selection there, not ``G_cen``); None otherwise.

    Outside the fully active regime (``fully_active=False``, only with the explicit
    ``dataset.allow_outside_regime=true`` override) ``phi`` is the PSD minimiser with clipped
    eigenvalues, so ``g_cen``, ``g_within``, ``grams`` and ``client_grams`` are still the
    optimal Grams of their objectives, but the barycenter theory of theory.md §5-7 does not hold:
    ``g_star`` is ``None`` and so is everything derived from it or from the recursion.
    """

    g_star: np.ndarray | None
    g_cen: np.ndarray
    g_within: np.ndarray
    grams: np.ndarray  # phi(Sigma_m), (M, C, C)
    client_grams: np.ndarray  # what the procedure's clients fit, (M, C, C)
    weights: np.ndarray  # p_m (M,)
    reference: str
    fully_active: bool = True
    g_corrected: np.ndarray | None = None
    corrected_converged: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, generated from the fields (arrays as lists)."""
        return {f.name: json_value(getattr(self, f.name)) for f in fields(self)}

    @property
    def reference_gram(self) -> np.ndarray | None:
        """The Gram named by [`reference`][fedhead.federation.tracking.Targets.reference] (``None`` when it is
        undefined)."""
        return {"star": self.g_star, "cen": self.g_cen, "within": self.g_within, "corrected": self.g_corrected}[
            self.reference
        ]


def reference_targets(
    moments: ufm.TargetMoments,
    gap: ufm.GapDecomposition | None,
    lambda_h: float,
    lambda_w: float,
    *,
    gamma: float = 0.0,
    centered: bool = False,
) -> Targets:
    """Collect the reference Grams for a procedure (correction strength ``gamma``, centring).

    ``gap`` is the [`fedhead.ufm.GapDecomposition`][fedhead.ufm.GapDecomposition] of the federation (fully active
    regime); pass ``gap=None`` outside the regime to get the partial targets described in
    [`Targets`][fedhead.federation.tracking.Targets] (``g_star=None``; ``g_cen``, ``g_within`` and the client Grams as
    the PSD minimisers ``phi`` with clipped eigenvalues). For a partial correction (``0 < gamma < 1``) the reference is
    ``"corrected"``, the barycenter of the corrected client Grams.
    """
    client_grams = ufm.optimal_gram(effective_covariances(moments, gamma), lambda_h, lambda_w)
    if gap is None:
        g_star = None
        g_cen = ufm.optimal_gram(moments.sigma_cen, lambda_h, lambda_w)
        g_within = ufm.optimal_gram(moments.sigma_within, lambda_h, lambda_w)
        grams = ufm.optimal_gram(moments.covs, lambda_h, lambda_w)
    else:
        g_star, g_cen, g_within, grams = gap.g_star, gap.g_cen, gap.g_within, gap.grams
    reference = reference_name(gamma, centered)
    g_corrected = converged = None
    if reference == "corrected" and gap is not None:
        bary = ufm.bw_barycenter(client_grams, moments.weights)
        g_corrected, converged = bary.gram, bool(bary.converged)
    return Targets(
        g_star=None if g_star is None else np.asarray(g_star, dtype=np.float64),
        g_cen=np.asarray(g_cen, dtype=np.float64),
        g_within=np.asarray(g_within, dtype=np.float64),
        grams=np.asarray(grams, dtype=np.float64),
        client_grams=np.asarray(client_grams, dtype=np.float64),
        weights=np.asarray(moments.weights, dtype=np.float64),
        reference=reference,
        fully_active=gap is not None,
        g_corrected=g_corrected,
        corrected_converged=converged,
    )


def selected_heads(broadcast: np.ndarray, client_grams: np.ndarray) -> np.ndarray:
    """``Pi_m(W_t)`` for every client, shape ``(M, C, P)`` (theory.md §5)."""
    w = np.asarray(broadcast, dtype=np.float64)
    return ufm.closest_head(w, np.asarray(client_grams, dtype=np.float64))  # one batched call for all M


class RoundTracker:
    """Accumulates the per-round server measurements of one run (pure numpy state).

    Call [`start`][fedhead.federation.tracking.RoundTracker.start] with the initial head, then
    [`record`][fedhead.federation.tracking.RoundTracker.record] after every aggregation.
    The exact recursion (theory.md §6) is run alongside from the run's own ``G_0`` (fully active
    regime only; outside it the recursion, ``G_star`` and the selection distance are ``None``).
    """

    def __init__(self, targets: Targets):
        self.targets = targets
        self.records: list[RoundRecord] = []
        self._recursion: list[np.ndarray] = []

    @property
    def theory(self) -> bool:
        """True when the theory.md §5-7 quantities (G_star, recursion, selection) are defined."""
        return self.targets.fully_active and self.targets.g_star is not None

    def _measure(self, t: int, weight: np.ndarray, bias: np.ndarray, **kw: Any) -> RoundRecord:
        tg = self.targets
        g = np.asarray(weight, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
        g = 0.5 * (g + g.T)
        ref = tg.reference_gram

        def err(fn: Callable[[Any, Any], float | np.ndarray], ref_g: np.ndarray | None) -> float | None:
            """``fn(g, ref_g)`` (a float: both are (C, C)); undefined (None) for a missing or zero reference Gram."""
            return None if ref_g is None or not np.any(ref_g) else float(fn(g, ref_g))

        rec_g = pred = traj = e_rec = None
        if self.theory:
            rec_g = self._recursion[t]
            e_rec = float(relative_error(g, rec_g))
            pred = ufm.gram_step(g, tg.client_grams, tg.weights)
            if t >= 1:
                errs = [float(relative_error(r.gram, self._recursion[r.round])) for r in self.records[1:]]
                errs.append(e_rec)
                traj = float(np.median(errs))
        return RoundRecord(
            round=t,
            gram=g,
            bias=np.asarray(bias, dtype=np.float64),
            e_f_star=err(relative_error, tg.g_star),
            e_f_cen=err(relative_error, tg.g_cen),
            e_f_within=err(relative_error, tg.g_within),
            d_star=err(direction_error, tg.g_star),
            d_cen=err(direction_error, tg.g_cen),
            d_within=err(direction_error, tg.g_within),
            e_f_reference=err(relative_error, ref),
            recursion_gram=rec_g,
            e_f_recursion=e_rec,
            trajectory_error=traj,
            predicted_gram=pred,
            **kw,
        )

    def start(self, weight: np.ndarray, bias: np.ndarray) -> RoundRecord:
        """Record round 0 (the initial broadcast head)."""
        g0 = np.asarray(weight, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
        self._recursion = [0.5 * (g0 + g0.T)]
        self.records = []
        rec = self._measure(0, weight, bias)
        self.records.append(rec)
        return rec

    @property
    def recursion(self) -> np.ndarray | None:
        """The exact recursion so far, ``(t + 1, C, C)`` (None outside the regime)."""
        return np.stack(self._recursion) if self.theory and self._recursion else None

    def restore(self, records: Sequence[RoundRecord], recursion: np.ndarray | None) -> None:
        """Continue from checkpointed ``records`` (rounds 0..t) and the recursion beside them."""
        if not records or [r.round for r in records] != list(range(len(records))):
            raise ValueError(f"restored records must be rounds 0..t, got {[r.round for r in records]}")
        self.records = list(records)
        self._recursion = [] if recursion is None else [np.asarray(g, dtype=np.float64) for g in recursion]
        if self.theory and len(self._recursion) < 1:
            raise ValueError("restoring a run in the fully active regime needs its recursion")

    def record(
        self,
        t: int,
        weight: np.ndarray,
        bias: np.ndarray,
        *,
        broadcast: np.ndarray,
        client_heads: np.ndarray,
        fit: LocalFit | None = None,
        client_metrics: Sequence[Mapping[str, float]] | None = None,
        extra: Mapping[str, float] | None = None,
        present: Sequence[int] | None = None,
        dropped: Sequence[Mapping[str, Any]] | None = None,
    ) -> RoundRecord:
        """Measure round ``t`` (>= 1): aggregated head, the broadcast it came from, client heads.

        ``present``: the clients (indices into the targets) the heads come from when the failure
        policy dropped some (``delta`` then uses their Grams with renormalised weights);
        ``dropped``: the dropped clients, recorded with the round."""
        if not self.records:
            raise RuntimeError("RoundTracker.start must be called with the initial head first")
        if t != self.records[-1].round + 1:
            raise ValueError(f"round {t} recorded after round {self.records[-1].round}")
        tg = self.targets
        delta = None
        if self.theory:
            while len(self._recursion) <= t:
                self._recursion.append(ufm.gram_step(self._recursion[-1], tg.client_grams, tg.weights))
            grams, weights = tg.client_grams, tg.weights
            if present is not None and len(present) != len(weights):
                idx = np.asarray(present, dtype=int)
                grams, weights = np.asarray(grams)[idx], np.asarray(weights)[idx] / np.sum(np.asarray(weights)[idx])
            delta = metrics.selection_distance(client_heads, selected_heads(broadcast, grams), weights)
        rec = self._measure(
            t,
            weight,
            bias,
            delta=delta,
            objective_gaps=None if fit is None else list(fit.objective_gaps),
            trained_gaps=None if fit is None else list(fit.trained_gaps),
            local_epochs=None if fit is None else list(fit.local_epochs),
            max_trained_gap=None if fit is None else float(fit.max_trained_gap),
            client_metrics=[dict(m) for m in (client_metrics or [])],
            extra=dict(extra or {}),
        )
        rec.dropped = [dict(d) for d in (dropped or [])]
        self.records.append(rec)
        return rec

    def set_mse(self, t: int, train_mse: float | None, test_mse: float | None) -> RoundRecord:
        """Attach the evaluated MSEs (shared head + each client's own backbone) to round ``t``."""
        rec = self.records[t]
        if rec.round != t:
            raise RuntimeError(f"record index {t} holds round {rec.round}")
        rec.train_mse = None if train_mse is None else float(train_mse)
        rec.test_mse = None if test_mse is None else float(test_mse)
        return rec
