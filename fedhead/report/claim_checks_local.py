"""The checks of the paper's claims on the local problem: the proximal weight rho (Table 5) and the
local budget E.

One function per claim, named after what it tests; [`CLAIMS`][fedhead.report.paper_claims.CLAIMS]
pairs each with its claim id and states its criterion.
"""

from __future__ import annotations

from fedhead.report import measures
from fedhead.report.claims import Evidence, Missing, final_value, median, number_text, pair_wins, verdict
from fedhead.report.measures import delta_last, endpoint_error
from fedhead.report.selection_tables import rho_value


# ------------------------------------------------------------------------------ Table 5
def _runs_by_rho(ev: Evidence) -> dict[float, list]:
    out: dict[float, list] = {}
    for r in ev.of("rho"):
        if (rho := rho_value(r)) is not None:
            out.setdefault(rho, []).append(r)
    return dict(sorted(out.items()))


def best_rho_is_interior(ev: Evidence):
    """C13: the smallest median e_F and δ_last are at neither end of the ρ values run."""
    groups = _runs_by_rho(ev)
    if len(groups) < 3:
        return Missing(f"{len(groups)} values of ρ: an interior minimum needs at least 3")
    parts, ok = [], True
    for name, measure in (("e_F", endpoint_error), ("δ_last", delta_last)):
        medians = {rho: v for rho, runs in groups.items() if (v := median(runs, measure)) is not None}
        if len(medians) < 3:
            return Missing(f"{name} defined at fewer than 3 values of ρ")
        best = min(medians, key=lambda rho: medians[rho])
        ok &= best not in (min(medians), max(medians))
        rhos = ", ".join(f"{r:g}" for r in medians)
        parts.append(f"{name} lowest at ρ = {best:g} ({number_text(medians[best])}) of {rhos}")
    return verdict(ok, "; ".join(parts) + " (paper: both at ρ = 1e-3)", *groups.values())


def _rho_pair_wins(ev: Evidence, measure):
    return pair_wins(ev.of("rho"), "0.001", "0", measure, name=lambda r: f"{rho_value(r):g}")


def moderate_rho_beats_no_penalty(ev: Evidence):
    """C14: ρ = 1e-3 lowers both δ_last and e_F against ρ = 0 in every pair."""
    (delta_wins, delta_pairs, delta_runs) = _rho_pair_wins(ev, delta_last)
    (error_wins, error_pairs, error_runs) = _rho_pair_wins(ev, endpoint_error)
    if delta_pairs == 0 and error_pairs == 0:
        return Missing("no (ρ = 1e-3, ρ = 0) pair on the same setting and seed")
    return verdict(
        delta_wins == delta_pairs and error_wins == error_pairs,
        f"δ_last lower in {delta_wins}/{delta_pairs} pairs, e_F in {error_wins}/{error_pairs} (paper 30/30 both)",
        delta_runs,
        error_runs,
    )


def _median_at_rho(groups, rho, measure):
    return median(groups.get(rho, []), measure)


def tiny_rho_is_weaker(ev: Evidence):
    """C15: the median e_F at ρ = 1e-5 is above the one at ρ = 1e-3."""
    groups = _runs_by_rho(ev)
    tiny, moderate, zero = (_median_at_rho(groups, rho, endpoint_error) for rho in (1e-5, 1e-3, 0.0))
    if tiny is None or moderate is None:
        return Missing("needs ρ = 1e-5 and ρ = 1e-3")
    return verdict(
        tiny > moderate,
        f"median e_F at ρ = 1e-5 {number_text(tiny)}, at 1e-3 {number_text(moderate)}, at 0 {number_text(zero)} "
        "(paper 7.38e-3, 3.08e-4, 1.71e-2)",
        groups[1e-5],
        groups[1e-3],
    )


