"""``report.md``: the sweeps found, every table inline, the tables not filled, every figure, the
runs that do not count and where each number came from."""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING

from fedhead.report.render import to_markdown

if TYPE_CHECKING:  # pragma: no cover
    from fedhead.report.build import Report

STATUSES = ("completed", "failed", "skipped", "pending", "unreadable")


def _escape(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def duration(seconds: float) -> str:
    """``12 s``, ``3.4 min`` or ``2.1 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def sweeps_section(report: Report) -> list[str]:
    """The sweep folders: name, scale, creation time and runs per status."""
    lines = [
        "## Sweeps found",
        "",
        "| sweep | scale | folder | " + " | ".join(STATUSES) + " | run time | created |",
        "|:--|:--|:--|" + "--:|" * (len(STATUSES) + 1) + ":--|",
    ]
    for s in report.collection.sweeps:
        counts = " | ".join(str(s.counts.get(k, 0)) for k in STATUSES)
        lines.append(
            f"| {s.sweep} | {s.scale} | `{s.sweep_dir}` | {counts} | {duration(s.wall_seconds)} | {s.created} |"
        )
    lines += [
        "",
        "Only completed runs with a readable, completed results.json count "
        "(unreadable: marked completed in the manifest, but its results.json is missing or bad).",
        "",
    ]
    return lines


def tables_section(report: Report) -> list[str]:
    """Each table inline, with links to its CSV and sources; then the tables that are missing."""
    lines = [
        "## Tables",
        "",
        "Medians over setting–seed combinations; `runs`: the runs of the row; numbers with 3 significant "
        "digits (full precision in the CSV files).",
        "",
    ]
    for key, table in report.tables.items():
        lines += [
            f"### {key}",
            "",
            to_markdown(table).rstrip(),
            "",
            f"Files: [{key}.md](tables/{key}.md), [{key}.csv](tables/{key}.csv), "
            f"sources [{key}_sources.csv](tables/{key}_sources.csv).",
            "",
        ]
    if report.missing:
        lines += ["### Tables not filled", ""]
        for spec in report.missing:
            sweeps = " or ".join(f"`{s}`" for s in spec.sweeps)
            cmd = " / ".join(f"`fedhead-sweep sweep={s} scale=smoke|paper out=DIR`" for s in spec.sweeps)
            lines.append(
                f"- Table {spec.number} ({spec.title}): no completed run of sweep {sweeps}; "
                f"run {cmd} and pass DIR to fedhead-report."
            )
        lines.append("")
    return lines


def figures_section(report: Report) -> list[str]:
    """Each figure with its caption."""
    lines = ["## Figures", ""]
    if not report.figures:
        lines += ["No figure could be drawn from these runs." if report.collection.runs else "No counted run.", ""]
    for fig in report.figures:
        lines += [f"### {fig.name}", "", fig.caption, "", f"![{fig.name}](figures/{fig.name})", ""]
    if report.figure_errors:
        lines += ["Figures that failed to draw:", ""] + [f"- {_escape(e)}" for e in report.figure_errors] + [""]
    return lines


def excluded_section(report: Report) -> list[str]:
    """The runs that do not count: id, sweep, status and reason (the manifest's error or needs)."""
    excluded = report.collection.excluded
    lines = ["## Runs not counted", ""]
    if not excluded:
        return lines + ["Every run of the manifests counts.", ""]
    lines += ["| run | sweep | status | reason | folder |", "|:--|:--|:--|:--|:--|"]
    for e in excluded:
        lines.append(f"| {_escape(e.id)} | {e.sweep} | {e.status} | {_escape(e.reason or '-')} | `{e.ref.run_dir}` |")
    return lines + [""]


def sources_section(report: Report) -> list[str]:
    """Where the numbers came from: the sources file of every table and the sweep folders."""
    lines = [
        "## Sources",
        "",
        "Every table has a sources file with one line per (cell, run): `table,row,column,value,"
        "sweep_dir,run_dir`; the run's results.json is `<sweep_dir>/<run_dir>/results.json`.",
        "",
    ]
    for key in report.tables:
        lines.append(f"- {key}: [tables/{key}_sources.csv](tables/{key}_sources.csv)")
    lines += ["", "Sweep folders:", ""]
    lines += [f"- `{s.sweep_dir}` (manifest.json, sweep {s.sweep}, scale {s.scale})" for s in report.collection.sweeps]
    revs = sorted({r.results.git_revision for r in report.collection.runs})
    if revs:
        lines += ["", "Code revisions of the counted runs: " + ", ".join(f"`{r}`" for r in revs)]
    return lines + [""]


def report_markdown(report: Report) -> str:
    """The whole report.md."""
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    c = report.collection
    head = [
        "# fedhead report",
        "",
        f"Generated {now} by `fedhead-report` from {len(c.sweeps)} sweep folder(s): {len(c.runs)} runs "
        f"counted, {len(c.excluded)} not counted. Contents: sweeps found, tables, figures, runs not counted, "
        "sources.",
        "",
    ]
    parts = head + sweeps_section(report) + tables_section(report) + figures_section(report)
    parts += excluded_section(report) + sources_section(report)
    return "\n".join(parts)
