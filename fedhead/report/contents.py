"""What a built report holds: the paper tables' specs, the written figures and the
[`Report`][fedhead.report.Report] that [`build_report`][fedhead.report.build_report] returns and
[`fedhead.report.document`][fedhead.report.document] writes out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedhead.report.claims import Claim, Verdict
from fedhead.report.collect import Collection, RunEntry
from fedhead.report.fixed_e import FixedEComparison
from fedhead.report.tables import Table

__all__ = ["FigureInfo", "Report", "TableSpec"]


@dataclass(frozen=True)
class TableSpec:
    """A paper table: its number, what it shows, the sweeps that fill it and its builder."""

    number: int
    title: str
    sweeps: tuple[str, ...]
    build: Callable[[Sequence[RunEntry]], list[Table]]
    all_runs: bool = False  # the builder picks its runs from every counted run


@dataclass(frozen=True)
class FigureInfo:
    """A written figure: file name (under ``OUT/figures``), caption and path."""

    name: str
    caption: str
    path: Path


@dataclass
class Report:
    """What [`build_report`][fedhead.report.build_report] produced.

    Attributes
    ----------
    out : Path
        The output folder.
    collection : Collection
        The sweeps and runs found (counted and excluded).
    tables : dict
        Table key (``table4``, ``table4_wins``, ...) -> [`fedhead.report.tables.Table`][fedhead.report.Table].
    missing : list of TableSpec
        The paper tables no counted run could fill.
    figures : list of FigureInfo
    figure_errors : list of str
        Figures that failed to draw (one line each; the report goes on without them).
    claims : list of (Claim, Verdict)
        The paper's claims ([`fedhead.report.paper_claims.CLAIMS`][fedhead.report.paper_claims.CLAIMS])
        with their verdicts.
    fixed_e : FixedEComparison or None
        C5 and C8 with the tolerance stop and with the paper's fixed E (sweep ``fixed_e``), None
        without that sweep.
    """

    out: Path
    collection: Collection
    tables: dict[str, Table] = field(default_factory=dict)
    missing: list[TableSpec] = field(default_factory=list)
    figures: list[FigureInfo] = field(default_factory=list)
    figure_errors: list[str] = field(default_factory=list)
    claims: list[tuple[Claim, Verdict]] = field(default_factory=list)
    fixed_e: FixedEComparison | None = None

    @property
    def markdown(self) -> Path:
        """``OUT/report.md``."""
        return self.out / "report.md"
