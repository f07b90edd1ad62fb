"""``fedhead-run``: Hydra config -> ServerApp + ClientApp -> Flower simulation (Ray backend).

* :func:`run_federation` runs one procedure (a :class:`fedhead.config.JobConfig`) with
  :func:`flwr.simulation.run_simulation` and returns its results (also written to
  ``<output>/<procedure>/results.json``, atomically after every round).
* :func:`run_experiment` runs every procedure of a typed config one after another and prints a
  table of ``e_F`` to ``G_star`` and ``G_cen`` per round.
* :func:`main` is the Hydra entry point (``config_path="pkg://conf"``).
* ``server_app`` / ``client_app`` serve ``flwr run .`` with ``[tool.flwr.app]`` in pyproject:
  the run config keys ``overrides`` (Hydra overrides, space separated), ``procedure-index`` and
  ``output-dir`` select the same job; :func:`serve` is the ServerApp body in both cases.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedhead.config import JobConfig, compose_config, hydra_config_path, load_config
from fedhead.io import provenance, write_json_atomic
from fedhead.tracking import RoundRecord, Targets

log = logging.getLogger("fedhead.run")

SCHEMA_VERSION = 1


# ------------------------------------------------------------------------------ progress grid
class ProgressGrid(Grid):
    """A Grid that shows per-client progress of every message phase and times the phases.

    Delegates to the real grid; ``send_and_receive`` pushes, then pulls replies as they arrive
    (a tqdm bar counts clients), and records ``(message type, seconds)`` in :attr:`phases`.
    """

    def __init__(self, grid: Grid, *, label: str = "", show: bool = True, poll: float = 0.02):
        self._grid = grid
        self.label = label
        self.show = show
        self.poll = poll
        self.phases: list[tuple[str, float, float]] = []  # (type, start, seconds)

    def set_run(self, run) -> None:  # noqa: D102
        self._grid.set_run(run)

    @property
    def run(self):  # noqa: D102
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: D102
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return self._grid.get_node_ids()

    def push_messages(self, messages):  # noqa: D102
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):  # noqa: D102
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        messages = list(messages)
        t0 = time.perf_counter()
        if not messages:
            return []
        kind = messages[0].metadata.message_type
        ids = set(self._grid.push_messages(messages))
        from tqdm.auto import tqdm

        bar = tqdm(total=len(ids), desc=f"{self.label} {kind}".strip(), unit="client", leave=False,
                   disable=not self.show, file=sys.stderr)
        out: list[Message] = []
        end = None if timeout is None else t0 + timeout
        try:
            while ids and (end is None or time.perf_counter() < end):
                got = list(self._grid.pull_messages(ids))
                if got:
                    out.extend(got)
                    ids.difference_update(m.metadata.reply_to_message_id for m in got)
                    bar.update(len(got))
                else:
                    time.sleep(self.poll)
        finally:
            bar.close()
        self.phases.append((kind, t0, time.perf_counter() - t0))
        return out


# ------------------------------------------------------------------------------ the recorder
class RunRecorder:
    """Observer of one federation: results.json (atomic, every round), TensorBoard, progress."""

    def __init__(self, job: JobConfig, *, show_progress: bool = True):
        from fedhead.tb import TensorBoardLogger

        self.job = job
        self.dir = Path(job.output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t_start = time.perf_counter()
        self.t_exchange: float | None = None
        self.round_times: list[float] = []
        self.targets: Targets | None = None
        self.records: dict[int, RoundRecord] = {}
        self.tb = TensorBoardLogger(self.dir / "tensorboard") if job.output.tensorboard else None
        self.show_progress = show_progress
        self.base_timing: dict[str, Any] = {}  # merged into results["timing"] by finish()
        self._bar = None
        seeds = {"seed": job.settings.seed, "dataset_seed": int(getattr(job.dataset, "seed", 0))}
        prov = provenance(seeds)
        self.results: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "status": "running",
            "procedure": dataclasses.asdict(job.procedure),
            "reference": job.procedure.reference,
            "config": job.resolved,
            "seeds": seeds,
            "git_revision": prov["git_revision"],
            "provenance": prov,
            "dataset": {"name": getattr(job.dataset, "name", ""), "num_clients": job.settings.num_clients},
            "diagnosis": None,
            "moments": None,
            "targets": None,
            "rounds": [],
            "timing": {},
        }
        self.write()

    @property
    def path(self) -> Path:
        return self.dir / "results.json"

    def write(self) -> None:
        self.results["rounds"] = [self.records[t].to_dict() for t in sorted(self.records)]
        write_json_atomic(self.path, self.results)

    # RunObserver
    def on_exchange(self, exchange: Any) -> None:
        self.t_exchange = time.perf_counter()
        m = exchange.moments
        self.targets = exchange.targets
        self.results["diagnosis"] = exchange.diagnosis.to_dict()
        self.results["moments"] = {
            "counts": np.asarray(m.counts).tolist(), "weights": np.asarray(m.weights).tolist(),
            "means": np.asarray(m.means).tolist(), "covs": np.asarray(m.covs).tolist(),
            "sigma_cen": np.asarray(m.sigma_cen).tolist(), "sigma_within": np.asarray(m.sigma_within).tolist(),
        }
        if exchange.targets is not None:
            self.results["targets"] = exchange.targets.to_dict()
        self.results["dataset"]["counts"] = np.asarray(m.counts).astype(int).tolist()
        log.info("[%s] diagnosis from the exchanged moments:\n%s", self.job.name, exchange.diagnosis.format())
        if self.tb is not None:
            self.tb.diagnosis(exchange.diagnosis)
        self.write()
        if self.show_progress and not self.job.settings.diagnose_only:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.job.settings.rounds, desc=f"{self.job.name} rounds", unit="round",
                             file=sys.stderr)

    def on_round(self, record: RoundRecord) -> None:
        t = record.round
        self.records[t] = record
        if t >= 1:
            self.round_times.append(time.perf_counter())
        if self.tb is not None:
            self.tb.round(record, self.targets)
        self.write()
        log.info(
            "[%s] round %d: e_F(G_star)=%s e_F(G_cen)=%s e_F(G_within)=%s recursion=%s delta=%s train_mse=%s",
            self.job.name, t, _fmt(record.e_f_star), _fmt(record.e_f_cen), _fmt(record.e_f_within),
            _fmt(record.e_f_recursion, ".3g"), _fmt(record.delta), _fmt(record.train_mse),
        )
        if self._bar is not None and t >= 1:
            self._bar.update(1)
            self._bar.set_postfix(e_star=_fmt(record.e_f_star, ".3g"), e_cen=_fmt(record.e_f_cen, ".3g"))

    def finish(self, status: str, *, timing: dict[str, Any] | None = None, error: str | None = None) -> dict[str, Any]:
        if self._bar is not None:
            self._bar.close()
        self.results["status"] = status
        if error:
            self.results["error"] = error
        self.results["timing"] = dict(self.base_timing, **(timing or {}),
                                      total_seconds=time.perf_counter() - self.t_start)
        if status == "completed" and self.job.output.figures and len(self.records) > 1:
            self.results["figures"] = [str(p.name) for p in write_figures(self)]
        self.write()
        if self.tb is not None:
            if status == "completed" and len(self.records) > 1:
                self.tb.text("summary", final_summary(self.results))
            self.tb.close()
        return self.results


def _fmt(value: float | None, spec: str = ".4g") -> str:
    """A number for logs and tables; ``-`` where it is undefined (None)."""
    return "-" if value is None else format(value, spec)


def final_summary(results: dict[str, Any]) -> str:
    last = results["rounds"][-1]
    return (
        f"procedure {results['procedure']['name']}: after round {last['round']} "
        f"e_F(G_star) = {_fmt(last['e_f_star'])}, e_F(G_cen) = {_fmt(last['e_f_cen'])}, "
        f"e_F(G_within) = {_fmt(last['e_f_within'])} (reference: G_{results['reference']})"
    )


def write_figures(rec: RunRecorder) -> list[Path]:
    """PNG figures of a finished federation: error curves and final ellipses."""
    from fedhead import plots
    from fedhead.tb import ellipse_figure

    rounds = sorted(rec.records)
    recs = [rec.records[t] for t in rounds]
    x = np.asarray(rounds, dtype=float)

    def arr(values):  # None (undefined outside the fully active regime) -> NaN
        return np.array([np.nan if v is None else v for v in values], dtype=float)

    curves = {
        "e_F(G_t, G_star)": arr(r.e_f_star for r in recs),
        "e_F(G_t, G_cen)": arr(r.e_f_cen for r in recs),
        "e_F(G_t, G_within)": arr(r.e_f_within for r in recs),
        # round 0 is the recursion's own start (error 0): drawn from round 1 on
        "e_F(G_t, recursion)": arr(None if r.round == 0 else r.e_f_recursion for r in recs),
    }
    curves = {k: v for k, v in curves.items() if np.isfinite(v).any()}
    fig, (ax,) = plots.new_figure(1, panel_size=(5.5, 4.0))
    with warnings.catch_warnings():  # the NaN at round 0 of the recursion curve is intended
        warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
        plots.plot_error_curves(ax, x, curves, band="none", xlabel="round", ylabel="relative error",
                                title=f"{rec.job.name}: head Gram errors")
    paths = [plots.save_figure(fig, rec.dir / "error_curves.png")]
    if rec.targets is not None:
        fig = ellipse_figure(recs[-1].gram, rec.targets, round_=rounds[-1], gram0=recs[0].gram)
        paths.append(plots.save_figure(fig, rec.dir / "ellipses.png"))
    return paths


# ------------------------------------------------------------------------------ server body
def initial_head(job: JobConfig, n_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """The common initial head ``Linear(P, C)`` from the run seed (float64 arrays)."""
    from fedhead.models import build_head

    head = build_head(job.model.feature_dim, n_targets, job.settings.seed)
    return (head.weight.detach().double().numpy().copy(), head.bias.detach().double().numpy().copy())


def make_job_strategy(job: JobConfig, observer: Any, message_config: dict[str, Any] | None = None):
    from strategies import make_strategy

    return make_strategy(
        job.procedure.strategy_kind,
        lambda_h=job.settings.lambda_h, lambda_w=job.settings.lambda_w,
        min_nodes=job.settings.num_clients, gamma=job.procedure.gamma,
        centered=job.procedure.centered, observer=observer,
        evaluate_mse=job.resources.evaluate_mse and not job.procedure.exact,
        message_config=message_config,
        allow_outside_regime=bool(job.dataset.allow_outside_regime),
    )


def serve(grid: Grid, job: JobConfig, recorder: RunRecorder, *, show_progress: bool = True,
          message_config: dict[str, Any] | None = None) -> ProgressGrid:
    """The ServerApp body: moment exchange, diagnosis, then the rounds of the job's procedure."""
    pgrid = ProgressGrid(grid, label=job.name, show=show_progress)
    strategy = make_job_strategy(job, recorder, message_config)
    strategy.run(
        pgrid, lambda c: initial_head(job, c), job.settings.rounds,
        diagnose_only=job.settings.diagnose_only,
    )
    return pgrid


