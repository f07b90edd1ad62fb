"""The fedhead ClientApp (flwr 1.42 Message API): ``query``, ``train`` and ``evaluate`` handlers.

* ``query``: the client's ``(N_m, mu_m, Sigma_m)`` (only these O(C^2) numbers leave the client);
  ``stage="statistics"`` (site-local ``dataset=table``): its raw statistics
  (:func:`fedhead.clients.site.handle_statistics`), after which every message carries the
  federation's standardisation and the client reads only its own file.
* ``train``: runs :func:`fedhead.train.train_local` on the client's partition with the
  procedure's terms (proximal ``rho``, correction ``gamma`` with the server's ``Sigma_cen``,
  target centring), optionally aligns the trained head to the broadcast, and uploads the head
  (plus the backbone for full-model averaging). The ``exact`` procedure returns
  ``Pi_m(W_t)`` in closed form (:func:`fedhead.train.exact_head`) instead of training.
* ``evaluate``: MSE of the broadcast (shared) head with the client's own backbone.
* ``query`` with ``stage="mismatch"`` (``measure_mismatch=true``, after round 1): the client's
  objectives of the mismatch measurement (:func:`handle_mismatch`, docs/theory.md §13).

Record names and keys come from the neutral :mod:`fedhead.federation.protocol` (the server imports it too);
the train reply's metrics, which become results.json's per-client metrics, are named by their
declarations in :class:`fedhead.results.rounds.ClientMetric`.
The private backbone persists across rounds in a :class:`fedhead.clients.store.BackboneStore` under the
job's state folder, keyed by run and partition; every client starts from the broadcast head and
the same seeded random backbone (``init=common``) or its own (``init=independent``).
:func:`make_client_app` builds the app from a :class:`fedhead.federation.config.JobConfig` (or a function
``Context -> JobConfig``).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedhead.clients.export import is_final, save_final_model
from fedhead.clients.site import handle_statistics, local_data
from fedhead.clients.state import (
    ClientError,
    apply_shared_state,
    client_moments,
    is_free,
    limit_threads,
    load_backbone,
    partition_of,
    round_of,
    save_backbone,
    shared_state,
    sigma_cen_of,
    train_inputs,
)
from fedhead.federation import protocol as P
from fedhead.federation.job import JobConfig
from fedhead.results.rounds import ClientMetric as CM
from fedhead.train import (
    align,
    evaluate_local,
    exact_head,
    head_distances,
    mismatch_objectives,
    round_seed,
    select_device,
    train_local,
)

log = logging.getLogger(__name__)


# -------------------------------------------------------------------------------- handlers
def handle_query(job: JobConfig, msg: Message, context: Context) -> Message:
    """Reply with ``(N_m, mu_m, Sigma_m)`` of the client's training targets (theory.md §3), or,
    for ``stage="mismatch"``, with the mismatch objectives (:func:`handle_mismatch`)."""
    cfg = msg.content.config_records.get(P.CONFIG)
    if cfg is not None and cfg.get(P.STAGE) == P.STAGE_MISMATCH:
        return handle_mismatch(job, msg, context)
    if cfg is not None and cfg.get(P.STAGE) == P.STAGE_STATISTICS:
        return handle_statistics(job, msg, context)
    pid = partition_of(context, job, msg)
    _, cd = local_data(job, context, msg, pid)
    y, mu, sigma = client_moments(job, pid, cd)
    content = RecordDict(
        {
            P.MOMENTS: ArrayRecord({P.MEAN: Array(mu), P.COV: Array(sigma)}),
            P.METRICS: MetricRecord({P.NUM_EXAMPLES: int(y.shape[0]), P.PARTITION_ID: pid}),
        }
    )
    return Message(content, reply_to=msg)


def handle_mismatch(job: JobConfig, msg: Message, context: Context) -> Message:
    """The client's three objectives of the mismatch measurement (docs/theory.md §13): its own
    trained local model, the trained heads' average with its backbone, the aligned average with
    its aligned backbone (:func:`fedhead.train.mismatch_objectives`; the stored backbone of the
    message's round is only read)."""
    limit_threads(job)
    pid = partition_of(context, job, msg)
    data, cd = local_data(job, context, msg, pid)
    if P.MISMATCH not in msg.content.array_records:
        raise ClientError(f"partition {pid}: mismatch query without the '{P.MISMATCH}' record")
    rec = msg.content.array_records[P.MISMATCH]
    missing = [
        k
        for k in (P.OWN_WEIGHT, P.OWN_BIAS, P.TRAINED_WEIGHT, P.ALIGNED_WEIGHT, P.AVERAGE_BIAS, P.ROTATION)
        if k not in rec
    ]
    if missing:
        raise ClientError(f"partition {pid}: mismatch record lacks {missing}")
    arr = {k: rec[k].numpy().astype(np.float64) for k in rec}
    backbone = load_backbone(job, context, pid, data, cd, required=True, expected_round=round_of(msg))
    device = select_device(job.settings.device)
    backbone.to(device)
    offset = cd.y_train.detach().cpu().double().mean(0).numpy() if job.procedure.centered else None
    ev = mismatch_objectives(
        backbone,
        train_inputs(job, cd),
        cd.y_train,
        own_head=(arr[P.OWN_WEIGHT], arr[P.OWN_BIAS]),
        trained_head=(arr[P.TRAINED_WEIGHT], arr[P.AVERAGE_BIAS]),
        aligned_head=(arr[P.ALIGNED_WEIGHT], arr[P.AVERAGE_BIAS]),
        rotation=arr[P.ROTATION],
        lambda_h=job.settings.lambda_h,
        lambda_w=job.settings.lambda_w,
        target_offset=offset,
        device=device,
    )
    metrics = {
        P.NUM_EXAMPLES: int(cd.n_train),
        P.PARTITION_ID: pid,
        P.MISMATCH_LOCAL: ev.local,
        P.MISMATCH_TRAINED: ev.trained,
        P.MISMATCH_ALIGNED: ev.aligned,
    }
    return Message(RecordDict({P.METRICS: MetricRecord(metrics)}), reply_to=msg)


def handle_train(job: JobConfig, msg: Message, context: Context) -> Message:
    """One round of local work: train (or the closed-form rule) and upload the head."""
    limit_threads(job)
    pid = partition_of(context, job, msg)
    rnd = round_of(msg)
    data, cd = local_data(job, context, msg, pid)
    w_t, b_t = P.read_head(msg.content.array_records[P.HEAD])
    sigma_cen = sigma_cen_of(msg, job, pid)
    y = cd.y_train
    n = int(y.shape[0])
    content = RecordDict()
    metrics: dict[str, float | int] = {CM.NUM_EXAMPLES.name: n, CM.PARTITION_ID.name: pid, CM.SERVER_ROUND.name: rnd}
    proc, lh, lw = job.procedure, job.settings.lambda_h, job.settings.lambda_w
    _, mu, sigma = client_moments(job, pid, cd)

    if proc.exact:
        t0 = time.perf_counter()
        weight, bias, gap, trained_gap = exact_head(
            mu, sigma, w_t, sigma_cen, gamma=proc.gamma, centered=proc.centered, lambda_h=lh, lambda_w=lw
        )
        metrics.update(
            {
                CM.OBJECTIVE_GAP.name: float(gap),
                CM.TRAINED_GAP.name: float(trained_gap),
                CM.N_STEPS.name: 0,
                CM.LOCAL_EPOCHS.name: 0,
                CM.LOCAL_SECONDS.name: time.perf_counter() - t0,
            }
        )
    else:
        device = select_device(job.settings.device)
        backbone = load_backbone(job, context, pid, data, cd, required=False, expected_round=rnd - 1)
        if job.procedure.full_model:
            apply_shared_state(backbone, msg.content.array_records.get(P.BACKBONE), pid)
        head = torch.nn.Linear(w_t.shape[1], w_t.shape[0])
        with torch.no_grad():
            head.weight.copy_(torch.as_tensor(w_t, dtype=torch.float32))
            head.bias.copy_(torch.as_tensor(b_t, dtype=torch.float32))
        t0 = time.perf_counter()
        result = train_local(
            backbone,
            head,
            train_inputs(job, cd),
            y,
            job.train,
            job.local_problem(),
            broadcast_weight=w_t,
            sigma_cen=sigma_cen,
            device=device,
            seed=round_seed(job.settings.seed, rnd, pid),
        )
        local_seconds = time.perf_counter() - t0
        weight, bias = result.weight, result.bias
        lm = result.metrics
        metrics.update(
            {
                CM.OBJECTIVE_GAP.name: float(lm.relative_gap),
                CM.TRAINED_GAP.name: float(lm.trained_gap),
                CM.OBJECTIVE.name: float(lm.objective),
                CM.OPTIMAL_OBJECTIVE.name: float(lm.optimal_objective),
                CM.LOCAL_TRAIN_MSE.name: float(lm.train_mse),
                CM.TRAIN_SECONDS.name: float(lm.seconds),
                CM.N_STEPS.name: int(lm.n_steps),
                CM.LOCAL_EPOCHS.name: int(lm.epochs),
                CM.LOCAL_SECONDS.name: local_seconds,
            }
        )
        if job.procedure.align:
            trained_gram = weight @ weight.T
            aligned = align(head, backbone, w_t)
            weight, bias = aligned.weight, aligned.bias
            metrics[CM.ALIGN_DISTANCE_BEFORE.name] = float(aligned.distance_before)
            metrics[CM.ALIGN_DISTANCE_AFTER.name] = float(aligned.distance_after)
            content[P.CHECKS] = ArrayRecord({P.TRAINED_GRAM: Array(np.asarray(trained_gram, dtype=np.float64))})
        if job.procedure.full_model:
            content[P.BACKBONE] = shared_state(backbone)
        save_backbone(job, context, pid, rnd, backbone)
    dist = head_distances(sigma, w_t, weight, sigma_cen, gamma=proc.gamma, lambda_h=lh, lambda_w=lw)
    metrics[CM.DISTANCE_TO_BROADCAST.name] = dist.to_broadcast
    metrics[CM.DISTANCE_TO_SELECTION.name] = dist.to_selection
    metrics[CM.RELATIVE_DISTANCE_TO_SELECTION.name] = dist.relative_to_selection
    content[P.HEAD] = P.head_record(weight, bias)
    content[P.METRICS] = MetricRecord(metrics)
    return Message(content, reply_to=msg)


def handle_evaluate(job: JobConfig, msg: Message, context: Context) -> Message:
    """MSE of the shared head with the client's own backbone on its train (and test) data."""
    limit_threads(job)
    pid = partition_of(context, job, msg)
    data, cd = local_data(job, context, msg, pid)
    w, b = P.read_head(msg.content.array_records[P.HEAD])
    backbone = load_backbone(job, context, pid, data, cd, required=True, expected_round=round_of(msg))
    if job.procedure.full_model:
        apply_shared_state(backbone, msg.content.array_records.get(P.BACKBONE), pid)
    device = select_device(job.settings.device)
    backbone.to(device)
    offset = None
    if job.procedure.centered:
        offset = cd.y_train.detach().cpu().double().mean(0).numpy()
    lh, lw = job.settings.lambda_h, job.settings.lambda_w
    ev = evaluate_local(
        backbone,
        (w, b),
        train_inputs(job, cd),
        cd.y_train,
        lambda_h=lh,
        lambda_w=lw,
        target_offset=offset,
        device=device,
    )
    metrics: dict[str, float | int] = {
        P.NUM_EXAMPLES: int(cd.n_train),
        P.PARTITION_ID: pid,
        P.TRAIN_MSE: float(ev.mse),
        P.SHARED_OBJECTIVE: float(ev.objective),
    }
    if cd.x_test is not None and cd.y_test is not None and cd.y_test.shape[0] > 0 and not is_free(job):
        et = evaluate_local(
            backbone, (w, b), cd.x_test, cd.y_test, lambda_h=lh, lambda_w=lw, target_offset=offset, device=device
        )
        metrics[P.TEST_MSE] = float(et.mse)
        metrics[P.NUM_TEST_EXAMPLES] = int(cd.y_test.shape[0])
    if is_final(msg):
        try:
            save_final_model(job, context, msg, pid, cd, backbone, (w, b), offset, round_of(msg))
        except Exception as exc:  # noqa: BLE001 - the run's results stand; the model is lost, said once
            log.warning("partition %d: the final model could not be saved: %s: %s", pid, type(exc).__name__, exc)
    return Message(RecordDict({P.METRICS: MetricRecord(metrics)}), reply_to=msg)


# -------------------------------------------------------------------------------- the app
#: Apps this process rebuilt from pickled jobs, by the pickle's digest (see :class:`JobsClientApp`).
_APPS: dict[str, ClientApp] = {}


class JobsClientApp(ClientApp):
    """The ClientApp of fixed jobs: it pickles as the jobs' pickle and unpickles into the app this
    process already built from them. flwr's Ray simulation sends the app with every message;
    this makes that a few kB of bytes instead of the handlers' code and the configs, rebuilt
    once per worker process instead of once per message."""

    def __init__(self, jobs: JobConfig | Sequence[JobConfig]):
        super().__init__()
        self._blob = pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL)
        self._digest = hashlib.sha256(self._blob).hexdigest()

    def __reduce__(self):
        return _app_from_pickle, (self._digest, self._blob)


