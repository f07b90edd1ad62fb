"""fedhead strategies on flwr's Message API: head averaging, moment exchange, alignment check,
full-model averaging.

The strategies are thin: every number they compute comes from :mod:`fedhead.federation.aggregation`,
:mod:`fedhead.analysis.diagnosis` and :mod:`fedhead.federation.tracking` (numpy only; no torch, no data layer).

* :class:`HeadAveraging` (a :class:`flwr.serverapp.strategy.FedAvg` subclass): before round 1 a
  ``query`` message asks every client for ``(N_m, mu_m, Sigma_m)``; the server builds
  :class:`fedhead.ufm.TargetMoments`, diagnoses the federation, checks the fully active
  condition and computes ``G_star, G_cen, G_within, G_m``. Each round it broadcasts the head
  (and ``Sigma_cen`` to corrected clients), averages the returned heads with weights
  ``N_m / N`` and measures the round (theory.md §11); an ``evaluate`` message then collects the MSE
  of the shared head on each client's own backbone.
* :class:`fedhead.strategies.variants.AlignedHeadAveraging` and
  :class:`fedhead.strategies.variants.FullModelAveraging` extend it (alignment check, backbone averaging).

The steps of the moment exchange are in :mod:`fedhead.strategies.exchange`, the reply parsers in
:mod:`fedhead.strategies.replies`, the failure policy in :mod:`fedhead.strategies.failures`. Measurements are
handed to an observer (:class:`fedhead.strategies.observer.RunObserver`) that writes results, TensorBoard
and progress; the strategy itself does no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedhead.federation import aggregation as agg
from fedhead.federation import protocol as P
from fedhead.federation.checkpoint import ServerState
from fedhead.federation.limits import FailurePolicy, Timeouts
from fedhead.federation.tracking import RoundRecord, RoundTracker
from fedhead.strategies.checkpointing import Checkpointing
from fedhead.strategies.exchange import (
    MomentExchange,
    build_exchange,
    enforce_regime,
    parse_moment_reply,
    query_messages,
    wait_for_nodes,
)
from fedhead.strategies.failures import Dropped, screen
from fedhead.strategies.observer import NullObserver, RunObserver
from fedhead.strategies.replies import (
    FederationError,
    metrics_of,
    parse_evaluate_reply,
    parse_train_reply,
    partition_of,
)

__all__ = ["FederationError", "HeadAveraging", "MomentExchange", "RunObserver"]

log = logging.getLogger(__name__)


class HeadAveraging(Checkpointing, FedAvg):
    """Head-only federated averaging with the one-time moment exchange.

    Parameters
    ----------
    lambda_h, lambda_w : float
        Penalties of the local objective (theory.md §2); used for the closed-form targets.
    gamma : float
        Moment-correction strength the clients use (0: none, 1: full, theory.md §8). When positive the
        server sends ``Sigma_cen`` with every training message.
    centered : bool
        Clients centre their targets (reference Gram becomes ``G_within``).
    observer : RunObserver, optional
        Receives the exchange and every round record.
    evaluate_mse : bool
        Send an ``evaluate`` message after every round to measure train/test MSE of the shared
        head with each client's own backbone.
    min_nodes : int
        Number of clients expected (all take part in every round).
    timeout : float, optional
        Seconds to wait for the replies of one message phase (overrides ``timeouts.exchange``
        and ``timeouts.round``).
    timeouts : fedhead.federation.limits.Timeouts, optional
        Deadlines of the node wait, the moment exchange and each training/evaluation phase
        (default :class:`fedhead.federation.limits.Timeouts`); every wait ends.
    min_clients : int, optional
        Failure policy: valid replies a phase needs (None: all ``min_nodes``). With fewer the
        run stops (:class:`fedhead.strategies.failures.TooFewReplies`); otherwise failed clients are
        dropped (logged, recorded per round) and the weights renormalised over the survivors.
    message_config : dict, optional
        Entries added to the ``config`` record of every message (e.g. the job index when one
        simulation serves several procedures).
    allow_outside_regime : bool
        Outside the fully active regime the run refuses to train (after reporting the
        diagnosis) unless this is True (``dataset.allow_outside_regime=true``); then it trains
        with the partial targets of :class:`fedhead.federation.aggregation.Targets` (``G_star`` and the
        recursion recorded as null) and a warning.
    """

    def __init__(
        self,
        *,
        lambda_h: float,
        lambda_w: float,
        min_nodes: int,
        gamma: float = 0.0,
        centered: bool = False,
        observer: RunObserver | None = None,
        evaluate_mse: bool = True,
        timeout: float | None = None,
        timeouts: Timeouts | None = None,
        min_clients: int | None = None,
        message_config: dict[str, int | float | str | bool] | None = None,
        allow_outside_regime: bool = False,
    ) -> None:
        super().__init__(
            fraction_train=1.0,
            fraction_evaluate=1.0,
            min_train_nodes=min_nodes,
            min_evaluate_nodes=min_nodes,
            min_available_nodes=min_nodes,
            weighted_by_key=P.NUM_EXAMPLES,
            arrayrecord_key=P.HEAD,
            configrecord_key=P.CONFIG,
        )
        if lambda_h <= 0 or lambda_w <= 0:
            raise ValueError(f"lambda_h and lambda_w must be positive, got {lambda_h}, {lambda_w}")
        self.lambda_h = float(lambda_h)
        self.lambda_w = float(lambda_w)
        self.gamma = float(gamma)
        self.centered = bool(centered)
        self.observer: RunObserver = observer or NullObserver()
        self.evaluate_mse = bool(evaluate_mse)
        self.min_nodes = int(min_nodes)
        self.timeouts = timeouts or Timeouts()
        if timeout is not None:
            self.timeouts = Timeouts(nodes=self.timeouts.nodes, exchange=timeout, round=timeout)
        self.timeout = self.timeouts.round
        self.required = FailurePolicy(min_clients).required(self.min_nodes)
        self._sent: dict[str, list[int]] = {}  # nodes each phase was sent to (missing replies)
        self._round_dropped: list[Dropped] = []
        self.message_config = dict(message_config or {})
        self.allow_outside_regime = bool(allow_outside_regime)
        self.exchange: MomentExchange | None = None
        self.tracker: RoundTracker | None = None
        self._broadcast: tuple[np.ndarray, np.ndarray] | None = None
        self._head_shape: tuple[int, int] | None = None
        self._head: tuple[np.ndarray, np.ndarray] | None = None  # the aggregate of the last round
        self._round_offset = 0  # rounds done before start() (a resumed run)
        self._on_round_end: Callable[[ServerState], None] | None = None

    # ---------------------------------------------------------------- description
    def summary(self) -> None:
        log.info(
            "%s: lambda_h=%g lambda_w=%g gamma=%g centered=%s clients=%d",
            type(self).__name__,
            self.lambda_h,
            self.lambda_w,
            self.gamma,
            self.centered,
            self.min_nodes,
        )

    # ---------------------------------------------------------------- moment exchange
    def query_messages(self, node_ids: Iterable[int]) -> list[Message]:
        """One ``query`` message per node asking for ``(N_m, mu_m, Sigma_m)``."""
        return query_messages(node_ids, self.message_config)

    def aggregate_moments(
        self, replies: Iterable[Message], *, expected_nodes: Sequence[int] | None = None
    ) -> MomentExchange:
        """Validate the query replies and compute moments, diagnosis and reference Grams.

        Each reply is screened (:func:`fedhead.strategies.failures.screen`): error replies, invalid
        moments (non-finite, asymmetric, not PSD, non-positive count) and missing replies drop
        the client when at least ``min_clients`` remain; the federation is then the survivors.
        Sets and returns :attr:`exchange` (:func:`fedhead.strategies.exchange.build_exchange`).
        """
        kept, dropped = screen(
            replies,
            parse_moment_reply,
            stage="moment exchange",
            required=self.required,
            expected_nodes=expected_nodes,
            expected_count=self.min_nodes,
            timeout=self.timeouts.exchange if expected_nodes is not None else None,
        )
        self.exchange = build_exchange(
            [r for _, r in kept],
            dropped,
            num_clients=self.min_nodes,
            lambda_h=self.lambda_h,
            lambda_w=self.lambda_w,
            gamma=self.gamma,
            centered=self.centered,
        )
        return self.exchange

    def exchange_moments(self, grid: Grid) -> MomentExchange:
        """Run the one-time moment exchange over ``grid`` and report it to the observer."""
        node_ids = self._wait_for_nodes(grid)
        replies = grid.send_and_receive(self.query_messages(node_ids), timeout=self.timeouts.exchange)
        self.exchange = self.aggregate_moments(replies, expected_nodes=node_ids)
        for line in self.exchange.diagnosis.format().splitlines():
            log.info("diagnosis: %s", line)
        self.observer.on_exchange(self.exchange)
        return self.exchange

    def check_regime(self) -> None:
        """Refuse to train outside the fully active regime unless explicitly allowed
        (:func:`fedhead.strategies.exchange.enforce_regime`)."""
        if self.exchange is None:
            raise RuntimeError("exchange_moments must run before the regime check")
        enforce_regime(self.exchange, self.lambda_h, self.lambda_w, self.allow_outside_regime)

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        """The nodes to message: before the exchange, exactly ``min_nodes`` connected SuperNodes
        (waiting at most ``timeouts.nodes``; :func:`fedhead.strategies.exchange.wait_for_nodes`),
        afterwards the clients that took part in the exchange."""
        if self.exchange is not None:
            return sorted(self.exchange.node_ids)
        return wait_for_nodes(grid, self.min_nodes, self.timeouts.nodes)

    # ---------------------------------------------------------------- training
    def begin(self, initial_head: tuple[np.ndarray, np.ndarray]) -> RoundRecord:
        """Record round 0 for the initial head (after :meth:`exchange_moments`)."""
        if self.exchange is None:
            raise RuntimeError("exchange_moments must run before training")
        self.check_regime()
        self.tracker = RoundTracker(self.exchange.targets)
        w, b = (np.asarray(a, dtype=np.float64) for a in initial_head)
        c = self.exchange.moments.dim
        if w.ndim != 2 or w.shape[0] != c or b.shape != (c,):
            raise ValueError(f"initial head {w.shape}/{b.shape} does not match C = {c} targets")
        self._head_shape = (w.shape[0], w.shape[1])
        self._head = (w, b)
        rec = self.tracker.start(w, b)
        self._round_complete(rec)
        return rec

    def train_content(self, arrays: ArrayRecord, config: ConfigRecord) -> RecordDict:
        """Content of a training message (head, config, Sigma_cen for corrected clients)."""
        content = RecordDict({P.HEAD: arrays, P.CONFIG: config})
        if self.gamma > 0:
            if self.exchange is None:
                raise RuntimeError("the corrected procedure needs the moment exchange first")
            content[P.SIGMA_CEN] = ArrayRecord(
                {P.SIGMA_CEN_ARRAY: Array(np.asarray(self.exchange.moments.sigma_cen, dtype=np.float64))}
            )
        return content

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        server_round += self._round_offset
        head_arrays = ArrayRecord({k: arrays[k] for k in (P.WEIGHT, P.BIAS)})
        self._broadcast = P.read_head(head_arrays)
        config[P.SERVER_ROUND] = server_round
        config.update(self.message_config)
        content = self.train_content(head_arrays, config)
        self._extend_train_content(content, arrays)
        node_ids = self._wait_for_nodes(grid)
        self._sent["train"] = list(node_ids)
        return [Message(content=content, dst_node_id=n, message_type=MessageType.TRAIN) for n in node_ids]

    def _extend_train_content(self, content: RecordDict, arrays: ArrayRecord) -> None:
        """Hook for subclasses that broadcast more than the head."""

    def _check_partitions(self, pids: Sequence[int]) -> None:
        """Replies' partitions: distinct and among the exchange's (a mismatch stops the run)."""
        assert self.exchange is not None
        if len(set(pids)) != len(pids) or not set(pids) <= set(self.exchange.partition_ids):
            raise FederationError(
                f"replies came from partitions {sorted(pids)}, expected {list(self.exchange.partition_ids)}"
            )

    def _screen(self, replies: Iterable[Message], parse, stage: str, kind: str):
        """:func:`fedhead.strategies.failures.screen` against the nodes the phase was sent to."""
        assert self.exchange is not None
        sent = self._sent.pop(kind, None)
        return screen(
            replies,
            parse,
            stage=stage,
            required=self.required,
            expected_nodes=sent,
            expected_count=len(self.exchange.partition_ids),
            timeout=self.timeouts.round if sent is not None else None,
            partitions=dict(zip(self.exchange.node_ids, self.exchange.partition_ids)),
        )

    def parse_train_replies(
        self, replies: Iterable[Message]
    ) -> tuple[list[Message], np.ndarray, np.ndarray, np.ndarray]:
        """Validated heads ``(M,C,P)``, biases ``(M,C)``, counts ``(M,)`` ordered by partition.

        Invalid, error and missing replies are dropped by the failure policy (kept in
        :attr:`_round_dropped`); the arrays cover the surviving clients only.
        """
        if self._head_shape is None or self.exchange is None:
            raise RuntimeError("begin() must record the initial head before training")
        expected_n = dict(zip(self.exchange.partition_ids, np.asarray(self.exchange.moments.counts)))
        shape = self._head_shape

        def parse(msg: Message):
            return parse_train_reply(msg, shape, expected_n)

        kept, dropped = self._screen(replies, parse, "training", "train")
        self._check_partitions([r[0] for _, r in kept])
        kept.sort(key=lambda mr: mr[1][0])
        self._round_dropped = list(dropped)
        msgs = [m for m, _ in kept]
        return (
            msgs,
            np.stack([r[1] for _, r in kept]),
            np.stack([r[2] for _, r in kept]),
            np.asarray([r[3] for _, r in kept]),
        )

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]:
        """Hook: extra checks on the replies; returns scalars to log with the round."""
        return {}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round += self._round_offset
        msgs, heads, biases, counts = self.parse_train_replies(replies)
        extra = self.verify_replies(msgs, heads)
        avg = agg.average_heads(heads, biases, counts)
        self._head = (avg.weight, avg.bias)
        metrics = [metrics_of(m) for m in msgs]
        fit = agg.local_fit(metrics, [P.node_of(m) for m in msgs])
        pids = [partition_of(m) for m in msgs]
        present = [self.exchange.partition_ids.index(p) for p in pids]
        client_metrics = [{k: float(v) for k, v in m.items() if not isinstance(v, list)} for m in metrics]
        assert self.tracker is not None and self._broadcast is not None
        rec = self.tracker.record(
            server_round,
            avg.weight,
            avg.bias,
            broadcast=self._broadcast[0],
            client_heads=heads,
            fit=fit,
            client_metrics=client_metrics,
            extra=extra,
            present=present,
            dropped=[d.to_dict() for d in self._round_dropped],
        )
        arrays = P.head_record(avg.weight, avg.bias)
        self._add_aggregate(arrays, msgs, counts)
        out_metrics = MetricRecord({k: float(v) for k, v in rec.scalars().items() if "/" not in k})
        if not self.evaluate_mse:
            self._round_complete(rec)
        return arrays, out_metrics

    def _add_aggregate(self, arrays: ArrayRecord, msgs: Sequence[Message], counts: np.ndarray) -> None:
        """Hook for subclasses that aggregate more than the head."""

    # ---------------------------------------------------------------- evaluation (MSE)
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self.evaluate_mse:
            return []
        server_round += self._round_offset
        config[P.SERVER_ROUND] = server_round
        config.update(self.message_config)
        head = ArrayRecord({k: arrays[k] for k in (P.WEIGHT, P.BIAS)})
        content = RecordDict({P.HEAD: head, P.CONFIG: config})
        self._extend_train_content(content, arrays)
        node_ids = self._wait_for_nodes(grid)
        self._sent["evaluate"] = list(node_ids)
        return [Message(content=content, dst_node_id=n, message_type=MessageType.EVALUATE) for n in node_ids]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if not self.evaluate_mse:
            return None
        server_round += self._round_offset
        kept, dropped = self._screen(replies, parse_evaluate_reply, "evaluation", "evaluate")
        self._check_partitions([r[0] for _, r in kept])
        rows = [r[1] for _, r in sorted(kept, key=lambda mr: mr[1][0])]
        train_v, train_n = [r[0] for r in rows], [r[1] for r in rows]
        test_v, test_n = [r[2] for r in rows if len(r) > 2], [r[3] for r in rows if len(r) > 2]
        ms = rows
        train = agg.weighted_mean(train_v, train_n)
        test = agg.weighted_mean(test_v, test_n) if len(test_v) == len(ms) else None
        assert self.tracker is not None
        rec = self.tracker.set_mse(server_round, train, test)
        rec.dropped.extend(d.to_dict() for d in dropped)
        self._round_complete(rec)
        out = {P.TRAIN_MSE: train}
        if test is not None:
            out[P.TEST_MSE] = test
        return MetricRecord(out)

    # ---------------------------------------------------------------- the whole run
    def run(
        self,
        grid: Grid,
        initial_head: tuple[np.ndarray, np.ndarray] | Callable[[int], tuple[np.ndarray, np.ndarray]],
        num_rounds: int,
        *,
        train_config: ConfigRecord | None = None,
        diagnose_only: bool = False,
        resume: ServerState | None = None,
        on_round_end: Callable[[ServerState], None] | None = None,
    ) -> Result | None:
        """Moment exchange, diagnosis, then ``num_rounds`` rounds of :meth:`FedAvg.start`.

        ``initial_head`` is ``(W_0 (C,P), b_0 (C,))`` or a function of ``C`` (known after the
        exchange) returning it; every client starts from this head. ``resume`` (a checkpointed
        :class:`fedhead.federation.checkpoint.ServerState`) continues after its round instead (the exchange
        is repeated and must give the same moments; the observer's optional ``on_resume``
        receives the restored records). ``on_round_end`` receives the server state after every
        complete round, round 0 included (the checkpointer).
        """
        self._on_round_end = on_round_end
        exchange = self.exchange_moments(grid)
        if diagnose_only:
            return None
        if resume is not None:
            self.restore(resume)
            assert self.tracker is not None and self._head is not None
            on_resume = getattr(self.observer, "on_resume", None)
            if on_resume is not None:
                on_resume(list(self.tracker.records))
            arrays = P.head_record(*self._head)
            log.info("resuming after round %d of %d", resume.round, num_rounds)
        else:
            if callable(initial_head):
                initial_head = initial_head(exchange.moments.dim)
            self.begin(initial_head)
            arrays = P.head_record(*initial_head)
        return self.start(
            grid=grid,
            initial_arrays=arrays,
            num_rounds=num_rounds - self._round_offset,
            timeout=self.timeouts.round,
            train_config=train_config or ConfigRecord(),
        )
