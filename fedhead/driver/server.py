"""The ServerApp body: [`serve`][fedhead.driver.server.serve] (the strategy of a job, the moment
exchange, the rounds, the checkpoints), used by the simulation driver and by
[`deployment_main`][fedhead.driver.server.deployment_main], the ServerApp of ``flwr run .``, which
reads its job from the run config and can resume from its output folder.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid

from fedhead import models
from fedhead.data.table_config import TableConfig
from fedhead.driver.console import diagnosis_lines, error_table
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.timing import timing_summary
from fedhead.federation.checkpoint import (
    Checkpoint,
    ResumeError,
    ServerState,
    check_data,
    checkpoint_path,
    load_for_resume,
    write_checkpoint,
)
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.federation.roster import Roster
from fedhead.federation.watchdog import EngineWatch
from fedhead.settings.config import JobConfig, job_from_context
from fedhead.strategies import HeadAveraging, RunObserver, make_strategy
from fedhead.strategies.exchange import ConfigValue, MomentExchange

log = logging.getLogger(__name__)


def initial_head(job: JobConfig, n_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """The common initial head ``Linear(P, C)`` from the run seed (float64 arrays)."""
    return models.initial_head(job.model.feature_dim, n_targets, job.settings.seed)


def measures_mismatch(job: JobConfig) -> bool:
    """Whether the job takes the round-1 mismatch measurement (``measure_mismatch=true``): head
    averaging of trained clients without alignment (not ``aligned*``, ``full_model``, ``exact``,
    whose heads are aligned, averaged with their backbones, or not trained)."""
    proc = job.procedure
    return job.settings.measure_mismatch and proc.strategy_kind == "head" and not proc.exact


def make_job_strategy(
    job: JobConfig,
    observer: RunObserver,
    message_config: dict[str, ConfigValue] | None = None,
    roster: Roster | None = None,
) -> HeadAveraging:
    """The strategy of ``job``'s procedure ([`make_strategy`][fedhead.strategies.variants.make_strategy]);
    ``roster``: the sites' signing keys of secure mode."""
    if job.settings.measure_mismatch and not measures_mismatch(job):
        log.info(
            "%s: measure_mismatch=true applies to trained head averaging without alignment; "
            "not measured for this procedure",
            job.name,
        )
    return make_strategy(
        job.procedure.strategy_kind,
        measure_mismatch=measures_mismatch(job),
        lambda_h=job.settings.lambda_h,
        lambda_w=job.settings.lambda_w,
        min_nodes=job.settings.num_clients,
        gamma=job.procedure.gamma,
        centered=job.procedure.centered,
        observer=observer,
        evaluate_mse=job.resources.evaluate_mse and not job.procedure.exact,
        message_config=message_config,
        allow_outside_regime=bool(job.dataset.allow_outside_regime),
        timeouts=job.timeouts,
        min_clients=job.failure.min_clients,
        site_statistics=site_statistics(job),
        trust=job.trust,
        privacy=job.privacy,
        roster=roster,
        private_heads=job.private_heads,
        exchange_noise=job.exchange_row_noise,
    )


def site_statistics(job: JobConfig) -> tuple[str, str] | None:
    """``(standardize_targets, standardize_inputs)`` when the job's clients read only their own
    file (a site-local ``dataset=table`` run: the statistics exchange), else None."""
    ds = job.dataset
    if not (isinstance(ds, TableConfig) and ds.site_local()):
        return None
    return ds.standardize_targets, ds.standardize_inputs


