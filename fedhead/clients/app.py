"""fedhead's own ClientApp (flwr 1.42 Message API), built by
[`make_client_app`][fedhead.clients.app.make_client_app] from its jobs. Its handlers serve ``query``
(the moments, a site's statistics, the mismatch objectives of docs/theory.md §13), ``train`` and
``evaluate`` with the client's data and stored private backbone, through the library steps of
[`fedhead.clients.step`][fedhead.clients.step] (one implementation).

A deployed message starts a fresh process that imports this module: the steps, the trainer and torch
are imported by the handlers that touch a model, when first called, so that a statistics query or a
SecAgg step imports no torch (``tests/clients/test_light_imports.py``).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, MetricRecordValues, RecordDict
from flwr.clientapp import ClientApp

from fedhead.clients.cache import CLIENT_CACHE
from fedhead.clients.identity import SimulatedSites
from fedhead.clients.ledger import SiteLedger, run_scope
from fedhead.clients.messages import ClientError, round_of
from fedhead.clients.moments import moment_reply
from fedhead.clients.policy import site_policy
from fedhead.clients.secure import SecureSite, secure_mod, sum_id
from fedhead.clients.site import handle_statistics, local_data, local_targets, own_site
from fedhead.clients.state import (
    client_moments,
    is_free,
    job_key,
    limit_threads,
    load_backbone,
    partition_of,
    record_ray_node,
    save_backbone,
    train_inputs,
)
from fedhead.clients.sum_inputs import fully_active
from fedhead.federation import protocol
from fedhead.federation.run_privacy import job_training
from fedhead.federation.secure_records import FULLY_ACTIVE, STAGE_REGIME
from fedhead.settings.job import JobConfig
from fedhead.settings.privacy import PrivacyPolicy

if TYPE_CHECKING:
    from fedhead.data.base import ClientData, FederatedData

log = logging.getLogger(__name__)

#: the node state's record of the site's own row-level exchange release (the exact rule's closed forms and the
#: correction under DP-SGD read it: [`released_moments`][fedhead.clients.app.released_moments])
OWN_RELEASE = "fedhead.own-row-release"


# -------------------------------------------------------------------------------- handlers
def setup(job: JobConfig, msg: Message, context: Context) -> tuple[int, FederatedData, ClientData]:
    """The opening of the handlers that touch a model: torch's threads limited to the client's CPU share,
    then ``(partition id, data set, client data)`` of the message's client
    ([`local_data`][fedhead.clients.site.local_data]: a site below its row minimum refuses here). The
    moment query and the regime check read only the targets
    ([`local_targets`][fedhead.clients.site.local_targets], no torch)."""
    limit_threads(job)
    pid = partition_of(context, job, msg)
    data, cd = local_data(job, context, msg, pid)
    return pid, data, cd


def handle_query(job: JobConfig, msg: Message, context: Context) -> Message:
    """Reply with ``(N_m, mu_m, Sigma_m)`` of the client's training targets (theory.md §3,
    [`fedhead.clients.step.moment_reply`][fedhead.clients.moment_reply]), or, for ``stage="mismatch"``,
    with the mismatch objectives ([`handle_mismatch`][fedhead.clients.app.handle_mismatch])."""
    cfg = msg.content.config_records.get(protocol.CONFIG)
    stage = None if cfg is None else cfg.get(protocol.STAGE)
    if stage == STAGE_REGIME:
        return handle_regime(job, msg, context)
    if stage == protocol.STAGE_MISMATCH:
        return handle_mismatch(job, msg, context)
    if stage == protocol.STAGE_STATISTICS:
        reply = handle_statistics(job, msg, context)
        add_row_release(job, msg, context, reply.content, own_site(job, context).y)  # its files' (public) units
        return reply
    pid = partition_of(context, job, msg)
    y, mu, sigma = client_moments(job, pid, local_targets(job, context, msg, pid))
    content = moment_reply(y, pid, moments=(mu, sigma))
    add_row_release(job, msg, context, content, y)
    return Message(content, reply_to=msg)


def add_row_release(job: JobConfig, msg: Message, context: Context, content: RecordDict, y: np.ndarray) -> None:
    """``privacy.dp_unit=row``, a message that names a sum: the site's row-level release of its targets ``y``
    ([`row_release`][fedhead.clients.app.row_release]) into ``content``; kept in the node's state when the site's
    heads will read their moments from it
    ([`JobConfig.reads_own_release`][fedhead.settings.job.JobConfig.reads_own_release])."""
    if not (job.privacy.row_level and sum_id(msg) is not None):
        return
    record = row_release(y, job.privacy, secure_site(job))
    content[protocol.ROW_RELEASE] = record
    if job.reads_own_release:
        context.state[OWN_RELEASE] = ArrayRecord({protocol.RELEASE: Array(record[protocol.RELEASE].numpy())})


def released_moments(job: JobConfig, context: Context, dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mu_m, Sigma_m)`` of the site's targets from its own row-level exchange release, which the exact rule and
    the correction under DP-SGD read (None when they read none,
    [`JobConfig.reads_own_release`][fedhead.settings.job.JobConfig.reads_own_release]); post-processing of that
    release, no row read."""
    if not job.reads_own_release:
        return None
    from fedhead.federation.row_privacy import pooled_moments
    from fedhead.federation.secure_records import nearest_psd

    if OWN_RELEASE not in context.state.array_records:
        raise ClientError("this run's heads read the site's own exchange release, which this node does not hold")
    try:
        own = pooled_moments(context.state.array_records[OWN_RELEASE][protocol.RELEASE].numpy(), dim)
    except ValueError as exc:  # a noised count that is not positive: too few rows for the noise
        raise ClientError(f"the site's own exchange release: {exc}") from None
    return own.mean, nearest_psd(own.cov)  # a noised covariance may have negative eigenvalues


