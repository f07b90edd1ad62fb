"""Tables 7-9: the mismatch cost of independent initialisations (``mismatch``), geometry across
architectures, data sizes and full-model averaging (``architectures``, ``data_size``,
``full_model``) and prediction (``prediction`` and every run with a test MSE). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from fedhead.report import measures
from fedhead.report.collect import RunEntry
from fedhead.report.tables import (
    Cell,
    Table,
    group,
    label,
    median_cell,
    metric_cell,
    paired,
    procedure_label,
    procedure_order,
)

ALL = "all settings"


def init_value(run: RunEntry) -> str:
    """The run's initialisation (``common``/``independent``; ``params.init``, else its config)."""
    value = measures.param(run.counted_results, run.params, "init")
    return "common" if value is None else str(value)


def table7(runs: Sequence[RunEntry]) -> list[Table]:
    """Table 7 (sweep ``mismatch``): per setting and initialisation, the median objective costs
    ``L_trained - L_local`` and ``L_aligned - L_local`` and the removed fraction; ``all
    settings`` rows pool the settings."""
    runs = [r for r in runs if measures.mismatch(r.counted_results)["trained_minus_local"] is not None]
    if not runs:
        return []
    rows = []
    groups = group(runs, lambda r: (r.setting, init_value(r)))
    pooled = group(runs, lambda r: (ALL, init_value(r)))
    for (setting, init), members in sorted(groups.items()) + sorted(pooled.items()):
        row = {
            "setting": label(setting),
            "init": label(init),
            "runs": Cell(len(members), tuple(sorted(r.ref for r in members))),
        }
        for key in ("trained_minus_local", "aligned_minus_local", "removed"):
            row[key] = median_cell((measures.mismatch(r.counted_results)[key], r.ref) for r in members)
        rows.append(row)
    return [
        Table(
            "table7",
            "Table 7: mismatch cost of the initialisation (sweep mismatch, round 1), medians over seeds",
            [("setting", "setting"), ("init", "init")],
            [
                ("runs", "runs"),
                ("trained_minus_local", "L_trained − L_local"),
                ("aligned_minus_local", "L_aligned − L_local"),
                ("removed", "removed fraction"),
            ],
            rows,
            note="weighted training objectives Σ p_m L_m of round 1's local models: L_local, each client's "
            "own trained model; L_trained, the average of the trained heads on each client's trained "
            "backbone; L_aligned, the average of the heads aligned to the broadcast (W_m Q_m) on each "
            "client's aligned backbone (features Q_m^T h); removed fraction = (L_trained − L_aligned) / "
            "(L_trained − L_local)",
        )
    ]


#: sweeps of Table 8
TABLE8_SWEEPS = ("architectures", "data_size", "full_model")


def variant(run: RunEntry) -> str:
    """A Table 8 variant: the setting for ``data_size``, else the model; the procedure (with
    ``+correction`` for a corrected full model) and the swept knobs other than model and init."""
    head = run.setting if run.sweep == "data_size" else run.model
    knobs = [f"{k}={v}" for k, v in sorted(run.params.items()) if k not in ("model", "init", "gamma", "seed")]
    return " / ".join([p for p in (head, procedure_label(run)) if p] + knobs)


def _closer_to_star(members: Sequence[RunEntry]) -> Cell:
    both = [
        (r, measures.final(r.counted_results, lambda t: t.d_star), measures.final(r.counted_results, lambda t: t.d_cen))
        for r in members
    ]
    both = [(r, s, c) for r, s, c in both if s is not None and c is not None]
    return Cell(sum(1 for _, s, c in both if s < c), tuple(sorted(r.ref for r, _, _ in both)), len(both), "fraction")


def table8(runs: Sequence[RunEntry]) -> list[Table]:
    """Table 8 (sweeps ``architectures``, ``data_size``, ``full_model``): per variant, median final
    direction errors to G_star and G_cen and how many runs end closer to G_star."""
    if not runs:
        return []
    groups = group(runs, lambda r: (r.sweep, variant(r)))
    rows = []
    for sweep, var in sorted(groups, key=lambda k: (TABLE8_SWEEPS.index(k[0]) if k[0] in TABLE8_SWEEPS else 9, k[1])):
        members = groups[(sweep, var)]
        rows.append(
            {
                "sweep": label(sweep),
                "variant": label(var),
                "runs": Cell(len(members), tuple(sorted(r.ref for r in members))),
                "d_star": metric_cell(members, lambda res: measures.final(res, lambda t: t.d_star)),
                "d_cen": metric_cell(members, lambda res: measures.final(res, lambda t: t.d_cen)),
                "closer": _closer_to_star(members),
            }
        )
    return [
        Table(
            "table8",
            "Table 8: direction errors at the final round (architectures, data sizes, full model)",
            [("sweep", "sweep"), ("variant", "variant")],
            [
                ("runs", "runs"),
                ("d_star", "d(G_T, G_star)"),
                ("d_cen", "d(G_T, G_cen)"),
                ("closer", "runs closer to G_star"),
            ],
            rows,
            note="d: direction error of G_T (scale removed) to the reference; medians over setting-seed "
            "pairs; 'closer to G_star': d(G_T, G_star) < d(G_T, G_cen)",
        )
    ]