def _use_cuda(job: JobConfig) -> bool:
    import torch

    if job.settings.device == "cuda":
        return True
    return job.settings.device == "auto" and torch.cuda.is_available()


def prepare_data(job: JobConfig):
    """Load (or generate) the job's data once in the driver: validates it, warms the cache the
    Ray workers read, and refuses a federation outside the fully active regime (SPEC 3) before
    any worker starts, unless ``dataset.allow_outside_regime=true`` or ``diagnose_only=true``
    (the server repeats the check on the exchanged moments, which is what deployments use)."""
    from fedhead.regime import ensure_fully_active
    from fedhead.data.registry import load_federated

    data = load_federated(job.dataset, num_clients=job.settings.num_clients)
    if data.n_clients != job.settings.num_clients:
        raise ValueError(f"data set {data.name} gave {data.n_clients} clients, expected {job.settings.num_clients}")
    if not job.settings.diagnose_only:
        ensure_fully_active(data, job.settings.lambda_h, job.settings.lambda_w,
                            allow_outside_regime=bool(job.dataset.allow_outside_regime))
    return data


def start_ray(init_args: dict[str, Any]) -> bool:
    """Start Ray for a simulation unless it is running; return whether this call started it.

    flwr's Ray backend would start it with a ``runtime_env`` (only to pass ``PYTHONPATH``),
    which makes Ray set up a runtime environment before every actor (~2.5 s of the start on 2
    cores, see benchmarks/bench_overhead.py). Starting it here without one, with the same
    ``PYTHONPATH`` exported to the worker processes, no dashboard and ``init_args`` from the
    resources config, lets flwr reuse the running instance (it shuts Ray down at the end).
    """
    import os

    import ray

    if ray.is_initialized():
        return False
    paths = [p for p in sys.path if p]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    args = dict(init_args)
    args.setdefault("include_dashboard", False)
    ray.init(**args)
    return True