def serve(
    grid: Grid,
    job: JobConfig,
    recorder: RunRecorder,
    *,
    show_progress: bool = True,
    message_config: dict[str, ConfigValue] | None = None,
    watch: EngineWatch | None = None,
    resume: Checkpoint | None = None,
    window: int | None = None,
    concurrency: int | None = None,
    data_record: dict[str, Any] | None = None,
    roster: Roster | None = None,
) -> ProgressGrid:
    """The ServerApp body: moment exchange, diagnosis, then the rounds of the job's procedure.

    ``watch`` ([`fedhead.federation.watchdog.EngineWatch`][fedhead.federation.watchdog.EngineWatch]): every wait for
    replies ends with [`fedhead.federation.watchdog.EngineDied`][fedhead.federation.watchdog.EngineDied] once it trips
    (the simulation engine died). The job's ``timeouts`` bound every wait, the straggler rule included (a client that
    never answers is given up on once the others have replied;
    [`fedhead.settings.limits.Timeouts.straggler_deadline`][fedhead.settings.limits.Timeouts.straggler_deadline]). After
    every complete round the server state is checkpointed into ``<job.output_dir>/checkpoint.npz``
    ([`fedhead.federation.checkpoint`][fedhead.federation.checkpoint]); ``resume`` (a checkpoint read by
    [`fedhead.federation.checkpoint.load_for_resume`][fedhead.federation.checkpoint.load_for_resume]) continues after
    its round.
    ``window``: see [`fedhead.federation.progress_grid.ProgressGrid`][fedhead.federation.progress_grid.ProgressGrid]
    (the simulation's messages in flight);
    ``concurrency``: the clients a simulation runs at once (None: all, a deployment);
    ``data_record`` ([`fedhead.data.data_record`][fedhead.data.data_record]; None where the server
    has no data, a deployment): kept in every checkpoint, for a resume to compare; a site-local
    deployment's server takes it from the statistics exchange instead (the site keys, the pooled
    standardisation and each site's input statistics) and compares it on a resume.
    ``roster``: the federation's roster of the sites' signing keys, which ``privacy.mode=secure`` needs (a
    simulation makes its own, a deployment's server reads the run config's ``roster`` file).
    """
    pgrid = ProgressGrid(grid, label=job.name, show=show_progress)
    pgrid.watch = watch
    pgrid.timeouts = job.timeouts  # the straggler rule ends the wait for a client that never answers
    pgrid.window = window
    pgrid.concurrency = concurrency  # a simulation's clients queue for its slots: the straggler rule waits per wave
    strategy = make_job_strategy(job, recorder, message_config, roster)
    record = {"data": data_record}

    def exchanged(exchange: MomentExchange) -> None:
        """A site-local deployment's server, which reads no data itself, learns the data record
        from the statistics exchange: a resume compares it with the checkpoint's, every checkpoint
        keeps it (a simulation's driver passes its own record, by file name, checked before Ray starts)."""
        if exchange.site_record is None or data_record is not None:
            return
        if resume is not None:
            check_data(resume, dict(exchange.site_record))
        record["data"] = dict(exchange.site_record)

    strategy.run(
        pgrid,
        lambda c: initial_head(job, c),
        job.settings.rounds,
        diagnose_only=job.settings.diagnose_only,
        resume=None if resume is None else resume.state,
        on_exchange=exchanged,
        on_round_end=None if job.settings.diagnose_only else checkpointer(job, lambda: record["data"]),
        on_resume=recorder.on_resume,
    )
    return pgrid


def checkpointer(job: JobConfig, data_record: Callable[[], dict[str, Any] | None]):
    """The function writing a job's server state (and the run's data record, as ``data_record()``
    returns it) after every round (atomically)."""
    path = checkpoint_path(job.output_dir)

    def write(state: ServerState) -> None:
        write_checkpoint(path, state, config_hash=job.config_hash, procedure=job.name, data=data_record())

    return write


def finish_job(job: JobConfig, rec: RunRecorder, pgrid: ProgressGrid, t0: float, t1: float) -> None:
    """Close a job's recorder: ``completed``/``diagnosed`` when every round ran, else ``failed`` (raises)."""
    expected = -1 if job.settings.diagnose_only else job.settings.rounds
    done = max(rec.records) if rec.records else -1
    timing = timing_summary(rec.results.rounds, pgrid, t0, t1)
    if rec.results.diagnosis is None or done < expected:
        rec.finish("failed", error=f"the federation stopped after round {done} of {expected}", timing=timing)
        raise RuntimeError(f"{job.name}: the federation stopped after round {done} of {expected}")
    rec.finish("diagnosed" if job.settings.diagnose_only else "completed", timing=timing)


#: attribute set on the handlers deployment_logging adds (so a second call adds none)
_HANDLER_MARK = "_fedhead"


