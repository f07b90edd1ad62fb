"""The checks of the paper's claims on Table 4, MPIIGaze, centring, Table 5 and the local budget.

One function per claim, named after what it tests; [`CLAIMS`][fedhead.report.paper_claims.CLAIMS]
pairs each with its claim id and states its criterion. The checks of Tables 6-9 are in
`fedhead.report.claim_checks_scope`.
"""

from __future__ import annotations

from fedhead.report import measures
from fedhead.report.claims import (
    Evidence,
    Missing,
    closer,
    every,
    final_value,
    median,
    need,
    number_text,
    pair_wins,
    round1_value,
    verdict,
)
from fedhead.report.measures import delta_last, endpoint_error, trajectory_error
from fedhead.report.selection_tables import rho_value


def _uncorrected(runs):
    return [r for r in runs if not measures.is_corrected(r.counted_results)]


def _corrected(runs):
    return [r for r in runs if measures.is_corrected(r.counted_results)]


# ------------------------------------------------------------------------------ Table 4
def uncorrected_proximal_ends_at_g_star(ev: Evidence):
    """C1: every uncorrected proximal run ends closer (e_F) to G_star than to G_cen."""
    runs = _uncorrected(ev.of(procedure="proximal"))
    if miss := need(("uncorrected proximal", runs)):
        return miss
    closer_runs, defined = every(runs, closer("e_f_star", "e_f_cen"))
    detail = (
        f"{closer_runs}/{defined} runs with e_F(G_T,G_star) < e_F(G_T,G_cen); medians "
        f"{number_text(median(runs, final_value('e_f_star')))} "
        f"vs {number_text(median(runs, final_value('e_f_cen')))} (paper Table 9: 1.54e-4 vs 4.96e-1)"
    )
    return verdict(defined > 0 and closer_runs == defined, detail, runs)


def proximal_lowers_endpoint_error(ev: Evidence):
    """C2: proximal's endpoint e_F is below ordinary's in every pair."""
    wins, pairs, runs = pair_wins(ev.of("main"), "proximal", "ordinary", endpoint_error)
    if pairs == 0:
        return Missing("no (proximal, ordinary) pair on the same setting and seed")
    prox, ordi = ev.of("main", procedure="proximal"), ev.of("main", procedure="ordinary")
    detail = (
        f"lower in {wins}/{pairs} pairs; medians {number_text(median(prox, endpoint_error))} "
        f"vs {number_text(median(ordi, endpoint_error))} (paper 50/50, 2.90e-4 vs 1.63e-2)"
    )
    return verdict(wins == pairs, detail, runs)


def ordinary_ends_near_g_star(ev: Evidence):
    """C3: ordinary training ends near G_star too, with a larger endpoint e_F than proximal."""
    ordi, prox = ev.of("main", procedure="ordinary"), ev.of("main", procedure="proximal")
    if miss := need(("ordinary", ordi), ("proximal", prox)):
        return miss
    ordinary_error, proximal_error = median(ordi, endpoint_error), median(prox, endpoint_error)
    if ordinary_error is None or proximal_error is None:
        return Missing("no endpoint e_F")
    detail = (
        f"ordinary median e_F {number_text(ordinary_error)}, proximal {number_text(proximal_error)} "
        "(paper 1.63e-2 vs 2.90e-4)"
    )
    return verdict(ordinary_error <= 0.1 and ordinary_error > proximal_error, detail, ordi, prox)


def proximal_follows_gram_recursion(ev: Evidence):
    """C4: proximal trajectories follow the exact Gram recursion (trajectory e_F <= 1e-3)."""
    prox, ordi = ev.of("main", procedure="proximal"), ev.of("main", procedure="ordinary")
    proximal_error = median(prox, trajectory_error)
    if proximal_error is None:
        return Missing("no proximal trajectory e_F")
    ordinary_error = median(ordi, trajectory_error)
    ok = proximal_error <= 1e-3 and (ordinary_error is None or proximal_error < ordinary_error)
    detail = (
        f"proximal median trajectory e_F {number_text(proximal_error)}, ordinary {number_text(ordinary_error)} "
        "(paper 3.39e-4 vs 3.44e-2)"
    )
    return verdict(ok, detail, prox, ordi)