def stop_ray() -> None:
    """Shut Ray down if it is still running (idempotent)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def timing_summary(recorder: RunRecorder, pgrid: ProgressGrid | None, t_sim: float, t_end: float) -> dict[str, Any]:
    """Wall-time split of a run (used by benchmarks/bench_overhead.py)."""
    train_seconds = 0.0
    for rec in recorder.records.values():
        for cm in rec.client_metrics:
            train_seconds += float(cm.get("train_seconds", 0.0))
    phases: dict[str, float] = {}
    first_phase = None
    if pgrid is not None:
        for kind, start, secs in pgrid.phases:
            phases[kind] = phases.get(kind, 0.0) + secs
            first_phase = start if first_phase is None else min(first_phase, start)
    return {
        "simulation_seconds": t_end - t_sim,
        "startup_seconds": (first_phase - t_sim) if first_phase is not None else None,
        "phase_seconds": phases,
        "client_train_seconds": train_seconds,
    }


def run_federation(job: JobConfig, *, show_progress: bool = True, verbose: bool = False) -> dict[str, Any]:
    """Run one procedure as a Flower simulation on the Ray backend; return its results.

    See :func:`run_federations`.
    """
    return run_federations([job], show_progress=show_progress, verbose=verbose)[0]


def run_federations(jobs: list[JobConfig], *, show_progress: bool = True, verbose: bool = False) -> list[dict[str, Any]]:
    """Run procedures one after another in one Flower simulation (Ray backend).

    Builds the ServerApp (:func:`serve` for every job in turn, each message naming its job) and
    the ClientApp (:func:`clients.make_client_app` over all jobs), starts ``num_clients``
    virtual SuperNodes with the per-client CPU/GPU resources of the config (fractional GPUs let
    several clients share a device) and writes results.json, TensorBoard events and PNG figures
    into each ``job.output_dir``. One Ray start serves every job.
    """
    from flwr.simulation import run_simulation

    from clients import make_client_app

    if not jobs:
        return []
    t_begin = time.perf_counter()
    first = jobs[0]
    for job in jobs[1:]:
        if (job.settings.num_clients, job.resources, job.dataset) != (first.settings.num_clients, first.resources, first.dataset):
            raise ValueError("jobs of one simulation must share the data set, client count and resources")
    backend = first.resources.backend_config(first.settings.num_clients, _use_cuda(first))
    if not verbose:
        for name in ("flwr", "alembic"):  # flwr's in-memory link state logs its migrations
            logging.getLogger(name).setLevel(logging.WARNING)
        backend["init_args"].setdefault("logging_level", logging.ERROR)
        backend["init_args"].setdefault("log_to_driver", False)
    # the driver's data preparation (cache warm-up, regime check) overlaps the Ray start
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="fedhead-data") as pool:
        data_ready = pool.submit(prepare_data, first)
        t_ray = time.perf_counter()
        started_ray = start_ray(backend["init_args"])
        t_ray = time.perf_counter() - t_ray
        try:
            data_ready.result()
        except BaseException:
            if started_ray:
                stop_ray()
            raise
    for job in jobs:
        if job.state_dir.exists():
            shutil.rmtree(job.state_dir)
    recorders = [RunRecorder(job, show_progress=show_progress) for job in jobs]
    recorders[0].t_start = t_begin  # the first federation's wall time includes data + Ray start
    for rec in recorders:
        rec.base_timing["ray_init_seconds"] = t_ray
    grids: dict[int, ProgressGrid] = {}
    sim_start: dict[int, float] = {}
    served: list[float] = []
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        for i, (job, rec) in enumerate(zip(jobs, recorders)):
            sim_start[i] = time.perf_counter()
            if i:
                rec.t_start = sim_start[i]
            log.info("running procedure %s (%d rounds x %d local epochs, %d clients, data %s, model %s)",
                     job.name, job.settings.rounds, job.settings.local_epochs, job.settings.num_clients,
                     getattr(job.dataset, "name", "?"), getattr(job.model, "name", "?"))
            grids[i] = serve(grid, job, rec, show_progress=show_progress, message_config={"job": i})
            _finish_job(job, rec, grids[i], sim_start[i] if i else t_sim, time.perf_counter())
        served.append(time.perf_counter())

    t_sim = time.perf_counter()
    try:
        run_simulation(
            server_app=server_app, client_app=make_client_app(list(jobs)),
            num_supernodes=first.settings.num_clients, backend_name="ray", backend_config=backend,
            verbose_logging=verbose,
        )
    except BaseException as exc:
        for i, rec in enumerate(recorders):
            if rec.results["status"] == "running":
                rec.finish("failed", error=f"{type(exc).__name__}: {exc}",
                           timing=timing_summary(rec, grids.get(i), sim_start.get(i, t_sim), time.perf_counter()))
        raise
    finally:
        stop_ray()  # flwr shuts Ray down itself on success; this covers early failures
    if served:
        log.info("simulation teardown (actors, Ray shutdown): %.2f s", time.perf_counter() - served[-1])
    failed = [r for r in recorders if r.results["status"] not in ("completed", "diagnosed")]
    for rec in failed:
        if rec.results["status"] == "running":
            rec.finish("failed", error="the simulation ended before this procedure finished")
    if failed:
        raise RuntimeError(
            f"procedures {[r.job.name for r in failed]} did not finish (see the log and their results.json)"
        )
    for job in jobs:
        if not job.output.keep_client_state and job.state_dir.exists():
            shutil.rmtree(job.state_dir)
    return [r.results for r in recorders]


def _finish_job(job: JobConfig, rec: RunRecorder, pgrid: ProgressGrid, t0: float, t1: float) -> None:
    expected = -1 if job.settings.diagnose_only else job.settings.rounds
    done = max(rec.records) if rec.records else -1
    timing = timing_summary(rec, pgrid, t0, t1)
    if rec.results["diagnosis"] is None or done < expected:
        rec.finish("failed", error=f"the federation stopped after round {done} of {expected}", timing=timing)
        raise RuntimeError(f"{job.name}: the federation stopped after round {done} of {expected}")
    rec.finish("diagnosed" if job.settings.diagnose_only else "completed", timing=timing)


# ------------------------------------------------------------------------------ experiments
def error_table(all_results: list[dict[str, Any]]) -> str:
    """Plain-text table: per round, e_F to G_star and G_cen of every procedure."""
    done = [r for r in all_results if r.get("rounds")]
    if not done:
        return ""
    names = [r["procedure"]["name"] for r in done]
    head = ["round"] + [f"{n}: e_F(G_star)" for n in names] + [f"{n}: e_F(G_cen)" for n in names]
    n_rounds = max(len(r["rounds"]) for r in done)
    rows = []
    for i in range(n_rounds):
        row = [str(i)]
        for key in ("e_f_star", "e_f_cen"):
            for r in done:
                row.append(_fmt(r["rounds"][i][key]) if i < len(r["rounds"]) else "")
        rows.append(row)
    # reorder so that each procedure's pair sits together
    order = [0]
    for j in range(len(names)):
        order += [1 + j, 1 + len(names) + j]
    head = [head[k] for k in order]
    rows = [[row[k] for k in order] for row in rows]
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def run_experiment(cfg: Any, output_dir: str | Path, *, show_progress: bool = True) -> list[dict[str, Any]]:
    """Run every procedure of a :class:`fedhead.config.FedheadConfig` one after another."""
    jobs = cfg.jobs(output_dir)
    if cfg.settings.diagnose_only:
        jobs = jobs[:1]  # the diagnosis depends on the data and penalties only
    results = run_federations(jobs, show_progress=show_progress)
    root = Path(cfg.output.dir) if cfg.output.dir else Path(output_dir)
    table = error_table(results)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "experiment": cfg.experiment.name,
        "procedures": [r["procedure"]["name"] for r in results],
        "results": [str(Path(j.output_dir) / "results.json") for j in jobs],
        "diagnosis": results[0]["diagnosis"] if results else None,
        "final": {
            r["procedure"]["name"]: {k: r["rounds"][-1][k] for k in ("e_f_star", "e_f_cen", "e_f_within")}
            for r in results if r.get("rounds")
        },
        "table": table,
    }
    write_json_atomic(root / "summary.json", summary)
    if results and results[0].get("diagnosis"):
        print("\nDiagnosis (from the exchanged moments):")
        print("  " + "\n  ".join(_diag_lines(results[0]["diagnosis"])))
    if table:
        print("\nRelative error of the shared head Gram G_t per round:")
        print(table)
    print(f"\nOutputs: {root}")
    return results


def _diag_lines(d: dict[str, Any]) -> list[str]:
    return [
        f"fully active margins: {', '.join(f'{m:.3g}' for m in d['margins'])} (threshold {d['threshold']:.3g})",
        f"relative gap ||G_cen - G_star|| / ||G_cen|| = {d['rel_gap']:.4g}" if d["rel_gap"] is not None else "relative gap: undefined",
        "gap shares: " + ", ".join(
            f"{k} {100 * d[f'share_m_{k}']:.1f}%" if d[f"share_m_{k}"] is not None else f"{k} -"
            for k in ("mu", "sigma", "a")
        ),
        f"recommendation: {d['recommendation']}",
    ]


def main() -> None:
    """Console entry point ``fedhead-run`` (Hydra; see ``conf/config.yaml``)."""
    import hydra

    @hydra.main(config_path=hydra_config_path(), config_name="config", version_base=None)
    def _app(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig

        typed = load_config(cfg)
        run_experiment(typed, HydraConfig.get().runtime.output_dir)

    _app()


# ------------------------------------------------------------------------------ flwr run .
_JOBS: dict[tuple[str, str, int], JobConfig] = {}


def job_from_context(context: Context) -> JobConfig:
    """The job named by a deployment's run config (``overrides``, ``procedure-index``, ``output-dir``)."""
    rc = context.run_config
    overrides = str(rc.get("overrides", ""))
    out = str(rc.get("output-dir", "outputs/flwr"))
    idx = int(rc.get("procedure-index", 0))
    key = (overrides, out, idx)
    if key not in _JOBS:
        jobs = load_config(compose_config(overrides.split())).jobs(out)
        if not 0 <= idx < len(jobs):
            raise ValueError(f"procedure-index {idx} outside 0..{len(jobs) - 1} ({[j.name for j in jobs]})")
        _JOBS[key] = jobs[idx]
    return _JOBS[key]


