"""Table containers and the aggregation helpers every report table is built with (pure).

A [`Table`][fedhead.report.Table] is a list of rows; a row maps column keys to [`Cell`][fedhead.report.Cell] objects. A
cell keeps its value, the number ``n`` of runs (or run pairs) behind it and the [`RunRef`][fedhead.report.RunRef] of
every run it came from, so every number of the report can be traced to its run folders.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fedhead.report import measures
from fedhead.report.collect import RunEntry, RunRef
from fedhead.results.schema import Results

#: The order procedures appear in tables and figures (presentation only: the procedures a run
#: knows are the files of ``conf/procedure/``); names not listed sort after these, by name.
PROCEDURE_ORDER = (
    "ordinary",
    "proximal",
    "corrected",
    "corrected_proximal",
    "aligned",
    "aligned_corrected",
    "centered",
    "full_model",
    "exact",
)

#: the key of a group of runs
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Cell:
    """One table cell.

    Attributes
    ----------
    value : float, int, str or None
        The number (None: no run defines it) or a label.
    runs : tuple of RunRef
        The runs the value came from (empty for labels).
    n : int or None
        Runs (or run pairs for a ``"fraction"``) behind the value; default ``len(runs)``.
    kind : {"number", "fraction", "label", "percent"}
        ``fraction``: ``value`` wins out of ``n`` pairs; ``percent``: a number shown with %.
    paper : float or None
        The paper's value of this cell ([`fedhead.report.paper`][fedhead.report.paper]; a percentage for a
        ``fraction`` or ``percent`` cell), None where the paper has none.
    """

    value: float | int | str | None
    runs: tuple[RunRef, ...] = ()
    n: int | None = None
    kind: str = "number"
    paper: float | None = None

    @property
    def comparable(self) -> float | None:
        """The value on the paper's scale: a fraction as a percentage of ``n``, else the value."""
        if self.kind == "label" or self.value is None:
            return None
        if self.kind == "fraction":
            return 100.0 * float(self.value) / self.count if self.count else None
        return float(self.value)

    @property
    def ratio(self) -> float | None:
        """Ours / paper (None without a paper value, a value of ours, or when the paper's is 0)."""
        ours = self.comparable
        if self.paper is None or ours is None or self.paper == 0:
            return None
        return ours / self.paper

    def paper_text(self) -> str:
        """``paper 2.9e-04, ×0.79`` (``%`` for fractions and percentages); empty without a paper value."""
        if self.paper is None:
            return ""
        unit = " %" if self.kind in ("fraction", "percent") else ""
        ratio = self.ratio
        return f"paper {fmt(self.paper)}{unit}, ×" + ("-" if ratio is None else fmt(ratio))

    @property
    def count(self) -> int:
        """``n``, or the number of runs."""
        return len(self.runs) if self.n is None else int(self.n)

    def text(self) -> str:
        """The value for a human: 3 significant digits, ``k/n`` for a fraction, ``-`` when undefined."""
        if self.kind == "label":
            return "" if self.value is None else str(self.value)
        if self.value is None:
            return "-"
        if self.kind == "fraction":
            return f"{int(self.value)}/{self.count}"
        text = fmt(float(self.value))
        return text + " %" if self.kind == "percent" else text


def label(value: Any) -> Cell:
    """A label cell."""
    return Cell(value=None if value is None else str(value), kind="label")


@dataclass
class Table:
    """A report table: label columns, value columns and rows of cells.

    Attributes
    ----------
    key : str
        File stem (``table4``, ``table4_wins``, ...).
    title : str
        One line shown above the table.
    labels : list of (key, header)
        The columns that name a row (procedure, setting, ...).
    values : list of (key, header)
        The number columns.
    rows : list of dict
        Column key -> [`Cell`][fedhead.report.Cell].
    note : str
        What the numbers are (shown under the table).
    """

    key: str
    title: str
    labels: list[tuple[str, str]]
    values: list[tuple[str, str]]
    rows: list[dict[str, Cell]] = field(default_factory=list)
    note: str = ""

    def row(self, **match: Any) -> dict[str, Cell]:
        """The first row whose label cells equal ``match`` (KeyError when none does)."""
        for r in self.rows:
            if all(r[k].value == str(v) for k, v in match.items()):
                return r
        raise KeyError(f"{self.key}: no row with {match}")

    def value(self, column: str, **match: Any) -> Any:
        """The value of ``column`` in the row matching ``match``."""
        return self.row(**match)[column].value


def fmt(x: float) -> str:
    """3 significant digits: ``0.00123``, ``1.23e-05``, ``12.3``, ``1.23e+04``."""
    if x == 0:
        return "0"
    return f"{x:.3g}"


def median_cell(items: Iterable[tuple[float | None, RunRef]], kind: str = "number") -> Cell:
    """The median of the defined values with the runs they came from (None when none is)."""
    pairs = [(v, ref) for v, ref in items if v is not None]
    if not pairs:
        return Cell(None, (), 0, kind)
    return Cell(float(statistics.median(v for v, _ in pairs)), tuple(sorted({r for _, r in pairs})), len(pairs), kind)


