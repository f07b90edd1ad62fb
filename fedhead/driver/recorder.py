"""The observer of a federation: results.json, TensorBoard, figures and progress.

* :class:`RunRecorder` implements :class:`strategies.RunObserver`: it writes results.json
  atomically after the exchange and every round, TensorBoard events, PNG figures at the end,
  and a tqdm progress bar over rounds. With ``background=True`` (the simulation driver) the
  figures (TensorBoard's per-round ellipses, the PNGs at the end) are drawn by one background
  thread while the clients train, off the server's critical path; :meth:`RunRecorder.wait`
  waits for them.
* :func:`timing_summary` splits a run's wall time with the phases timed by
  :class:`fedhead.federation.progress_grid.ProgressGrid`.
* :func:`error_table` and :func:`diagnosis_lines` format results for the console and the log.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from fedhead.driver.logs import console
from fedhead.federation.aggregation import LOCAL_GAP_THRESHOLD
from fedhead.federation.config import JobConfig
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.federation.protocol import LOCAL_SECONDS, TRAIN_SECONDS
from fedhead.federation.tracking import RoundRecord, Targets
from fedhead.plotting.canvas import DRAWER
from fedhead.results.io import provenance, write_json_atomic

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


# ------------------------------------------------------------------------------ the recorder
class RunRecorder:
    """Observer of one federation: results.json (atomic, every round), TensorBoard, progress.

    ``background=True``: figures are drawn by a background thread (see the module docstring);
    results.json's final write (with the figure names) follows them; :meth:`wait` blocks until
    everything is written.
    """

    def __init__(self, job: JobConfig, *, show_progress: bool = True, background: bool = False):
        from fedhead.driver.tensorboard import TensorBoardLogger

        self.job = job
        self.dir = Path(job.output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t_start = time.perf_counter()
        self.t_exchange: float | None = None
        self.round_times: list[float] = []
        self.targets: Targets | None = None
        self.records: dict[int, RoundRecord] = {}
        self.target_names, self.unit = target_axes(job)
        self.tb = (
            TensorBoardLogger(
                self.dir / "tensorboard", target_names=self.target_names, unit=self.unit, procedure=job.name
            )
            if job.output.tensorboard
            else None
        )
        self.show_progress = show_progress
        self.base_timing: dict[str, Any] = {}  # merged into results["timing"] by finish()
        self._bar = None
        self.background = bool(background)
        self._pending: list[Future] = []
        seeds = {"seed": job.settings.seed, "dataset_seed": int(getattr(job.dataset, "seed", 0)), **init_seeds(job)}
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
        if self.tb is not None:
            self.tb.hparams(job_hparams(job))
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
            "counts": np.asarray(m.counts).tolist(),
            "weights": np.asarray(m.weights).tolist(),
            "means": np.asarray(m.means).tolist(),
            "covs": np.asarray(m.covs).tolist(),
            "sigma_cen": np.asarray(m.sigma_cen).tolist(),
            "sigma_within": np.asarray(m.sigma_within).tolist(),
        }
        if exchange.targets is not None:
            self.results["targets"] = exchange.targets.to_dict()
        self.results["dataset"]["counts"] = np.asarray(m.counts).astype(int).tolist()
        log.info("[%s] diagnosis from the exchanged moments:\n%s", self.job.name, exchange.diagnosis.format())
        shown = (str(self.dir.parent), exchange.diagnosis.format())
        if shown not in _DIAGNOSES_SHOWN:  # once per experiment: every procedure sees the same moments
            _DIAGNOSES_SHOWN.add(shown)
            console.info(
                "Diagnosis (from the exchanged moments, before training):\n  %s",
                "\n  ".join(diagnosis_lines(self.results["diagnosis"])),
            )
        if self.tb is not None:
            self.tb.diagnosis(exchange.diagnosis)
        self.write()
        if self.show_progress and not self.job.settings.diagnose_only:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.job.settings.rounds, desc=f"{self.job.name} rounds", unit="round", file=sys.stderr
            )

    def on_resume(self, records: list[RoundRecord]) -> None:
        """A resumed run: the checkpointed rounds 0..k, so results.json continues as if uninterrupted."""
        self.records = {r.round: r for r in records}
        self.results["resumed_after_round"] = max(self.records)
        if self._bar is not None:
            self._bar.update(max(self.records))
        self.write()
        log.info("[%s] resumed after round %d", self.job.name, max(self.records))

    def on_round(self, record: RoundRecord) -> None:
        t = record.round
        self.records[t] = record
        if t >= 1:
            self.round_times.append(time.perf_counter())
        if self.tb is not None:
            self.tb.round(record, self.targets, ellipses=not self.background)
            if self.background:
                self._later(self.tb.ellipses, record, self.targets)
        self.write()
        log.info(
            "[%s] round %d: e_F(G_star)=%s e_F(G_cen)=%s e_F(G_within)=%s recursion=%s delta=%s train_mse=%s "
            "max local gap=%s epochs=%s",
            self.job.name,
            t,
            _fmt(record.e_f_star),
            _fmt(record.e_f_cen),
            _fmt(record.e_f_within),
            _fmt(record.e_f_recursion, ".3g"),
            _fmt(record.delta),
            _fmt(record.train_mse),
            _fmt(record.max_trained_gap, ".2g"),
            "-" if not record.local_epochs else "/".join(str(e) for e in record.local_epochs),
        )
        console.info("%s", round_line(self.job, record))
        if record.max_trained_gap is not None and record.max_trained_gap > LOCAL_GAP_THRESHOLD:
            log.warning("[%s] round %d: %s", self.job.name, t, local_gap_advice(record, self.job))
        if self._bar is not None and t >= 1:
            self._bar.update(1)
            self._bar.set_postfix(e_star=_fmt(record.e_f_star, ".3g"), e_cen=_fmt(record.e_f_cen, ".3g"))

    def finish(self, status: str, *, timing: dict[str, Any] | None = None, error: str | None = None) -> dict[str, Any]:
        if self._bar is not None:
            self._bar.close()
        self.results["status"] = status
        if error:
            self.results["error"] = error
        self.results["timing"] = dict(
            self.base_timing, **(timing or {}), total_seconds=time.perf_counter() - self.t_start
        )
        self.results["local_optimality"] = local_optimality([self.records[t] for t in sorted(self.records)])
        if self.background and status == "completed":
            self._later(self._write_outputs, status)  # figures, then results.json and the events
        else:
            self.wait(raise_errors=status in ("completed", "diagnosed"))  # the writer closes below
            self._write_outputs(status)
        return self.results

    def _write_outputs(self, status: str) -> None:
        if status == "completed" and self.job.output.figures and len(self.records) > 1:
            self.results["figures"] = [str(p.name) for p in write_figures(self)]
        self.write()
        if self.tb is not None:
            if status == "completed" and len(self.records) > 1:
                self.tb.text("summary", final_summary(self.results))
            self.tb.finish(status)
            self.tb.close()

    def _later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the figure thread (in order), or now without ``background``."""
        if self.background:
            self._pending.append(DRAWER.submit(fn, *args))
        else:
            fn(*args)

    def wait(self, *, raise_errors: bool = True) -> float:
        """Block until this recorder's background work is written; return the seconds waited.

        The first error of that work is raised (``raise_errors``) or logged."""
        t0 = time.perf_counter()
        pending, self._pending = self._pending, []
        first: BaseException | None = None
        for fut in pending:
            try:
                fut.result()
            except Exception as exc:
                if first is None:
                    first = exc
                if not raise_errors:
                    log.error("[%s] writing figures failed: %s", self.job.name, exc, exc_info=exc)
        if first is not None and raise_errors:
            raise first
        return time.perf_counter() - t0


