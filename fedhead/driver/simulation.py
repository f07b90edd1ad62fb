"""``fedhead-run``: Hydra config -> ServerApp + ClientApp -> Flower simulation (Ray backend).

* [`run_federations`][fedhead.driver.simulation.run_federations] runs procedures
  ([`fedhead.settings.config.JobConfig`][fedhead.settings.job.JobConfig]) one after another
  in one `flwr.simulation.run_simulation` and returns their results (also written to
  ``<output>/<procedure>/results.json``, atomically after every round, by
  [`fedhead.driver.recorder.RunRecorder`][fedhead.driver.recorder.RunRecorder]).
* [`run_experiment`][fedhead.driver.simulation.run_experiment] runs every procedure of a typed
  config and prints a table of ``e_F`` to ``G_star`` and ``G_cen`` per round.

The ServerApp body is [`fedhead.driver.server.serve`][fedhead.driver.server.serve]; the ClientApp is
[`clients.make_client_app`][fedhead.clients.make_client_app]. ``flwr run .`` uses
[`fedhead.server_app`][fedhead.server_app] and
[`fedhead.client_app`][fedhead.client_app] instead of this driver.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedhead.clients import make_client_app
from fedhead.clients.identity import SimulatedSites
from fedhead.clients.state import simulation_state_dir
from fedhead.clients.store import BackboneStore
from fedhead.driver import ray_session
from fedhead.driver.checks import check_data_once, client_slots, message_window, preflight, uses_cuda
from fedhead.driver.cluster import check_client_fits, check_shared_folder, cluster_address, describe_cluster
from fedhead.driver.console import error_table, local_optimality_note, local_steps_line, start_line
from fedhead.driver.errors import debug_enabled, is_flwr_wrapper, one_line
from fedhead.driver.figures import write_procedures_figure
from fedhead.driver.logs import console, run_logging_active, simulation_logging
from fedhead.driver.ray_session import start_ray, stop_ray
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import finish_job, serve
from fedhead.driver.timing import timing_summary
from fedhead.federation.checkpoint import Checkpoint, ResumeError, check_data, resume_checkpoints
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.federation.protocol import JOB
from fedhead.federation.roster import Roster
from fedhead.federation.watchdog import EngineDied, EngineWatch, end_hung_clients
from fedhead.results import schema
from fedhead.results.io import write_json_atomic
from fedhead.results.schema import Results, Timing
from fedhead.settings.config import JobConfig

log = logging.getLogger(__name__)


def run_federations(
    jobs: list[JobConfig],
    *,
    show_progress: bool = True,
    verbose: bool = False,
    client_app: ClientApp | None = None,
    keep_going: bool = False,
    on_job_end: Callable[[int, Results], None] | None = None,
    parallel: int = 1,
    simulated: SimulatedSites | None = None,
) -> list[dict[str, Any]]:
    """Run procedures one after another in one Flower simulation (Ray backend).

    The ServerApp serves every job in turn ([`serve`][fedhead.driver.server.serve]), the
    ClientApp ([`make_client_app`][fedhead.clients.make_client_app], or ``client_app``) loads each
    message's job; ``num_clients`` virtual SuperNodes share one Ray start and the config's
    resources, and each job writes results.json, TensorBoard events and figures into its
    ``output_dir``. Failures end the run, never hang it: the running jobs are marked ``failed``
    and the error is raised; with ``keep_going=True`` (sweeps) a failed job is recorded and the
    next one runs. ``on_job_end(i, results)`` is called as each job ends; ``parallel > 1`` serves
    that many jobs at once (their clients share the Ray actors). Inside
    [`shared_ray_session`][fedhead.driver.ray_session.shared_ray_session] Ray is reused and left running.
    In secure mode the simulation makes its own roster, a fresh signing key per site (``simulated``, which a
    custom ``client_app`` must share; [`SimulatedSites`][fedhead.clients.identity.SimulatedSites]).
    """
    from flwr.simulation import run_simulation  # lazy: imports Ray (seconds); a sweep's data checks need none

    if not jobs:
        return []
    if not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
    first = jobs[0]
    backend, resumes, recorders = _set_up(jobs, show_progress=show_progress, verbose=verbose)
    if simulated is None and any(job.privacy.secure for job in jobs):
        simulated = SimulatedSites.make(first.settings.num_clients)
    sim = _Simulation(
        jobs,
        recorders,
        show_progress and parallel == 1,
        resumes,
        keep_going=keep_going,
        on_job_end=on_job_end,
        parallel=parallel,
        roster=None if simulated is None else simulated.roster,
    )
    try:
        run_simulation(
            server_app=sim.server_app(),
            client_app=client_app or make_client_app(list(jobs), simulated),
            num_supernodes=first.settings.num_clients,
            backend_name="ray",
            backend_config=backend,
            verbose_logging=verbose,
        )
    except BaseException as exc:
        sim.watch.trip(one_line(exc))  # the ServerApp thread stops waiting (no hang)
        sim.fail_running(exc)
        for rec in recorders:
            rec.wait(raise_errors=False)
        if is_flwr_wrapper(exc):
            raise EngineDied(f"the simulation engine crashed: {one_line(exc)}") from exc
        raise
    finally:
        sim.engine_done.set()
        sim.watch.trip("the simulation ended")
        if not ray_session.shared():
            stop_ray()  # flwr shuts Ray down itself on success; this covers early failures
    if sim.served:
        log.info("simulation teardown (actors, Ray shutdown): %.2f s", time.perf_counter() - sim.served[-1])
    _wait_for_outputs(recorders)
    _check_finished(recorders, raise_error=not keep_going)
    _remove_client_state(jobs, recorders)
    return [r.results.to_dict() for r in recorders]


def _remove_client_state(jobs: list[JobConfig], recorders: list[RunRecorder]) -> None:
    """Remove the private backbones of the jobs that ended (an interrupted one keeps them for
    ``resume=``), unless ``output.keep_client_state``."""
    for job, rec in zip(jobs, recorders):
        if (
            rec.results.status in ("completed", "diagnosed")
            and not job.output.keep_client_state
            and job.state_dir.exists()
        ):
            shutil.rmtree(job.state_dir)


def _set_up(jobs: list[JobConfig], *, show_progress: bool, verbose: bool):
    """Before the engine starts: checks, logging, resume points, data, Ray, the recorders.

    Returns ``(backend_config, resumes, recorders)``."""
    preflight(jobs)
    t_begin = time.perf_counter()
    first = jobs[0]
    for job in jobs[1:]:
        if (job.settings.num_clients, job.resources) != (first.settings.num_clients, first.resources):
            raise ValueError("jobs of one simulation must share the client count and the resources")
    backend = first.resources.backend_config(first.settings.num_clients, uses_cuda(first))
    address = cluster_address(first.resources.ray_address)
    if address:
        backend["init_args"]["address"] = address
    simulation_logging(backend["init_args"], verbose=verbose)
    if not verbose and not debug_enabled() and not run_logging_active():
        # flwr logs an engine crash's traceback (twice); the error says it once
        logging.getLogger("flwr").setLevel(logging.CRITICAL)
    resumes = prepare_resume(jobs)
    t_ray = _prepare_and_start_ray(jobs, backend["init_args"])
    for job, ckpt in zip(jobs, resumes):
        if ckpt is None and job.state_dir.exists():
            shutil.rmtree(job.state_dir)
    # figures are drawn on a background thread while the clients train (waited for later)
    recorders = [RunRecorder(job, show_progress=show_progress, background=True) for job in jobs]
    recorders[0].t_start = t_begin  # the first federation's wall time includes data + Ray start
    for rec in recorders:
        rec.base_timing = Timing(ray_init_seconds=t_ray)
    return backend, resumes, recorders


def prepare_resume(jobs: list[JobConfig]) -> list[Checkpoint | None]:
    """The checkpoint every job continues from (all None unless ``resume=``); checks that the data
    are those of the first start ([`check_data`][fedhead.federation.checkpoint.check_data]: site
    keys, standardisation, input statistics) and that the interrupted run's client state (the
    private backbones of the checkpointed round) is there. Removes nothing."""
    if not any(job.resume for job in jobs):
        return [None] * len(jobs)
    ckpts = resume_checkpoints(jobs)
    for job, ckpt in zip(jobs, ckpts):
        if ckpt is not None:
            check_data(ckpt, check_data_once(job))
        if ckpt is None or ckpt.round in (0, job.settings.rounds) or job.procedure.exact:
            continue  # nothing stored yet, nothing left to train, or no private backbones
        store = BackboneStore(simulation_state_dir(job, 0))
        missing = [pid for pid in range(job.settings.num_clients) if not store.path(pid, ckpt.round).is_file()]
        if missing:
            raise ResumeError(
                f"cannot resume {job.output_dir}: the private backbones of round {ckpt.round} of partitions "
                f"{missing} are not under {store.root} (removed after a completed run unless "
                f"output.keep_client_state=true)"
            )
        log.info("%s: resuming after round %d of %d (%s)", job.name, ckpt.round, job.settings.rounds, ckpt.path)
    return ckpts


def _prepare_and_start_ray(jobs: list[JobConfig], init_args: dict[str, Any]) -> float:
    """Prepare every job's data (cache warm-up, regime check), then start Ray; return Ray's start time.

    The data come first so that a data or regime error ends the run before Ray starts."""
    for job in jobs:
        check_data_once(job)
    t_ray = time.perf_counter()
    start_ray(init_args)
    if init_args.get("address"):
        join_checks(jobs, str(init_args["address"]))
    return time.perf_counter() - t_ray


def join_checks(jobs: list[JobConfig], address: str) -> None:
    """On a joined cluster, before any run: one console line with its nodes, CPUs and GPUs; one
    line refusing a cluster on which one client does not fit, or whose nodes do not all see the
    clients' state folder ([`fedhead.driver.cluster`][fedhead.driver.cluster])."""
    info = describe_cluster()
    console.info("%s", info.line(address))
    res = jobs[0].resources
    gpus = res.backend_config(jobs[0].settings.num_clients, uses_cuda(jobs[0]))["client_resources"]["num_gpus"]
    check_client_fits(info, float(res.client_cpus), float(gpus))
    for job in jobs:
        if not job.procedure.exact:  # exact clients keep no backbone
            check_shared_folder(info, job.state_dir)


