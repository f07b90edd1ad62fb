"""Console and log text of a federation: round lines, advice, tables, the diagnosis.

Every function formats; none writes a file. The recorder ([`fedhead.driver.recorder`][fedhead.driver.recorder]) logs the
lines, the drivers ([`fedhead.driver.simulation`][fedhead.driver.simulation],
[`fedhead.driver.server`][fedhead.driver.server]) print the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedhead.driver.privacy import DP_SGD_EPSILON, ROW_EPSILON
from fedhead.federation.local_fit import LOCAL_GAP_THRESHOLD
from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import Results
from fedhead.settings.config import JobConfig
from fedhead.strategies.secure import DP_EPSILON, SITES_AT_OPTIMUM, SITES_SUMMED

__all__ = [
    "fmt",
    "round_line",
    "round_log_line",
    "start_line",
    "local_gap_advice",
    "final_summary",
    "error_table",
    "diagnosis_lines",
    "local_optimality_note",
    "local_steps_line",
]


def fmt(value: float | None, spec: str = ".4g") -> str:
    """A number for logs and tables; ``-`` where it is undefined (None)."""
    return "-" if value is None else format(value, spec)


def round_line(job: JobConfig, record: RoundRecord) -> str:
    """The console line of one round: errors to both references and how close clients came."""
    parts = [
        f"[{job.name}] round {record.round}/{job.settings.rounds}:",
        f"e_F(G_t, G_star) = {fmt(record.e_f_star, '.3g')},",
        f"e_F(G_t, G_cen) = {fmt(record.e_f_cen, '.3g')}",
    ]
    if record.max_trained_gap is not None:
        parts[-1] += ","
        parts.append(f"largest local gap {record.max_trained_gap:.2g}")
        if record.local_epochs:
            lo, hi = min(record.local_epochs), max(record.local_epochs)
            parts.append(f"({lo} epochs)" if lo == hi else f"({lo}-{hi} epochs)")
    elif record.extra.get(SITES_SUMMED) is not None:  # secure mode: the sites' own pass or fail
        parts[-1] += ","
        parts.append(f"{sites_at_optimum(record)} sites at their local optimum")
    if record.extra.get(DP_EPSILON) is not None:
        parts.append(f"(epsilon so far {record.extra[DP_EPSILON]:.3g})")
    if record.extra.get(ROW_EPSILON) is not None:
        parts.append(
            f"(row-level epsilon so far {record.extra[ROW_EPSILON]:.3g}, DP-SGD alone "
            f"{fmt(record.extra.get(DP_SGD_EPSILON), '.3g')})"
        )
    return " ".join(parts)


def sites_at_optimum(record: RoundRecord) -> str:
    """``k/M``: the sites of a secure round that report they reached their local optimum ("-": not secure)."""
    k, m = record.extra.get(SITES_AT_OPTIMUM), record.extra.get(SITES_SUMMED)
    return "-" if k is None or m is None else f"{int(k)}/{int(m)}"


def round_log_line(job: JobConfig, record: RoundRecord) -> str:
    """The run log's line of one round: every error, delta, MSE, local gap and epochs."""
    epochs = "-" if not record.local_epochs else "/".join(str(e) for e in record.local_epochs)
    return (
        f"[{job.name}] round {record.round}: e_F(G_star)={fmt(record.e_f_star)} e_F(G_cen)={fmt(record.e_f_cen)} "
        f"e_F(G_within)={fmt(record.e_f_within)} recursion={fmt(record.e_f_recursion, '.3g')} "
        f"delta={fmt(record.delta)} train_mse={fmt(record.train_mse)} "
        f"max local gap={fmt(record.max_trained_gap, '.2g')} epochs={epochs}"
    )


def start_line(experiment: str, jobs: list[JobConfig], root: Path) -> str:
    """The console's first line: what runs (of ``experiment``, when named), and where its outputs go."""
    if not jobs:
        return f"fedhead-run: nothing to run; outputs in {root}"
    st = jobs[0].settings
    what = (
        "diagnosis only"
        if st.diagnose_only
        else f"{', '.join(j.name for j in jobs)}: {st.rounds} rounds x up to {st.local_epochs} local epochs"
    )
    return (
        f"fedhead-run{f' {experiment}' if experiment else ''}: {what}, {st.num_clients} clients on "
        f"{jobs[0].dataset.name}, model {jobs[0].model.name} -> {root} (full log: run.log)"
    )


