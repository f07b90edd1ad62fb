"""A real smoke sweep (``sweep=main scale=smoke`` on Hopper, plus Beijing without its files):
manifest, skipped settings, one Ray session for the sweep, restart that recomputes nothing, and
``fedhead-report`` whose Table 4 equals values recomputed from the runs' results.json.

The runs train the free-feature model for 2 rounds (``run_overrides``, appended after the
preset's, as ``fedhead-sweep`` appends them): what is tested is the sweep's bookkeeping, not the
backbone or the rounds; trained ResMLPs run in ``tests/train``."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from fedhead.federation import protocol
from fedhead.results import schema
from fedhead.sweep import SweepConfig, run_sweep
from fedhead.sweep.presets import MAIN_PROCEDURES

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("ray_session")]  # one Ray start (tests/conftest.py)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    cache = tmp_path_factory.mktemp("cache")
    cfg = SweepConfig(
        sweep="main",
        scale="smoke",
        out=out,
        settings=("hopper", "beijing"),
        run_overrides=(
            f"dataset.cache_dir={cache}",
            "model=free",
            "model.feature_dim=8",
            "local_epochs=60",
            "rounds=2",
        ),
        show_progress=False,
    )
    result = run_sweep(cfg)
    return cfg, result


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_manifest_lists_every_run_with_status_hash_and_time(sweep):
    cfg, result = sweep
    man = _manifest(cfg.out)
    assert (man["sweep"], man["scale"], man["schema_version"]) == ("main", "smoke", 1)
    runs = {r["id"]: r for r in man["runs"]}
    assert len(runs) == 2 * len(MAIN_PROCEDURES)
    for proc in MAIN_PROCEDURES:
        run = runs[f"main/hopper/{proc}/s0"]
        assert run["status"] == "completed", run
        assert run["wall_seconds"] > 0 and run["dir"] == f"runs/main/hopper/{proc}/s0"
        res = json.loads((cfg.out / run["dir"] / "results.json").read_text())
        from fedhead.settings.job import config_hash

        assert res["status"] == "completed" and config_hash(res["config"]) == run["config_hash"]
        assert len(res["rounds"]) == 3 and res["local_optimality"]["last_round_max_trained_gap"] is not None
        assert res["procedure"]["name"] == proc and res["seeds"]["seed"] == 0
        assert not (cfg.out / run["dir"] / "client_state").exists()  # private backbones removed after a run
    for proc in MAIN_PROCEDURES:  # Beijing has no offline generator: skipped with the file it needs
        run = runs[f"main/beijing/{proc}/s0"]
        assert run["status"] == "skipped" and "PRSA_Data_" in run["needs"], run
    assert result.counts == {"pending": 0, "completed": 4, "failed": 0, "skipped": 4}
    assert sorted(result.ran) == sorted(f"main/hopper/{p}/s0" for p in MAIN_PROCEDURES)


def test_a_restarted_finished_sweep_recomputes_nothing(sweep):
    cfg, _ = sweep
    before = {p: p.stat().st_mtime_ns for p in cfg.out.glob("runs/**/results.json")}
    again = run_sweep(cfg)
    assert again.ran == [] and again.counts["completed"] == 4
    assert {p: p.stat().st_mtime_ns for p in cfg.out.glob("runs/**/results.json")} == before


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_report_of_the_sweep_equals_the_runs(sweep, tmp_path):
    from fedhead.cli.report import main

    cfg, _ = sweep
    out = tmp_path / "report"
    assert main([str(cfg.out), "--out", str(out)]) == 0
    rows = {r["procedure"]: r for r in _csv(out / "tables" / "table4.csv")}
    sources = _csv(out / "tables" / "table4_sources.csv")
    for proc in MAIN_PROCEDURES:
        rel = f"runs/main/hopper/{proc}/s0"
        res = json.loads((cfg.out / rel / "results.json").read_text())
        last = res["rounds"][-1]
        ref = "cen" if res["procedure"]["gamma"] > 0 else "star"
        assert float(rows[proc]["endpoint"]) == pytest.approx(statistics.median([last[f"e_f_{ref}"]]), rel=1e-12)
        assert float(rows[proc]["delta_last"]) == pytest.approx(last["delta"], rel=1e-12)
        assert any(s["run_dir"] == rel and s["row"] == proc for s in sources)
    text = (out / "report.md").read_text()
    assert "main/beijing/ordinary/s0" in text and "PRSA_Data_" in text  # skipped runs listed with what they need
    assert (out / "figures" / "curves_main.png").stat().st_size > 0


def _failing_first_job_app(jobs):
    """The real client handlers, except that every message of job 0 raises."""
    from flwr.clientapp import ClientApp

    from fedhead.clients.app import handle_evaluate, handle_query, handle_train

    app = ClientApp()

    def job_of(msg):
        cfg = msg.content.config_records.get(protocol.CONFIG)
        idx = int(cfg.get(protocol.JOB, 0)) if cfg is not None else 0
        if idx == 0:
            raise RuntimeError("job 0 exploded on purpose")
        return jobs[idx]

    @app.query()
    def query(msg, context):
        return handle_query(job_of(msg), msg, context)

    @app.train()
    def train(msg, context):
        return handle_train(job_of(msg), msg, context)

    @app.evaluate()
    def evaluate(msg, context):
        return handle_evaluate(job_of(msg), msg, context)

    return app


@pytest.mark.timeout(300)
def test_a_failed_run_is_recorded_and_the_next_one_runs(tmp_path):
    """keep_going (what the sweep uses): the failing job is marked failed with its reason, the
    next job of the same simulation completes, and the callback sees both."""
    from fedhead.driver.simulation import run_federations
    from fedhead.settings.config import compose_config, load_config

    cfg = load_config(
        compose_config(
            [
                "model=free",
                "procedure=exact",
                "num_clients=2",
                "rounds=1",
                "dataset.n_train=200",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "output.figures=false",
                "output.tensorboard=false",
                "resources.evaluate_mse=false",
                "timeouts.exchange=60",
            ]
        )
    )
    import dataclasses

    base = cfg.jobs(tmp_path / "out")[0]
    jobs = [
        dataclasses.replace(base, output_dir=tmp_path / f"run{i}", state_dir=tmp_path / f"run{i}" / "state")
        for i in range(2)
    ]
    seen = []
    results = run_federations(
        jobs,
        show_progress=False,
        keep_going=True,
        client_app=_failing_first_job_app(jobs),
        on_job_end=lambda i, res: seen.append((i, res.status)),  # a typed Results
    )
    assert [r["status"] for r in results] == ["failed", "completed"]
    assert "job 0 exploded on purpose" in results[0]["error"]
    assert seen == [(0, "failed"), (1, "completed")]
    on_disk = schema.read(tmp_path / "run0" / "results.json")
    assert on_disk.status == "failed" and "exploded" in on_disk.error


@pytest.mark.timeout(300)
def test_concurrent_jobs_keep_their_messages_apart(tmp_path):
    """parallel=2 (what a GPU node uses to pack runs): two exact-rule federations with different
    seeds served at once in one simulation each follow their own exact BW recursion to 1e-10, so
    no reply reached the wrong job."""
    import dataclasses

    from fedhead.driver.simulation import run_federations
    from fedhead.settings.config import compose_config, load_config

    jobs = []
    for seed in (0, 1):
        cfg = load_config(
            compose_config(
                [
                    "model=free",
                    "procedure=exact",
                    "num_clients=3",
                    "rounds=3",
                    "dataset.n_train=300",
                    f"seed={seed}",
                    f"dataset.cache_dir={tmp_path / 'cache'}",
                    "output.figures=true",
                    "output.tensorboard=true",
                    "resources.evaluate_mse=false",
                ]
            )
        )
        job = cfg.jobs(tmp_path / "out")[0]
        jobs.append(dataclasses.replace(job, output_dir=tmp_path / f"s{seed}", state_dir=tmp_path / f"s{seed}" / "st"))
    results = run_federations(jobs, show_progress=False, parallel=2)
    assert [r["status"] for r in results] == ["completed", "completed"]
    g0 = [r["rounds"][0]["gram"] for r in results]
    assert g0[0] != g0[1]  # different seeds: different initial heads
    for res in results:
        assert len(res["rounds"]) == 4
        assert max(r["e_f_recursion"] for r in res["rounds"]) < 1e-10
    assert all((tmp_path / f"s{seed}" / "error_curves.png").stat().st_size > 0 for seed in (0, 1))