def proximal_keeps_heads_near_selection(ev: Evidence):
    """C5: proximal's median δ_last (uploaded vs selected heads) is at most a tenth of ordinary's."""
    prox, ordi = ev.of("main", procedure="proximal"), ev.of("main", procedure="ordinary")
    proximal_delta, ordinary_delta = median(prox, delta_last), median(ordi, delta_last)
    if proximal_delta is None or ordinary_delta is None:
        return Missing("no proximal and ordinary δ_last")
    ratio = proximal_delta / ordinary_delta if ordinary_delta else None
    return verdict(
        proximal_delta <= 0.1 * ordinary_delta,
        f"median δ_last {number_text(proximal_delta)} vs {number_text(ordinary_delta)}, ratio {number_text(ratio)} "
        "(paper 4.47e-3 vs 1.85e-1)",
        prox,
        ordi,
    )


def ordinary_points_to_g_star(ev: Evidence):
    """C6: every ordinary run (main and residual CNN) is closer in direction to G_star than to G_cen."""
    runs = ev.of("main", procedure="ordinary") + [
        r for r in ev.of("architectures", procedure="ordinary") if r.model == "rescnn"
    ]
    if miss := need(("ordinary", runs)):
        return miss
    closer_runs, defined = every(runs, closer("d_star", "d_cen"))
    return verdict(
        defined > 0 and closer_runs == defined,
        f"{closer_runs}/{defined} ordinary runs with d(G_T,G_star) < d(G_T,G_cen) (paper 65/65)",
        runs,
    )


def correction_points_to_g_cen(ev: Evidence):
    """C7: corrected runs point to G_cen; corrected proximal ends nearer it than corrected ordinary."""
    runs = _corrected(ev.of("main"))
    if miss := need(("corrected", runs)):
        return miss
    closer_runs, defined = every(runs, closer("d_cen", "d_star"))
    cp, co = ev.of("main", procedure="corrected_proximal"), ev.of("main", procedure="corrected")
    proximal_error, ordinary_error = median(cp, endpoint_error), median(co, endpoint_error)
    ok = (
        defined > 0
        and closer_runs == defined
        and (proximal_error is None or ordinary_error is None or proximal_error < ordinary_error)
    )
    detail = (
        f"{closer_runs}/{defined} corrected runs closer in direction to G_cen; median e_F(G_T,G_cen) corrected "
        f"proximal {number_text(proximal_error)}, corrected ordinary {number_text(ordinary_error)} "
        "(paper 7.08e-5 vs 5.06e-3)"
    )
    return verdict(ok, detail, runs)


def corrected_proximal_reaches_g_cen_in_round_one(ev: Evidence):
    """C8: corrected proximal is near G_cen after round 1 (e_F <= 0.1) and keeps improving."""
    cp, co = ev.of("main", procedure="corrected_proximal"), ev.of("main", procedure="corrected")
    round1_error = round1_value("e_f_cen")
    first = median(cp, round1_error)
    if first is None:
        return Missing("no corrected proximal run with round 1")
    if all(measures.last_round(r.counted_results).round <= 1 for r in cp):
        return Missing("corrected proximal runs have one round only: no improvement after round 1 to measure")

    def improved(res):
        start, end = round1_error(res), endpoint_error(res)
        return None if start is None or end is None else end < start

    improved_runs, defined = every(cp, improved)
    baseline = median(co, round1_error)
    ok = first <= 0.1 and improved_runs == defined and (baseline is None or first < baseline)
    detail = (
        f"round-1 median e_F(G_1,G_cen) {number_text(first)} (corrected ordinary {number_text(baseline)}; "
        f"paper 2.29e-2 vs 3.08e-1); final below round 1 in {improved_runs}/{defined} runs, final median "
        f"{number_text(median(cp, endpoint_error))} (paper 7.08e-5)"
    )
    return verdict(ok, detail, cp, co)


