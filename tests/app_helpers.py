"""Helpers shared by the Flower-app tests (importable: tests/app is on sys.path)."""

from __future__ import annotations

import contextlib
import functools
import logging

import numpy as np


def rotation(deg: float) -> np.ndarray:
    a = np.deg2rad(deg)
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


def targets_with_moments(n: int, mean: np.ndarray, cov: np.ndarray, seed: int) -> np.ndarray:
    """``(n, C)`` samples whose population mean and covariance are exactly ``mean``, ``cov``."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, len(mean)))
    z -= z.mean(0)
    ev, evec = np.linalg.eigh(z.T @ z / n)
    z = z @ evec @ np.diag(ev**-0.5) @ evec.T  # whitened exactly
    ev, evec = np.linalg.eigh(cov)
    return z @ (evec @ np.diag(np.sqrt(ev)) @ evec.T) + mean


# ------------------------------------------------------------------ hand-made Flower replies
from collections.abc import Callable, Iterable  # noqa: E402

from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from fedhead import ufm  # noqa: E402
from fedhead.clients.identity import SimulatedSites  # noqa: E402
from fedhead.federation import protocol  # noqa: E402


def pooled_g_cen(targets: list[np.ndarray], lambda_h: float, lambda_w: float) -> np.ndarray:
    """``G_cen`` ``(C, C)`` of the sites' training targets ``(N_m, C)`` pooled and standardised
    directly (every row together, population mean and std; no federation, no exchanged moments):
    ``phi`` of the covariance of the pooled standardised rows."""
    y = np.concatenate([np.asarray(t, dtype=np.float64) for t in targets])
    z = (y - y.mean(0)) / y.std(0)
    sigma = (z - z.mean(0)).T @ (z - z.mean(0)) / z.shape[0]
    return ufm.optimal_gram(sigma, lambda_h, lambda_w)


def instruction(node_id: int, message_type: str, content: RecordDict | None = None) -> Message:
    """A server -> client message (needs the ``task_identity`` fixture)."""
    return Message(content=content or RecordDict(), dst_node_id=int(node_id), message_type=message_type)


def query_reply(msg: Message, y: np.ndarray, pid: int, count: int | None = None) -> Message:
    mom = ufm.TargetMoments.from_targets([y])
    return Message(
        RecordDict(
            {
                protocol.MOMENTS: ArrayRecord(
                    {"mean": Array(np.asarray(mom.means[0])), "cov": Array(np.asarray(mom.covs[0]))}
                ),
                protocol.METRICS: MetricRecord(
                    {protocol.NUM_EXAMPLES: int(count if count is not None else y.shape[0]), protocol.PARTITION_ID: pid}
                ),
            }
        ),
        reply_to=msg,
    )


def train_reply(msg: Message, weight, bias, n: int, pid: int, **extra_records) -> Message:
    content = RecordDict(
        {
            protocol.HEAD: protocol.head_record(weight, bias),
            protocol.METRICS: MetricRecord(
                {
                    protocol.NUM_EXAMPLES: int(n),
                    protocol.PARTITION_ID: pid,
                    "objective_gap": 0.01 * (pid + 1),
                    "trained_gap": 0.01 * (pid + 1),
                    "local_epochs": 10,
                }
            ),
        }
    )
    for k, v in extra_records.items():
        content[k] = v
    return Message(content, reply_to=msg)


class Recorder:
    """A strategy observer (``RunObserver``) that keeps what it is told: exchanges and round records."""

    def __init__(self):
        self.exchanges, self.records = [], []

    def on_exchange(self, exchange):
        self.exchanges.append(exchange)

    def on_round(self, record):
        self.records.append(record)


class NumpyClient:
    """A client of the UFM with free features answering every message type in closed form.

    ``train`` returns ``Pi_m(W_t)`` for ``phi((1 - gamma) Sigma_m + gamma Sigma_cen)`` and bias
    ``mu_m`` (the exact rule); ``evaluate`` returns ``train_mse = pid + 1`` so that the server's
    count-weighted mean is known.
    """

    def __init__(self, y: np.ndarray, pid: int, lambda_h: float, lambda_w: float, gamma: float = 0.0):
        self.y, self.pid, self.lh, self.lw, self.gamma = y, pid, lambda_h, lambda_w, gamma
        mom = ufm.TargetMoments.from_targets([y])
        self.mu, self.sigma = np.asarray(mom.means[0]), np.asarray(mom.covs[0])
        self.seen_sigma_cen: list[np.ndarray] = []

    def __call__(self, msg: Message) -> Message:
        kind = msg.metadata.message_type
        if kind == "query":
            return query_reply(msg, self.y, self.pid)
        if kind == "train":
            w_t, _ = protocol.read_head(msg.content.array_records[protocol.HEAD])
            target = self.sigma
            if self.gamma > 0:
                sc = msg.content.array_records[protocol.SIGMA_CEN]["sigma_cen"].numpy()
                self.seen_sigma_cen.append(sc)
                target = (1 - self.gamma) * self.sigma + self.gamma * sc
            w = ufm.closest_head(w_t, ufm.optimal_gram(target, self.lh, self.lw))
            return train_reply(msg, w, self.mu, self.y.shape[0], self.pid)
        if kind == "evaluate":
            return Message(
                RecordDict(
                    {
                        protocol.METRICS: MetricRecord(
                            {
                                protocol.NUM_EXAMPLES: self.y.shape[0],
                                protocol.PARTITION_ID: self.pid,
                                "train_mse": float(self.pid + 1),
                            }
                        )
                    }
                ),
                reply_to=msg,
            )
        raise ValueError(kind)


class FakeGrid(Grid):
    """An in-process Grid: ``node_id -> handler(Message) -> Message``; no Ray, no SuperLink."""

    def __init__(self, handlers: dict[int, Callable[[Message], Message]]):
        self.handlers = handlers
        self.sent: list[Message] = []

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.handlers)

    def push_messages(self, messages):
        ids = []
        if not hasattr(self, "_replies"):
            self._replies: dict[str, Message] = {}
        for m in messages:
            m.metadata.__dict__["_message_id"] = f"msg-{len(self.sent)}"  # as flwr's InMemoryGrid
            self.sent.append(m)
            try:
                reply = self.handlers[m.metadata.dst_node_id](m)
            except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp -> an error reply
                from flwr.app import Error

                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=m)
            if reply is not None:  # None: the client never answers
                self._replies[m.metadata.message_id] = reply
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            self.sent.append(m)
            out.append(self.handlers[m.metadata.dst_node_id](m))
        return out


class InProcessGrid(FakeGrid):
    """Serves messages with a real ClientApp in this process (one Context per node), no Ray."""

    def __init__(self, client_app, num_nodes: int, *, run_id: int = 11, run_config: dict | None = None):
        from flwr.app import Context

        self.app = client_app
        self.contexts = {
            1000 + i: Context(
                run_id=run_id,
                node_id=1000 + i,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i in range(num_nodes)
        }
        super().__init__({n: (lambda m, n=n: self.app(m, self.contexts[n])) for n in self.contexts})


@contextlib.contextmanager
def captured_strategies_log(caplog):
    """caplog's handler on the ``fedhead.strategies`` logger itself, each record once (a deployed
    ServerApp's logging, set up earlier in the same process, stops it propagating to the root)."""
    logger = logging.getLogger("fedhead.strategies")
    propagate = logger.propagate
    logger.addHandler(caplog.handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


# ------------------------------------------------------------------ lying and failing sites (tests of trust:)
class Lying:
    """A site's honest handler (``Message -> Message``), whose replies to ``kind`` messages ``lie``
    (``RecordDict -> RecordDict``) rewrites."""

    def __init__(self, client, kind: str, lie):
        self.client, self.kind, self.lie = client, kind, lie

    def __call__(self, msg: Message):
        reply = self.client(msg)
        if msg.metadata.message_type != self.kind:
            return reply
        return Message(self.lie(reply.content), reply_to=msg)


def moments_lie(count=None, mean=None, cov=None):
    def lie(content: RecordDict) -> RecordDict:
        arrays = content.array_records[protocol.MOMENTS]
        metrics = dict(content.metric_records[protocol.METRICS])
        mu = arrays[protocol.MEAN].numpy() if mean is None else mean
        sigma = arrays[protocol.COV].numpy() if cov is None else cov
        if count is not None:
            metrics[protocol.NUM_EXAMPLES] = count
        return RecordDict(
            {
                protocol.MOMENTS: ArrayRecord({protocol.MEAN: Array(np.asarray(mu)), protocol.COV: Array(sigma)}),
                protocol.METRICS: MetricRecord(metrics),
            }
        )

    return lie


def train_lie(head=None, metrics=None):
    def lie(content: RecordDict) -> RecordDict:
        w, b = protocol.read_head(content.array_records[protocol.HEAD])
        m = dict(content.metric_records[protocol.METRICS])
        m.update(metrics or {})
        return RecordDict(
            {
                protocol.HEAD: protocol.head_record(w if head is None else head(w), b),
                protocol.METRICS: MetricRecord(m),
            }
        )

    return lie


class Crashing:
    """The same site failing at ``kind`` messages: the run without the attacker."""

    def __init__(self, client, kind: str):
        self.client, self.kind = client, kind

    def __call__(self, msg: Message):
        if msg.metadata.message_type == self.kind:
            raise RuntimeError("this site is down")
        return self.client(msg)


def handlers_app(job, around=None):
    """A ClientApp of fedhead's real handlers for ``job``; ``around(stage, handle)`` (stage
    ``query``/``train``/``evaluate``, ``handle(msg, context)`` the real one) returns the handler to
    register instead (a test's hanging, lying or recording site)."""
    from flwr.clientapp import ClientApp

    from fedhead.clients import app as handlers

    app = ClientApp()
    for stage, register, handle in (
        ("query", app.query, handlers.handle_query),
        ("train", app.train, handlers.handle_train),
        ("evaluate", app.evaluate, handlers.handle_evaluate),
    ):

        def real(msg, context, handle=handle):
            return handle(job, msg, context)

        register()(real if around is None else around(stage, real))
    return app


def stored_round(store, partition: int) -> int | None:
    """Round of the newest private state that ``store`` (a ``BackboneStore``) holds for
    ``partition`` (None: nothing stored)."""
    entry = store.load(partition)
    return None if entry is None else entry[0]


# ------------------------------------------------------------------ site-local tables (dataset=table)
def write_table(path, cols: dict[str, np.ndarray]):
    """A CSV file of ``cols`` (name -> values), every value as Python writes its float."""
    rows = zip(*(np.asarray(v, dtype=np.float64) for v in cols.values()), strict=True)
    path.write_text("\n".join([",".join(cols), *(",".join(repr(float(v)) for v in row) for row in rows)]) + "\n")
    return path


def table_job(out, *overrides: str):
    """The job of a ``dataset=table`` run (targets t1, t2, the free-feature model, no TensorBoard or figures)."""
    from fedhead.settings.config import compose_config, load_config

    base = [
        "dataset=table",
        "dataset.targets=[t1,t2]",
        "model=free",
        "output.tensorboard=false",
        "output.figures=false",
    ]
    return load_config(compose_config([*base, *overrides])).jobs(out)[0]


@functools.cache
def simulated_sites(n: int) -> SimulatedSites:
    """A simulation's own roster and signing keys for ``n`` sites (partition ``i`` signs as ``partition-i``),
    made once per size: what secure mode's sites and server hold in the tests."""
    return SimulatedSites.make(n)
