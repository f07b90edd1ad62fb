"""``report.md``: the sweeps found, every table inline, the tables not filled, every figure, the
runs that do not count and where each number came from."""

from __future__ import annotations

import datetime as _dt

from fedhead.report import measures
from fedhead.report.claims import NOT_MEASURED, OPTIMUM_GAP, runs_text
from fedhead.report.contents import Report
from fedhead.report.fixed_e import explanation
from fedhead.report.render import csv_text, to_markdown
from fedhead.report.tables import fmt, median_cell

STATUSES = ("completed", "failed", "skipped", "pending", "unreadable")


def _escape(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def duration(seconds: float) -> str:
    """``12 s``, ``3.4 min`` or ``2.1 h``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


CLAIMS_INTRO = (
    "Each claim of the paper about the network experiments, with the criterion the report tests, the "
    "numbers and the runs behind them. `holds` / `does not hold`: the verdict on the runs whose clients "
    f"reached their local optima (largest trained gap <= {fmt(OPTIMUM_GAP)} at the last round; runs with a "
    "proximal weight ρ > 1e-3 are not judged by the gap, which is of the unpenalised objective); a claim "
    "that does not hold there is a finding. `not testable`: only runs whose clients stopped short of their "
    "optima measure it, so the numbers would measure the optimiser, not the theory, or no network run can "
    "(the reason is given). `not measured`: no run measures it (the sweep that fills it is named, or the "
    "file-only data set it rests on). Every claim's runs: claims.csv."
)

#: the ``data_roots`` key of a data set whose name differs from it (a Hydra key cannot start with a digit)
DATA_ROOT_KEYS = {"300w_lp": "w300lp"}
#: the claims that rest on a file-only data set alone
FILE_ONLY_CLAIMS = {"mpiigaze": ("C9",)}


def claims_section(report: Report) -> list[str]:
    """The paper's claims: those on the tables filled (or with a verdict) first, then the rest."""
    filled = {n for n in range(4, 10)} - {s.number for s in report.missing}
    lines = ["## Claims of the paper", "", CLAIMS_INTRO, ""]
    rest = []
    for claim, v in report.claims:
        tables = ", ".join(f"Table {t}" for t in claim.tables) or "no table"
        if v.status == NOT_MEASURED and not filled & set(claim.tables):
            rest.append(f"- **{claim.id}** ({tables}) {claim.text} — **{v.status}**: {_escape(v.detail)}")
            continue
        lines.append(f"- **{claim.id}** ({tables}) {claim.text} — **{v.status}**")
        if claim.criterion:
            lines.append(f"  - criterion: {claim.criterion}")
        lines.append(f"  - {_escape(v.detail)}")
        if v.runs:
            lines.append(f"  - runs: {runs_text(v.runs)}")
    if rest:
        lines += ["", "Claims on tables or figures these runs do not fill:", ""] + rest
    return lines + [""]


def data_section(report: Report) -> list[str]:
    """The settings that did not run for want of their files: the file each needs, how to run it
    and the claims that rest on it alone (none when every run had its data)."""
    needs: dict[str, tuple[str, int]] = {}
    for e in report.collection.excluded:
        if e.status == "skipped" and e.reason:
            what, count = needs.get(e.dataset, (e.reason, 0))
            needs[e.dataset] = (what, count + 1)
    if not needs:
        return []
    lines = [
        "## Settings not run for want of their files",
        "",
        "These data sets have no offline generator; their runs are `skipped` in the manifests. Give their "
        "folder once per sweep (`data_roots.<name>=<folder>`) and run the same command again: only their runs "
        "run.",
        "",
    ]
    for name, (what, count) in sorted(needs.items()):
        key = DATA_ROOT_KEYS.get(name, name)
        rests = ", ".join(FILE_ONLY_CLAIMS.get(name, ()))
        lines.append(
            f"- **{name}** ({count} runs skipped): {_escape(what)}; `data_roots.{key}=<folder>`"
            + (f". Claims resting on it alone: {rests}." if rests else ".")
        )
    return lines + [""]


def fixed_e_section(report: Report) -> list[str]:
    """C5 and C8 with the tolerance stop and with the paper's fixed E, and what the numbers say of
    the README's explanation of both findings (nothing without sweep ``fixed_e``)."""
    cmp = report.fixed_e
    if cmp is None:
        return []
    lines = [
        "## C5 and C8: the tolerance stop against the paper's fixed E",
        "",
        "Hypothesis (README, scale=cpu): with the tolerance stop, warm-started ordinary clients stop after tens "
        "of epochs near the broadcast, which makes proximal's δ_last ratio larger than the paper's (C5) and "
        "corrected ordinary's first round closer to G_cen (C8). Sweep `fixed_e` runs main's procedures on "
        f"{cmp.pairs} of its setting-seed pairs with E epochs in every round; the claims' own checks decide both "
        "variants (table `table4_fixed_e` under Tables).",
        "",
    ]
    lines += [f"- {_escape(t)}" for t in explanation(cmp)]
    lines.append("")
    for (cid, variant), v in cmp.verdicts.items():
        lines.append(f"- {cid}, {variant}: **{v.status}** — {_escape(v.detail)}")
    return lines + [""]


def claims_csv(report: Report) -> str:
    """``claims.csv``: one line per (claim, run) with the verdict (a claim without runs: one line)."""
    rows: list[list[object]] = [["claim", "verdict", "tables", "detail", "sweep_dir", "run_dir"]]
    for claim, v in report.claims:
        tables = " ".join(str(t) for t in claim.tables)
        for ref in v.runs or (None,):
            where = [ref.sweep_dir, ref.run_dir] if ref else ["", ""]
            rows.append([claim.id, v.status, tables, v.detail, *where])
    return csv_text(rows)


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


def local_steps_sentence(report: Report) -> str:
    """One sentence: the median over all counted runs of the local steps ratio (fixed E × T / used)."""
    runs = report.collection.runs
    cell = median_cell((measures.local_steps_ratio(r.counted_results), r.ref) for r in runs)
    if cell.value is None:
        return (
            "Local steps: no counted run records them (results.json without `local_steps`), so the ratio of "
            "the fixed recipe's steps (E epochs in each of T rounds) to those used is not given."
        )
    return (
        f"Local steps: the fixed recipe (E epochs in each of T rounds) takes {fmt(float(cell.value))} times the "
        f"optimiser steps the clients used (stopping at local_tol), median over {cell.count} of "
        f"{len(runs)} counted runs (each run's median over clients; Table 4's `local steps ratio`)."
    )


def tables_section(report: Report) -> list[str]:
    """Each table inline, with links to its CSV and sources; then the tables that are missing."""
    lines = [
        "## Tables",
        "",
        "Medians over setting–seed combinations; `runs`: the runs of the row; numbers with 3 significant "
        "digits (full precision in the CSV files).",
        "",
        local_steps_sentence(report),
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
            cmd = " / ".join(f"`fedhead-sweep sweep={s} scale=smoke|cpu|paper out=DIR`" for s in spec.sweeps)
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
    revs = sorted({r.results.git_revision for r in report.collection.runs if r.results is not None})
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
        f"counted, {len(c.excluded)} not counted. Contents: claims of the paper, C5 and C8 against the paper's "
        "fixed E (with sweep fixed_e), settings not run for want of their files, sweeps found, tables, figures, "
        "runs not counted, sources.",
        "",
    ]
    parts = head + claims_section(report) + fixed_e_section(report) + data_section(report) + sweeps_section(report)
    parts += tables_section(report) + figures_section(report)
    parts += excluded_section(report) + sources_section(report)
    return "\n".join(parts)
