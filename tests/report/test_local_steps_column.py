"""Table 4's ``local steps ratio`` column and report.md's sentence, from hand-made runs (results
written before ``local_steps`` existed give no value)."""

from __future__ import annotations

from pathlib import Path

import pytest
from results_helpers import typed_results

from fedhead.report import Report
from fedhead.report.collect import Collection, RunEntry, RunRef
from fedhead.report.document import report_markdown
from fedhead.report.render import to_csv, to_markdown
from fedhead.report.selection_tables import table4
from fedhead.results.schema import LocalSteps


def _run(procedure: str, seed: int, ratio: float | None) -> RunEntry:
    """A run whose clients' median ratio (fixed E×T / used steps) is ``ratio``; None: an older
    results.json without ``local_steps``."""
    res = typed_results({})
    res.procedure = {"name": procedure, "gamma": 0.0}
    if ratio is not None:
        res.local_steps = LocalSteps(
            local_epochs=5,
            rounds=[2],
            epochs=[10],
            steps=[20],
            fixed_epochs=[10],
            fixed_steps=[20],
            ratios=[ratio],
            median_ratio=ratio,
        )
    ref = RunRef("/sweeps/main", f"runs/{procedure}/s{seed}")
    return RunEntry(ref, "main", "smoke", ref.run_dir, "hopper", "hopper", "free", procedure, seed, results=res)


RUNS = [_run("ordinary", 0, 2.0), _run("ordinary", 1, 4.0), _run("proximal", 0, 5.0), _run("proximal", 1, None)]


def test_table4_median_ratio_per_procedure_and_csv_count():
    table = table4(RUNS)[0]
    assert ("local_steps_ratio", "local steps ratio (fixed E×T / used)") in table.values
    ordinary, proximal = table.row(procedure="ordinary"), table.row(procedure="proximal")
    assert ordinary["local_steps_ratio"].value == pytest.approx(3.0, rel=1e-15)
    assert ordinary["local_steps_ratio"].count == 2
    assert proximal["local_steps_ratio"].value == 5.0 and proximal["local_steps_ratio"].count == 1
    assert [r.run_dir for r in proximal["local_steps_ratio"].runs] == ["runs/proximal/s0"]
    head, *rows = to_csv(table).splitlines()
    cols = [dict(zip(head.split(","), r.split(","))) for r in rows]
    assert [(c["procedure"], float(c["local_steps_ratio"]), c["local_steps_ratio_n"]) for c in cols] == [
        ("ordinary", 3.0, "2"),
        ("proximal", 5.0, "1"),
    ]
    assert "| 5 (n=1) |" in to_markdown(table)


def test_report_md_gives_the_median_over_all_counted_runs():
    text = report_markdown(Report(Path("/out"), Collection([], RUNS, [])))
    assert "takes 4 times the optimiser steps the clients used" in text
    assert "median over 3 of 4 counted runs" in text
    old = report_markdown(Report(Path("/out"), Collection([], [_run("ordinary", 0, None)], [])))
    assert "Local steps: no counted run records them" in old
