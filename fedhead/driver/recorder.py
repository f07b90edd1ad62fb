"""The run's observer: [`RunRecorder`][fedhead.driver.recorder.RunRecorder] keeps results.json,
TensorBoard, the figures and the progress bar current as the strategy reports the exchange and
every round (a [`RunObserver`][fedhead.strategies.observer.RunObserver]). Console text lives in
[`fedhead.driver.console`][fedhead.driver.console], the wall-time split in
[`fedhead.driver.timing`][fedhead.driver.timing], the run's closing summaries of local training in
[`fedhead.driver.local_summary`][fedhead.driver.local_summary].
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from fedhead.analysis.seeds import backbone_seed
from fedhead.analysis.standardization import Standardization
from fedhead.clients.state import ray_nodes
from fedhead.data.pipeline import memo_get, standardize_targets
from fedhead.data.registry import coerce_config
from fedhead.data.units import axis_unit
from fedhead.driver.console import diagnosis_lines, final_summary, fmt, local_gap_advice, round_line, round_log_line
from fedhead.driver.figures import write_run_figures
from fedhead.driver.local_summary import local_optimality, local_steps
from fedhead.driver.logs import LOCAL_GAP, console
from fedhead.driver.privacy import dp_sgd_settings, row_epsilons
from fedhead.driver.tensorboard import TensorBoardLogger
from fedhead.federation.local_fit import LOCAL_GAP_THRESHOLD
from fedhead.federation.tracking import Targets
from fedhead.plotting.canvas import DRAWER
from fedhead.progress import progress
from fedhead.results import schema
from fedhead.results.io import provenance
from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import ABSENT, DatasetInfo, Results, Timing
from fedhead.settings.config import JobConfig
from fedhead.strategies.exchange import MomentExchange
from fedhead.strategies.secure import ABSENT as SECURE_ABSENT
from fedhead.strategies.secure import ABSENT_REASON as SECURE_ABSENT_REASON
from fedhead.strategies.secure import DP_EPSILON, DP_RELEASES

log = logging.getLogger(__name__)
gap_log = logging.getLogger(LOCAL_GAP)


# ------------------------------------------------------------------------------ the recorder
class RunRecorder:
    """Observer of one federation: results.json (atomic, every round), TensorBoard, progress.

    ``background=True``: figures are drawn by the process's figure thread
    ([`fedhead.plotting.canvas.DRAWER`][fedhead.plotting.canvas.DRAWER]); results.json's final
    write (with the figure names) follows them; [`wait`][fedhead.driver.recorder.RunRecorder.wait]
    blocks until everything is written. [`results`][fedhead.driver.recorder.RunRecorder.results]
    is the run's [`fedhead.results.schema.Results`][fedhead.results.schema.Results].
    """

    def __init__(self, job: JobConfig, *, show_progress: bool = True, background: bool = False):
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
        self.base_timing = Timing()  # ray_init_seconds; merged into results.timing by finish()
        self._bar = None
        self._gap_warned = False  # the console warns of clients short of their optima once per run
        self.background = bool(background)
        self._pending: list[Future] = []
        seeds = {"seed": job.settings.seed, "dataset_seed": int(job.dataset.seed), **init_seeds(job)}
        prov = provenance(seeds)
        self.results = Results(
            schema_version=schema.SCHEMA_VERSION,
            status="running",
            procedure=dataclasses.asdict(job.procedure),
            reference=job.procedure.reference,
            config=job.resolved,
            seeds=seeds,
            git_revision=prov["git_revision"],
            provenance=prov,
            dataset=DatasetInfo(name=job.dataset.name, num_clients=job.settings.num_clients),
            diagnosis=None,
            moments=None,
            targets=None,
            rounds=[],
            timing=Timing(),
        )
        if self.tb is not None:
            self.tb.hparams(job_hparams(job))
        self.write()

    @property
    def path(self) -> Path:
        return self.dir / schema.FILE_NAME

    def write(self) -> None:
        self.results.rounds = [self.records[t] for t in sorted(self.records)]
        schema.write(self.path, self.results)

    def _record_secure(self, exchange: MomentExchange) -> None:
        """A secure exchange: its pooled moments only, every per-site entry null, and why (said once)."""
        assert exchange.secure is not None
        self.results.moments = {
            "counts": None,
            "weights": None,
            "means": None,
            "covs": None,
            "count": int(exchange.secure.count),
            "mean": np.asarray(exchange.moments.means[0]).tolist(),
            "sigma_cen": np.asarray(exchange.moments.sigma_cen).tolist(),
            "sigma_within": np.asarray(exchange.secure.within).tolist(),
        }
        if self.results.targets is not None:
            self.results.targets.update(grams=None, client_grams=None, weights=None)
        self.results.privacy = {
            "mode": "secure",
            "sites": len(exchange.node_ids),
            "absent": list(SECURE_ABSENT),
            "reason": SECURE_ABSENT_REASON,
        }
        if str(self.dir.parent) not in _SECURE_SHOWN:
            _SECURE_SHOWN.add(str(self.dir.parent))
            console.info(
                "privacy.mode=secure: the server holds only sums over the %d sites; G_star, the gap terms and "
                "every per-site value are absent from results.json, and the trust checks see only the sums",
                len(exchange.node_ids),
            )

    # RunObserver
    def on_exchange(self, exchange: MomentExchange) -> None:
        self.t_exchange = time.perf_counter()
        m = exchange.moments
        self.targets = exchange.targets
        self.results.diagnosis = exchange.diagnosis.to_dict()
        self.results.moments = {
            "counts": np.asarray(m.counts).tolist(),
            "weights": np.asarray(m.weights).tolist(),
            "means": np.asarray(m.means).tolist(),
            "covs": np.asarray(m.covs).tolist(),
            "sigma_cen": np.asarray(m.sigma_cen).tolist(),
            "sigma_within": np.asarray(m.sigma_within).tolist(),
        }
        if exchange.targets is not None:
            self.results.targets = exchange.targets.to_dict()
        if exchange.secure is not None:
            self._record_secure(exchange)
        st = exchange.standardization or loaded_standardization(self.job)
        if st is not None:  # the federation's pooled offsets and scales, or the loaded data set's
            self.results.standardization = st.to_dict()
        if exchange.secure is None:
            self.results.dataset = dataclasses.replace(
                self.results.dataset, counts=np.asarray(m.counts).astype(int).tolist()
            )
        log.info("[%s] diagnosis from the exchanged moments:\n%s", self.job.name, exchange.diagnosis.format())
        shown = (str(self.dir.parent), exchange.diagnosis.format())
        if shown not in _DIAGNOSES_SHOWN:  # once per experiment: every procedure sees the same moments
            _DIAGNOSES_SHOWN.add(shown)
            console.info(
                "Diagnosis (from the exchanged moments, before training):\n  %s",
                "\n  ".join(diagnosis_lines(self.results.diagnosis)),
            )
        if self.tb is not None:
            self.tb.diagnosis(exchange.diagnosis)
        self.write()
        if self.show_progress and not self.job.settings.diagnose_only:
            self._bar = progress(  # off a terminal: no line, every round has its own (on_round)
                total=self.job.settings.rounds, desc=f"{self.job.name} rounds", unit="round", leave=True, summary=False
            )

    def on_resume(self, records: list[RoundRecord]) -> None:
        """A resumed run: the checkpointed rounds 0..k, so results.json continues as if uninterrupted."""
        self.records = {r.round: r for r in records}
        self.results.resumed_after_round = max(self.records)
        if self._bar is not None:
            self._bar.update(max(self.records))
        self.write()
        log.info("[%s] resumed after round %d", self.job.name, max(self.records))

    def on_round(self, record: RoundRecord) -> None:
        t = record.round
        self.records[t] = record
        releases, epsilon = record.extra.get(DP_RELEASES), record.extra.get(DP_EPSILON)
        if releases is not None and epsilon is not None and self.results.privacy:  # DP: what it cost so far
            pv = self.job.privacy
            self.results.privacy["dp"] = {
                "noise_multiplier": pv.dp_noise,
                "clip": pv.dp_clip,
                "head_clip": pv.clip_of(heads=True),
                "max_rows": pv.dp_max_rows,
                "delta": pv.dp_delta,
                "releases": int(releases),
                "epsilon": float(epsilon),
            }
        if self.job.train.private:  # per-example DP: the run's epsilon in the row unit, one accountant
            self._record_row_privacy(record)
        if t >= 1:
            self.round_times.append(time.perf_counter())
        if self.tb is not None:
            self.tb.round(record, self.targets, ellipses=not self.background)
            if self.background:
                self._later(self.tb.ellipses, record, self.targets)
        self.write()
        log.info("%s", round_log_line(self.job, record))
        console.info("%s", round_line(self.job, record))
        if record.max_trained_gap is not None and record.max_trained_gap > LOCAL_GAP_THRESHOLD:
            advice = local_gap_advice(record, self.job)
            if self._gap_warned:  # each round's gaps are on the console line; the advice once is enough
                gap_log.info("[%s] round %d: %s", self.job.name, t, advice)
            else:
                gap_log.warning("[%s] round %d: %s (later rounds: run.log)", self.job.name, t, advice)
                self._gap_warned = True
        if self._bar is not None and t >= 1:
            self._bar.update(1)
            self._bar.set_postfix(e_star=fmt(record.e_f_star, ".3g"), e_cen=fmt(record.e_f_cen, ".3g"))

    def _record_row_privacy(self, record: RoundRecord) -> None:
        """``row_epsilon`` and ``dp_sgd_epsilon`` of the round ([`row_epsilons`][fedhead.driver.privacy.row_epsilons])
        and ``privacy.dp_sgd`` of results.json."""
        spent = row_epsilons(self.job, record.round, record.extra.get(DP_RELEASES))
        record.extra.update(spent)
        section = self.results.privacy if isinstance(self.results.privacy, dict) else {}
        section["dp_sgd"] = {**dp_sgd_settings(self.job), **spent}
        self.results.privacy = section

    def finish(self, status: str, *, timing: Timing | None = None, error: str | None = None) -> Results:
        if self._bar is not None:
            self._bar.close()
        self.results.status = status
        if error:
            self.results.error = error
        nodes = ray_nodes(self.job)
        if nodes:  # a simulation: the Ray nodes its clients trained on (several on a cluster)
            self.results.provenance["ray_nodes"] = nodes
        self.results.timing = dataclasses.replace(
            self.base_timing,
            **(timing or Timing()).to_dict(),
            total_seconds=time.perf_counter() - self.t_start,
        )
        records = [self.records[t] for t in sorted(self.records)]
        self.results.local_optimality = local_optimality(records)
        steps = local_steps(records, self.job.settings.local_epochs, self.job.settings.num_clients)
        self.results.local_steps = ABSENT if steps is None else steps
        if self.background and status == "completed":
            self._later(self._write_outputs, status)  # figures, then results.json and the events
        else:
            self.wait(raise_errors=status in ("completed", "diagnosed"))  # the writer closes below
            self._write_outputs(status)
        return self.results

    def add_timing(self, **seconds: float) -> None:
        """Add ``timing`` entries (e.g. ``figures_wait_seconds``) and rewrite results.json."""
        self.results.timing = dataclasses.replace(self.results.timing, **seconds)
        self.write()

    def _write_outputs(self, status: str) -> None:
        if status == "completed" and self.job.output.figures and len(self.records) > 1:
            self.results.rounds = [self.records[t] for t in sorted(self.records)]
            paths = write_run_figures(
                self.results, self.targets, self.dir, target_names=self.target_names, unit=self.unit
            )
            self.results.figures = [str(p.name) for p in paths]
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


#: experiment folders whose secure-mode note the console has shown
_SECURE_SHOWN: set[str] = set()
#: (experiment folder, diagnosis text) already shown on the console in this process
_DIAGNOSES_SHOWN: set[tuple[str, str]] = set()


def target_axes(job: JobConfig) -> tuple[list[str] | None, str]:
    """Target names and the unit of the Gram axes of ``job``'s data set.

    Names come from the data set if this process has loaded it (the simulation driver has; a
    deployed ServerApp has no data and gets ``None``: axes "coordinate k"); the unit is
    [`fedhead.data.units.axis_unit`][fedhead.data.units.axis_unit]'s.
    """
    name = str(job.dataset.name)
    names, standardized = None, True
    try:
        raw = memo_get(coerce_config(job.dataset))
        if raw is not None:
            names, standardized = [str(n) for n in raw.target_names], bool(raw.standardize)
    except Exception:
        log.debug("target names of %s not available", name, exc_info=True)
    return names, axis_unit(name, names, standardized=standardized)


def loaded_standardization(job: JobConfig) -> Standardization | None:
    """The target standardisation of a data set this process has loaded (the simulation driver
    has; a deployed ServerApp has not: None), computed as the data pipeline does; its inputs are
    the loader's (``mode="loader"``, not recorded)."""
    try:
        raw = memo_get(coerce_config(job.dataset))
    except Exception:
        log.debug("data set of %s not available", job.dataset.name, exc_info=True)
        return None
    if raw is None:
        return None
    st = standardize_targets(raw.y, enabled=raw.standardize)
    mode = "pooled" if raw.standardize else "none"
    return Standardization(mode, "loader", st.offset, st.scale, np.zeros(0), np.zeros(0))


def init_seeds(job: JobConfig) -> dict[str, Any]:
    """``init`` and each partition's initial-backbone seed
    ([`fedhead.analysis.seeds.backbone_seed`][fedhead.analysis.seeds.backbone_seed])."""
    init = job.settings.init
    return {
        "init": init,
        "backbone_seeds": [backbone_seed(job.settings.seed, m, init) for m in range(job.settings.num_clients)],
    }


def job_hparams(job: JobConfig) -> dict[str, Any]:
    """The hyperparameters a sweep varies (TensorBoard's hparams plugin filters runs by them)."""
    st, tr, proc = job.settings, job.train, job.procedure
    return {
        "procedure": proc.name,
        "dataset": str(job.dataset.name),
        "model": str(job.model.name),
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
        "init": str(st.init),
    }
