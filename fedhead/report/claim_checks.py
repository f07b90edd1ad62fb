"""The checkers of the paper's claims (:data:`fedhead.report.paper_claims.CLAIMS`), one per claim.

Each checker reads the runs (and the report tables built from them) it is given and states its
criterion in :attr:`Claim.criterion`; thresholds the paper does not state are chosen from its
numbers and named there. Claims about figures only or the UFM have no checker.
"""

from __future__ import annotations

from fedhead.report import measures
from fedhead.report.claims import (
    Evidence,
    Missing,
    closer,
    every,
    final_value,
    m,
    median,
    need,
    pair_wins,
    round1_value,
    verdict,
)
from fedhead.report.selection_tables import rho_value

E = measures.endpoint_error
T = measures.trajectory_error
D = measures.delta_last


def _uncorr(runs):
    return [r for r in runs if not measures.is_corrected(r.results)]


def _corr(runs):
    return [r for r in runs if measures.is_corrected(r.results)]


# ------------------------------------------------------------------------------ Table 4
def c1(ev: Evidence):
    runs = _uncorr(ev.of(procedure="proximal"))
    if miss := need(("uncorrected proximal", runs)):
        return miss
    k, n = every(runs, closer("e_f_star", "e_f_cen"))
    detail = (
        f"{k}/{n} runs with e_F(G_T,G_star) < e_F(G_T,G_cen); medians {m(median(runs, final_value('e_f_star')))} "
        f"vs {m(median(runs, final_value('e_f_cen')))} (paper Table 9: 1.54e-4 vs 4.96e-1)"
    )
    return verdict(n > 0 and k == n, detail, runs)


def c2(ev: Evidence):
    k, n, runs = pair_wins(ev.of("main"), "proximal", "ordinary", E)
    if n == 0:
        return Missing("no (proximal, ordinary) pair on the same setting and seed")
    prox, ordi = ev.of("main", procedure="proximal"), ev.of("main", procedure="ordinary")
    detail = (
        f"lower in {k}/{n} pairs; medians {m(median(prox, E))} vs {m(median(ordi, E))}"
        f" (paper 50/50, 2.90e-4 vs 1.63e-2)"
    )
    return verdict(k == n, detail, runs)


def c3(ev: Evidence):
    ordi, prox = ev.of("main", procedure="ordinary"), ev.of("main", procedure="proximal")
    if miss := need(("ordinary", ordi), ("proximal", prox)):
        return miss
    a, b = median(ordi, E), median(prox, E)
    if a is None or b is None:
        return Missing("no endpoint e_F")
    return verdict(
        a <= 0.1 and a > b, f"ordinary median e_F {m(a)}, proximal {m(b)} (paper 1.63e-2 vs 2.90e-4)", ordi, prox
    )


def c4(ev: Evidence):
    prox, ordi = ev.of("main", procedure="proximal"), ev.of("main", procedure="ordinary")
    a = median(prox, T)
    if a is None:
        return Missing("no proximal trajectory e_F")
    b = median(ordi, T)
    ok = a <= 1e-3 and (b is None or a < b)
    return verdict(ok, f"proximal median trajectory e_F {m(a)}, ordinary {m(b)} (paper 3.39e-4 vs 3.44e-2)", prox, ordi)


def c5(ev: Evidence):
    prox, ordi = ev.of("main", procedure="proximal"), ev.of("main", procedure="ordinary")
    a, b = median(prox, D), median(ordi, D)
    if a is None or b is None:
        return Missing("no proximal and ordinary δ_last")
    return verdict(
        a <= 0.1 * b,
        f"median δ_last {m(a)} vs {m(b)}, ratio {m(a / b if b else None)} (paper 4.47e-3 vs 1.85e-1)",
        prox,
        ordi,
    )


def c6(ev: Evidence):
    runs = ev.of("main", procedure="ordinary") + [
        r for r in ev.of("architectures", procedure="ordinary") if r.model == "rescnn"
    ]
    if miss := need(("ordinary", runs)):
        return miss
    k, n = every(runs, closer("d_star", "d_cen"))
    return verdict(n > 0 and k == n, f"{k}/{n} ordinary runs with d(G_T,G_star) < d(G_T,G_cen) (paper 65/65)", runs)