def local_gap_advice(record: RoundRecord, job: JobConfig) -> str:
    """One line: which client is how far from its local optimum, and what to raise."""
    gaps = record.trained_gaps or []
    worst = int(np.argmax(gaps))
    return (
        f"client {worst} ended local training at relative gap {gaps[worst]:.2g} > "
        f"{LOCAL_GAP_THRESHOLD:g} from its local optimum, so G_star, G_cen and the recursion (which assume "
        f"local optima) do not describe this round yet; raise local_epochs (now {job.settings.local_epochs}) or "
        f"train.lr, or set train.local_tol to train each client until it is close enough"
    )


def final_summary(results: Results) -> str:
    """The final errors of a run (TensorBoard's ``summary`` text); the run must have recorded a round."""
    last = results.last
    if last is None:
        raise ValueError(f"procedure {results.name}: no round recorded, so no final errors to summarise")
    return (
        f"procedure {results.name}: after round {last.round} "
        f"e_F(G_star) = {fmt(last.e_f_star)}, e_F(G_cen) = {fmt(last.e_f_cen)}, "
        f"e_F(G_within) = {fmt(last.e_f_within)} (reference: G_{results.reference})"
    )


def error_table(all_results: list[Results]) -> str:
    """Plain-text table: per round, e_F to G_star and G_cen of every procedure."""
    done = [r for r in all_results if r.rounds]
    if not done:
        return ""
    cols = (
        ("e_f_star", "e_F(G_star)", ".4g"),
        ("e_f_cen", "e_F(G_cen)", ".4g"),
        ("max_trained_gap", "local gap", ".2g"),
    )
    head = ["round"] + [f"{r.name}: {label}" for r in done for _, label, _ in cols]
    n_rounds = max(len(r.rounds) for r in done)

    def cell(r: Results, i: int, attr: str, spec: str) -> str:
        if i >= len(r.rounds):
            return ""
        rec = r.rounds[i]
        if attr == "max_trained_gap" and rec.max_trained_gap is None and rec.extra.get(SITES_SUMMED) is not None:
            return f"{sites_at_optimum(rec)} at optimum"
        return fmt(getattr(rec, attr), spec)

    rows = [[str(i)] + [cell(r, i, a, spec) for r in done for a, _, spec in cols] for i in range(n_rounds)]
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def diagnosis_lines(d: dict[str, Any]) -> list[str]:
    """The diagnosis of a results.json ([`Results.diagnosis`][fedhead.results.schema.Results.diagnosis]) as console
    lines."""
    if d.get("absent"):  # secure mode: the server holds only sums
        return [
            f"fully active: {d['fully_active']} ({d['recommendation']})",
            "per-site diagnosis absent (privacy.mode=secure: the server holds only sums)",
            *(f"FLAG: {flag}" for flag in d.get("flags") or ()),
        ]
    return [
        f"fully active margins: {', '.join(f'{m:.3g}' for m in d['margins'])} (threshold {d['threshold']:.3g})",
        f"relative gap ||G_cen - G_star|| / ||G_cen|| = {d['rel_gap']:.4g}"
        if d["rel_gap"] is not None
        else "relative gap: undefined",
        "gap shares: "
        + ", ".join(
            f"{k} {100 * d[f'share_m_{k}']:.1f}%" if d[f"share_m_{k}"] is not None else f"{k} -"
            for k in ("mu", "sigma", "a")
        ),
        f"recommendation: {d['recommendation']}",
        *(f"FLAG: {flag}" for flag in d.get("flags") or ()),
    ]


def local_optimality_note(results: Results) -> str | None:
    """The end-of-run note when a client had not reached its local optimum at the last round."""
    lo = results.local_optimality
    if not lo or lo.reached is not False:
        return None
    if lo.last_round_max_trained_gap is None:  # secure mode: the sites' own pass or fail
        return (
            f"NOTE [{results.name}]: at the last round a site reports that it did not reach its local optimum: "
            "the theory's references assume local optima. Raise local_epochs or train.lr, or set train.local_tol."
        )
    return (
        f"NOTE [{results.name}]: at the last round a client is {lo.last_round_max_trained_gap:.2g} "
        f"from its local optimum (> {lo.threshold:g}): the theory's references assume local optima and do "
        f"not apply yet. Raise local_epochs or train.lr, or set train.local_tol."
    )


def local_steps_line(results: Results) -> str | None:
    """One end-of-run line: the optimiser steps the clients took against the fixed recipe's (E
    epochs in each of T rounds) and the median ratio over clients; None without ``local_steps``
    or where the fixed recipe has no steps (``exact``)."""
    ls = results.local_steps
    fixed = [f for f in ls.fixed_steps if f is not None] if ls else []
    if not fixed:
        return None
    t = max(ls.rounds)
    return (
        f"[{results.name}] local steps: {sum(ls.steps)} of the fixed recipe's {sum(fixed)} "
        f"(E × T = {ls.local_epochs} × {t}), ratio {fmt(ls.median_ratio, '.3g')}"
    )
