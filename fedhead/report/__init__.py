"""``fedhead-report``: the paper's tables and figures from ``fedhead-sweep`` output folders.

Pipeline (pure computation separate from rendering):

collect
    :func:`collect` reads every ``manifest.json`` and the results.json of each completed run
    (:class:`RunEntry`, :class:`Collection`; :class:`ReportInputError` for bad input).
measures
    Per-run numbers from one results.json (endpoint/trajectory e_F, δ_last, MSE, ...).
tables, selection_tables, scope_tables
    :class:`Table` / :class:`Cell` (value, n, the runs behind it) and Tables 4-9.
render, figures, figures_bars, document
    Markdown/CSV/sources files, PNG figures, ``report.md``.
build
    :func:`build_report` ``(sweep_dirs, out) -> Report`` (tables accessible as objects).
cli
    ``fedhead-report DIR... --out OUT``.
"""

from fedhead.report.build import TABLES, Report, build_report, compute_tables
from fedhead.report.collect import Collection, ReportInputError, RunEntry, RunRef, collect
from fedhead.report.tables import Cell, Table

__all__ = [
    "TABLES",
    "Report",
    "build_report",
    "compute_tables",
    "Collection",
    "ReportInputError",
    "RunEntry",
    "RunRef",
    "collect",
    "Cell",
    "Table",
]
