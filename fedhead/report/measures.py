"""Per-run numbers the report's tables and figures use, read from one run's typed results (pure).

Every function takes the results of one counted run and returns a float, or ``None`` where the
run does not define the number (outside the fully active regime, a missing round). The
definitions of the errors are in docs/theory.md §11.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedhead.analysis.mismatch_cost import MISMATCH_ALIGNED, MISMATCH_LOCAL, MISMATCH_REMOVED, MISMATCH_TRAINED
from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import Results

#: Results.reference -> the round's error to that reference
REFERENCE_ERROR: dict[str, Callable[[RoundRecord], float | None]] = {
    "star": lambda r: r.e_f_star,
    "cen": lambda r: r.e_f_cen,
    "within": lambda r: r.e_f_within,
    "corrected": lambda r: r.e_f_reference,
}


def num(x: Any) -> float | None:
    """``x`` as a finite float, else None (JSON null, NaN, a string, a list)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def last_round(results: Results) -> RoundRecord:
    """The last recorded round (a counted run has at least one)."""
    return results.rounds[-1]


def reference(results: Results) -> str:
    """The reference the procedure should reach (``star``, ``cen``, ``within``, ``corrected``)."""
    return results.reference


def is_corrected(results: Results) -> bool:
    """True for a moment-corrected procedure (``gamma > 0``)."""
    return results.gamma > 0


def error_to_reference(record: RoundRecord, ref: str) -> float | None:
    """One round's ``e_F`` to the reference ``ref`` (``e_f_reference``, else the named error)."""
    value = num(record.e_f_reference)
    return value if value is not None else num(REFERENCE_ERROR[ref](record))


def endpoint_error(results: Results) -> float | None:
    """Endpoint ``e_F``: the last round's error to the procedure's reference.

    The reference is ``e_f_reference`` where recorded: ``G_star`` uncorrected, ``G_cen``
    corrected, ``G_within`` centred."""
    return error_to_reference(last_round(results), reference(results))


def trajectory_error(results: Results) -> float | None:
    """Trajectory ``e_F``: the last round's ``trajectory_error``.

    That is the median over rounds of the error to the exact recursion from the run's own ``G_0``."""
    return num(last_round(results).trajectory_error)


def delta_last(results: Results) -> float | None:
    """The last round's selection distance ``delta``."""
    return num(last_round(results).delta)


def local_steps_ratio(results: Results) -> float | None:
    """The run's median over clients of fixed-recipe steps (E × T) / steps used (``local_steps``).

    The fixed recipe's optimiser steps are E epochs in each of T rounds; None for results written
    before the ratio was recorded."""
    ls = getattr(results, "local_steps", None)
    return num(ls.median_ratio) if ls else None


def first_round(results: Results, value: Callable[[RoundRecord], Any]) -> float | None:
    """``value`` of round 1 (``lambda r: r.d_cen``, ...); None when round 1 was not recorded."""
    rec = results.round_at(1)
    return None if rec is None else num(value(rec))


def final(results: Results, value: Callable[[RoundRecord], Any]) -> float | None:
    """``value`` of the last round (``lambda r: r.d_star``, ``lambda r: r.train_mse``, ...)."""
    return num(value(last_round(results)))


def objective_gaps(results: Results) -> list[float]:
    """The last round's per-client relative gaps of the original objective (without the proximal term)."""
    return [v for v in (num(g) for g in last_round(results).objective_gaps or []) if v is not None]


def final_mse(results: Results) -> tuple[float | None, str]:
    """The last round's test MSE, or the train MSE where there is no test split: ``(value, split)``."""
    test = final(results, lambda r: r.test_mse)
    if test is not None:
        return test, "test"
    return final(results, lambda r: r.train_mse), "train"


def mismatch(results: Results) -> dict[str, float | None]:
    """The mismatch costs of the first round that records them (``RoundRecord.extra``).

    Returns ``trained_minus_local`` (``L_trained - L_local``), ``aligned_minus_local``
    (``L_aligned - L_local``) and ``removed`` (``(L_trained - L_aligned) / (L_trained - L_local)``,
    the recorded ``mismatch_removed``, else computed), each None when not recorded.
    """
    extra = next((r.extra for r in results.rounds if r.extra.get(MISMATCH_LOCAL) is not None), {})
    local, trained, aligned = (num(extra.get(k)) for k in (MISMATCH_LOCAL, MISMATCH_TRAINED, MISMATCH_ALIGNED))
    removed = num(extra.get(MISMATCH_REMOVED))
    trained_minus_local = None if trained is None or local is None else trained - local
    aligned_minus_local = None if aligned is None or local is None else aligned - local
    recorded = MISMATCH_REMOVED in extra
    if not recorded and trained is not None and aligned is not None and local is not None and trained != local:
        removed = (trained - aligned) / (trained - local)
    return {
        "trained_minus_local": trained_minus_local,
        "aligned_minus_local": aligned_minus_local,
        "removed": removed,
    }


def error_curve(results: Results) -> tuple[np.ndarray, np.ndarray]:
    """``(rounds, e_F to the reference)`` over every recorded round (NaN where undefined)."""
    ref = reference(results)
    x = np.array([r.round for r in results.rounds], dtype=float)
    y = np.array([np.nan if (v := error_to_reference(r, ref)) is None else v for r in results.rounds])
    return x, y


def final_gram(results: Results) -> np.ndarray | None:
    """The head Gram ``G_T`` after the last round."""
    g = last_round(results).gram
    return None if g is None else np.asarray(g, dtype=np.float64)


def gap_traces(results: Results) -> tuple[float, float, float] | None:
    """``(Tr M_mu, Tr M_Sigma, Tr M_A)`` of the run's diagnosis (docs/theory.md §7), or None."""
    d = results.diagnosis or {}
    t_mu, t_sigma, t_a = (num(d.get(k)) for k in ("trace_m_mu", "trace_m_sigma", "trace_m_a"))
    return None if t_mu is None or t_sigma is None or t_a is None else (t_mu, t_sigma, t_a)


def measured_gap_trace(results: Results) -> float | None:
    """``Tr(G_ref - G_T)`` of the last round, ``G_ref`` the centralised reference of the run:
    ``G_within`` for a centred procedure, ``G_cen`` otherwise (the gap the run leaves)."""
    g_ref = results.target("g_within" if reference(results) == "within" else "g_cen")
    g_t = final_gram(results)
    return None if g_ref is None or g_t is None else float(np.trace(g_ref - g_t))


def param(results: Results, params: Mapping[str, Any], key: str) -> Any:
    """A swept knob: the manifest's ``params[key]``, else the run's procedure or config value."""
    if key in params:
        return params[key]
    if key in results.procedure:
        return results.procedure[key]
    return results.config.get(key)
