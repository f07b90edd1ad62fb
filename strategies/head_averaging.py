""":class:`HeadAveraging`, fedhead's strategy on flwr's Message API (a :class:`flwr.serverapp.strategy.FedAvg`).

Before round 1 a ``query`` asks every client for ``(N_m, mu_m, Sigma_m)`` (the moment exchange;
site-local tables: :mod:`~fedhead.strategies.statistics`). Each round broadcasts the head (and ``Sigma_cen``
when the clients correct), averages the returned heads with weights ``N_m / N`` and measures the
round (theory.md §11); an ``evaluate`` phase then collects the shared head's MSE on each client's own
backbone. The strategy is thin and does no I/O: the numbers come from the numpy layers, the steps
from :mod:`~fedhead.strategies.exchange` (moment exchange), :mod:`~fedhead.strategies.phases` and
:mod:`~fedhead.strategies.replies` (replies), :mod:`~fedhead.strategies.failures` (failure policy) and
:mod:`~fedhead.strategies.rounds` (the round state a checkpoint holds); measurements go to an observer
(:class:`fedhead.strategies.observer.RunObserver`). Variants: :mod:`fedhead.strategies.variants`.
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
from fedhead.federation.tracking import RoundRecord
from fedhead.strategies.exchange import (
    MomentExchange,
    collect_moments,
    enforce_regime,
    query_messages,
    wait_for_nodes,
)
from fedhead.strategies.failures import Dropped
from fedhead.strategies.observer import NullObserver, RunObserver
from fedhead.strategies.phases import mean_mse, round_inputs, screen_phase, stack_heads
from fedhead.strategies.replies import (
    FederationError,
    parse_evaluate_reply,
    parse_train_reply,
)
from fedhead.strategies.rounds import RoundState
from fedhead.strategies.statistics import exchange_statistics, node_messages

__all__ = ["FederationError", "HeadAveraging", "MomentExchange", "RunObserver"]

log = logging.getLogger(__name__)


class HeadAveraging(FedAvg):
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
        After every round, an ``evaluate`` phase: train/test MSE of the shared head on each client's backbone.
    min_nodes : int
        Number of clients expected (all take part in every round).
    timeouts : fedhead.federation.limits.Timeouts, optional
        Deadlines of the node wait, the moment exchange and each phase (every wait ends).
    min_clients : int, optional
        Failure policy: valid replies a phase needs (None: all ``min_nodes``). With fewer the
        run stops (:class:`fedhead.strategies.failures.TooFewReplies`); otherwise failed clients are
        dropped (logged, recorded per round) and the weights renormalised over the survivors.
    message_config : dict, optional
        Entries added to every message's ``config`` record (e.g. the job index of a simulation's procedure).
    allow_outside_regime : bool
        Outside the fully active regime the run refuses to train (after the diagnosis) unless True
        (``dataset.allow_outside_regime=true``); then it trains with the partial targets of
        :class:`fedhead.federation.tracking.Targets` (``G_star`` and the recursion null) and a warning.
    site_statistics : (str, str), optional
        ``(standardize_targets, standardize_inputs)``: the statistics exchange replaces the moment query.
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
        timeouts: Timeouts | None = None,
        min_clients: int | None = None,
        message_config: dict[str, int | float | str | bool] | None = None,
        allow_outside_regime: bool = False,
        site_statistics: tuple[str, str] | None = None,
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
        self.required = FailurePolicy(min_clients).required(self.min_nodes)
        self._sent: dict[str, list[int]] = {}  # nodes each phase was sent to (missing replies)
        self._round_dropped: list[Dropped] = []
        self.message_config = dict(message_config or {})
        self.allow_outside_regime = bool(allow_outside_regime)
        self.site_statistics = site_statistics
        self.exchange: MomentExchange | None = None
        #: the head, the measurements and the resume offset between rounds (what a checkpoint holds)
        self.rounds = RoundState()
        self._broadcast: tuple[np.ndarray, np.ndarray] | None = None
        self._on_round_end: Callable[[ServerState], None] | None = None
        #: the run's number of rounds (set by :meth:`run`): its last evaluate message says ``final-round``
        self.num_rounds: int | None = None

    def summary(self) -> None:
        args = (type(self).__name__, self.lambda_h, self.lambda_w, self.gamma, self.centered, self.min_nodes)
        log.info("%s: lambda_h=%g lambda_w=%g gamma=%g centered=%s clients=%d", *args)

    # ---------------------------------------------------------------- moment exchange
    def aggregate_moments(
        self, replies: Iterable[Message], *, expected_nodes: Sequence[int] | None = None
    ) -> MomentExchange:
        """Sets and returns :attr:`exchange`: moments, diagnosis and reference Grams of the valid
        query replies, failed clients dropped (:func:`fedhead.strategies.exchange.collect_moments`)."""
        self.exchange = collect_moments(
            replies,
            required=self.required,
            num_clients=self.min_nodes,
            expected_nodes=expected_nodes,
            timeout=self.timeouts.exchange,
            lambda_h=self.lambda_h,
            lambda_w=self.lambda_w,
            gamma=self.gamma,
            centered=self.centered,
        )
        return self.exchange

    def exchange_moments(self, grid: Grid) -> MomentExchange:
        """Run the one-time moment exchange over ``grid`` and report it to the observer."""
        node_ids = self._wait_for_nodes(grid)
        if self.site_statistics is not None:  # a site-local dataset=table run
            self.exchange = exchange_statistics(self, grid, node_ids)
        else:
            queries = query_messages(node_ids, self.message_config)
            replies = grid.send_and_receive(queries, timeout=self.timeouts.exchange)
            self.exchange = self.aggregate_moments(replies, expected_nodes=node_ids)
        for line in self.exchange.diagnosis.format().splitlines():
            log.info("diagnosis: %s", line)
        self.observer.on_exchange(self.exchange)
        return self.exchange

    def check_regime(self) -> None:
        """Refuse to train outside the fully active regime unless allowed (:func:`~.exchange.enforce_regime`)."""
        if self.exchange is None:
            raise RuntimeError("exchange_moments must run before the regime check")
        enforce_regime(self.exchange, self.lambda_h, self.lambda_w, self.allow_outside_regime)

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        """Before the exchange ``min_nodes`` SuperNodes (:func:`~.exchange.wait_for_nodes`), then its clients."""
        if self.exchange is not None:
            return sorted(self.exchange.node_ids)
        return wait_for_nodes(grid, self.min_nodes, self.timeouts.nodes)

    # ---------------------------------------------------------------- training
    def begin(self, initial_head: tuple[np.ndarray, np.ndarray]) -> RoundRecord:
        """Record round 0 for the initial head (after :meth:`exchange_moments`)."""
        if self.exchange is None:
            raise RuntimeError("exchange_moments must run before training")
        self.check_regime()
        rec = self.rounds.start(self.exchange.targets, *initial_head, dim=self.exchange.moments.dim)
        self._round_complete(rec)
        return rec

    # ---------------------------------------------------------------- checkpoint and resume
    def _round_complete(self, rec: RoundRecord) -> None:
        """A round is fully measured: report it, then hand the server state to the checkpointer."""
        self.observer.on_round(rec)
        if self._on_round_end is not None:
            self._on_round_end(self.server_state())

    def server_state(self) -> ServerState:
        """Everything needed to continue after the last complete round (:mod:`fedhead.federation.checkpoint`)."""
        if self.exchange is None:
            raise RuntimeError("no round has been recorded yet")
        return self.rounds.server_state(self.exchange.moments, self._extra_state())

    def restore(self, state: ServerState) -> None:
        """Continue after checkpointed round ``state.round`` (the exchange's moments must be its)."""
        if self.exchange is None:
            raise RuntimeError("exchange_moments must run before a restore")
        self.rounds.restore(state, self.exchange.moments, self.exchange.targets)
        self.check_regime()
        self._restore_extra(state.extra)

    def _extra_state(self) -> dict[str, np.ndarray]:  # hook: strategy state beyond the head to checkpoint
        return {}

    def _restore_extra(self, extra: dict[str, np.ndarray]) -> None:  # restore what _extra_state saved
        pass

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
        head_arrays = ArrayRecord({k: arrays[k] for k in (P.WEIGHT, P.BIAS)})
        self._broadcast = P.read_head(head_arrays)
        content = self.train_content(head_arrays, self._phase_config(server_round, config))
        return self._phase_messages(grid, "train", MessageType.TRAIN, content, arrays)

    def _phase_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """A phase's config record: the run's round number and :attr:`message_config`."""
        config[P.SERVER_ROUND] = self.rounds.round(server_round)
        config.update(self.message_config)
        return config

    def _phase_messages(
        self, grid: Grid, kind: str, message_type: str, content: RecordDict, arrays: ArrayRecord
    ) -> list[Message]:
        """One message per client of ``content`` (extended by the subclass hook); remembers the nodes."""
        self._extend_train_content(content, arrays)
        node_ids = self._wait_for_nodes(grid)
        self._sent[kind] = list(node_ids)
        return node_messages(content, node_ids, message_type, self.exchange)

    def _extend_train_content(self, content: RecordDict, arrays: ArrayRecord) -> None:
        """Hook for subclasses that broadcast more than the head."""

    def _screen(self, replies: Iterable[Message], parse, stage: str, kind: str):
        """:func:`fedhead.strategies.phases.screen_phase` against the nodes the phase was sent to."""
        assert self.exchange is not None
        sent = self._sent.pop(kind, None)
        return screen_phase(
            replies,
            parse,
            stage=stage,
            exchange=self.exchange,
            required=self.required,
            sent=sent,
            timeout=self.timeouts.round,
        )

    def parse_train_replies(
        self, replies: Iterable[Message]
    ) -> tuple[list[Message], np.ndarray, np.ndarray, np.ndarray]:
        """Validated heads ``(M,C,P)``, biases ``(M,C)``, counts ``(M,)`` ordered by partition, of the
        surviving clients (the failure policy's drops are kept in :attr:`_round_dropped`)."""
        if self.exchange is None:
            raise RuntimeError("begin() must record the initial head before training")
        expected_n = dict(zip(self.exchange.partition_ids, np.asarray(self.exchange.moments.counts)))
        shape = self.rounds.head_shape

        def parse(msg: Message):
            return parse_train_reply(msg, shape, expected_n)

        kept, dropped = self._screen(replies, parse, "training", "train")
        self._round_dropped = list(dropped)
        return stack_heads(kept)

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]:
        """Hook: extra checks on the replies; returns scalars to log with the round."""
        return {}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.rounds.round(server_round)
        msgs, heads, biases, counts = self.parse_train_replies(replies)
        extra = self.verify_replies(msgs, heads)
        avg = agg.average_heads(heads, biases, counts)
        self.rounds.set_head(avg.weight, avg.bias)
        fit, present, client_metrics = round_inputs(msgs, self.exchange)
        assert self.rounds.tracker is not None and self._broadcast is not None
        rec = self.rounds.tracker.record(
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
        head = ArrayRecord({k: arrays[k] for k in (P.WEIGHT, P.BIAS)})
        config = self._phase_config(server_round, ConfigRecord(dict(config)))  # a fresh record per round
        if self.num_rounds is not None and config[P.SERVER_ROUND] == self.num_rounds:
            config[P.FINAL_ROUND] = True  # the final shared head: each client saves its model
        content = RecordDict({P.HEAD: head, P.CONFIG: config})
        return self._phase_messages(grid, "evaluate", MessageType.EVALUATE, content, arrays)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if not self.evaluate_mse:
            return None
        server_round = self.rounds.round(server_round)
        kept, dropped = self._screen(replies, parse_evaluate_reply, "evaluation", "evaluate")
        train, test = mean_mse([r[1] for _, r in kept])
        assert self.rounds.tracker is not None
        rec = self.rounds.tracker.set_mse(server_round, train, test)
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
        exchange) returning it. ``resume`` (a :class:`fedhead.federation.checkpoint.ServerState`)
        continues after its round instead (the exchange must give the same moments; the observer's
        optional ``on_resume`` receives the restored records). ``on_round_end`` (the checkpointer)
        receives the server state after every complete round, round 0 included.
        """
        self._on_round_end = on_round_end
        self.num_rounds = int(num_rounds)
        exchange = self.exchange_moments(grid)
        if diagnose_only:
            return None
        if resume is not None:
            self.restore(resume)
            assert self.rounds.tracker is not None and self.rounds.head is not None
            on_resume = getattr(self.observer, "on_resume", None)
            if on_resume is not None:
                on_resume(list(self.rounds.tracker.records))
            arrays = P.head_record(*self.rounds.head)
            log.info("resuming after round %d of %d", resume.round, num_rounds)
        else:
            if callable(initial_head):
                initial_head = initial_head(exchange.moments.dim)
            self.begin(initial_head)
            arrays = P.head_record(*initial_head)
        return self.start(
            grid=grid,
            initial_arrays=arrays,
            num_rounds=num_rounds - self.rounds.offset,
            timeout=self.timeouts.round,
            train_config=train_config or ConfigRecord(),
        )