def row_release(y: np.ndarray, privacy: PrivacyPolicy, site: SecureSite) -> ArrayRecord:
    """``privacy.dp_unit=row``: the site's row-clipped statistics with its share of the discrete Gaussian noise
    ([`site_release`][fedhead.federation.row_privacy.site_release]), which the secure reply sends into the sum in
    place of its moments; drawn from the operating system's entropy (no seed the server could know)."""
    from fedhead.federation.row_privacy import site_release

    values = site_release(
        y,
        clip=privacy.dp_clip,
        noise_multiplier=privacy.dp_noise,
        min_sites=site.min_sites,
        sites=site.sites,
        rng=random.SystemRandom(),
    )
    return ArrayRecord({protocol.RELEASE: Array(values)})


def handle_regime(job: JobConfig, msg: Message, context: Context) -> Message:
    """Secure mode, a site-local table: this site's own margin, pass or fail, for its targets in the
    pooled standardisation the message carries (nothing else is sent)."""
    pid = partition_of(context, job, msg)
    _, _, sigma = client_moments(job, pid, local_targets(job, context, msg, pid))
    passed = fully_active(sigma, (job.settings.lambda_h, job.settings.lambda_w))
    metrics: dict[str, MetricRecordValues] = {protocol.PARTITION_ID: pid, FULLY_ACTIVE: int(passed)}
    return Message(RecordDict({protocol.METRICS: MetricRecord(metrics)}), reply_to=msg)


def secure_site(job: JobConfig) -> SecureSite:
    """What the job's secure replies need ([`fedhead.clients.secure.secure_mod`][fedhead.clients.secure.secure_mod])."""
    st = job.settings
    return SecureSite(
        lambdas=(st.lambda_h, st.lambda_w),
        privacy=job.privacy,
        min_sites=job.min_summed_sites,
        sites=st.num_clients,
        job_key=job_key(job),
        max_abs=job.trust.max_abs,
        private_heads=job.private_heads,
        exchange_noise=job.exchange_row_noise,
    )


