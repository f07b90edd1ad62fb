"""Run a sweep: plan -> skip finished runs -> check data -> pack runs into simulations -> manifest.

[`run_sweep`][fedhead.sweep.runner.run_sweep] is the entry point of ``fedhead-sweep``; what it
guarantees (restarts recompute nothing, missing data skip a setting, one Ray session per sweep)
is in its docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhead.analysis.constraints import ConfigError
from fedhead.data.base import MissingDataError
from fedhead.driver.checks import check_data_once, data_key, uses_cuda
from fedhead.driver.cluster import cluster_address, describe_cluster
from fedhead.driver.errors import one_line
from fedhead.driver.logs import SWEEP, simulation_logging
from fedhead.driver.ray_session import shared_ray_session
from fedhead.driver.simulation import run_federations
from fedhead.progress import progress
from fedhead.results import schema
from fedhead.results.io import provenance
from fedhead.results.schema import Results
from fedhead.settings.config import JobConfig, compose_config, load_config
from fedhead.settings.job import config_hash
from fedhead.sweep.manifest import Manifest, run_dir
from fedhead.sweep.presets import plan
from fedhead.sweep.specs import RunSpec

log = logging.getLogger(SWEEP)
#: attempts of a simulation whose engine died (the runs it did not finish go to the next one)
ENGINE_ATTEMPTS = 2


@dataclass(frozen=True)
class SweepConfig:
    """A typed ``fedhead-sweep`` invocation (built once by
    [`fedhead.cli.sweep.typed_config`][fedhead.cli.sweep.typed_config]).

    ``data_roots`` maps a data set name to the folder of its published files (given once for the
    sweep); ``run_overrides`` are appended to every run (``device=cuda``, ``resources.*``);
    ``seeds`` / ``settings`` narrow the preset, ``runs`` (shell patterns of run ids) picks runs of it.
    ``reuse``: other sweep folders whose finished runs are copied instead of run again where a run
    has the same config (``sweep=all``: main's runs in centering, alignment, prediction, ...).
    ``on_run_end(spec, status, wall_seconds)`` is called as each run ends; the text it returns (if
    any) ends the run's console line (``sweep=all``: the time left).
    """

    sweep: str
    scale: str
    out: Path
    data_roots: dict[str, str] = field(default_factory=dict)
    run_overrides: tuple[str, ...] = ()
    seeds: tuple[int, ...] | None = None
    settings: tuple[str, ...] | None = None
    runs: tuple[str, ...] | None = None
    show_progress: bool = True
    parallel_runs: int = 1
    reuse: tuple[Path, ...] = ()
    on_run_end: Callable[[RunSpec, str, float | None], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.parallel_runs, int) or self.parallel_runs < 1:
            raise ConfigError(f"parallel_runs must be an integer >= 1, got {self.parallel_runs!r}")


@functools.lru_cache(maxsize=4096)
def _composed(overrides: tuple[str, ...]):
    """The loaded config of ``overrides`` (cached: ``sweep=all`` plans every preset, then runs them)."""
    return load_config(compose_config(list(overrides)))


def build_job(spec: RunSpec, out: Path, data_roots: dict[str, str], run_overrides: Sequence[str] = ()) -> JobConfig:
    """The [`JobConfig`][fedhead.settings.job.JobConfig] of one run, writing into ``<out>/runs/<id>``."""
    overrides = list(spec.overrides)
    root = data_roots.get(spec.dataset)
    if root:
        overrides.append(f"dataset.root={root}")
    overrides += list(run_overrides)
    job = _composed(tuple(overrides)).jobs(out)[0]
    folder = out / run_dir(spec)
    return dataclasses.replace(job, output_dir=folder, state_dir=folder / "client_state")


def finished(job: JobConfig) -> bool:
    """True when ``results.json`` of the job's folder is complete for the same config."""
    try:
        res = schema.read(Path(job.output_dir) / schema.FILE_NAME)
    except (OSError, schema.SchemaError):
        return False
    return res.status == "completed" and config_hash(res.config) == job.config_hash


@dataclass(frozen=True)
class FinishedRun:
    """A completed run of another sweep folder: its folder and the manifest's wall time."""

    folder: Path
    wall_seconds: float | None


def reuse_index(folders: Sequence[str | Path]) -> dict[str, FinishedRun]:
    """Config hash -> a completed run with a results.json, over the manifests of ``folders``
    (missing folders and unreadable manifests are passed over)."""
    index: dict[str, FinishedRun] = {}
    for folder in folders:
        path = Path(folder) / "manifest.json"
        try:
            runs = json.loads(path.read_text()).get("runs", [])
        except (OSError, ValueError, AttributeError):
            continue
        for run in runs:
            if not isinstance(run, dict) or run.get("status") != "completed" or not run.get("config_hash"):
                continue
            src = Path(folder) / str(run.get("dir") or f"runs/{run.get('id')}")
            if (src / schema.FILE_NAME).is_file():
                index.setdefault(str(run["config_hash"]), FinishedRun(src, run.get("wall_seconds")))
    return index


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def copy_run(src: Path, job: JobConfig) -> bool:
    """Copy (hard-link where it can) the run folder ``src`` into the job's folder; True when the
    copy is a finished run of the job's config. A copy that is not is removed."""
    dst = Path(job.output_dir)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("client_state"))
    if finished(job):
        return True
    shutil.rmtree(dst, ignore_errors=True)
    return False


