"""The checks of the paper's claims on Table 4, MPIIGaze and centring.

One function per claim, named after what it tests; [`CLAIMS`][fedhead.report.paper_claims.CLAIMS]
pairs each with its claim id and states its criterion. The checks of Table 5 and the local budget
are in [`fedhead.report.claim_checks_local`][fedhead.report.claim_checks_local], those of Tables 6-9
in [`fedhead.report.claim_checks_scope`][fedhead.report.claim_checks_scope].
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