#: (experiment folder, diagnosis text) already shown on the console in this process
_DIAGNOSES_SHOWN: set[tuple[str, str]] = set()

_MUJOCO = ("swimmer", "hopper", "halfcheetah", "walker2d")


def target_axes(job: JobConfig) -> tuple[list[str] | None, str]:
    """Target names and the unit of the Gram axes of ``job``'s data set.

    Names come from the data set if this process has loaded it (the simulation driver has; a
    deployed ServerApp has no data and gets ``None``: axes "coordinate k"). MuJoCo actions keep
    their stored scale (torque commands); every other data set's targets are standardised.
    """
    from fedhead.data.units import target_units

    name = str(getattr(job.dataset, "name", ""))
    names = None
    try:
        from fedhead.data.pipeline import memo_get
        from fedhead.data.registry import coerce_config

        raw = memo_get(coerce_config(job.dataset))
        if raw is not None:
            names = [str(n) for n in raw.target_names]
            if not raw.standardize:
                units = sorted(set(target_units(name, names)) - {""})
                return names, (units[0] if len(units) == 1 else "stored scale")
    except Exception:
        log.debug("target names of %s not available", name, exc_info=True)
    if name in _MUJOCO:
        return names, "torque command"
    return names, "standardised"


def init_seeds(job: JobConfig) -> dict[str, Any]:
    """``init`` and each partition's initial-backbone seed (:func:`fedhead.analysis.seeds.backbone_seed`)."""
    from fedhead.analysis.seeds import backbone_seed

    init = getattr(job.settings, "init", "common")
    return {
        "init": init,
        "backbone_seeds": [backbone_seed(job.settings.seed, m, init) for m in range(job.settings.num_clients)],
    }


