"""The checks of the paper's claims on Tables 6-9 and the fully active condition.

Alignment, the mismatch cost, architectures and data size, full-model averaging and prediction:
one function per claim, named after what it tests; [`CLAIMS`][fedhead.report.paper_claims.CLAIMS]
pairs each with its claim id and states its criterion.
"""

from __future__ import annotations

import statistics

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
from fedhead.report.tables import paired


# ------------------------------------------------------------------------------ Table 6
def _uncorrected_alignment_runs(ev):
    return [r for r in ev.of("alignment") if not measures.is_corrected(r.counted_results)]


def alignment_beats_ordinary(ev: Evidence):
    """C21: aligned below ordinary on δ_last, trajectory and endpoint error in every uncorrected pair."""
    results = [
        pair_wins(_uncorrected_alignment_runs(ev), "aligned", "ordinary", measure)
        for measure in (delta_last, trajectory_error, endpoint_error)
    ]
    if all(pairs == 0 for _, pairs, _ in results):
        return Missing("no (aligned, ordinary) pair")
    text = ", ".join(
        f"{name} lower in {wins}/{pairs}"
        for name, (wins, pairs, _) in zip(("δ_last", "trajectory", "endpoint"), results)
    )
    return verdict(
        all(wins == pairs for wins, pairs, _ in results),
        text + " pairs (paper 30/30 each)",
        *(runs for *_, runs in results),
    )


def alignment_beats_proximal(ev: Evidence):
    """C22: aligned below proximal on trajectory error in every pair, on endpoint error in 29/30."""
    runs = _uncorrected_alignment_runs(ev)
    trajectory_wins, trajectory_pairs, trajectory_runs = pair_wins(runs, "aligned", "proximal", trajectory_error)
    endpoint_wins, endpoint_pairs, endpoint_runs = pair_wins(runs, "aligned", "proximal", endpoint_error)
    if trajectory_pairs == 0 and endpoint_pairs == 0:
        return Missing("no (aligned, proximal) pair")
    ok = trajectory_wins == trajectory_pairs and endpoint_wins >= endpoint_pairs * 29 / 30
    return verdict(
        ok,
        f"trajectory lower in {trajectory_wins}/{trajectory_pairs}, endpoint in {endpoint_wins}/{endpoint_pairs} "
        "pairs (paper 30/30, 29/30)",
        trajectory_runs,
        endpoint_runs,
    )


def corrected_alignment_reaches_g_cen_in_round_one(ev: Evidence):
    """C23: corrected alignment's round-1 e_F(G_1, G_cen) is <= 1e-3 and below corrected proximal's."""
    aligned = ev.of("alignment", procedure="aligned_corrected")
    proximal = ev.of("alignment", procedure="corrected_proximal")
    round1_error = round1_value("e_f_cen")
    aligned_error, proximal_error = median(aligned, round1_error), median(proximal, round1_error)
    if aligned_error is None:
        return Missing("no corrected aligned run with round 1")
    ok = aligned_error <= 1e-3 and (proximal_error is None or aligned_error < proximal_error)
    return verdict(
        ok,
        f"round-1 median e_F(G_1,G_cen) aligned {number_text(aligned_error)}, proximal "
        f"{number_text(proximal_error)} (paper 8.38e-5 vs 2.38e-2)",
        aligned,
        proximal,
    )


# ------------------------------------------------------------------------------ Tables 7-9
def alignment_lowers_averaged_objective(ev: Evidence):
    """C24: averaging aligned heads gives a lower training objective than averaging trained heads."""
    runs = ev.of("mismatch")
    costs = [(r, measures.mismatch(r.counted_results)) for r in runs]
    costs = [(r, c) for r, c in costs if None not in (c["trained_minus_local"], c["aligned_minus_local"])]
    if not costs:
        return Missing("no mismatch costs recorded")
    lower = sum(1 for _, c in costs if c["aligned_minus_local"] < c["trained_minus_local"])
    return verdict(
        lower == len(costs),
        f"L_aligned < L_trained in {lower}/{len(costs)} runs (paper 60/60)",
        [r for r, _ in costs],
    )


def g_star_holds_across_architectures(ev: Evidence):
    """C25: every ordinary run of other architectures and data sizes points to G_star."""
    runs = [r for r in ev.of("architectures", "data_size", procedure="ordinary")]
    if miss := need(("ordinary architecture or data-size", runs)):
        return miss
    closer_runs, defined = every(runs, closer("d_star", "d_cen"))
    return verdict(
        defined > 0 and closer_runs == defined,
        f"{closer_runs}/{defined} runs closer to G_star, median d(G_T,G_star) "
        f"{number_text(median(runs, final_value('d_star')))} (paper 100%, 9.55e-3 to 1.45e-2)",
        runs,
    )


def correction_works_for_residual_cnn(ev: Evidence):
    """C26: the residual CNN's median d(G_T, G_cen) is lower with moment correction."""
    ordinary = [r for r in ev.of("architectures", procedure="ordinary") if r.model == "rescnn"]
    corrected = [r for r in ev.of("architectures", procedure="corrected") if r.model == "rescnn"]
    before, after = median(ordinary, final_value("d_cen")), median(corrected, final_value("d_cen"))
    if before is None or after is None:
        return Missing("needs residual-CNN runs with and without correction")
    return verdict(
        after < before,
        f"median d(G_T,G_cen) {number_text(before)} -> {number_text(after)} with correction (paper 5.24e-1 -> 1.93e-3)",
        ordinary,
        corrected,
    )


