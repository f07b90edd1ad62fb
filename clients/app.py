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
from collections.abc import Callable, Sequence

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedhead.clients.export import is_final, save_final_model
from fedhead.clients.site import handle_statistics, local_data
from fedhead.clients.state import (
    ClientError,
    client_moments,
    is_free,
    limit_threads,
    load_backbone,
    partition_of,
    round_of,
    save_backbone,
    train_inputs,
)
from fedhead.clients.step import evaluate_step, moment_reply, train_step
from fedhead.federation import protocol as P
from fedhead.federation.job import JobConfig
from fedhead.train import mismatch_objectives, select_device

log = logging.getLogger(__name__)


# -------------------------------------------------------------------------------- handlers
def handle_query(job: JobConfig, msg: Message, context: Context) -> Message:
    """Reply with ``(N_m, mu_m, Sigma_m)`` of the client's training targets (theory.md §3,
    :func:`fedhead.clients.step.moment_reply`), or, for ``stage="mismatch"``, with the mismatch
    objectives (:func:`handle_mismatch`)."""
    cfg = msg.content.config_records.get(P.CONFIG)
    if cfg is not None and cfg.get(P.STAGE) == P.STAGE_MISMATCH:
        return handle_mismatch(job, msg, context)
    if cfg is not None and cfg.get(P.STAGE) == P.STAGE_STATISTICS:
        return handle_statistics(job, msg, context)
    pid = partition_of(context, job, msg)
    _, cd = local_data(job, context, msg, pid)
    y, mu, sigma = client_moments(job, pid, cd)
    return Message(moment_reply(y, pid, moments=(mu, sigma)), reply_to=msg)


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
    """One round of local work (:func:`fedhead.clients.step.train_step`) on the client's partition
    and its stored private backbone, which is saved afterwards."""
    limit_threads(job)
    pid = partition_of(context, job, msg)
    rnd = round_of(msg)
    data, cd = local_data(job, context, msg, pid)
    _, mu, sigma = client_moments(job, pid, cd)
    backbone = None
    if not job.procedure.exact:
        backbone = load_backbone(job, context, pid, data, cd, required=False, expected_round=rnd - 1)
    content = train_step(
        msg.content,
        backbone,
        None if backbone is None else train_inputs(job, cd),
        cd.y_train,
        procedure=job.procedure,
        problem=job.local_problem(),
        train=job.train,
        partition_id=pid,
        seed=job.settings.seed,
        device=job.settings.device,
        moments=(mu, sigma),
    )
    if backbone is not None:
        save_backbone(job, context, pid, rnd, backbone)
    return Message(content, reply_to=msg)


def handle_evaluate(job: JobConfig, msg: Message, context: Context) -> Message:
    """MSE of the shared head with the client's own backbone on its train (and test) data
    (:func:`fedhead.clients.step.evaluate_step`)."""
    limit_threads(job)
    pid = partition_of(context, job, msg)
    data, cd = local_data(job, context, msg, pid)
    backbone = load_backbone(job, context, pid, data, cd, required=True, expected_round=round_of(msg))
    has_test = cd.x_test is not None and cd.y_test is not None and cd.y_test.shape[0] > 0 and not is_free(job)
    content = evaluate_step(
        msg.content,
        backbone,
        train_inputs(job, cd),
        cd.y_train,
        procedure=job.procedure,
        problem=job.local_problem(),
        partition_id=pid,
        test=(cd.x_test, cd.y_test) if has_test else None,
        device=job.settings.device,
    )
    if is_final(msg):
        w, b = P.read_head(msg.content.array_records[P.HEAD])
        offset = cd.y_train.detach().cpu().double().mean(0).numpy() if job.procedure.centered else None
        try:
            save_final_model(job, context, msg, pid, cd, backbone, (w, b), offset, round_of(msg))
        except Exception as exc:  # noqa: BLE001 - the run's results stand; the model is lost, said once
            log.warning("partition %d: the final model could not be saved: %s: %s", pid, type(exc).__name__, exc)
    return Message(content, reply_to=msg)


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