def _median_objective_gap(runs):
    gaps = [g for r in runs for g in measures.objective_gaps(r.counted_results)]
    return sorted(gaps)[len(gaps) // 2] if gaps else None


def large_rho_worsens_agreement(ev: Evidence):
    """C16: every ρ >= 1e-2 has a larger median objective gap and e_F than ρ = 1e-3."""
    groups = _runs_by_rho(ev)
    large = [rho for rho in groups if rho >= 1e-2]
    ref_gap, ref_error = _median_objective_gap(groups.get(1e-3, [])), _median_at_rho(groups, 1e-3, endpoint_error)
    if not large or ref_gap is None or ref_error is None:
        return Missing("needs ρ = 1e-3 and some ρ ≥ 1e-2 with objective gaps")
    ok, parts = True, []
    for rho in large:
        gap, error = _median_objective_gap(groups[rho]), median(groups[rho], endpoint_error)
        ok &= gap is not None and error is not None and gap > ref_gap and error > ref_error
        parts.append(f"ρ = {rho:g}: gap {number_text(gap)}, e_F {number_text(error)}")
    detail = (
        f"at ρ = 1e-3 gap {number_text(ref_gap)}, e_F {number_text(ref_error)}; "
        + "; ".join(parts)
        + " (paper at ρ = 1: 1.57e-1, 3.80e-1)"
    )
    return verdict(ok, detail, *(groups[r] for r in large), groups[1e-3])


def moderate_rho_keeps_objective_gap_small(ev: Evidence):
    """C17: at ρ = 1e-3 the median gap of the original objective is at most 1e-3."""
    groups = _runs_by_rho(ev)
    moderate, zero = _median_objective_gap(groups.get(1e-3, [])), _median_objective_gap(groups.get(0.0, []))
    if moderate is None:
        return Missing("no objective gaps at ρ = 1e-3")
    return verdict(
        moderate <= 1e-3,
        f"median objective gap at ρ = 1e-3 {number_text(moderate)}, at ρ = 0 {number_text(zero)} "
        "(paper 4.05e-5, 1.43e-5)",
        groups[1e-3],
    )


# ------------------------------------------------------------------------------ epochs
def _ordinary_by_budget(ev: Evidence, setting: str | None = None) -> dict[float, list]:
    """Ordinary runs of sweep ``epochs`` grouped by the paper's E (optionally of one setting)."""
    groups: dict[float, list] = {}
    for r in ev.of("epochs", procedure="ordinary"):
        epochs = measures.num(r.params.get("paper_local_epochs", r.params.get("local_epochs")))
        if epochs is not None and (setting is None or r.setting == setting):
            groups.setdefault(epochs, []).append(r)
    return dict(sorted(groups.items()))


def local_budget_depends_on_setting(ev: Evidence):
    """C19: the smallest paper budget E whose median ordinary d(G_T, G_star) is below 0.1 differs
    between settings."""
    budgets: dict[str, float | None] = {}
    used: list = []
    for setting in sorted({r.setting for r in ev.of("epochs", procedure="ordinary")}):
        groups = _ordinary_by_budget(ev, setting)
        medians = {e: v for e, runs in groups.items() if (v := median(runs, final_value("d_star"))) is not None}
        if len(medians) < 2:
            continue
        budgets[setting] = next((e for e, v in medians.items() if v < 0.1), None)
        used += [r for runs in groups.values() for r in runs]
    if len(budgets) < 2:
        return Missing("fewer than 2 settings with at least 2 local budgets E")
    largest = max(e for r in used if (e := measures.num(r.params.get("paper_local_epochs"))) is not None)
    distinct = set(budgets.values())
    text = ", ".join(f"{s}: " + (f"> {largest:g}" if b is None else f"{b:g}") for s, b in budgets.items())
    return verdict(
        len(distinct) > 1,
        f"first paper E with median d(G_T,G_star) < 0.1: {text} (paper: 400, 1000 or 2000 by setting)",
        used,
    )


def more_local_epochs_approach_g_star(ev: Evidence):
    """C18: ordinary runs' median d(G_T, G_star) decreases strictly with the local budget E."""
    groups = _ordinary_by_budget(ev)
    medians = {
        epochs: v for epochs, runs in sorted(groups.items()) if (v := median(runs, final_value("d_star"))) is not None
    }
    if len(medians) < 2:
        return Missing("fewer than 2 local budgets E with d(G_T,G_star)")
    values = list(medians.values())
    ok = all(b < a for a, b in zip(values, values[1:]))
    text = ", ".join(f"E={epochs:g}: {number_text(v)}" for epochs, v in medians.items())
    return verdict(
        ok,
        f"median d(G_T,G_star) {text} (paper 4.57e-1, 1.76e-1, 4.33e-2, 1.39e-2 at E = 50, 400, 1000, 4000)",
        *groups.values(),
    )
