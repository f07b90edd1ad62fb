"""End-to-end Flower simulations on the Ray backend (free-feature backbone, tiny sizes).

The default suite keeps one fast trained federation; the training comparisons and the
``fedhead-run`` CLI run are marked slow (Ray starts a fresh cluster for each federation).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedhead import ufm
from fedhead.settings.config import compose_config, load_config

pytestmark = pytest.mark.usefixtures("ray_session")  # one Ray start for the session (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]


def _job(tmp_path: Path, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "model=free",
                "dataset.n_train=300",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "output.figures=true",
                "resources.client_cpus=1",
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


def _check_results_file(job, results):
    on_disk = json.loads((Path(job.output_dir) / "results.json").read_text())
    assert on_disk["status"] == "completed"
    assert on_disk["rounds"][-1]["round"] == job.settings.rounds
    for key in ("config", "seeds", "git_revision", "provenance", "diagnosis", "targets", "moments"):
        assert on_disk[key] is not None, key
    for key in ("g_star", "g_cen", "g_within", "grams"):
        assert np.asarray(on_disk["targets"][key]).shape[-2:] == (3, 3)
    assert len(on_disk["rounds"]) == job.settings.rounds + 1
    assert on_disk["rounds"] == json.loads(json.dumps(results["rounds"]))
    assert list((Path(job.output_dir) / "tensorboard").glob("events.out.tfevents.*"))
    assert (Path(job.output_dir) / "error_curves.png").stat().st_size > 0
    return on_disk


def test_trained_simulation_meets_the_theory(tmp_path):
    """One Ray simulation, two trained procedures (free features, the quickstart's recipe):
    proximal follows the exact BW recursion from the run's own G_0 (docs/theory.md §6) to 2e-3,
    corrected-proximal is on G_cen after one round (§8) to 2e-3, every client at its local
    optimum; results.json, TensorBoard and figures are written."""
    from fedhead.driver.simulation import run_federations

    cfg = load_config(
        compose_config(
            [
                "model=free",
                "dataset.n_train=300",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "num_clients=3",
                "experiment=single",
                "experiment.procedures=[proximal,corrected_proximal]",
                "rounds=2",
                "local_epochs=400",
                "train.lr=3e-3",
                "local_tol=1e-5",
                "rho=1e-5",
                "output.figures=true",
                "resources.client_cpus=1",
            ]
        )
    )
    jobs = cfg.jobs(tmp_path / "out")
    prox, corr = run_federations(jobs, show_progress=False)
    res = _check_results_file(jobs[0], prox)
    _check_results_file(jobs[1], corr)
    t = res["targets"]
    grams = np.array([r["gram"] for r in res["rounds"]])
    recursion = ufm.gram_recursion(grams[0], np.array(t["client_grams"]), np.array(t["weights"]), 2)
    for r, g_rec in zip(res["rounds"][1:], recursion[1:]):
        assert np.linalg.norm(np.array(r["gram"]) - g_rec) / np.linalg.norm(g_rec) < 2e-3
        assert max(r["trained_gaps"]) < 1e-4 and r["delta"] < 1e-2
        np.testing.assert_allclose(
            r["bias"], np.array(res["moments"]["weights"]) @ np.array(res["moments"]["means"]), rtol=0, atol=1e-3
        )
    assert corr["rounds"][1]["e_f_cen"] < 2e-3 and corr["reference"] == "cen"
    assert res["diagnosis"]["fully_active"] and len(res["diagnosis"]["margins"]) == 3
    assert not jobs[0].state_dir.exists()  # private state removed after the run


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_proximal_vs_ordinary_and_corrected_proximal(tmp_path):
    """Trained free features (one Ray simulation, three procedures one after another):
    proximal ends closer to G_star than ordinary, corrected_proximal within 1e-2 of G_cen."""
    from fedhead.driver.simulation import run_federations

    cfg = load_config(
        compose_config(
            [
                "model=free",
                "model.feature_dim=12",
                "dataset.n_train=300",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "experiment=single",
                "experiment.procedures=[ordinary,proximal,corrected_proximal]",
                "num_clients=4",
                "rounds=4",
                "local_epochs=1500",
                "train.lr=1e-2",
                "train.lr_min=1e-5",
                "resources.evaluate_mse=false",
                "output.tensorboard=false",
                "output.figures=false",
            ]
        )
    )
    results = run_federations(cfg.jobs(tmp_path / "out"), show_progress=False)
    final = {r["procedure"]["name"]: r["rounds"][-1] for r in results}
    assert final["proximal"]["e_f_star"] < final["ordinary"]["e_f_star"]
    assert final["proximal"]["e_f_star"] < 0.1 * final["proximal"]["e_f_cen"]
    assert final["corrected_proximal"]["e_f_cen"] < 1e-2


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_fedhead_run_cli_on_a_tiny_resmlp(tmp_path):
    """``fedhead-run`` (Hydra) on a tiny ResMLP: results.json, TensorBoard events, figures."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "fedhead.cli.run",
        "procedure=proximal",
        "model=resmlp_small",
        "model.width=16",
        "model.feature_dim=8",
        "rounds=2",
        "local_epochs=2",
        "dataset.n_train=400",
        f"dataset.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={out}",
    ]
    proc = subprocess.run(
        cmd,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "proximal" / "results.json").read_text())
    assert res["status"] == "completed" and len(res["rounds"]) == 3
    assert res["config"]["rounds"] == 2 and res["procedure"]["rho"] == res["config"]["rho"] == 1e-5  # quickstart rho
    for r in res["rounds"][1:]:
        assert r["train_mse"] is not None and np.isfinite(r["e_f_star"]) and len(r["objective_gaps"]) == 4
    assert list((out / "proximal" / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "proximal" / "ellipses.png").is_file()
    assert json.loads((out / "summary.json").read_text())["procedures"] == ["proximal"]
    assert "e_F(G_star)" in proc.stdout
    # the console: no third-party noise, one line per round, the rest in run.log
    console = [
        seg
        for seg in re.split(r"[\r\n]", proc.stdout + proc.stderr)
        if seg.strip() and not re.search(r"\| *\d+/\d+ \[", seg) and seg.strip() != "\x1b[A"
    ]
    for noise in ("alembic", "DEPRECATED", "FutureWarning", "Aggregated ClientApp-side"):
        assert noise not in proc.stdout + proc.stderr, noise
    assert sum("Diagnosis" in line for line in console) == 1
    assert [line.split(":")[0] for line in console if line.startswith("[proximal] round")] == [
        f"[proximal] round {t}/2" for t in range(3)
    ]
    assert len(console) <= 40, console
    log_text = (out / "run.log").read_text()
    assert "[flwr]" in log_text and "[fedhead.console][INFO] [proximal] round 2/2" in log_text


def _raising_client_app():
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.query()
    def query(msg, context):
        raise RuntimeError("client exploded on purpose")

    return app


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_raising_client_fails_the_run_with_its_reason(tmp_path):
    """The driver's failure path: a ClientApp that raises ends the simulation with an exception
    naming the client's error, results.json marked failed with it, no rounds recorded."""
    from fedhead.driver.simulation import run_federations
    from fedhead.strategies import FederationError

    job = _job(tmp_path, "procedure=exact", "num_clients=2", "rounds=1", "timeouts.exchange=60")
    with pytest.raises(FederationError, match="client exploded on purpose"):
        run_federations([job], show_progress=False, client_app=_raising_client_app())
    res = json.loads((Path(job.output_dir) / "results.json").read_text())
    assert res["status"] == "failed"
    assert "moment exchange" in res["error"] and "client exploded on purpose" in res["error"]
    assert res["rounds"] == [] and res["diagnosis"] is None


@pytest.mark.timeout(120)
def test_a_crashed_engine_ends_the_run(tmp_path, monkeypatch):
    """A simulation engine that dies (here: no Ray actor fits the client resources; the
    driver's preflight that refuses this is switched off) ends the run within seconds instead
    of leaving the ServerApp thread waiting forever; results.json says failed and why."""
    import threading
    import time

    from fedhead.driver import simulation as run_mod

    monkeypatch.setattr(run_mod, "preflight", lambda jobs: None)
    job = _job(
        tmp_path,
        "procedure=exact",
        "num_clients=2",
        "rounds=1",
        "resources.client_cpus=64",
        "resources.evaluate_mse=false",
        "output.tensorboard=false",
    )
    t0 = time.perf_counter()
    from fedhead.federation.watchdog import EngineDied

    with pytest.raises(EngineDied, match="the simulation engine crashed: .*ActorPool is empty"):
        run_mod.run_federations([job], show_progress=False)
    res = json.loads((Path(job.output_dir) / "results.json").read_text())
    assert res["status"] == "failed" and "ActorPool is empty" in res["error"]
    deadline = time.perf_counter() + 10
    while any(t.name != "MainThread" and not t.daemon and t.is_alive() for t in threading.enumerate()):
        assert time.perf_counter() < deadline, [t.name for t in threading.enumerate()]  # no hung ServerApp thread
        time.sleep(0.1)
    assert time.perf_counter() - t0 < 60