def check_data(job: JobConfig) -> tuple[str, str | None, str | None]:
    """``(status, error, needs)`` of a job's data: ``("ok", None, None)``, ``("skipped", None,
    what is missing)`` or ``("failed", the error line, None)``. Loads (or generates) the data set
    once in the driver, which warms the cache the Ray workers read."""
    try:
        check_data_once(job)
    except MissingDataError as exc:
        return "skipped", None, f"{exc.what} (looked in {exc.looked_in}; from {exc.where_to_get})"
    except Exception as exc:  # noqa: BLE001 - recorded in the manifest, the sweep goes on
        return "failed", one_line(exc), None
    return "ok", None, None


@dataclass
class SweepResult:
    """What a sweep did: the manifest and the runs run now (ids)."""

    manifest: Manifest
    ran: list[str]
    wall_seconds: float

    @property
    def counts(self) -> dict[str, int]:
        return self.manifest.counts()


def run_sweep(cfg: SweepConfig) -> SweepResult:
    """Run (or continue) a sweep; returns when every run is done.

    * Every run is a `JobConfig` built from its `RunSpec` overrides exactly as ``fedhead-run``
      would build it, writing into ``<out>/runs/<id>``.
    * A run whose ``results.json`` is complete for the same config hash is not run again:
      restarting a finished sweep recomputes nothing. Failed runs are retried on the next start.
    * Data are checked in the driver before Ray starts; a setting whose files are missing is
      ``skipped`` with the file it needs, and the sweep goes on.
    * Runs sharing a client count and resources are packed into one Flower simulation, and every
      simulation of the sweep shares one Ray session (`fedhead.driver.ray_session.shared_ray_session`):
      the start-up cost is paid once per sweep. ``parallel_runs`` runs of a simulation are served
      at once (their clients share the Ray actors: with fractional ``resources.client_gpus`` a GPU
      node runs several runs on one GPU). A run that fails is recorded with its error and the next
      one runs; if the engine itself dies, the runs not yet finished go to a new simulation once.
    """
    t0 = time.perf_counter()
    out = Path(cfg.out)
    specs = plan(cfg.sweep, cfg.scale, seeds=cfg.seeds, settings=cfg.settings, runs=cfg.runs)
    # every run's config is built (and validated) before anything runs
    jobs = {s.id: build_job(s, out, cfg.data_roots, cfg.run_overrides) for s in specs}
    manifest = Manifest(
        out,
        cfg.sweep,
        cfg.scale,
        extra={
            "data_roots": dict(cfg.data_roots),
            "run_overrides": list(cfg.run_overrides),
            "git_revision": provenance().get("git_revision"),
        },
    )
    todo: list[RunSpec] = []
    index = reuse_index([f for f in cfg.reuse if Path(f).resolve() != out.resolve()])
    reused = 0
    for spec in specs:
        job = jobs[spec.id]
        entry = manifest.add(spec, job.config_hash)
        src = index.get(job.config_hash)
        if finished(job):
            prev = manifest.previous(spec.id) or {}
            entry.update(status="completed", wall_seconds=prev.get("wall_seconds"), reused_from=prev.get("reused_from"))
        elif src is not None and copy_run(src.folder, job):
            entry.update(status="completed", wall_seconds=src.wall_seconds, reused_from=str(src.folder))
            reused += 1
        else:
            todo.append(spec)
    manifest.write()
    log.info(
        "sweep %s (%s): %d runs, %d already finished%s, %d to run -> %s",
        cfg.sweep,
        cfg.scale,
        len(specs),
        len(specs) - len(todo),
        f" ({reused} copied from other sweeps)" if reused else "",
        len(todo),
        out,
    )
    todo = _check_all_data(todo, jobs, manifest)
    ran: list[str] = []
    if todo:
        _Packer(todo, jobs, manifest, cfg.show_progress, cfg.parallel_runs, cfg.on_run_end).run(ran)
    manifest.write()
    res = SweepResult(manifest, ran, time.perf_counter() - t0)
    c = res.counts
    log.info(
        "sweep %s done in %.0f s: %d completed, %d failed, %d skipped (manifest %s)",
        cfg.sweep,
        res.wall_seconds,
        c["completed"],
        c["failed"],
        c["skipped"],
        manifest.path,
    )
    return res


