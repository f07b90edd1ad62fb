"""Helpers of the report tests (importable: tests/report is on sys.path): a tiny real sweep of
Flower federations (free features, 2 rounds) in the layout of fedhead-sweep."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

PROCEDURES = ("ordinary", "proximal", "corrected_proximal")
SEEDS = (0, 1)
SETTING = "hopper"


def _jobs(root: Path, cache: Path):
    """One job per (seed, procedure), writing into ``<root>/runs/main/hopper/<procedure>/s<seed>``."""
    from fedhead.settings.config import compose_config, load_config

    jobs, runs = [], []
    for seed in SEEDS:
        cfg = load_config(
            compose_config(
                [
                    "model=free",
                    "model.feature_dim=12",
                    "dataset.n_train=300",
                    f"dataset.cache_dir={cache}",
                    "num_clients=3",
                    "experiment=single",
                    f"experiment.procedures=[{','.join(PROCEDURES)}]",
                    "rounds=2",
                    "local_epochs=150",
                    "train.lr=3e-3",
                    "local_tol=1e-4",
                    f"seed={seed}",
                    "output.figures=false",
                    "output.tensorboard=false",
                    "resources.client_cpus=1",
                ]
            )
        )
        for job in cfg.jobs(root / "unused"):
            rid = f"main/{SETTING}/{job.name}/s{seed}"
            out = root / "runs" / rid
            if job.name in ("ordinary", "proximal"):
                # no closing solves: these clients stop above the 1e-3 gap, so Table 4's claims on them
                # are "not testable" (test_report.py); corrected proximal keeps them (it reaches G_cen)
                job = dataclasses.replace(job, train=dataclasses.replace(job.train, solve_last_layer=False))
            jobs.append(dataclasses.replace(job, output_dir=out, state_dir=out / "client_state"))
            runs.append(_manifest_run(rid, job.name, seed, "completed", job.config_hash))
    return jobs, runs


def _manifest_run(
    rid: str, procedure: str, seed: int, status: str, config_hash: str = "", sweep: str = "main", **extra
) -> dict:
    run = {
        "id": rid,
        "sweep": sweep,
        "setting": SETTING,
        "dataset": SETTING,
        "model": "free",
        "procedure": procedure,
        "seed": seed,
        "params": {},
        "status": status,
        "config_hash": config_hash,
        "wall_seconds": 1.0,
        "dir": f"runs/{rid}",
        "error": None,
        "needs": None,
    }
    run.update(extra)
    return run


def write_manifest(folder: Path, sweep: str, runs: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "schema_version": 1,
        "sweep": sweep,
        "scale": "smoke",
        "created": "2026-12-01T00:00:00+00:00",
        "runs": runs,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def build_sweeps(root: Path) -> Path:
    """``<root>/main`` (3 procedures x 2 seeds, real runs, plus a skipped and a failed entry) and
    ``<root>/prediction`` (copies of the same runs under a prediction manifest); returns ``root``."""
    from fedhead.driver.simulation import run_federations

    main = root / "main"
    jobs, runs = _jobs(main, root / "cache")
    run_federations(jobs, show_progress=False)
    runs.append(
        _manifest_run(
            "main/shapes3d/ordinary/s0", "ordinary", 0, "skipped", setting="shapes3d", needs="data/shapes3d/3dshapes.h5"
        )
    )
    runs.append(
        _manifest_run(
            "main/beijing/proximal/s0",
            "proximal",
            0,
            "failed",
            setting="beijing",
            error="RuntimeError: the simulation engine crashed",
        )
    )
    write_manifest(main, "main", runs)
    pred_runs = []
    for run in runs[: len(PROCEDURES) * len(SEEDS)]:
        rid = run["id"].replace("main/", "prediction/", 1)
        shutil.copytree(main / run["dir"], root / "prediction" / "runs" / rid)
        pred_runs.append(dict(run, id=rid, sweep="prediction", dir=f"runs/{rid}"))
    write_manifest(root / "prediction", "prediction", pred_runs)
    return root