def c7(ev: Evidence):
    runs = _corr(ev.of("main"))
    if miss := need(("corrected", runs)):
        return miss
    k, n = every(runs, closer("d_cen", "d_star"))
    cp, co = ev.of("main", procedure="corrected_proximal"), ev.of("main", procedure="corrected")
    a, b = median(cp, E), median(co, E)
    ok = n > 0 and k == n and (a is None or b is None or a < b)
    detail = (
        f"{k}/{n} corrected runs closer in direction to G_cen; median e_F(G_T,G_cen) corrected proximal {m(a)}, "
        f"corrected ordinary {m(b)} (paper 7.08e-5 vs 5.06e-3)"
    )
    return verdict(ok, detail, runs)


def c8(ev: Evidence):
    cp, co = ev.of("main", procedure="corrected_proximal"), ev.of("main", procedure="corrected")
    e1 = round1_value("e_f_cen")
    first = median(cp, e1)
    if first is None:
        return Missing("no corrected proximal run with round 1")
    if all(measures.last_round(r.results).round <= 1 for r in cp):
        return Missing("corrected proximal runs have one round only: no improvement after round 1 to measure")
    k, n = every(cp, lambda res: None if (a := e1(res)) is None or (b := E(res)) is None else b < a)
    base = median(co, e1)
    ok = first <= 0.1 and k == n and (base is None or first < base)
    detail = (
        f"round-1 median e_F(G_1,G_cen) {m(first)} (corrected ordinary {m(base)}; paper 2.29e-2 vs 3.08e-1); "
        f"final below round 1 in {k}/{n} runs, final median {m(median(cp, E))} (paper 7.08e-5)"
    )
    return verdict(ok, detail, cp, co)


def c10(ev: Evidence):
    runs = ev.of("prediction", "main", procedure="corrected_proximal")
    if miss := need(("corrected proximal", runs)):
        return miss
    k, n = every(runs, closer("e_f_cen", "e_f_star"))
    detail = (
        f"{k}/{n} runs with e_F(G_T,G_cen) < e_F(G_T,G_star); medians {m(median(runs, final_value('e_f_cen')))} "
        f"vs {m(median(runs, final_value('e_f_star')))} (paper 7.03e-5 vs 6.23e-1)"
    )
    return verdict(n > 0 and k == n, detail, runs)