def job_hparams(job: JobConfig) -> dict[str, Any]:
    """The hyperparameters a sweep varies (TensorBoard's hparams plugin filters runs by them)."""
    st, tr, proc = job.settings, job.train, job.procedure
    return {
        "procedure": proc.name,
        "dataset": str(getattr(job.dataset, "name", "")),
        "model": str(getattr(job.model, "name", "")),
        "rounds": int(st.rounds),
        "local_epochs": int(st.local_epochs),
        "num_clients": int(st.num_clients),
        "seed": int(st.seed),
        "rho": float(proc.rho),
        "gamma": float(proc.gamma),
        "lambda_h": float(st.lambda_h),
        "lambda_w": float(st.lambda_w),
        "lr": float(tr.lr),
        "local_tol": -1.0 if tr.local_tol is None else float(tr.local_tol),
        "init": str(getattr(st, "init", "common")),
    }


def round_line(job: JobConfig, record: RoundRecord) -> str:
    """The console line of one round: errors to both references and how close clients came."""
    rounds = job.settings.rounds
    parts = [
        f"[{job.name}] round {record.round}/{rounds}:",
        f"e_F(G_t, G_star) = {_fmt(record.e_f_star, '.3g')},",
        f"e_F(G_t, G_cen) = {_fmt(record.e_f_cen, '.3g')}",
    ]
    if record.max_trained_gap is not None:
        parts[-1] += ","
        parts.append(f"largest local gap {record.max_trained_gap:.2g}")
        if record.local_epochs:
            lo, hi = min(record.local_epochs), max(record.local_epochs)
            parts.append(f"({lo} epochs)" if lo == hi else f"({lo}-{hi} epochs)")
    return " ".join(parts)


def start_line(cfg: Any, jobs: list[JobConfig], root: Path) -> str:
    """The console's first line: what runs, and where its outputs go."""
    if not jobs:
        return f"fedhead-run: nothing to run; outputs in {root}"
    st = jobs[0].settings
    what = (
        "diagnosis only"
        if st.diagnose_only
        else f"{', '.join(j.name for j in jobs)}: {st.rounds} rounds x up to {st.local_epochs} local epochs"
    )
    exp = getattr(getattr(cfg, "experiment", None), "name", "")
    return (
        f"fedhead-run{f' {exp}' if exp else ''}: {what}, {st.num_clients} clients on "
        f"{getattr(jobs[0].dataset, 'name', '?')}, model {getattr(jobs[0].model, 'name', '?')} -> {root} "
        f"(full log: run.log)"
    )


def _fmt(value: float | None, spec: str = ".4g") -> str:
    """A number for logs and tables; ``-`` where it is undefined (None)."""
    return "-" if value is None else format(value, spec)


def local_gap_advice(record: RoundRecord, job: JobConfig) -> str:
    """One line: which client is how far from its local optimum, and what to raise."""
    gaps = record.trained_gaps or []
    worst = int(np.argmax(gaps))
    return (
        f"client {worst} ended local training at relative gap {gaps[worst]:.2g} > "
        f"{LOCAL_GAP_THRESHOLD:g} from its local optimum, so G_star, G_cen and the recursion (which assume "
        f"local optima) do not describe this round yet; raise local_epochs (now {job.settings.local_epochs}) or "
        f"train.lr, or set train.local_tol to train each client until it is close enough"
    )


def local_optimality(records: list[RoundRecord]) -> dict[str, Any]:
    """results.json's ``local_optimality``: did every client reach its local optimum, per round?"""
    trained = [r for r in records if r.max_trained_gap is not None]
    above = [r.round for r in trained if r.max_trained_gap > LOCAL_GAP_THRESHOLD]
    last = trained[-1] if trained else None
    return {
        "threshold": LOCAL_GAP_THRESHOLD,
        "rounds_above_threshold": above,
        "last_round_max_trained_gap": None if last is None else last.max_trained_gap,
        "last_round_max_objective_gap": None if last is None else float(max(last.objective_gaps)),
        "reached": None if last is None else not above or above[-1] != last.round,
    }


def final_summary(results: dict[str, Any]) -> str:
    last = results["rounds"][-1]
    return (
        f"procedure {results['procedure']['name']}: after round {last['round']} "
        f"e_F(G_star) = {_fmt(last['e_f_star'])}, e_F(G_cen) = {_fmt(last['e_f_cen'])}, "
        f"e_F(G_within) = {_fmt(last['e_f_within'])} (reference: G_{results['reference']})"
    )