def _app_from_pickle(digest: str, blob: bytes) -> ClientApp:
    app = _APPS.get(digest)
    if app is None:
        app = _APPS[digest] = make_client_app(pickle.loads(blob))
    return app


def make_client_app(job: JobConfig | Sequence[JobConfig] | Callable[[Context], JobConfig]) -> ClientApp:
    """Build the ClientApp.

    ``job`` is a :class:`fedhead.federation.config.JobConfig`, a sequence of them (one simulation serving
    several procedures one after another: each message's ``config["job"]`` picks the job), or a
    function ``Context -> JobConfig`` (deployments, where the run config names the job). The
    jobs travel with the app in a Ray simulation (as their pickle: :class:`JobsClientApp`).
    """
    app: ClientApp = ClientApp()
    if isinstance(job, (list, tuple)) or not callable(job):
        try:
            app = JobsClientApp(job)
        except (pickle.PicklingError, TypeError, AttributeError):  # e.g. a test's local class: by value
            log.debug("jobs not picklable by reference; the ClientApp travels by value", exc_info=True)
    if isinstance(job, (list, tuple)):
        jobs = tuple(job)

        def resolve(msg: Message, _ctx: Context) -> JobConfig:
            cfg = msg.content.config_records.get(P.CONFIG)
            idx = int(cfg.get(P.JOB, 0)) if cfg is not None else 0
            if not 0 <= idx < len(jobs):
                raise ClientError(f"message names job {idx}, but this app serves {len(jobs)} job(s)")
            return jobs[idx]
    elif callable(job):

        def resolve(msg: Message, ctx: Context) -> JobConfig:
            return job(ctx)
    else:

        def resolve(msg: Message, ctx: Context) -> JobConfig:
            return job

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return handle_query(resolve(msg, context), msg, context)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return handle_train(resolve(msg, context), msg, context)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return handle_evaluate(resolve(msg, context), msg, context)

    return app
