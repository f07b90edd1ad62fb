"""Outside the fully active regime (theory.md §3): refuse by default, train with the explicit override.

In-process (real ClientApp, no Ray). With ``lambda_h = lambda_w = 0.25`` (threshold 0.0625) two
of the three Hopper partitions of 80 samples (smallest action-covariance eigenvalues 0.045 and
0.018) violate the condition, the third (0.069) and Sigma_cen / Sigma_within (0.11) satisfy it.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, captured_strategies_log

from fedhead.clients import make_client_app
from fedhead.data import OutsideRegimeError, OutsideRegimeWarning
from fedhead.driver.checks import prepare_data
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.results import schema
from fedhead.settings.config import compose_config, load_config

OUTSIDE = [
    "model=free",
    "procedure=proximal",
    "rounds=2",
    "local_epochs=3",
    "num_clients=3",
    "lambda_h=0.25",
    "lambda_w=0.25",
    "output.tensorboard=true",
    "output.figures=true",
]


def _job(tmp_path: Path, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "dataset.n_train=240",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                *OUTSIDE,
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


def test_outside_regime_is_refused_by_default(tmp_path, task_identity):
    job = _job(tmp_path)
    with pytest.raises(OutsideRegimeError, match="allow_outside_regime=true") as err:
        prepare_data(job)  # the simulation driver refuses before Ray starts
    assert "2 client(s) [0, 1]" in str(err.value) and "margin" in str(err.value)
    # the server refuses too (deployments have no data on the server): after the diagnosis
    recorder = RunRecorder(job, show_progress=False)
    grid = InProcessGrid(make_client_app(job), 3)
    with pytest.raises(OutsideRegimeError, match=r"lambda_min\(Sigma_m\) <= lambda_H \* lambda_W"):
        serve(grid, job, recorder, show_progress=False)
    res = recorder.finish("failed", error="refused")
    assert res.diagnosis["fully_active"] is False and min(res.diagnosis["margins"]) < 0
    assert res.rounds == [] and res.status == "failed" and res.error == "refused"
    assert [m.metadata.message_type for m in grid.sent] == ["query"] * 3  # nobody trained


def test_diagnose_only_works_outside_the_regime(tmp_path, task_identity):
    job = _job(tmp_path, "diagnose_only=true")
    prepare_data(job)  # no refusal: the diagnosis is what the user asked for
    recorder = RunRecorder(job, show_progress=False)
    serve(InProcessGrid(make_client_app(job), 3), job, recorder, show_progress=False)
    recorder.finish("diagnosed")
    res = schema.read(job.output_dir / schema.FILE_NAME)
    assert res.status == "diagnosed" and res.diagnosis["fully_active"] is False
    assert "outside the fully active regime" in res.diagnosis["recommendation"]
    assert res.diagnosis["rel_gap"] is None  # NaN written as null


def test_override_trains_and_records_undefined_references_as_null(tmp_path, task_identity, caplog):
    job = _job(tmp_path, "dataset.allow_outside_regime=true")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutsideRegimeWarning)
        prepare_data(job)  # allowed: silent here, the server reports it once after the exchange
    recorder = RunRecorder(job, show_progress=False)
    with caplog.at_level(logging.WARNING, logger="fedhead.strategies"), captured_strategies_log(caplog):
        serve(InProcessGrid(make_client_app(job), 3), job, recorder, show_progress=False)
    said = [r.getMessage() for r in caplog.records if "fully active regime" in r.getMessage()]
    assert len(said) == 1 and "Continuing because dataset.allow_outside_regime=true" in said[0]
    assert "recorded as null" in said[0]
    res = recorder.finish("completed")
    on_disk = json.loads((job.output_dir / "results.json").read_text())
    assert on_disk["status"] == "completed" and [r["round"] for r in on_disk["rounds"]] == [0, 1, 2]
    t = on_disk["targets"]
    assert t["fully_active"] is False and t["g_star"] is None
    # the PSD minimisers phi (clipped eigenvalues) are still defined and PSD
    for key in ("g_cen", "g_within"):  # fully active themselves here: phi is positive definite
        assert np.linalg.eigvalsh(np.array(t[key])).min() > 0
    grams = np.array(t["grams"])  # phi(Sigma_m): clipped (singular) for the violating clients
    assert np.linalg.eigvalsh(grams[1]).min() == pytest.approx(0.0, abs=1e-12)
    assert np.linalg.eigvalsh(grams[2]).min() > 0
    assert np.array(t["grams"]).shape == (3, 3, 3)
    for r in on_disk["rounds"]:
        for key in (
            "e_f_star",
            "d_star",
            "e_f_reference",
            "recursion_gram",
            "e_f_recursion",
            "trajectory_error",
            "predicted_gram",
            "delta",
        ):
            assert r[key] is None, (r["round"], key)
        assert np.isfinite(r["e_f_cen"]) and np.isfinite(r["e_f_within"]) and np.isfinite(r["d_cen"])
    for r in on_disk["rounds"][1:]:
        assert np.isfinite(r["train_mse"]) and len(r["objective_gaps"]) == 3
        assert all(np.isfinite(g) for g in r["objective_gaps"])
        assert all(np.isfinite(c["distance_to_selection"]) for c in r["client_metrics"])
    # G_t measured against the clipped phi(Sigma_cen) exactly as e_F defines it
    g2, g_cen = np.array(on_disk["rounds"][-1]["gram"]), np.array(t["g_cen"])
    assert on_disk["rounds"][-1]["e_f_cen"] == pytest.approx(
        np.linalg.norm(g2 - g_cen) / np.linalg.norm(g_cen), rel=1e-12
    )
    assert res.figures == ["error_curves.png", "ellipses.png"]
    assert list((job.output_dir / "tensorboard").glob("events.out.tfevents.*"))
