"""``build_report``: sweep folders in, ``OUT/tables``, ``OUT/figures`` and ``OUT/report.md`` out.

The pipeline is collect ([`fedhead.report.collect`][fedhead.report.collect]) -> tables (pure builders of
[`fedhead.report.selection_tables`][fedhead.report.selection_tables] and
[`fedhead.report.scope_tables`][fedhead.report.scope_tables]) -> rendering
([`fedhead.report.render`][fedhead.report.render], [`fedhead.report.figures`][fedhead.report.figures],
[`fedhead.report.document`][fedhead.report.document]).
The returned [`Report`][fedhead.report.Report] keeps every table with its cells, so callers (tests, notebooks)
read the numbers without parsing files.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from matplotlib.figure import Figure

from fedhead.plotting.canvas import save_figure
from fedhead.report import fixed_e, paper, scope_tables, selection_tables
from fedhead.report.claims import Claim, Verdict, evaluate
from fedhead.report.collect import Collection, RunEntry, collect
from fedhead.report.contents import FigureInfo, Report, TableSpec
from fedhead.report.document import claims_csv, report_markdown
from fedhead.report.figures import ellipses_figure, epochs_figure, error_curves_figure, rho_figure
from fedhead.report.figures_bars import CENTERING_NOTE, centering_figure, mse_figure
from fedhead.report.paper_claims import CLAIMS
from fedhead.report.render import write_table
from fedhead.report.tables import Table
from fedhead.results.io import write_bytes_atomic

log = logging.getLogger(__name__)


TABLES = (
    TableSpec(4, "selection and correction", ("main",), selection_tables.table4),
    TableSpec(5, "proximal weight ρ", ("rho",), selection_tables.table5),
    TableSpec(6, "alignment", ("alignment",), selection_tables.table6),
    TableSpec(7, "mismatch cost of the initialisation", ("mismatch",), scope_tables.table7),
    TableSpec(
        8,
        "direction errors across architectures, data sizes and full-model averaging",
        scope_tables.TABLE8_SWEEPS,
        scope_tables.table8,
    ),
    TableSpec(9, "prediction (test MSE)", ("prediction",), scope_tables.table9, all_runs=True),
)


def compute_tables(collection: Collection) -> tuple[dict[str, Table], list[TableSpec]]:
    """Every table the counted runs fill, and the specs of those they cannot fill (pure)."""
    tables: dict[str, Table] = {}
    missing = []
    for spec in TABLES:
        runs = collection.runs if spec.all_runs else collection.of_sweep(*spec.sweeps)
        built = spec.build(runs)
        if not built:
            missing.append(spec)
        for t in built:
            tables[t.key] = paper.attach(t)
    return tables, missing


def tables_of_runs(collection: Collection) -> Callable[[Sequence[RunEntry]], dict[str, Table]]:
    """``runs -> the report tables built from exactly these runs`` (each subset computed once)."""
    cache: dict[tuple[int, ...], dict[str, Table]] = {}

    def tables_of(runs: Sequence[RunEntry]) -> dict[str, Table]:
        key = tuple(id(r) for r in runs)
        if key not in cache:
            cache[key] = compute_tables(replace(collection, runs=list(runs)))[0]
        return cache[key]

    return tables_of


def judge_claims(
    collection: Collection, tables_of: Callable[[Sequence[RunEntry]], dict[str, Table]] | None = None
) -> list[tuple[Claim, Verdict]]:
    """Every claim of the paper with its verdict on the counted runs (tables of a run subset are
    computed once per subset)."""
    tables_of = tables_of or tables_of_runs(collection)
    return [(claim, evaluate(claim, collection, tables_of)) for claim in CLAIMS]


def slug(text: str) -> str:
    """A file-name-safe version of ``text``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def figure_jobs(collection: Collection) -> Iterable[tuple[str, str, Callable[[], Figure | None]]]:
    """``(file name, caption, draw)`` of every figure the runs may fill (draw returns None when not)."""
    for sweep in ("main", "alignment", "centering"):
        runs = collection.of_sweep(sweep)
        if runs:
            yield (
                f"curves_{sweep}.png",
                f"Error of the head Gram to each procedure's own reference per round, sweep {sweep} "
                "(one panel per setting, mean ± 1 sd over seeds, log scale).",
                lambda runs=runs, sweep=sweep: error_curves_figure(runs, sweep),
            )
    main = collection.of_sweep("main")
    for setting in sorted({r.setting for r in main}):
        yield (
            f"ellipses_{slug(setting)}.png",
            f"Final head Gram of each procedure against G_star and G_cen on {setting} (smallest seed; "
            "first three targets when there are more).",
            lambda setting=setting: ellipses_figure(main, setting),
        )
    yield (
        "epochs.png",
        "Direction error d(G_T, G_star) against the local epochs E per round (sweep epochs, log-log; the "
        "paper's Figure 13, at this scale's E; the dotted line: d = 0.1, the budget of claim C19).",
        lambda: epochs_figure(collection.of_sweep("epochs")),
    )
    yield (
        "rho.png",
        "δ_last and endpoint e_F against ρ (sweep rho); ρ = 0 at the tick labelled 0 left of the dotted axis break.",
        lambda: rho_figure(collection.of_sweep("rho")),
    )
    yield ("centering_gap.png", CENTERING_NOTE, lambda: centering_figure(collection.of_sweep("centering")))
    yield (
        "mse_change.png",
        "Paired change of the final MSE against ordinary on the same setting and seed (sweep prediction).",
        lambda: mse_figure(collection.of_sweep("prediction"), "prediction"),
    )
    yield (
        "mse_change_data_size.png",
        "The same on the enlarged image settings (sweep data_size: correction against ordinary, more "
        "samples per client than main's; set beside main's corrected runs in Table 9).",
        lambda: mse_figure(collection.of_sweep("data_size"), "data_size"),
    )