def mse_change(run: RunEntry, base: RunEntry) -> float | None:
    """Relative change (%) of the final MSE of ``run`` against ``base`` (same split), or None."""
    (a, sa), (b, sb) = measures.final_mse(run.counted_results), measures.final_mse(base.counted_results)
    if a is None or b is None or sa != sb or b == 0:
        return None
    return 100.0 * (a - b) / b


def mse_pairs(runs: Sequence[RunEntry], procedure: str) -> list[tuple[RunEntry, RunEntry, float]]:
    """``(run, ordinary run, % change)`` for every pair of ``procedure`` with ordinary."""
    out = []
    for a, b in paired(runs, procedure, "ordinary"):
        change = mse_change(a, b)
        if change is not None:
            out.append((a, b, change))
    return out


def table9_runs(all_runs: Sequence[RunEntry]) -> list[RunEntry]:
    """The runs of Table 9: sweep ``prediction`` and every sweep with a run that has a test MSE."""
    with_test = {r.sweep for r in all_runs if measures.final(r.counted_results, lambda t: t.test_mse) is not None}
    return [r for r in all_runs if r.sweep == "prediction" or r.sweep in with_test]


def _table9_row(sweep: str, name: str, members: Sequence[RunEntry], scope: Sequence[RunEntry]) -> dict[str, Cell]:
    splits = sorted(
        {
            measures.final_mse(r.counted_results)[1]
            for r in members
            if measures.final_mse(r.counted_results)[0] is not None
        }
    )
    row = {
        "sweep": label(sweep),
        "procedure": label(name),
        "split": label("+".join(splits) or "-"),
        "runs": Cell(len(members), tuple(sorted(r.ref for r in members))),
        "mse": metric_cell(members, lambda res: measures.final_mse(res)[0]),
    }
    pairs = mse_pairs(scope, name) if name != "ordinary" else []
    refs = tuple(sorted({r.ref for a, b, _ in pairs for r in (a, b)}))
    row["change"] = Cell(median_cell((c, a.ref) for a, _, c in pairs).value, refs, len(pairs), "percent")
    row["improved"] = Cell(sum(1 for *_, c in pairs if c < 0) if pairs else None, refs, len(pairs), "fraction")
    row["endpoint"] = metric_cell(members, measures.endpoint_error)
    return row


def table9(all_runs: Sequence[RunEntry]) -> list[Table]:
    """Table 9: per sweep and procedure, the median final test MSE (train MSE where there is no
    test split), its paired change against ordinary on the same setting and seed, and the
    geometry (endpoint e_F)."""
    runs = [r for r in table9_runs(all_runs) if measures.final_mse(r.counted_results)[0] is not None]
    if not runs:
        return []
    groups = group(runs, lambda r: (r.sweep, procedure_label(r)))
    order = sorted(groups, key=lambda k: (k[0] != "prediction", k[0], procedure_order(k[1])))
    rows = [_table9_row(s, p, groups[(s, p)], [r for r in runs if r.sweep == s]) for s, p in order]
    return [
        Table(
            "table9",
            "Table 9: prediction (final-round MSE of the shared head with each client's backbone)",
            [("sweep", "sweep"), ("procedure", "procedure"), ("split", "split")],
            [
                ("runs", "runs"),
                ("mse", "final MSE"),
                ("change", "paired change vs ordinary"),
                ("improved", "pairs improving on ordinary"),
                ("endpoint", "endpoint e_F"),
            ],
            rows,
            note="final MSE: test MSE, or train MSE where the data set has no test split (column split); "
            "paired change: median over (setting, seed) pairs of (MSE − MSE_ordinary) / MSE_ordinary; "
            "MSE in the data set's standardised target units",
        )
    ]