class _Simulation:
    """The driver's ServerApp over several jobs, with their recorders, grids and clocks."""

    def __init__(
        self,
        jobs: list[JobConfig],
        recorders: list[RunRecorder],
        show_progress: bool,
        resumes: list[Checkpoint | None] | None = None,
        *,
        keep_going: bool = False,
        on_job_end: Callable[[int, Results], None] | None = None,
        parallel: int = 1,
        roster: Roster | None = None,
    ):
        self.jobs, self.recorders, self.show_progress = jobs, recorders, show_progress
        self.roster = roster
        self.keep_going, self.on_job_end, self.parallel = keep_going, on_job_end, parallel
        self.resumes = resumes or [None] * len(jobs)
        self.grids: dict[int, ProgressGrid] = {}
        self.sim_start: dict[int, float] = {}
        self.served: list[float] = []
        self.t_sim = time.perf_counter()
        self.watch = EngineWatch()
        self.engine_done = threading.Event()  # run_simulation returned

    def server_app(self) -> ServerApp:
        app = ServerApp()

        @app.main()
        def _main(grid: Grid, context: Context) -> None:
            try:
                self.serve_all(grid)
            finally:  # a ClientApp still running (hung) must not keep the engine, hence the run, waiting
                threading.Thread(
                    target=end_hung_clients, args=(self.engine_done,), daemon=True, name="fedhead-end-hung-clients"
                ).start()

        self.t_sim = time.perf_counter()
        return app

    def serve_all(self, grid: Grid) -> None:
        if self.parallel == 1:
            for i in range(len(self.jobs)):
                self.serve_one(grid, i)
        else:
            with ThreadPoolExecutor(self.parallel, thread_name_prefix="fedhead-job") as pool:
                futures = [pool.submit(self.serve_one, grid, i) for i in range(len(self.jobs))]
                for fut in futures:
                    fut.result()  # the first error, once every job ended
        self.served.append(time.perf_counter())

    def serve_one(self, grid: Grid, i: int) -> None:
        job, rec = self.jobs[i], self.recorders[i]
        if self.watch.tripped:
            return  # the engine died while this job waited for a thread
        self.sim_start[i] = time.perf_counter()
        if i:
            rec.t_start = self.sim_start[i]
        log.info(
            "running procedure %s (%d rounds x %d local epochs, %d clients, data %s, model %s)",
            job.name,
            job.settings.rounds,
            job.settings.local_epochs,
            job.settings.num_clients,
            job.dataset.name,
            job.model.name,
        )
        try:
            self.grids[i] = serve(
                grid,
                job,
                rec,
                show_progress=self.show_progress,
                message_config={JOB: i},
                watch=self.watch,
                resume=self.resumes[i],
                window=message_window(job),
                concurrency=client_slots(job),
                data_record=check_data_once(job),  # checked before Ray started: the process's record
                roster=self.roster,
            )
            finish_job(job, rec, self.grids[i], self.sim_start[i] if i else self.t_sim, time.perf_counter())
        except Exception as exc:
            if not self.keep_going or self.watch.tripped:
                if self.parallel > 1:
                    self.watch.trip(f"{job.name}: {one_line(exc)}")  # the other jobs stop waiting
                raise
            log.error("%s failed: %s", job.output_dir, one_line(exc))
            if rec.results.status == "running":
                timing = timing_summary(rec.results.rounds, self.grids.get(i), self.sim_start[i], time.perf_counter())
                rec.finish("failed", error=one_line(exc), timing=timing)
        if self.on_job_end is not None:
            self.on_job_end(i, rec.results)

    def fail_running(self, exc: BaseException) -> None:
        for i, rec in enumerate(self.recorders):
            if rec.results.status == "running":
                t0 = self.sim_start.get(i, self.t_sim)
                timing = timing_summary(rec.results.rounds, self.grids.get(i), t0, time.perf_counter())
                rec.finish("failed", error=one_line(exc), timing=timing)


