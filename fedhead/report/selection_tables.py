"""Tables 4-6: selection and correction (sweep ``main``), the proximal weight (``rho``) and
alignment (``alignment``). Pure: runs in, [`fedhead.report.tables.Table`][fedhead.report.Table] out."""

from __future__ import annotations

from collections.abc import Sequence

from fedhead.report import measures
from fedhead.report.collect import RunEntry
from fedhead.report.tables import (
    Cell,
    Table,
    group,
    label,
    metric_cell,
    pooled_median_cell,
    procedure_label,
    procedure_order,
    wins_table,
)

ENDPOINT_NOTE = (
    "endpoint e_F: the final round's relative Frobenius error of G_T to the procedure's own "
    "reference (G_star uncorrected, G_cen corrected, G_within centred)"
)


def _uncorrected(fn):
    """``fn`` restricted to uncorrected runs (None for corrected ones)."""
    return lambda res: None if measures.is_corrected(res) else fn(res)


def _corrected(fn):
    """``fn`` restricted to corrected runs (None for uncorrected ones)."""
    return lambda res: fn(res) if measures.is_corrected(res) else None


#: Table 4's value columns: (key, header, per-run function)
TABLE4_COLUMNS = (
    ("endpoint", "endpoint e_F", measures.endpoint_error),
    ("trajectory", "trajectory e_F (uncorrected)", _uncorrected(measures.trajectory_error)),
    ("delta_last", "δ_last", measures.delta_last),
    ("d_cen_1", "round-1 d(G_1, G_cen) (corrected)", _corrected(lambda r: measures.first_round(r, lambda t: t.d_cen))),
    (
        "e_cen_1",
        "round-1 e_F(G_1, G_cen) (corrected)",
        _corrected(lambda r: measures.first_round(r, lambda t: t.e_f_cen)),
    ),
    ("local_steps_ratio", "local steps ratio (fixed E×T / used)", measures.local_steps_ratio),
)


def procedure_rows(runs: Sequence[RunEntry], columns, by: Sequence[str] = ()) -> list[dict[str, Cell]]:
    """One row per procedure (and per ``by`` attribute, e.g. ``setting``): medians of ``columns``."""
    keyf = lambda r: tuple(getattr(r, b) for b in by) + (procedure_label(r),)  # noqa: E731
    groups = group(runs, keyf)
    rows = []
    for key in sorted(groups, key=lambda k: (k[:-1], procedure_order(k[-1]))):
        members = groups[key]
        row = {b: label(v) for b, v in zip(by, key)}
        row["procedure"] = label(key[-1])
        row["runs"] = Cell(len(members), tuple(sorted(r.ref for r in members)))
        for col, _, fn in columns:
            row[col] = metric_cell(members, fn)
        rows.append(row)
    return rows


def table4(runs: Sequence[RunEntry]) -> list[Table]:
    """Table 4 (sweep ``main``): per procedure, medians over setting-seed pairs; the wins of the
    proximal and corrected variants; the per-setting breakdown."""
    if not runs:
        return []
    values = [("runs", "runs")] + [(k, h) for k, h, _ in TABLE4_COLUMNS]
    main = Table(
        "table4",
        "Table 4: selection and correction (sweep main), medians over setting-seed pairs",
        [("procedure", "procedure")],
        values,
        procedure_rows(runs, TABLE4_COLUMNS),
        note=ENDPOINT_NOTE + "; trajectory e_F: median over rounds of the error to the exact recursion "
        "from the run's own G_0 (last round's value); δ_last: the last round's selection distance "
        "Σ p_m ||W_m - Π_m(W_t)||_F; round-1 columns: G_1 against G_cen after one round; local steps ratio: "
        "the optimiser steps of the fixed recipe (E epochs in each of T rounds) over those the clients used "
        "(stopping at local_tol), median over clients",
    )
    out = [main]
    wins = wins_table(
        "table4_wins",
        "Table 4 (wins): lower endpoint e_F on the same setting and seed",
        runs,
        [("proximal", "ordinary"), ("corrected_proximal", "corrected")],
    )
    if wins is not None:
        out.append(wins)
    by_setting = [(k, h, f) for k, h, f in TABLE4_COLUMNS if k in ("endpoint", "delta_last")]
    out.append(
        Table(
            "table4_by_setting",
            "Table 4 by setting: medians over seeds",
            [("setting", "setting"), ("procedure", "procedure")],
            [("runs", "runs")] + [(k, h) for k, h, _ in by_setting],
            procedure_rows(runs, by_setting, by=("setting",)),
            note=ENDPOINT_NOTE,
        )
    )
    return out


def rho_value(run: RunEntry) -> float | None:
    """The run's proximal weight: ``params.rho``, else its procedure's ``rho``."""
    return measures.num(measures.param(run.counted_results, run.params, "rho"))


def table5(runs: Sequence[RunEntry]) -> list[Table]:
    """Table 5 (sweep ``rho``): per ρ, δ_last, the relative original-objective gap and endpoint e_F."""
    rho_of = {id(r): rho for r in runs if (rho := rho_value(r)) is not None}
    runs = [r for r in runs if id(r) in rho_of]
    if not runs:
        return []
    groups = group(runs, lambda r: rho_of[id(r)])
    rows = []
    for rho in sorted(groups):
        members = groups[rho]
        rows.append(
            {
                "rho": label(f"{rho:g}"),
                "runs": Cell(len(members), tuple(sorted(r.ref for r in members))),
                "delta_last": metric_cell(members, measures.delta_last),
                "objective_gap": pooled_median_cell(
                    (measures.objective_gaps(r.counted_results), r.ref) for r in members
                ),
                "endpoint": metric_cell(members, measures.endpoint_error),
            }
        )
    return [
        Table(
            "table5",
            "Table 5: proximal weight ρ (sweep rho), medians over setting-seed pairs",
            [("rho", "ρ")],
            [
                ("runs", "runs"),
                ("delta_last", "δ_last"),
                ("objective_gap", "relative original-objective gap"),
                ("endpoint", "endpoint e_F"),
            ],
            rows,
            note="objective gap: median over clients and runs of the last round's relative gap of each "
            "client's original objective (without the proximal term) to its optimum; " + ENDPOINT_NOTE,
        )
    ]


#: Table 6's value columns
TABLE6_COLUMNS = (
    ("endpoint", "endpoint e_F", measures.endpoint_error),
    ("trajectory", "trajectory e_F", measures.trajectory_error),
    ("delta_last", "δ_last", measures.delta_last),
)


def table6(runs: Sequence[RunEntry]) -> list[Table]:
    """Table 6 (sweep ``alignment``): per procedure, endpoint and trajectory e_F and δ_last, and the
    wins of the aligned procedures over their unaligned counterparts."""
    if not runs:
        return []
    out = [
        Table(
            "table6",
            "Table 6: alignment (sweep alignment), medians over setting-seed pairs",
            [("procedure", "procedure")],
            [("runs", "runs")] + [(k, h) for k, h, _ in TABLE6_COLUMNS],
            procedure_rows(runs, TABLE6_COLUMNS),
            note=ENDPOINT_NOTE + "; trajectory e_F: the error to the exact recursion (median over rounds)",
        )
    ]
    wins = wins_table(
        "table6_wins",
        "Table 6 (wins): lower endpoint e_F on the same setting and seed",
        runs,
        [
            ("aligned", "proximal"),
            ("aligned", "ordinary"),
            ("aligned_corrected", "corrected_proximal"),
            ("aligned_corrected", "corrected"),
        ],
    )
    if wins is not None:
        out.append(wins)
    return out