def _check_all_data(todo: list[RunSpec], jobs: dict[str, JobConfig], manifest: Manifest) -> list[RunSpec]:
    """Check every distinct data set of the runs to do once; drop (and record) those that cannot run."""
    verdicts: dict[tuple, tuple[str, str | None, str | None]] = {}
    keep = []
    for spec in todo:
        job = jobs[spec.id]
        key = data_key(job)
        if key not in verdicts:
            verdicts[key] = check_data(job)
            if verdicts[key][0] != "ok":
                log.warning("%s: %s", spec.setting, verdicts[key][2] or verdicts[key][1])
        status, error, needs = verdicts[key]
        if status == "ok":
            keep.append(spec)
        else:
            manifest.update(spec.id, status=status, error=error, needs=needs)
    return keep


class _Packer:
    """Packs the runs to do into simulations (one per client count and resources) in one Ray session."""

    def __init__(
        self,
        todo: list[RunSpec],
        jobs: dict[str, JobConfig],
        manifest: Manifest,
        show_progress: bool,
        parallel: int = 1,
        on_run_end: Callable[[RunSpec, str, float | None], str | None] | None = None,
    ):
        self.todo, self.jobs, self.manifest, self.parallel = todo, jobs, manifest, parallel
        self.on_run_end = on_run_end
        self.bar = _progress(len(todo), show_progress)
        self.done = 0
        self._lock = threading.Lock()  # parallel_runs: runs end on several server threads

    def groups(self, specs: list[RunSpec]) -> list[list[RunSpec]]:
        by: dict[Any, list[RunSpec]] = {}
        for s in specs:
            job = self.jobs[s.id]
            by.setdefault((job.settings.num_clients, job.resources), []).append(s)
        # within a simulation, runs of one data set follow each other (the clients' data cache)
        return [sorted(g, key=lambda s: (s.dataset, s.setting)) for g in by.values()]

    def run(self, ran: list[str]) -> None:
        first = self.jobs[self.todo[0].id]
        init_args = first.resources.backend_config(first.settings.num_clients, uses_cuda(first))["init_args"]
        address = cluster_address(first.resources.ray_address)
        if address:  # RAY_ADDRESS: the sweep joins that cluster (driver/cluster.py)
            init_args["address"] = address
        simulation_logging(init_args)  # Ray's worker output off the console (before Ray starts)
        with shared_ray_session(init_args):
            if address:  # joined: one line with what the cluster has, before the first run
                log.info("%s", describe_cluster().line(address))
            for group in self.groups(self.todo):
                self.run_group(group, ran)
        self.bar.close()

    def run_group(self, group: list[RunSpec], ran: list[str]) -> None:
        pending = list(group)
        for attempt in range(1, ENGINE_ATTEMPTS + 1):
            jobs = [self.jobs[s.id] for s in pending]
            try:
                run_federations(
                    jobs,
                    show_progress=False,
                    keep_going=True,
                    parallel=self.parallel,
                    on_job_end=lambda i, res, specs=pending: self.job_end(specs[i], res, ran),
                )
            except Exception as exc:  # noqa: BLE001 - the engine died: the unfinished runs go again
                left = [s for s in pending if self.manifest.entry(s.id)["status"] == "pending"]
                log.error(
                    "simulation failed (%s); %d run(s) unfinished%s",
                    one_line(exc),
                    len(left),
                    ", retrying them" if attempt < ENGINE_ATTEMPTS and left else "",
                )
                pending = left
                if attempt == ENGINE_ATTEMPTS:
                    for s in left:
                        self.manifest.update(s.id, status="failed", error=f"simulation failed: {one_line(exc)}")
                        self.bar.update(1)
                if not pending:
                    return
                continue
            return

    def job_end(self, spec: RunSpec, results: Results, ran: list[str]) -> None:
        status = "completed" if results.status == "completed" else "failed"
        wall = results.timing.total_seconds or None
        error = results.error or None
        nodes = results.provenance.get("ray_nodes")  # where its clients trained (a cluster: several)
        self.manifest.update(spec.id, status=status, error=error, wall_seconds=wall, nodes=nodes)
        with self._lock:
            ran.append(spec.id)
            self.done += 1
            done = self.done
            self.bar.update(1)
        last = results.last
        err = None if last is None else last.e_f_reference
        gap = None if last is None else last.max_trained_gap
        tail = self.on_run_end(spec, status, wall) if self.on_run_end is not None else None
        log.info(
            "[%d/%d] %s %s in %.1f s%s%s%s",
            done,
            len(self.todo),
            spec.id,
            status,
            wall or 0.0,
            "" if err is None else f", e_F(G_T, G_{results.reference}) {err:.3g}",
            "" if gap is None else f", local gap {gap:.2g}",
            f"; {tail}" if tail else "",
        )
        if status == "failed":
            log.warning("%s failed: %s", spec.id, error)


def _progress(total: int, show: bool):
    # off a terminal: no line of its own, every run has one (_Packer.job_end)
    return progress(
        total=total, unit="run", desc="sweep", leave=True, disable=not show, summary=False, dynamic_ncols=True
    )