def handle_mismatch(job: JobConfig, msg: Message, context: Context) -> Message:
    """The client's three objectives of the mismatch measurement (docs/theory.md §13): its own
    trained local model, the trained heads' average with its backbone, the aligned average with its
    aligned backbone ([`mismatch_objectives`][fedhead.train.mismatch_objectives.mismatch_objectives]; the
    stored backbone of the message's round is only read)."""
    from fedhead.train import select_device
    from fedhead.train.mismatch_objectives import mismatch_objectives

    pid, data, cd = setup(job, msg, context)
    if protocol.MISMATCH not in msg.content.array_records:
        raise ClientError(f"partition {pid}: mismatch query without the '{protocol.MISMATCH}' record")
    rec = msg.content.array_records[protocol.MISMATCH]
    missing = [
        k
        for k in (
            protocol.OWN_WEIGHT,
            protocol.OWN_BIAS,
            protocol.TRAINED_WEIGHT,
            protocol.ALIGNED_WEIGHT,
            protocol.AVERAGE_BIAS,
            protocol.ROTATION,
        )
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
        own_head=(arr[protocol.OWN_WEIGHT], arr[protocol.OWN_BIAS]),
        trained_head=(arr[protocol.TRAINED_WEIGHT], arr[protocol.AVERAGE_BIAS]),
        aligned_head=(arr[protocol.ALIGNED_WEIGHT], arr[protocol.AVERAGE_BIAS]),
        rotation=arr[protocol.ROTATION],
        lambda_h=job.settings.lambda_h,
        lambda_w=job.settings.lambda_w,
        target_offset=offset,
        device=device,
    )
    metrics = {
        protocol.NUM_EXAMPLES: int(cd.n_train),
        protocol.PARTITION_ID: pid,
        protocol.MISMATCH_LOCAL: ev.local,
        protocol.MISMATCH_TRAINED: ev.trained,
        protocol.MISMATCH_ALIGNED: ev.aligned,
    }
    return Message(RecordDict({protocol.METRICS: MetricRecord(metrics)}), reply_to=msg)


def handle_train(job: JobConfig, msg: Message, context: Context) -> Message:
    """One round of local work ([`fedhead.clients.step.train_step`][fedhead.clients.train_step])
    on the client's partition and its stored private backbone, which is saved afterwards."""
    from fedhead.clients.step import train_step

    pid, data, cd = setup(job, msg, context)
    rnd = round_of(msg)
    charge_training(job, context, rnd)
    y, mu, sigma = client_moments(job, pid, cd.y_train.detach().cpu().numpy())
    released = released_moments(job, context, y.shape[1])
    if released is not None and job.procedure.exact:  # the closed form of the released moments
        mu, sigma = released
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
        released_sigma=None if released is None or job.procedure.exact else released[1],
    )
    if backbone is not None:
        save_backbone(job, context, pid, rnd, backbone)
    record_ray_node(job)
    return Message(content, reply_to=msg)


def charge_training(job: JobConfig, context: Context, rnd: int) -> None:
    """Charge round ``rnd``'s DP-SGD (``train.dp_noise > 0``) to the site's epsilon ledger before it trains
    ([`SiteLedger.charge_training`][fedhead.clients.ledger.SiteLedger.charge_training]): a round over the
    site's ``epsilon-budget`` is refused, with one line naming the rule."""
    training = job_training(job)
    if training is not None:
        SiteLedger(context).charge_training(run_scope(context, job_key(job)), rnd, site_policy(context), training)


def handle_evaluate(job: JobConfig, msg: Message, context: Context) -> Message:
    """MSE of the shared head with the client's own backbone on its train (and test) data
    ([`fedhead.clients.step.evaluate_step`][fedhead.clients.evaluate_step])."""
    from fedhead.clients.export import is_final, save_final_model
    from fedhead.clients.step import evaluate_step

    pid, data, cd = setup(job, msg, context)
    backbone = load_backbone(job, context, pid, data, cd, required=True, expected_round=round_of(msg))
    test = None
    if cd.x_test is not None and cd.y_test is not None and cd.y_test.shape[0] > 0 and not is_free(job):
        test = (cd.x_test, cd.y_test)
    content = evaluate_step(
        msg.content,
        backbone,
        train_inputs(job, cd),
        cd.y_train,
        procedure=job.procedure,
        problem=job.local_problem(),
        partition_id=pid,
        test=test,
        device=job.settings.device,
    )
    if is_final(msg):
        w, b = protocol.read_head(msg.content.array_records[protocol.HEAD])
        offset = cd.y_train.detach().cpu().double().mean(0).numpy() if job.procedure.centered else None
        try:
            save_final_model(job, context, msg, pid, cd, backbone, (w, b), offset, round_of(msg))
        except Exception as exc:  # noqa: BLE001 - the run's results stand; the model is lost, said once
            log.warning("partition %d: the final model could not be saved: %s: %s", pid, type(exc).__name__, exc)
    return Message(content, reply_to=msg)