def mpiigaze_shows_both_endpoints(ev: Evidence):
    """C9: on MPIIGaze, uncorrected runs end nearer (e_F) G_star, corrected ones nearer G_cen, and
    proximal's endpoint is below ordinary's in every seed."""
    runs = [r for r in ev.of("main") if r.dataset == "mpiigaze"]
    if not runs:
        return Missing(
            "no MPIIGaze run: a file-only data set (fedhead-sweep ... data_roots.mpiigaze=<folder of the "
            "MPIIGaze files>)"
        )
    plain, corrected = _uncorrected(runs), _corrected(runs)
    to_star, n_plain = every(plain, closer("e_f_star", "e_f_cen"))
    to_cen, n_corrected = every(corrected, closer("e_f_cen", "e_f_star"))
    wins, pairs, paired_runs = pair_wins(runs, "proximal", "ordinary", endpoint_error)
    if n_plain + n_corrected == 0:
        return Missing("no MPIIGaze run with e_F to G_star and G_cen")
    ok = to_star == n_plain and to_cen == n_corrected and pairs > 0 and wins == pairs
    return verdict(
        ok,
        f"{to_star}/{n_plain} uncorrected runs nearer G_star, {to_cen}/{n_corrected} corrected nearer G_cen; "
        f"proximal endpoint below ordinary's in {wins}/{pairs} seeds (paper Figure 4)",
        runs,
        paired_runs,
    )


def corrected_proximal_ends_at_g_cen(ev: Evidence):
    """C10: every corrected proximal run ends closer (e_F) to G_cen than to G_star."""
    runs = ev.of("prediction", "main", procedure="corrected_proximal")
    if miss := need(("corrected proximal", runs)):
        return miss
    closer_runs, defined = every(runs, closer("e_f_cen", "e_f_star"))
    detail = (
        f"{closer_runs}/{defined} runs with e_F(G_T,G_cen) < e_F(G_T,G_star); medians "
        f"{number_text(median(runs, final_value('e_f_cen')))} "
        f"vs {number_text(median(runs, final_value('e_f_star')))} (paper 7.03e-5 vs 6.23e-1)"
    )
    return verdict(defined > 0 and closer_runs == defined, detail, runs)


# ------------------------------------------------------------------------------ centring
def centering_leaves_positive_gap(ev: Evidence):
    """C11: after client-wise centring, G_within − G_T is positive definite in every run."""
    import numpy as np

    runs = ev.of("centering", procedure="centered")
    if miss := need(("centered", runs)):
        return miss

    def gap_is_positive_definite(res):
        g, gw = measures.final_gram(res), res.target("g_within")
        return None if g is None or gw is None else bool(np.linalg.eigvalsh(gw - g).min() > 0)

    positive, defined = every(runs, gap_is_positive_definite)
    if defined == 0:
        return Missing("no final Gram or G_within")
    ratios = []
    for r in runs:
        gap, traces = measures.measured_gap_trace(r.counted_results), measures.gap_traces(r.counted_results)
        if gap is not None and traces is not None and traces[1] + traces[2] > 0:
            ratios.append(gap / (traces[1] + traces[2]))
    ratio = sorted(ratios)[len(ratios) // 2] if ratios else None
    return verdict(
        positive == defined,
        f"G_within − G_T positive definite in {positive}/{defined} runs; gap / Tr(M_Σ+M_A) about "
        f"{number_text(ratio)} (paper 30/30, 1.19)",
        runs,
    )


def centered_training_points_to_g_star(ev: Evidence):
    """C12: after centring, the median direction error d(G_T, G_star) is below 0.05."""
    runs = ev.of("centering", procedure="centered")
    direction_error = median(runs, final_value("d_star"))
    if direction_error is None:
        return Missing("no centred run with d(G_T,G_star)")
    return verdict(direction_error < 0.05, f"median d(G_T,G_star) {number_text(direction_error)} (paper 9.48e-3)", runs)


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