def write_figures(collection: Collection, folder: Path) -> tuple[list[FigureInfo], list[str]]:
    """Draw and write every figure the runs fill; a figure that fails is logged and skipped."""
    written, errors = [], []
    for name, caption, draw in figure_jobs(collection):
        try:
            fig = draw()
            if fig is None:
                continue
            written.append(FigureInfo(name, caption, save_figure(fig, folder / name)))
        except Exception as exc:  # noqa: BLE001 - one broken figure must not cost the tables
            log.warning("figure %s not drawn: %s: %s", name, type(exc).__name__, exc)
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return written, errors


def remove_stale(folder: Path, pattern: str, written: Sequence[Path]) -> list[Path]:
    """Remove the files of an earlier report in ``folder`` (``pattern``) that this one did not
    write, so the folder matches report.md (a table no longer filled leaves no old file)."""
    keep = {Path(p).resolve() for p in written}
    stale = [p for p in sorted(folder.glob(pattern)) if p.is_file() and p.resolve() not in keep]
    for p in stale:
        log.info("removing %s of an earlier report", p)
        p.unlink()
    return stale


def build_report(sweep_dirs: Sequence[str | Path], out: str | Path, *, figures: bool = True) -> Report:
    """Collect the runs of ``sweep_dirs``, write the tables, figures and ``report.md`` into ``out``.

    Parameters
    ----------
    sweep_dirs : sequence of path-like
        Sweep folders (with ``manifest.json``) or folders holding several.
    out : path-like
        Output folder (created).
    figures : bool
        Draw the figures (False: tables and report.md only).

    Returns
    -------
    Report

    Raises
    ------
    fedhead.report.collect.ReportInputError
        No manifest found, or a manifest that is not readable JSON.
    """
    collection = collect(sweep_dirs)
    out = Path(out)
    report = Report(out=out, collection=collection)
    report.tables, report.missing = compute_tables(collection)
    tables_of = tables_of_runs(collection)
    report.fixed_e = fixed_e.compare(collection, CLAIMS, tables_of)
    if report.fixed_e is not None:
        report.tables[report.fixed_e.table.key] = report.fixed_e.table
    written = [p for table in report.tables.values() for p in write_table(table, out / "tables").values()]
    remove_stale(out / "tables", "table*", written)
    if figures:
        report.figures, report.figure_errors = write_figures(collection, out / "figures")
        remove_stale(out / "figures", "*.png", [f.path for f in report.figures])
    report.claims = judge_claims(collection, tables_of)
    write_bytes_atomic(out / "claims.csv", claims_csv(report).encode("utf-8"), sync=False)
    write_bytes_atomic(report.markdown, report_markdown(report).encode("utf-8"), sync=False)
    log.info("report: %d tables, %d figures -> %s", len(report.tables), len(report.figures), report.markdown)
    return report
