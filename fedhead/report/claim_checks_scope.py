"""The checkers of the paper's claims on Tables 6-9 and the preconditions (alignment, mismatch,
architectures, full-model averaging, prediction); see :mod:`fedhead.report.claim_checks`.

Each checker reads the runs (and the report tables built from them) it is given and states its
criterion in :attr:`Claim.criterion`; thresholds the paper does not state are chosen from its
numbers and named there. Claims about figures only or the UFM have no checker.
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
    m,
    median,
    need,
    pair_wins,
    round1_value,
    verdict,
)
from fedhead.report.tables import paired

E = measures.endpoint_error
T = measures.trajectory_error
D = measures.delta_last


# ------------------------------------------------------------------------------ Table 6
def _plain(ev):
    return [r for r in ev.of("alignment") if not measures.is_corrected(r.results)]


def c21(ev: Evidence):
    res = [pair_wins(_plain(ev), "aligned", "ordinary", fn) for fn in (D, T, E)]
    if all(n == 0 for _, n, _ in res):
        return Missing("no (aligned, ordinary) pair")
    text = ", ".join(f"{name} lower in {k}/{n}" for name, (k, n, _) in zip(("δ_last", "trajectory", "endpoint"), res))
    return verdict(all(k == n for k, n, _ in res), text + " pairs (paper 30/30 each)", *(r for *_, r in res))


def c22(ev: Evidence):
    (kt, nt, rt), (ke, ne, re_) = (pair_wins(_plain(ev), "aligned", "proximal", fn) for fn in (T, E))
    if nt == 0 and ne == 0:
        return Missing("no (aligned, proximal) pair")
    ok = kt == nt and ke >= ne * 29 / 30
    return verdict(ok, f"trajectory lower in {kt}/{nt}, endpoint in {ke}/{ne} pairs (paper 30/30, 29/30)", rt, re_)


def c23(ev: Evidence):
    al, cp = ev.of("alignment", procedure="aligned_corrected"), ev.of("alignment", procedure="corrected_proximal")
    e1 = round1_value("e_f_cen")
    a, b = median(al, e1), median(cp, e1)
    if a is None:
        return Missing("no corrected aligned run with round 1")
    ok = a <= 1e-3 and (b is None or a < b)
    return verdict(
        ok, f"round-1 median e_F(G_1,G_cen) aligned {m(a)}, proximal {m(b)} (paper 8.38e-5 vs 2.38e-2)", al, cp
    )


# ------------------------------------------------------------------------------ Tables 7-9
def c24(ev: Evidence):
    runs = ev.of("mismatch")
    costs = [(r, measures.mismatch(r.results)) for r in runs]
    costs = [(r, c) for r, c in costs if None not in (c["trained_minus_local"], c["aligned_minus_local"])]
    if not costs:
        return Missing("no mismatch costs recorded")
    k = sum(1 for _, c in costs if c["aligned_minus_local"] < c["trained_minus_local"])
    return verdict(
        k == len(costs), f"L_aligned < L_trained in {k}/{len(costs)} runs (paper 60/60)", [r for r, _ in costs]
    )


def c25(ev: Evidence):
    runs = [r for r in ev.of("architectures", "data_size", procedure="ordinary")]
    if miss := need(("ordinary architecture or data-size", runs)):
        return miss
    k, n = every(runs, closer("d_star", "d_cen"))
    return verdict(
        n > 0 and k == n,
        f"{k}/{n} runs closer to G_star, median d(G_T,G_star) {m(median(runs, final_value('d_star')))} "
        "(paper 100%, 9.55e-3 to 1.45e-2)",
        runs,
    )


def c26(ev: Evidence):
    o = [r for r in ev.of("architectures", procedure="ordinary") if r.model == "rescnn"]
    c = [r for r in ev.of("architectures", procedure="corrected") if r.model == "rescnn"]
    a, b = median(o, final_value("d_cen")), median(c, final_value("d_cen"))
    if a is None or b is None:
        return Missing("needs residual-CNN runs with and without correction")
    return verdict(b < a, f"median d(G_T,G_cen) {m(a)} -> {m(b)} with correction (paper 5.24e-1 -> 1.93e-3)", o, c)


def _full(ev, e_paper, corrected):
    return [
        r
        for r in ev.of("full_model")
        if measures.num(r.params.get("paper_local_epochs")) == e_paper and measures.is_corrected(r.results) == corrected
    ]


def c27(ev: Evidence):
    runs = _full(ev, 400, False)
    a, b = median(runs, final_value("d_star")), median(runs, final_value("d_cen"))
    if a is None or b is None:
        return Missing("no full-model run at E = 400 (paper budget)")
    k, n = every(runs, closer("d_star", "d_cen"))
    return verdict(
        a > 0.1 and b > 0.1,
        f"median d to G_star {m(a)}, to G_cen {m(b)}; {k}/{n} closer to G_star (paper 4.41e-1, 1.82e-1, 27%)",
        runs,
    )


def c28(ev: Evidence):
    plain, corr = _full(ev, 4000, False), _full(ev, 4000, True)
    if miss := need(("full-model E = 4000", plain)):
        return miss
    k, n = every(plain, closer("d_star", "d_cen"))
    a, b = median(plain, final_value("d_cen")), median(corr, final_value("d_cen"))
    ok = n > 0 and k == n and (b is None or (a is not None and b < a))
    return verdict(
        ok,
        f"{k}/{n} closer to G_star; median d(G_T,G_cen) {m(a)} -> {m(b)} with correction "
        "(paper 100%, 6.20e-1 -> 8.08e-3)",
        plain,
        corr,
    )


def _mse_change(ev: Evidence, proc: str, key: str) -> list:
    """``(run, ordinary run, % change)`` of the final ``key`` MSE (``train_mse``/``test_mse``)."""
    out = []
    for a, b in paired(ev.of("prediction"), proc, "ordinary"):
        x, y = final_value(key)(a.results), final_value(key)(b.results)
        if x is not None and y:
            out.append((a, b, 100.0 * (x - y) / y))
    return out


def median_of(changes: list) -> float | None:
    """The median of the changes of ``(run, run, change)`` triples."""
    return statistics.median(c for *_, c in changes) if changes else None


def c29(ev: Evidence):
    res = {p: _mse_change(ev, p, "train_mse") for p in ("proximal", "corrected_proximal")}
    if not any(res.values()):
        return Missing("no (proximal, ordinary) pair with a train MSE")
    parts = [f"{p}: lower in {sum(c < 0 for *_, c in v)}/{len(v)}, median {m(median_of(v))} %" for p, v in res.items()]
    ok = all(c < 0 for v in res.values() for *_, c in v)
    return verdict(
        ok,
        "; ".join(parts) + " (paper 15/15, −0.2 % and −2.0 %)",
        [r for v in res.values() for a, b, _ in v for r in (a, b)],
    )


def _test_changes(ev, proc):
    pairs = _mse_change(ev, proc, "test_mse")
    return pairs if pairs else Missing("no test MSE (the data sets of these runs have no test split)")


def c30(ev: Evidence):
    pairs = _test_changes(ev, "proximal")
    if isinstance(pairs, Missing):
        return pairs
    k = sum(abs(c) < 1.5 for *_, c in pairs)
    low = sum(c < 0 for *_, c in pairs)
    return verdict(
        k == len(pairs),
        f"within 1.5 % in {k}/{len(pairs)}, lower in {low}, median {m(median_of(pairs))} % (paper 15/15, 9/15, −0.1 %)",
        [r for a, b, _ in pairs for r in (a, b)],
    )


def c31(ev: Evidence):
    pairs = _test_changes(ev, "corrected_proximal")
    if isinstance(pairs, Missing):
        return pairs
    low, med = sum(c < 0 for *_, c in pairs), median_of(pairs)
    ok = low >= len(pairs) * 13 / 15 and med < 0
    return verdict(
        ok,
        f"lower in {low}/{len(pairs)}, median {m(med)} % (paper 13/15, −1.5 %)",
        [r for a, b, _ in pairs for r in (a, b)],
    )


def c32(ev: Evidence):
    runs = list(ev.runs)
    k, n = every(runs, lambda res: None if (v := (res.targets or {}).get("fully_active")) is None else bool(v))
    if n == 0:
        return Missing("no run records targets.fully_active")
    return verdict(k == n, f"fully active in {k}/{n} runs (paper: every DNN experiment)", runs)
