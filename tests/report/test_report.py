"""fedhead-report on real runs: the numbers of the tables equal values recomputed directly from
the runs' results.json, every cell lists its run folders, figures and report.md are written."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
from pathlib import Path

import pytest
from report_helpers import PROCEDURES, SEEDS, SETTING, write_manifest

from fedhead.cli.report import main

pytestmark = pytest.mark.timeout(600)  # the session fixture runs six federations (one Ray start)


@pytest.fixture(scope="module")
def report_dir(sweeps, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert main([str(sweeps), "--out", str(out)]) == 0  # the parent folder: both manifests are found
    return out


def _results(sweep: Path, procedure: str) -> dict[str, dict]:
    """results.json of each seed's run of ``procedure``, keyed by run folder (plain json)."""
    out = {}
    for seed in SEEDS:
        rel = f"runs/{sweep.name}/{SETTING}/{procedure}/s{seed}"
        out[rel] = json.loads((sweep / rel / "results.json").read_text())
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _expected_table4(res: dict) -> dict[str, float | None]:
    """Independent recomputation: the endpoint error is to G_cen for a corrected procedure, to
    G_star otherwise; trajectory for uncorrected, round-1 d(G_1, G_cen) for corrected runs; the
    local steps ratio is the run's recorded median over clients."""
    corrected = res["procedure"]["gamma"] > 0
    last, first = res["rounds"][-1], res["rounds"][1]
    return {
        "endpoint": last["e_f_cen"] if corrected else last["e_f_star"],
        "delta_last": last["delta"],
        "trajectory": None if corrected else last["trajectory_error"],
        "d_cen_1": first["d_cen"] if corrected else None,
        "e_cen_1": first["e_f_cen"] if corrected else None,
        "local_steps_ratio": res["local_steps"]["median_ratio"],
    }


def test_table4_equals_the_runs_and_lists_its_sources(sweeps, report_dir):
    rows = {r["procedure"]: r for r in _csv(report_dir / "tables" / "table4.csv")}
    sources = _csv(report_dir / "tables" / "table4_sources.csv")
    assert set(rows) == set(PROCEDURES)
    for proc in PROCEDURES:
        runs = _results(sweeps / "main", proc)
        assert int(rows[proc]["runs"]) == len(SEEDS)
        expected = [_expected_table4(r) for r in runs.values()]
        for col in ("endpoint", "delta_last", "trajectory", "d_cen_1", "e_cen_1", "local_steps_ratio"):
            vals = [e[col] for e in expected if e[col] is not None]
            if not vals:
                assert rows[proc][col] == "" and int(rows[proc][f"{col}_n"]) == 0
                continue
            assert float(rows[proc][col]) == pytest.approx(statistics.median(vals), rel=1e-12, abs=0)
            assert int(rows[proc][f"{col}_n"]) == len(vals)
            cell = [s for s in sources if s["row"] == proc and s["column"] == col]
            assert {s["run_dir"] for s in cell} == set(runs)
            assert {s["sweep_dir"] for s in cell} == {str((sweeps / "main").resolve())}


def test_wins_and_per_setting_breakdown(sweeps, report_dir):
    prox, ordi = _results(sweeps / "main", "proximal"), _results(sweeps / "main", "ordinary")
    wins = sum(p["rounds"][-1]["e_f_star"] < o["rounds"][-1]["e_f_star"] for p, o in zip(prox.values(), ordi.values()))
    row = next(
        r
        for r in _csv(report_dir / "tables" / "table4_wins.csv")
        if (r["challenger"], r["baseline"]) == ("proximal", "ordinary")
    )
    assert (int(row["wins"]), int(row["wins_n"])) == (wins, len(SEEDS))
    by_setting = {r["procedure"]: r for r in _csv(report_dir / "tables" / "table4_by_setting.csv")}
    assert by_setting["proximal"]["setting"] == SETTING
    assert float(by_setting["proximal"]["endpoint"]) == pytest.approx(
        statistics.median(r["rounds"][-1]["e_f_star"] for r in prox.values()), rel=1e-12
    )