# -------------------------------------------------------------------------------- the app
class JobsClientApp(ClientApp):
    """The ClientApp of fixed jobs: it pickles as the jobs' pickle and unpickles into the app this
    process already built from them. flwr's Ray simulation sends the app with every message;
    this makes that a few kB of bytes instead of the handlers' code and the configs, rebuilt
    once per worker process instead of once per message."""

    def __init__(
        self, jobs: JobConfig | Sequence[JobConfig], mods: list | None = None, simulated: SimulatedSites | None = None
    ):
        super().__init__(mods=mods)
        self._blob = pickle.dumps((jobs, simulated), protocol=pickle.HIGHEST_PROTOCOL)
        self._digest = hashlib.sha256(self._blob).hexdigest()

    def __reduce__(self):
        return _app_from_pickle, (self._digest, self._blob)


def _app_from_pickle(digest: str, blob: bytes) -> ClientApp:
    return CLIENT_CACHE.remember(CLIENT_CACHE.apps, digest, lambda: make_client_app(*pickle.loads(blob)))


def make_client_app(
    job: JobConfig | Sequence[JobConfig] | Callable[[Context], JobConfig], simulated: SimulatedSites | None = None
) -> ClientApp:
    """Build the ClientApp.

    ``job`` is a [`fedhead.settings.config.JobConfig`][fedhead.settings.job.JobConfig], a
    sequence of them (one simulation serving several procedures one after another: each
    message's ``config["job"]`` picks the job), or a function ``Context -> JobConfig``
    (deployments, where the run config names the job). The jobs travel with the app in a Ray
    simulation (as their pickle: [`JobsClientApp`][fedhead.clients.app.JobsClientApp]), and so does
    ``simulated``, a simulation's own roster and signing keys for secure mode (a deployed site reads its
    own from its node config: [`fedhead.clients.identity`][fedhead.clients.identity]).
    """
    resolve = _job_resolver(job)
    mods = [secure_mod(lambda msg, ctx: secure_site(resolve(msg, ctx)), simulated)]  # privacy.mode=secure
    app: ClientApp = ClientApp(mods=mods)
    if isinstance(job, (list, tuple)) or not callable(job):
        try:
            app = JobsClientApp(job, mods, simulated)
        except (pickle.PicklingError, TypeError, AttributeError):  # e.g. a test's local class: by value
            log.debug("jobs not picklable by reference; the ClientApp travels by value", exc_info=True)

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


def _job_resolver(
    job: JobConfig | Sequence[JobConfig] | Callable[[Context], JobConfig],
) -> Callable[[Message, Context], JobConfig]:
    """How a message finds its job: by ``config["job"]`` among several, from the context, or the one job."""
    if isinstance(job, JobConfig):
        single = job
        return lambda _msg, _ctx: single
    if callable(job):
        from_context = job
        return lambda _msg, ctx: from_context(ctx)
    jobs = tuple(job)

    def by_index(msg: Message, _ctx: Context) -> JobConfig:
        cfg = msg.content.config_records.get(protocol.CONFIG)
        idx = protocol.record_int(cfg.get(protocol.JOB, 0)) if cfg is not None else 0
        if not 0 <= idx < len(jobs):
            raise ClientError(f"message names job {idx}, but this app serves {len(jobs)} job(s)")
        return jobs[idx]

    return by_index