def pooled_median_cell(items: Iterable[tuple[Sequence[float], RunRef]]) -> Cell:
    """The median of every value of every run (e.g. all clients' gaps), ``n`` = contributing runs."""
    values, refs = [], set()
    for vals, ref in items:
        if vals:
            values.extend(vals)
            refs.add(ref)
    if not values:
        return Cell(None, (), 0)
    return Cell(float(statistics.median(values)), tuple(sorted(refs)), len(refs))


def metric_cell(runs: Sequence[RunEntry], fn: Callable[[Results], float | None]) -> Cell:
    """The median of ``fn(results)`` over ``runs``."""
    return median_cell((fn(r.counted_results), r.ref) for r in runs)


def group(runs: Iterable[RunEntry], key: Callable[[RunEntry], K]) -> dict[K, list[RunEntry]]:
    """Runs grouped by ``key``, groups in first-seen order."""
    out: dict[K, list[RunEntry]] = {}
    for r in runs:
        out.setdefault(key(r), []).append(r)
    return out


def procedure_order(name: str) -> tuple[int, str]:
    """Sort key: the order of [`PROCEDURE_ORDER`][fedhead.report.tables.PROCEDURE_ORDER], other names after."""
    base = name.split("+")[0].split(" ")[0]
    return (PROCEDURE_ORDER.index(base) if base in PROCEDURE_ORDER else len(PROCEDURE_ORDER), name)


def procedure_label(run: RunEntry) -> str:
    """The procedure's name; ``full_model+correction`` for a corrected full-model run (the
    sweep may name it ``full_model`` with ``gamma > 0``)."""
    name = run.procedure
    g = measures.num(measures.param(run.counted_results, run.params, "gamma"))
    if name == "full_model" and g:
        return "full_model+correction"
    return name


#: knobs that never separate the variants of a comparison (they identify a run, not a variant)
_PAIR_IGNORED = ("procedure", "rho", "gamma", "seed")


def pair_key(run: RunEntry) -> tuple:
    """Runs with the same key differ only by procedure: same sweep folder, setting, seed, model
    and swept knobs (other than ``rho``/``gamma``, which belong to the procedure)."""
    params = tuple(sorted((k, repr(v)) for k, v in run.params.items() if k not in _PAIR_IGNORED))
    return (run.ref.sweep_dir, run.setting, run.seed, run.model, params)


def paired(
    runs: Sequence[RunEntry], challenger: str, baseline: str, name: Callable[[RunEntry], str] = procedure_label
) -> list[tuple[RunEntry, RunEntry]]:
    """``(challenger run, baseline run)`` pairs on the same [`pair_key`][fedhead.report.tables.pair_key], in order."""
    base = {pair_key(r): r for r in runs if name(r) == baseline}
    return [(r, base[pair_key(r)]) for r in runs if name(r) == challenger and pair_key(r) in base]


def wins_row(
    runs: Sequence[RunEntry],
    challenger: str,
    baseline: str,
    metric: Callable[[Results], float | None] = measures.endpoint_error,
) -> dict[str, Cell] | None:
    """A wins row: in how many pairs the challenger's ``metric`` is lower, and the median ratio.

    Returns None when there is no pair with both values defined.
    """
    pairs = [
        (a, b, metric(a.counted_results), metric(b.counted_results)) for a, b in paired(runs, challenger, baseline)
    ]
    pairs = [(a, b, x, y) for a, b, x, y in pairs if x is not None and y is not None]
    if not pairs:
        return None
    refs = tuple(sorted({r.ref for a, b, _, _ in pairs for r in (a, b)}))
    wins = sum(1 for _, _, x, y in pairs if x < y)
    ratios = [(x / y, a.ref) for a, _, x, y in pairs if y > 0]
    ratio = median_cell(ratios)
    return {
        "challenger": label(challenger),
        "baseline": label(baseline),
        "wins": Cell(wins, refs, len(pairs), "fraction"),
        "ratio": Cell(ratio.value, refs, ratio.count),
    }


def wins_table(
    key: str,
    title: str,
    runs: Sequence[RunEntry],
    comparisons: Sequence[tuple[str, str]],
    metric_name: str = "endpoint e_F",
) -> Table | None:
    """A table of [`wins_row`][fedhead.report.tables.wins_row] rows (None when no comparison has a pair)."""
    rows = [r for a, b in comparisons if (r := wins_row(runs, a, b)) is not None]
    if not rows:
        return None
    return Table(
        key,
        title,
        [("challenger", "challenger"), ("baseline", "baseline")],
        [("wins", f"pairs with lower {metric_name}"), ("ratio", f"median ratio of {metric_name}")],
        rows,
        note="pairs: the same sweep folder, setting, seed, model and swept knobs; "
        "ratio: challenger / baseline (below 1: the challenger ends closer)",
    )
