"""Tables as Markdown and CSV, and the sources file of every table (the runs behind each cell).

Rendering only: [`fedhead.report.tables.Table`][fedhead.report.Table] in, text out; files are written
atomically ([`fedhead.results.io.write_bytes_atomic`][fedhead.results.io.write_bytes_atomic]).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from fedhead.report.tables import Cell, Table
from fedhead.results.io import write_bytes_atomic

SOURCES_HEADER = ("table", "row", "column", "value", "sweep_dir", "run_dir")


def row_name(table: Table, row: dict[str, Cell]) -> str:
    """The row's label cells joined with `` / `` (e.g. ``hopper / proximal``)."""
    return " / ".join(row[k].text() for k, _ in table.labels)


def _md_cell(cell: Cell, runs: int | None) -> str:
    """A Markdown cell: the value, ``(n=k)`` when fewer runs than the row's define it, and the
    paper's value with the ratio ours / paper where the paper has the cell."""
    text = cell.text()
    if cell.kind in ("number", "percent") and cell.value is not None and runs is not None and cell.count != runs:
        text += f" (n={cell.count})"
    if cell.paper is not None:
        text += f" ({cell.paper_text()})"
    return text.replace("|", "\\|")


def to_markdown(table: Table) -> str:
    """The table as GitHub Markdown: a bold title line, the table, the note in italics."""
    heads = [h for _, h in table.labels] + [h for _, h in table.values]
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "|".join([":--"] * len(table.labels) + ["--:"] * len(table.values)) + "|",
    ]
    for row in table.rows:
        count = row["runs"].value if "runs" in row else None
        runs = count if isinstance(count, int) else None
        cells = [row[k].text().replace("|", "\\|") for k, _ in table.labels]
        cells += [_md_cell(row[k], runs) if k != "runs" else row[k].text() for k, _ in table.values]
        lines.append("| " + " | ".join(cells) + " |")
    if table.note:
        lines += ["", f"*{table.note}. A value marked (n=k) comes from k of the row's runs; k/n: k of n pairs.*"]
    return "\n".join(lines) + "\n"


def csv_text(rows: list[list[object]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def _csv_value(cell: Cell) -> object:
    """Full precision for numbers (``repr``), the text for labels, empty for undefined values."""
    if cell.value is None:
        return ""
    return cell.value if cell.kind == "label" else repr(cell.value)


def paper_columns(table: Table) -> set[str]:
    """The value columns where some row has a paper value."""
    return {k for k, _ in table.values if any(row[k].paper is not None for row in table.rows if k in row)}


def _num(x: float | None) -> object:
    return "" if x is None else repr(x)


def to_csv(table: Table) -> str:
    """The table as CSV: label columns, then each value column ``key`` at full precision with
    ``key_n`` (runs, or pairs for a fraction) beside it (``runs`` has no ``_n``); where the paper
    has a value in the column, ``key_paper`` and ``key_ratio`` (ours / paper) follow."""
    with_paper = paper_columns(table)
    head: list[object] = [k for k, _ in table.labels]
    for k, _ in table.values:
        head += [k] if k == "runs" else [k, f"{k}_n"]
        head += [f"{k}_paper", f"{k}_ratio"] if k in with_paper else []
    rows = [head]
    for row in table.rows:
        out: list[object] = [_csv_value(row[k]) for k, _ in table.labels]
        for k, _ in table.values:
            out += [_csv_value(row[k])] if k == "runs" else [_csv_value(row[k]), row[k].count]
            out += [_num(row[k].paper), _num(row[k].ratio)] if k in with_paper else []
        rows.append(out)
    return csv_text(rows)


def sources_csv(table: Table) -> str:
    """One line per (cell, run): ``table,row,column,value,sweep_dir,run_dir``."""
    rows: list[list[object]] = [list(SOURCES_HEADER)]
    for row in table.rows:
        name = row_name(table, row)
        for k, _ in table.values:
            cell = row[k]
            for ref in cell.runs:
                rows.append([table.key, name, k, _csv_value(cell), ref.sweep_dir, ref.run_dir])
    return csv_text(rows)


def write_table(table: Table, folder: Path) -> dict[str, Path]:
    """Write ``<key>.md``, ``<key>.csv`` and ``<key>_sources.csv`` into ``folder``."""
    out = {}
    for suffix, text in ((".md", to_markdown(table)), (".csv", to_csv(table)), ("_sources.csv", sources_csv(table))):
        out[suffix] = write_bytes_atomic(folder / f"{table.key}{suffix}", text.encode("utf-8"), sync=False)
    return out
