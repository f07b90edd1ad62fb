"""Tables 5-8 and the sweep figures from copies of the session's real runs, relabelled as the
rho, epochs, alignment, mismatch, full_model and centering sweeps would write them (same
results.json schema; only the manifest params, and for mismatch the round-1 keys, are set)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from report_helpers import SEEDS, SETTING, write_manifest

from fedhead.report import build_report


def _copy(
    sweeps: Path,
    root: Path,
    sweep: str,
    procedure: str,
    seed: int,
    variant: str,
    new_procedure: str,
    params: dict,
    edit=None,
) -> dict:
    """Copy the main sweep's run of (procedure, seed) into ``root/<sweep>`` and return its manifest entry."""
    rid = f"{sweep}/{SETTING}/{variant}/{new_procedure}/s{seed}"
    dst = root / sweep / "runs" / rid
    shutil.copytree(sweeps / "main" / "runs" / "main" / SETTING / procedure / f"s{seed}", dst)
    if edit is not None:
        path = dst / "results.json"
        res = json.loads(path.read_text())
        edit(res)
        path.write_text(json.dumps(res))
    return {
        "id": rid,
        "sweep": sweep,
        "setting": SETTING,
        "dataset": SETTING,
        "model": "free",
        "procedure": new_procedure,
        "seed": seed,
        "params": params,
        "status": "completed",
        "dir": f"runs/{rid}",
    }


def _mismatch(init: str, seed: int):
    def edit(res):
        trained = 2.0 + seed + (init == "independent")
        res["rounds"][1].update(
            mismatch_objective_local=1.0, mismatch_objective_trained=trained, mismatch_objective_aligned=1.25
        )
        res["rounds"][1]["mismatch_removed"] = (res["rounds"][1]["mismatch_objective_trained"] - 1.25) / (
            res["rounds"][1]["mismatch_objective_trained"] - 1.0
        )

    return edit


def _centered(res):
    res["reference"], res["procedure"]["centered"] = "within", True
    for r in res["rounds"]:
        r["e_f_reference"] = r["e_f_within"]


@pytest.fixture(scope="module")
def relabelled(sweeps, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("relabelled")
    runs = {
        "rho": [
            _copy(sweeps, root, "rho", "proximal", s, f"rho{r:g}", "proximal", {"rho": r})
            for r in (0.0, 1e-5)
            for s in SEEDS
        ],
        "epochs": [
            _copy(sweeps, root, "epochs", p, s, f"E{e}", p, {"local_epochs": e})
            for e in (100, 300)
            for p in ("ordinary", "proximal")
            for s in SEEDS
        ],
        "alignment": [
            _copy(sweeps, root, "alignment", p, s, "", q, {"correction": False})
            for p, q in (("ordinary", "ordinary"), ("proximal", "proximal"), ("proximal", "aligned"))
            for s in SEEDS
        ],
        "mismatch": [
            _copy(sweeps, root, "mismatch", "ordinary", s, i, "ordinary", {"init": i}, _mismatch(i, s))
            for i in ("common", "independent")
            for s in SEEDS
        ],
        "full_model": [
            _copy(sweeps, root, "full_model", p, s, f"g{g}", "full_model", {"local_epochs": 300, "gamma": g})
            for p, g in (("ordinary", 0.0), ("corrected_proximal", 1.0))
            for s in SEEDS
        ],
        "centering": [
            _copy(sweeps, root, "centering", "ordinary", s, "", p, {}, _centered if p == "centered" else None)
            for p in ("ordinary", "centered")
            for s in SEEDS
        ],
    }
    for sweep, entries in runs.items():
        write_manifest(root / sweep, sweep, entries)
    return root


def test_tables_5_to_8_and_the_sweep_figures(relabelled, tmp_path):
    rep = build_report([relabelled], tmp_path / "out")
    t5, t6, t7, t8 = (rep.tables[k] for k in ("table5", "table6", "table7", "table8"))
    assert [r["rho"].value for r in t5.rows] == ["0", "1e-05"]
    runs = [
        json.loads(
            (relabelled / "rho" / "runs" / "rho" / SETTING / "rho0" / "proximal" / f"s{s}" / "results.json").read_text()
        )
        for s in SEEDS
    ]
    gaps = [g for r in runs for g in r["rounds"][-1]["objective_gaps"]]
    assert t5.value("objective_gap", rho="0") == pytest.approx(statistics.median(gaps), rel=1e-12)
    assert t6.value("runs", procedure="aligned") == len(SEEDS)
    assert rep.tables["table6_wins"].row(challenger="aligned", baseline="proximal")["wins"].count == len(SEEDS)
    assert t7.value("trained_minus_local", setting=SETTING, init="independent") == pytest.approx(
        statistics.median(2.0 + s + 1 - 1.0 for s in SEEDS)
    )
    assert t7.value("removed", setting="all settings", init="common") == pytest.approx(
        statistics.median((1.0 + s - 0.25) / (1.0 + s) for s in SEEDS)
    )
    corrected = t8.row(sweep="full_model", variant="free / full_model+correction / local_epochs=300")
    assert corrected["closer"].value == 0 and corrected["closer"].count == len(SEEDS)
    assert t8.row(sweep="full_model", variant="free / full_model / local_epochs=300")["closer"].value == len(SEEDS)
    names = {f.name for f in rep.figures}
    assert {"epochs.png", "rho.png", "centering_gap.png", "curves_alignment.png", "curves_centering.png"} <= names
    assert not rep.figure_errors and [s.number for s in rep.missing] == [4, 9]