server_app = ServerApp()


def deployment_logging(job: JobConfig) -> None:
    """Console (streamed by ``flwr run --stream``) and ``<output>/run.log`` logging of the
    fedhead loggers in a deployed ServerApp, where no Hydra sets logging up."""
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s")
    Path(job.output_dir).mkdir(parents=True, exist_ok=True)
    for name in ("fedhead", "strategies"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not any(getattr(h, "_fedhead", False) for h in logger.handlers):
            for handler in (logging.StreamHandler(sys.stdout),
                            logging.FileHandler(Path(job.output_dir) / "run.log")):
                handler.setFormatter(fmt)
                handler._fedhead = True  # noqa: SLF001 - marks our handlers (idempotent setup)
                logger.addHandler(handler)
        logger.propagate = False


@server_app.main()
def _deployment_main(grid: Grid, context: Context) -> None:
    job = job_from_context(context)
    deployment_logging(job)
    recorder = RunRecorder(job)
    run = getattr(grid, "run", None)
    if run is not None:  # the FAB identifies the code when no git checkout is at hand
        recorder.results["provenance"]["fab"] = {
            "fab_id": run.fab_id, "fab_version": run.fab_version, "fab_hash": run.fab_hash,
            "run_id": int(run.run_id),
        }
    recorder.results["provenance"]["run_config"] = dict(context.run_config)
    log.info("running procedure %s (%d rounds x %d local epochs, %d clients, data %s, model %s) -> %s",
             job.name, job.settings.rounds, job.settings.local_epochs, job.settings.num_clients,
             getattr(job.dataset, "name", "?"), getattr(job.model, "name", "?"), job.output_dir)
    t0 = time.perf_counter()
    pgrid = None
    try:
        pgrid = serve(grid, job, recorder)
    except BaseException as exc:
        recorder.finish("failed", error=f"{type(exc).__name__}: {exc}",
                        timing=timing_summary(recorder, pgrid, t0, time.perf_counter()))
        raise
    _finish_job(job, recorder, pgrid, t0, time.perf_counter())
    if recorder.results.get("diagnosis"):
        log.info("diagnosis:\n  %s", "\n  ".join(_diag_lines(recorder.results["diagnosis"])))
    table = error_table([recorder.results])
    if table:
        log.info("relative error of the shared head Gram G_t per round:\n%s", table)
    if not job.output.keep_client_state and job.state_dir.exists():
        shutil.rmtree(job.state_dir, ignore_errors=True)  # clients on this machine (default state dir)


def _make_deployment_client_app():
    from clients import make_client_app

    return make_client_app(job_from_context)


client_app = _make_deployment_client_app()


if __name__ == "__main__":  # pragma: no cover
    main()