def _wait_for_outputs(recorders: list[RunRecorder]) -> None:
    """Wait for the figures drawn in the background (mostly done during the engine's teardown);
    the wait is recorded with the last procedure as ``timing.figures_wait_seconds``."""
    t0 = time.perf_counter()
    for rec in recorders:
        rec.wait()
    if recorders and recorders[-1].results.status == "completed":
        recorders[-1].add_timing(figures_wait_seconds=time.perf_counter() - t0)


def _check_finished(recorders: list[RunRecorder], *, raise_error: bool = True) -> None:
    failed = [r for r in recorders if r.results.status not in ("completed", "diagnosed")]
    for rec in failed:
        if rec.results.status == "running":
            rec.finish("failed", error="the simulation ended before this procedure finished")
    if failed and raise_error:
        raise RuntimeError(
            f"procedures {[r.job.name for r in failed]} did not finish (see the log and their results.json)"
        )


def run_experiment(cfg: Any, output_dir: str | Path, *, show_progress: bool = True) -> list[dict[str, Any]]:
    """Run every procedure of a
    [`fedhead.settings.config.FedheadConfig`][fedhead.settings.job.FedheadConfig] one after another."""
    jobs = cfg.jobs(output_dir)
    if cfg.settings.diagnose_only:
        jobs = jobs[:1]  # the diagnosis depends on the data and penalties only
    root = cfg.output_root(output_dir)
    console.info("%s", start_line(cfg.experiment.name, jobs, root))
    raw = run_federations(jobs, show_progress=show_progress)
    results = [schema.from_dict(r) for r in raw]
    table = error_table(results)
    summary = {
        "schema_version": schema.SCHEMA_VERSION,
        "experiment": cfg.experiment.name,
        "procedures": [r.name for r in results],
        "results": [str(Path(j.output_dir) / schema.FILE_NAME) for j in jobs],
        "diagnosis": results[0].diagnosis if results else None,
        "final": {
            r.name: {"e_f_star": last.e_f_star, "e_f_cen": last.e_f_cen, "e_f_within": last.e_f_within}
            for r in results
            if (last := r.last) is not None
        },
        "table": table,
    }
    if cfg.output.figures and len([r for r in results if len(r.rounds) > 1]) > 1:
        summary["figures"] = [write_procedures_figure(results, root / "procedures.png").name]
    write_json_atomic(root / "summary.json", summary)
    if table:
        print(
            "\nRelative error of the shared head Gram G_t per round (local gap: the largest relative gap of a "
            "client's trained objective to its optimum):"
        )
        print(table)
    steps = [line for r in results if (line := local_steps_line(r))]
    if steps:
        print("\n" + "\n".join(steps))
    for r in results:
        note = local_optimality_note(r)
        if note:
            print(f"\n{note}")
    print(f"\nOutputs: {root}")
    return raw
