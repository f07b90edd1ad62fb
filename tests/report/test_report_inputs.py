"""Bad input to fedhead-report (one error line, exit 2) and the pure helpers (no runs needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from results_helpers import typed_results

from fedhead.cli.report import main
from fedhead.report import measures
from fedhead.report.figures import rho_positions
from fedhead.report.tables import Cell, fmt


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedhead-report: error: ")
    return err[0]


def test_no_manifest_is_a_usage_error(tmp_path, capsys):
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no manifest.json" in _one_error_line(capsys)
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "out")]) == 2
    assert "no such folder" in _one_error_line(capsys)


def test_unreadable_manifest_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text("{not json")
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "unreadable JSON" in _one_error_line(capsys)


def test_a_completed_run_without_results_is_listed_not_counted(tmp_path, capsys):
    run = {
        "id": "main/hopper/ordinary/s0",
        "sweep": "main",
        "setting": "hopper",
        "procedure": "ordinary",
        "seed": 0,
        "params": {},
        "status": "completed",
        "dir": "runs/main/hopper/ordinary/s0",
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"sweep": "main", "scale": "smoke", "runs": [run]}))
    assert main([str(tmp_path), "--out", str(tmp_path / "out"), "--no-figures"]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "unreadable" in text and "is missing" in text and "- Table 4 " in text


def test_number_formatting_and_cells():
    assert [fmt(x) for x in (0.0, 0.001234, 1.23456e-5, 12.345, 12345.0)] == [
        "0",
        "0.00123",
        "1.23e-05",
        "12.3",
        "1.23e+04",
    ]
    assert Cell(3, n=4, kind="fraction").text() == "3/4" and Cell(None).text() == "-"
    assert Cell(-15.43, n=2, kind="percent").text() == "-15.4 %"


def test_rho_zero_gets_a_placeholder_left_of_the_smallest_rho():
    pos, zero = rho_positions([0.0, 1e-5, 1e-3, 1.0])
    assert zero == pytest.approx(1e-5 / 10**1.5) and pos[0.0] == zero and pos[1e-3] == 1e-3
    assert rho_positions([1e-3, 1.0])[1] is None


def test_mismatch_costs_from_the_round_keys():
    res = typed_results(
        {},
        {
            "mismatch_objective_local": 1.0,
            "mismatch_objective_trained": 3.0,
            "mismatch_objective_aligned": 1.5,
        },
    )
    assert res.rounds[1].extra["mismatch_objective_trained"] == 3.0  # not a field: a strategy's extra
    m = measures.mismatch(res)
    assert m == {"trained_minus_local": 2.0, "aligned_minus_local": 0.5, "removed": 0.75}
    assert measures.mismatch(typed_results({}, {}))["removed"] is None
    recorded = typed_results({}, {"mismatch_objective_local": 1.0, "mismatch_removed": 0.1})
    assert measures.mismatch(recorded)["removed"] == 0.1


def test_measures_read_the_typed_rounds():
    res = typed_results({"e_f_star": 0.5}, {"e_f_star": 0.2, "e_f_reference": None, "d_cen": 0.3, "test_mse": 4.0})
    assert measures.endpoint_error(res) == 0.2  # e_f_reference null: the error to the named reference
    assert measures.first_round(res, lambda t: t.d_cen) == 0.3 and measures.final_mse(res) == (4.0, "test")
    np.testing.assert_array_equal(measures.error_curve(res)[1], [0.5, 0.2])
    assert measures.first_round(typed_results({}), lambda t: t.d_cen) is None


def test_a_second_report_removes_the_files_the_first_wrote_and_it_does_not(tmp_path):
    from fedhead.report.build import remove_stale

    (tmp_path / "table5.md").write_text("old")
    (tmp_path / "table4.md").write_text("new")
    (tmp_path / "notes.txt").write_text("mine")
    assert remove_stale(tmp_path, "table*", [tmp_path / "table4.md"]) == [tmp_path / "table5.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "table4.md"]