def deployment_logging(job: JobConfig) -> None:
    """Console (streamed by ``flwr run --stream``) and ``<output>/run.log`` logging of the
    fedhead loggers in a deployed ServerApp, where no Hydra sets logging up."""
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    Path(job.output_dir).mkdir(parents=True, exist_ok=True)
    for logger in (logging.getLogger("fedhead"),):
        logger.setLevel(logging.INFO)
        if not any(getattr(h, _HANDLER_MARK, False) for h in logger.handlers):
            for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(Path(job.output_dir) / "run.log")):
                handler.setFormatter(fmt)
                setattr(handler, _HANDLER_MARK, True)
                logger.addHandler(handler)
        logger.propagate = False


def deployment_resume(job: JobConfig) -> Checkpoint | None:
    """The checkpoint a deployed ServerApp continues from (``resume`` in the run config), read
    before anything is written:
    [`fedhead.federation.checkpoint.ResumeError`][fedhead.federation.checkpoint.ResumeError] when there is
    none or it was written with another config or procedure (the rule of ``fedhead-run resume=``)."""
    if not job.resume:
        return None
    ckpt = load_for_resume(job.output_dir, config_hash=job.config_hash, procedure=job.name, rounds=job.settings.rounds)
    if ckpt is None:
        raise ResumeError(
            f"cannot resume {job.output_dir}: no {checkpoint_path(job.output_dir).name} there "
            f"(resume=true continues the run of the same output-dir; is it the folder of a "
            f"fedhead ServerApp run?)"
        )
    log.info(
        "%s: resuming after round %d of %d (%s); the clients continue from their node-local state",
        job.name,
        ckpt.round,
        job.settings.rounds,
        ckpt.path,
    )
    return ckpt


#: The run config key of the federation's roster file (``privacy.mode=secure``; ``fedhead-keys roster`` makes it).
ROSTER_RUN_KEY = "roster"


def deployment_roster(context: Context) -> Roster | None:
    """The roster file the run config names (``flwr run . --run-config "roster='/keys/roster.json'"``), if any."""
    path = context.run_config.get(ROSTER_RUN_KEY)
    return Roster.load(str(path)) if path else None


def deployment_main(grid: Grid, context: Context) -> None:
    """The body of the ServerApp of ``flwr run .``: the job from the run config, then
    [`serve`][fedhead.driver.server.serve]."""
    job = job_from_context(context)
    deployment_logging(job)
    try:
        resume = deployment_resume(job)
    except ResumeError as exc:
        log.error("%s", exc)  # one line in the streamed log; results.json stays as it was
        raise
    recorder = RunRecorder(job)
    run = grid.run  # None only on a test's in-process grid
    if run is not None:  # the FAB identifies the code when no git checkout is at hand
        recorder.results.provenance["fab"] = {
            "fab_id": run.fab_id,
            "fab_version": run.fab_version,
            "fab_hash": run.fab_hash,
            "run_id": int(run.run_id),
        }
    recorder.results.provenance["run_config"] = dict(context.run_config)
    recorder.write()
    log.info(
        "running procedure %s (%d rounds x %d local epochs, %d clients, data %s, model %s) -> %s",
        job.name,
        job.settings.rounds,
        job.settings.local_epochs,
        job.settings.num_clients,
        job.dataset.name,
        job.model.name,
        job.output_dir,
    )
    t0 = time.perf_counter()
    pgrid = None
    try:
        pgrid = serve(grid, job, recorder, resume=resume, roster=deployment_roster(context))
    except BaseException as exc:
        recorder.finish(
            "failed",
            error=f"{type(exc).__name__}: {exc}",
            timing=timing_summary(recorder.results.rounds, pgrid, t0, time.perf_counter()),
        )
        raise
    finish_job(job, recorder, pgrid, t0, time.perf_counter())
    if recorder.results.diagnosis:
        log.info("diagnosis:\n  %s", "\n  ".join(diagnosis_lines(recorder.results.diagnosis)))
    table = error_table([recorder.results])
    if table:
        log.info("relative error of the shared head Gram G_t per round:\n%s", table)
    if not job.output.keep_client_state and job.state_dir.exists():
        shutil.rmtree(job.state_dir, ignore_errors=True)  # clients on this machine (default state dir)
