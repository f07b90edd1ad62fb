"""Per-run numbers the report's tables and figures use, read from one results.json (pure).

Every function takes the ``results.json`` content of one run (a dict) and returns a float, or
``None`` where the run does not define the number (outside the fully active regime, a round
that is missing, a key an older run did not record). Definitions (docs/theory.md §11):

* endpoint ``e_F``: the last round's error to the procedure's own reference
  (``e_f_reference``: ``G_star`` uncorrected, ``G_cen`` corrected, ``G_within`` centred);
* trajectory ``e_F``: the last round's ``trajectory_error`` (median over rounds of the error to
  the exact recursion from the run's own ``G_0``);
* ``delta_last``: the last round's selection distance ``delta``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: results["reference"] -> the round field of the error to that reference
REFERENCE_FIELD = {"star": "e_f_star", "cen": "e_f_cen", "within": "e_f_within", "corrected": "e_f_reference"}
#: results["reference"] -> the Gram key of results["targets"]
REFERENCE_GRAM = {"star": "g_star", "cen": "g_cen", "within": "g_within", "corrected": "g_corrected"}
#: mismatch keys the ``mismatch`` sweep records in its round-1 results
MISMATCH_KEYS = (
    "mismatch_objective_local",
    "mismatch_objective_trained",
    "mismatch_objective_aligned",
    "mismatch_removed",
)

Results = Mapping[str, Any]


def num(x: Any) -> float | None:
    """``x`` as a finite float, else None (JSON null, NaN, a string, a list)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def last_round(results: Results) -> Mapping[str, Any]:
    """The last recorded round (``{}`` when there is none)."""
    rounds = results.get("rounds") or []
    return rounds[-1] if rounds else {}


def round_at(results: Results, t: int) -> Mapping[str, Any]:
    """Round ``t`` (``{}`` when it was not recorded)."""
    for r in results.get("rounds") or []:
        if int(r.get("round", -1)) == t:
            return r
    return {}


def reference(results: Results) -> str:
    """The reference the procedure should reach (``star``, ``cen``, ``within``, ``corrected``)."""
    return str(results.get("reference") or "star")


def gamma(results: Results) -> float:
    """The correction strength of the run's procedure (0 when absent)."""
    return num((results.get("procedure") or {}).get("gamma")) or 0.0


def is_corrected(results: Results) -> bool:
    """True for a moment-corrected procedure (``gamma > 0``)."""
    return gamma(results) > 0


def error_to_reference(record: Mapping[str, Any], ref: str) -> float | None:
    """One round's ``e_F`` to the reference ``ref`` (``e_f_reference``, else the named field)."""
    value = num(record.get("e_f_reference"))
    return value if value is not None else num(record.get(REFERENCE_FIELD.get(ref, "e_f_reference")))


def endpoint_error(results: Results) -> float | None:
    """Endpoint ``e_F``: the last round's error to the procedure's reference."""
    return error_to_reference(last_round(results), reference(results))


def trajectory_error(results: Results) -> float | None:
    """Trajectory ``e_F``: the last round's ``trajectory_error``."""
    return num(last_round(results).get("trajectory_error"))


def delta_last(results: Results) -> float | None:
    """The last round's selection distance ``delta``."""
    return num(last_round(results).get("delta"))


def first_round(results: Results, key: str) -> float | None:
    """Round 1's value of ``key`` (``d_cen``, ``e_f_cen``, ...)."""
    return num(round_at(results, 1).get(key))


def final(results: Results, key: str) -> float | None:
    """The last round's value of ``key`` (``d_star``, ``d_cen``, ``train_mse``, ...)."""
    return num(last_round(results).get(key))


def objective_gaps(results: Results) -> list[float]:
    """The last round's per-client relative gaps of the original objective (without the proximal term)."""
    return [v for v in (num(g) for g in last_round(results).get("objective_gaps") or []) if v is not None]


def final_mse(results: Results) -> tuple[float | None, str]:
    """The last round's test MSE, or the train MSE where there is no test split: ``(value, split)``."""
    test = final(results, "test_mse")
    if test is not None:
        return test, "test"
    return final(results, "train_mse"), "train"


def mismatch(results: Results) -> dict[str, float | None]:
    """The mismatch costs of the first round that records them.

    Returns ``trained_minus_local`` (``L_trained - L_local``), ``aligned_minus_local``
    (``L_aligned - L_local``) and ``removed`` (``(L_trained - L_aligned) / (L_trained - L_local)``,
    the recorded ``mismatch_removed``, else computed), each None when not recorded.
    """
    rec = next((r for r in results.get("rounds") or [] if r.get("mismatch_objective_local") is not None), {})
    local, trained, aligned = (num(rec.get(k)) for k in MISMATCH_KEYS[:3])
    removed = num(rec.get("mismatch_removed"))
    if "mismatch_removed" not in rec and None not in (local, trained, aligned) and trained != local:
        removed = (trained - aligned) / (trained - local)
    return {
        "trained_minus_local": None if None in (trained, local) else trained - local,
        "aligned_minus_local": None if None in (aligned, local) else aligned - local,
        "removed": removed,
    }


def error_curve(results: Results) -> tuple[np.ndarray, np.ndarray]:
    """``(rounds, e_F to the reference)`` over every recorded round (NaN where undefined)."""
    ref = reference(results)
    rounds = results.get("rounds") or []
    x = np.array([int(r["round"]) for r in rounds], dtype=float)
    y = np.array([np.nan if (v := error_to_reference(r, ref)) is None else v for r in rounds])
    return x, y


def gram(results: Results, key: str) -> np.ndarray | None:
    """A target Gram of the run (``g_star``, ``g_cen``, ``g_within``, ...) or None."""
    g = (results.get("targets") or {}).get(key)
    return None if g is None else np.asarray(g, dtype=np.float64)


def final_gram(results: Results) -> np.ndarray | None:
    """The head Gram ``G_T`` after the last round."""
    g = last_round(results).get("gram")
    return None if g is None else np.asarray(g, dtype=np.float64)


def gap_traces(results: Results) -> tuple[float, float, float] | None:
    """``(Tr M_mu, Tr M_Sigma, Tr M_A)`` of the run's diagnosis (docs/theory.md §7), or None."""
    d = results.get("diagnosis") or {}
    vals = tuple(num(d.get(k)) for k in ("trace_m_mu", "trace_m_sigma", "trace_m_a"))
    return None if None in vals else vals  # type: ignore[return-value]


def measured_gap_trace(results: Results) -> float | None:
    """``Tr(G_ref - G_T)`` of the last round, ``G_ref`` the centralised reference of the run:
    ``G_within`` for a centred procedure, ``G_cen`` otherwise (the gap the run leaves)."""
    key = "g_within" if reference(results) == "within" else "g_cen"
    g_ref, g_t = gram(results, key), final_gram(results)
    return None if g_ref is None or g_t is None else float(np.trace(g_ref - g_t))


def param(results: Results | None, params: Mapping[str, Any], key: str) -> Any:
    """A swept knob: the manifest's ``params[key]``, else the run's procedure or config value."""
    if key in params:
        return params[key]
    if results is None:
        return None
    proc = results.get("procedure") or {}
    if key in proc:
        return proc[key]
    return (results.get("config") or {}).get(key)