def _full_model_runs(ev, e_paper, corrected):
    return [
        r
        for r in ev.of("full_model")
        if measures.num(r.params.get("paper_local_epochs")) == e_paper
        and measures.is_corrected(r.counted_results) == corrected
    ]


def short_full_model_training_misses_both_targets(ev: Evidence):
    """C27: full-model averaging with E = 400 ends far (d > 0.1) from both G_star and G_cen."""
    runs = _full_model_runs(ev, 400, False)
    to_star, to_cen = median(runs, final_value("d_star")), median(runs, final_value("d_cen"))
    if to_star is None or to_cen is None:
        return Missing("no full-model run at E = 400 (paper budget)")
    closer_runs, defined = every(runs, closer("d_star", "d_cen"))
    return verdict(
        to_star > 0.1 and to_cen > 0.1,
        f"median d to G_star {number_text(to_star)}, to G_cen {number_text(to_cen)}; {closer_runs}/{defined} "
        "closer to G_star (paper 4.41e-1, 1.82e-1, 27%)",
        runs,
    )


def long_full_model_training_reaches_g_star(ev: Evidence):
    """C28: full-model averaging with E = 4000 points to G_star, and correction moves it to G_cen."""
    plain, corrected = _full_model_runs(ev, 4000, False), _full_model_runs(ev, 4000, True)
    if miss := need(("full-model E = 4000", plain)):
        return miss
    closer_runs, defined = every(plain, closer("d_star", "d_cen"))
    before, after = median(plain, final_value("d_cen")), median(corrected, final_value("d_cen"))
    ok = defined > 0 and closer_runs == defined and (after is None or (before is not None and after < before))
    return verdict(
        ok,
        f"{closer_runs}/{defined} closer to G_star; median d(G_T,G_cen) {number_text(before)} -> "
        f"{number_text(after)} with correction (paper 100%, 6.20e-1 -> 8.08e-3)",
        plain,
        corrected,
    )


def _mse_change(ev: Evidence, proc: str, key: str) -> list:
    """``(run, ordinary run, % change)`` of the final ``key`` MSE (``train_mse``/``test_mse``)."""
    out = []
    for run, ordinary in paired(ev.of("prediction"), proc, "ordinary"):
        mse, ordinary_mse = final_value(key)(run.counted_results), final_value(key)(ordinary.counted_results)
        if mse is not None and ordinary_mse:
            out.append((run, ordinary, 100.0 * (mse - ordinary_mse) / ordinary_mse))
    return out


def median_of(changes: list) -> float | None:
    """The median of the changes of ``(run, run, change)`` triples."""
    return statistics.median(c for *_, c in changes) if changes else None


def proximal_lowers_train_mse(ev: Evidence):
    """C29: proximal and corrected proximal lower the training MSE against ordinary in every pair."""
    changes = {p: _mse_change(ev, p, "train_mse") for p in ("proximal", "corrected_proximal")}
    if not any(changes.values()):
        return Missing("no (proximal, ordinary) pair with a train MSE")
    parts = [
        f"{p}: lower in {sum(c < 0 for *_, c in v)}/{len(v)}, median {number_text(median_of(v))} %"
        for p, v in changes.items()
    ]
    ok = all(c < 0 for v in changes.values() for *_, c in v)
    return verdict(
        ok,
        "; ".join(parts) + " (paper 15/15, −0.2 % and −2.0 %)",
        [r for v in changes.values() for a, b, _ in v for r in (a, b)],
    )


def _test_mse_changes(ev, proc):
    pairs = _mse_change(ev, proc, "test_mse")
    return pairs if pairs else Missing("no test MSE (the data sets of these runs have no test split)")


def proximal_keeps_test_mse(ev: Evidence):
    """C30: proximal's test MSE is within 1.5 % of ordinary's in every pair."""
    pairs = _test_mse_changes(ev, "proximal")
    if isinstance(pairs, Missing):
        return pairs
    within = sum(abs(c) < 1.5 for *_, c in pairs)
    lower = sum(c < 0 for *_, c in pairs)
    return verdict(
        within == len(pairs),
        f"within 1.5 % in {within}/{len(pairs)}, lower in {lower}, median {number_text(median_of(pairs))} % "
        "(paper 15/15, 9/15, −0.1 %)",
        [r for a, b, _ in pairs for r in (a, b)],
    )


def corrected_proximal_lowers_test_mse(ev: Evidence):
    """C31: corrected proximal lowers the test MSE in at least 13/15 of the pairs, median change < 0."""
    pairs = _test_mse_changes(ev, "corrected_proximal")
    if isinstance(pairs, Missing):
        return pairs
    lower, median_change = sum(c < 0 for *_, c in pairs), median_of(pairs)
    ok = lower >= len(pairs) * 13 / 15 and median_change is not None and median_change < 0
    return verdict(
        ok,
        f"lower in {lower}/{len(pairs)}, median {number_text(median_change)} % (paper 13/15, −1.5 %)",
        [r for a, b, _ in pairs for r in (a, b)],
    )


def fully_active_everywhere(ev: Evidence):
    """C32: every run records the fully active condition as holding."""
    runs = list(ev.runs)
    active, defined = every(
        runs, lambda res: None if (v := (res.targets or {}).get("fully_active")) is None else bool(v)
    )
    if defined == 0:
        return Missing("no run records targets.fully_active")
    return verdict(active == defined, f"fully active in {active}/{defined} runs (paper: every DNN experiment)", runs)