# ------------------------------------------------------------------------------ centring
def c11(ev: Evidence):
    import numpy as np

    runs = ev.of("centering", procedure="centered")
    if miss := need(("centered", runs)):
        return miss

    def pd(res):
        g, gw = measures.final_gram(res), res.target("g_within")
        return None if g is None or gw is None else bool(np.linalg.eigvalsh(gw - g).min() > 0)

    k, n = every(runs, pd)
    if n == 0:
        return Missing("no final Gram or G_within")
    ratios = []
    for r in runs:
        gap, tr = measures.measured_gap_trace(r.results), measures.gap_traces(r.results)
        if gap is not None and tr is not None and tr[1] + tr[2] > 0:
            ratios.append(gap / (tr[1] + tr[2]))
    ratio = sorted(ratios)[len(ratios) // 2] if ratios else None
    return verdict(
        k == n,
        f"G_within − G_T positive definite in {k}/{n} runs; gap / Tr(M_Σ+M_A) about {m(ratio)} (paper 30/30, 1.19)",
        runs,
    )


def c12(ev: Evidence):
    runs = ev.of("centering", procedure="centered")
    a = median(runs, final_value("d_star"))
    if a is None:
        return Missing("no centred run with d(G_T,G_star)")
    return verdict(a < 0.05, f"median d(G_T,G_star) {m(a)} (paper 9.48e-3)", runs)


# ------------------------------------------------------------------------------ Table 5
def _by_rho(ev: Evidence) -> dict[float, list]:
    out: dict[float, list] = {}
    for r in ev.of("rho"):
        if (rho := rho_value(r)) is not None:
            out.setdefault(rho, []).append(r)
    return dict(sorted(out.items()))


def c13(ev: Evidence):
    groups = _by_rho(ev)
    if len(groups) < 3:
        return Missing(f"{len(groups)} values of ρ: an interior minimum needs at least 3")
    parts, ok = [], True
    for name, fn in (("e_F", E), ("δ_last", D)):
        meds = {rho: v for rho, runs in groups.items() if (v := median(runs, fn)) is not None}
        if len(meds) < 3:
            return Missing(f"{name} defined at fewer than 3 values of ρ")
        best = min(meds, key=meds.get)
        ok &= best not in (min(meds), max(meds))
        parts.append(f"{name} lowest at ρ = {best:g} ({m(meds[best])}) of {', '.join(f'{r:g}' for r in meds)}")
    return verdict(ok, "; ".join(parts) + " (paper: both at ρ = 1e-3)", *groups.values())


def _rho_pairs(ev: Evidence, fn):
    return pair_wins(ev.of("rho"), "0.001", "0", fn, name=lambda r: f"{rho_value(r):g}")


def c14(ev: Evidence):
    (k1, n1, r1), (k2, n2, r2) = _rho_pairs(ev, D), _rho_pairs(ev, E)
    if n1 == 0 and n2 == 0:
        return Missing("no (ρ = 1e-3, ρ = 0) pair on the same setting and seed")
    return verdict(
        k1 == n1 and k2 == n2, f"δ_last lower in {k1}/{n1} pairs, e_F in {k2}/{n2} (paper 30/30 both)", r1, r2
    )


def _rho_median(groups, rho, fn):
    return median(groups.get(rho, []), fn)


def c15(ev: Evidence):
    g = _by_rho(ev)
    a, b, z = _rho_median(g, 1e-5, E), _rho_median(g, 1e-3, E), _rho_median(g, 0.0, E)
    if a is None or b is None:
        return Missing("needs ρ = 1e-5 and ρ = 1e-3")
    return verdict(
        a > b,
        f"median e_F at ρ = 1e-5 {m(a)}, at 1e-3 {m(b)}, at 0 {m(z)} (paper 7.38e-3, 3.08e-4, 1.71e-2)",
        g[1e-5],
        g[1e-3],
    )


def _gap(runs):
    gaps = [g for r in runs for g in measures.objective_gaps(r.results)]
    return sorted(gaps)[len(gaps) // 2] if gaps else None


def c16(ev: Evidence):
    g = _by_rho(ev)
    large = [rho for rho in g if rho >= 1e-2]
    ref_gap, ref_e = _gap(g.get(1e-3, [])), _rho_median(g, 1e-3, E)
    if not large or ref_gap is None or ref_e is None:
        return Missing("needs ρ = 1e-3 and some ρ ≥ 1e-2 with objective gaps")
    ok, parts = True, []
    for rho in large:
        gap, e = _gap(g[rho]), median(g[rho], E)
        ok &= gap is not None and e is not None and gap > ref_gap and e > ref_e
        parts.append(f"ρ = {rho:g}: gap {m(gap)}, e_F {m(e)}")
    detail = (
        f"at ρ = 1e-3 gap {m(ref_gap)}, e_F {m(ref_e)}; " + "; ".join(parts) + " (paper at ρ = 1: 1.57e-1, 3.80e-1)"
    )
    return verdict(ok, detail, *(g[r] for r in large), g[1e-3])


def c17(ev: Evidence):
    g = _by_rho(ev)
    a, z = _gap(g.get(1e-3, [])), _gap(g.get(0.0, []))
    if a is None:
        return Missing("no objective gaps at ρ = 1e-3")
    return verdict(
        a <= 1e-3, f"median objective gap at ρ = 1e-3 {m(a)}, at ρ = 0 {m(z)} (paper 4.05e-5, 1.43e-5)", g[1e-3]
    )


# ------------------------------------------------------------------------------ epochs
def c18(ev: Evidence):
    groups: dict[float, list] = {}
    for r in ev.of("epochs", procedure="ordinary"):
        e = measures.num(r.params.get("paper_local_epochs", r.params.get("local_epochs")))
        if e is not None:
            groups.setdefault(e, []).append(r)
    meds = {e: v for e, runs in sorted(groups.items()) if (v := median(runs, final_value("d_star"))) is not None}
    if len(meds) < 2:
        return Missing("fewer than 2 local budgets E with d(G_T,G_star)")
    vals = list(meds.values())
    ok = all(b < a for a, b in zip(vals, vals[1:]))
    text = ", ".join(f"E={e:g}: {m(v)}" for e, v in meds.items())
    return verdict(
        ok,
        f"median d(G_T,G_star) {text} (paper 4.57e-1, 1.76e-1, 4.33e-2, 1.39e-2 at E = 50, 400, 1000, 4000)",
        *groups.values(),
    )