def test_table9_pairs_the_mse_with_ordinary(sweeps, report_dir):
    """The prediction sweep (copies of the runs): final MSE (train split: hopper has no test
    split) and the median paired change against ordinary on the same seed."""
    pred = sweeps / "prediction"
    ordi = list(_results(pred, "ordinary").values())
    rows = {(r["sweep"], r["procedure"]): r for r in _csv(report_dir / "tables" / "table9.csv")}
    for proc in ("proximal", "corrected_proximal"):
        runs = list(_results(pred, proc).values())
        row = rows[("prediction", proc)]
        assert row["split"] == "train"
        mse = [r["rounds"][-1]["train_mse"] for r in runs]
        assert float(row["mse"]) == pytest.approx(statistics.median(mse), rel=1e-12)
        changes = [
            100 * (r["rounds"][-1]["train_mse"] - o["rounds"][-1]["train_mse"]) / o["rounds"][-1]["train_mse"]
            for r, o in zip(runs, ordi)
        ]
        assert float(row["change"]) == pytest.approx(statistics.median(changes), rel=1e-9)
        assert (int(row["improved"]), int(row["improved_n"])) == (sum(c < 0 for c in changes), len(SEEDS))


def test_report_md_figures_missing_tables_and_excluded_runs(report_dir):
    text = (report_dir / "report.md").read_text()
    for name in ("curves_main.png", "ellipses_hopper.png", "mse_change.png"):
        path = report_dir / "figures" / name
        assert path.stat().st_size > 10_000, name
        assert f"(figures/{name})" in text
    assert "### Tables not filled" in text
    for number, sweep in ((5, "rho"), (6, "alignment"), (7, "mismatch"), (8, "architectures")):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"- Table {number} "))
        assert f"`{sweep}`" in line
    assert "- Table 4 " not in text and "- Table 9 " not in text
    assert "data/shapes3d/3dshapes.h5" in text and "RuntimeError: the simulation engine crashed" in text
    assert "](tables/table4_sources.csv)" in text and "| main | smoke |" in text


def test_build_report_api_gives_the_rows(sweeps, tmp_path):
    from fedhead.report import build_report

    rep = build_report([sweeps / "main"], tmp_path / "out", figures=False)
    t4 = rep.tables["table4"]
    assert t4.value("runs", procedure="proximal") == len(SEEDS)
    assert {s.number for s in rep.missing} == {5, 6, 7, 8, 9}  # prediction sweep not given: no test MSE
    assert {e.status for e in rep.collection.excluded} == {"skipped", "failed"}
    assert not (tmp_path / "out" / "figures").exists()


def test_report_md_opens_with_the_claims(report_dir):
    """The tiny sweep's clients stop above the 1e-3 gap: its Table 4 claims are not testable."""
    text = (report_dir / "report.md").read_text()
    sections = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert sections[0] == "## Claims of the paper"
    claims = text.split("## Claims of the paper")[1].split("\n## ")[0]
    line = next(ln for ln in claims.splitlines() if ln.startswith("- **C2**"))
    assert line.endswith("**not testable**")
    assert "measures the optimiser" in claims and "- **C13** (Table 5)" in claims and "sweep=rho" in claims
    assert (report_dir / "claims.csv").read_text().startswith("claim,verdict,tables,detail,sweep_dir,run_dir")
    assert "(paper 0.00029, ×" in (report_dir / "tables" / "table4.md").read_text()


def test_the_data_size_sweep_gets_its_own_mse_figure(sweeps, tmp_path):
    """A data_size sweep with a test or train MSE gets ``mse_change_data_size.png`` beside the
    prediction sweep's figure (the same runs copied under a data_size manifest here)."""
    manifest = json.loads((sweeps / "prediction" / "manifest.json").read_text())
    runs = []
    for run in manifest["runs"]:
        rid = run["id"].replace("prediction/", "data_size/", 1)
        shutil.copytree(sweeps / "prediction" / run["dir"], tmp_path / "data_size" / "runs" / rid)
        runs.append(dict(run, id=rid, sweep="data_size", dir=f"runs/{rid}"))
    write_manifest(tmp_path / "data_size", "data_size", runs)
    out = tmp_path / "report"
    assert main([str(tmp_path / "data_size"), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert (out / "figures" / "mse_change_data_size.png").stat().st_size > 10_000
    assert "(figures/mse_change_data_size.png)" in text and "(figures/mse_change.png)" not in text