def write_figures(rec: RunRecorder) -> list[Path]:
    """PNG figures of a finished federation: error curves (:func:`fedhead.plotting.run_error_figure`)
    and the final Gram ellipses with the data set's target names and unit."""
    from fedhead.plotting.canvas import FIGURE_LOCK

    with FIGURE_LOCK:
        return _write_figures(rec)


def _write_figures(rec: RunRecorder) -> list[Path]:
    from fedhead import plotting
    from fedhead.driver.tensorboard import ellipse_figure

    rounds = sorted(rec.records)
    recs = [rec.records[t] for t in rounds]
    fig = plotting.run_error_figure(dict(rec.results, rounds=[r.to_dict() for r in recs]))
    paths = [plotting.save_figure(fig, rec.dir / "error_curves.png")]
    if rec.targets is not None and recs[-1].gram.shape[0] >= 2:
        fig = ellipse_figure(
            recs[-1].gram,
            rec.targets,
            round_=rounds[-1],
            gram0=recs[0].gram,
            target_names=rec.target_names,
            unit=rec.unit,
            procedure=rec.job.name,
        )
        paths.append(plotting.save_figure(fig, rec.dir / "ellipses.png"))
    return paths


def write_procedures_figure(results: list[dict[str, Any]], path: str | Path) -> Path:
    """``procedures.png`` of an experiment: per procedure, e_F to G_star and to G_cen per round
    with the diagnosis's predicted gap (:func:`fedhead.plotting.procedures_figure`)."""
    from fedhead import plotting

    done = [r for r in results if r.get("rounds")]
    return plotting.save_figure(plotting.procedures_figure(done), path)


def timing_summary(recorder: RunRecorder, pgrid: ProgressGrid | None, t_sim: float, t_end: float) -> dict[str, Any]:
    """Wall-time split of a run (used by benchmarks/bench_overhead.py).

    ``phase_seconds`` sums the message phases by type; ``phases`` lists every phase in order as
    ``[type, seconds]``; ``round_train_seconds[t - 1]`` is the clients' summed training-loop time
    of round ``t``, ``round_local_seconds[t - 1]`` their summed local computation (the whole
    ``train_local``: set-up, epochs and finishing step).
    """
    rounds = [recorder.records[t] for t in sorted(recorder.records) if t >= 1]
    per_round = [sum(float(cm.get(TRAIN_SECONDS, 0.0)) for cm in rec.client_metrics) for rec in rounds]
    per_round_local = [sum(float(cm.get(LOCAL_SECONDS, 0.0)) for cm in rec.client_metrics) for rec in rounds]
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
        "phases": [[kind, secs] for kind, _, secs in (pgrid.phases if pgrid is not None else [])],
        "client_train_seconds": sum(per_round),
        "round_train_seconds": per_round,
        "client_local_seconds": sum(per_round_local),
        "round_local_seconds": per_round_local,
    }


# ------------------------------------------------------------------------------ experiments
def error_table(all_results: list[dict[str, Any]]) -> str:
    """Plain-text table: per round, e_F to G_star and G_cen of every procedure."""
    done = [r for r in all_results if r.get("rounds")]
    if not done:
        return ""
    names = [r["procedure"]["name"] for r in done]
    cols = (
        ("e_f_star", "e_F(G_star)", ".4g"),
        ("e_f_cen", "e_F(G_cen)", ".4g"),
        ("max_trained_gap", "local gap", ".2g"),
    )
    head = ["round"] + [f"{n}: {label}" for n in names for _, label, _ in cols]
    n_rounds = max(len(r["rounds"]) for r in done)

    def cell(r: dict[str, Any], i: int, key: str, spec: str) -> str:
        if i >= len(r["rounds"]):
            return ""
        return _fmt(r["rounds"][i][key], spec)

    rows = [[str(i)] + [cell(r, i, key, spec) for r in done for key, _, spec in cols] for i in range(n_rounds)]
    widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def diagnosis_lines(d: dict[str, Any]) -> list[str]:
    """The diagnosis of a results.json (``results["diagnosis"]``) as console lines."""
    return [
        f"fully active margins: {', '.join(f'{m:.3g}' for m in d['margins'])} (threshold {d['threshold']:.3g})",
        f"relative gap ||G_cen - G_star|| / ||G_cen|| = {d['rel_gap']:.4g}"
        if d["rel_gap"] is not None
        else "relative gap: undefined",
        "gap shares: "
        + ", ".join(
            f"{k} {100 * d[f'share_m_{k}']:.1f}%" if d[f"share_m_{k}"] is not None else f"{k} -"
            for k in ("mu", "sigma", "a")
        ),
        f"recommendation: {d['recommendation']}",
    ]
