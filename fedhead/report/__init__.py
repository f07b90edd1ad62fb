"""``fedhead-report``: the paper's tables, figures and claim verdicts from ``fedhead-sweep`` folders.

The pipeline is collect (`collect`) -> per-run numbers (`measures`) -> tables (`tables`,
`selection_tables`, `scope_tables`) and claims (`claims`, `paper_claims`) -> rendering (`render`,
`figures`, `figures_bars`, `document`); `build_report` runs it and returns the tables as objects.
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
