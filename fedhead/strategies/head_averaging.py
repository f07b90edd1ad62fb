"""[`HeadAveraging`][fedhead.strategies.head_averaging.HeadAveraging]: fedhead's server strategy on
flwr's Message API (a subclass of flwr's `flwr.serverapp.strategy.Strategy`).

It drives the one-time moment exchange ([`exchange`][fedhead.strategies.exchange]), then each round
broadcasts the head, averages the returned heads with weights ``N_m / N`` and measures the round
(theory.md §11). Every sum comes from one [`Aggregator`][fedhead.strategies.aggregator.Aggregator],
chosen once from ``privacy.mode``; the other steps live in the sibling modules; the strategy does no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from types import MappingProxyType

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, MetricRecordValues, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedhead.federation import protocol
from fedhead.federation.checkpoint import ServerState
from fedhead.federation.roster import Roster
from fedhead.federation.tracking import RoundRecord
from fedhead.settings.limits import FailurePolicy, Timeouts
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.settings.trust import TrustPolicy
from fedhead.strategies.aggregator import HeadSum, Phase, next_phase
from fedhead.strategies.exchange import ConfigValue, ExchangeSettings, MomentExchange, collect_moments, wait_for_nodes
from fedhead.strategies.observer import NullObserver, RunObserver
from fedhead.strategies.phases import train_content
from fedhead.strategies.privacy_modes import make_aggregator
from fedhead.strategies.replies import FederationError
from fedhead.strategies.rounds import RoundState
from fedhead.strategies.statistics import node_messages

__all__ = ["FederationError", "HeadAveraging", "MomentExchange", "RunObserver"]

log = logging.getLogger(__name__)

#: A run's initial head ``(W_0 (C, P), b_0 (C,))``, or a function of ``C`` returning it.
InitialHead = tuple[np.ndarray, np.ndarray] | Callable[[int], tuple[np.ndarray, np.ndarray]]


class HeadAveraging(Strategy):
    """Head-only federated averaging with the one-time moment exchange.

    It implements flwr's four hooks itself (no FedAvg code runs);
    [`run`][fedhead.strategies.HeadAveraging.run] is the entry point: the exchange and the diagnosis,
    then flwr's round loop (``Strategy.start``).

    Parameters
    ----------
    lambda_h, lambda_w, gamma, centered, timeouts, message_config, site_statistics
        The fields of [`ExchangeSettings`][fedhead.strategies.exchange.ExchangeSettings] (``gamma > 0``:
        ``Sigma_cen`` travels with every training message; ``timeouts=None``: the defaults).
    min_nodes : int
        Number of clients expected (all take part in every round).
    min_clients : int, optional
        Failure policy: valid replies a phase needs (None: all ``min_nodes``). With fewer the run stops
        ([`TooFewReplies`][fedhead.strategies.failures.TooFewReplies]); otherwise failed clients are
        dropped (logged, recorded per round) and the weights renormalised over the survivors.
    observer : RunObserver, optional
        Receives the exchange and every round record.
    evaluate_mse : bool
        After every round, an ``evaluate`` phase: the shared head's MSE on each client's backbone.
    allow_outside_regime : bool
        Outside the fully active regime the run refuses to train unless True; then it trains with the
        partial targets of [`Targets`][fedhead.federation.tracking.Targets] (``G_star`` and the
        recursion null) and a warning.
    trust : TrustPolicy, optional
        What a site's reply may claim: weight cap, count and magnitude bounds, update clipping,
        consistency flags ([`fedhead.settings.trust.TrustPolicy`][fedhead.settings.trust.TrustPolicy];
        None: the defaults).
    privacy : PrivacyPolicy, optional
        Picks the [`aggregator`][fedhead.strategies.HeadAveraging.aggregator] once
        ([`make_aggregator`][fedhead.strategies.privacy_modes.make_aggregator]). ``mode="secure"``: the
        exchange, every round's heads and every evaluation reach the server only as secure sums
        ([`fedhead.strategies.secure`][fedhead.strategies.secure]); per-site checks and measurements are
        then absent. None: clear mode.
    roster : Roster, optional
        The federation's roster of the sites' signing keys, which secure mode needs
        ([`fedhead.federation.roster`][fedhead.federation.roster]).
    private_heads, exchange_noise : bool, float or None
        Row unit ([`make_aggregator`][fedhead.strategies.privacy_modes.make_aggregator]): the heads are private
        (summed without noise, no release of their own); the exchange's accounted noise multiplier (None: z).
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
        message_config: dict[str, ConfigValue] | None = None,
        allow_outside_regime: bool = False,
        site_statistics: tuple[str, str] | None = None,
        trust: TrustPolicy | None = None,
        privacy: PrivacyPolicy | None = None,
        roster: Roster | None = None,
        private_heads: bool = False,
        exchange_noise: float | None = None,
    ) -> None:
        if lambda_h <= 0 or lambda_w <= 0:
            raise ValueError(f"lambda_h and lambda_w must be positive, got {lambda_h}, {lambda_w}")
        self.privacy = privacy or PrivacyPolicy()
        #: what the exchange, the node wait and the failure policy read (built once)
        self.settings = ExchangeSettings(
            lambda_h=float(lambda_h),
            lambda_w=float(lambda_w),
            gamma=float(gamma),
            centered=bool(centered),
            num_clients=int(min_nodes),
            required=FailurePolicy(min_clients).required(int(min_nodes)),
            timeouts=timeouts or Timeouts(),
            message_config=MappingProxyType(dict(message_config or {})),
            site_statistics=site_statistics,
            trust=trust or TrustPolicy(),
            row_level=self.privacy.row_level,
        )
        self.settings.trust.check(int(min_nodes))
        self.privacy.check_strategy(int(min_nodes), self.settings.trust, site_units=site_statistics)
        #: where every sum comes from: the exchange, the heads, the errors and what they cost in privacy
        self.aggregator = make_aggregator(
            self.privacy, int(min_nodes), roster, private_heads=private_heads, exchange_noise=exchange_noise
        )
        self._grid: Grid | None = None
        self.observer: RunObserver = observer or NullObserver()
        self.evaluate_mse = bool(evaluate_mse)
        self.allow_outside_regime = bool(allow_outside_regime)
        self._sent: dict[str, list[int]] = {}  # nodes each phase was sent to (missing replies)
        self.exchange: MomentExchange | None = None
        #: the head, the measurements and the resume offset between rounds (what a checkpoint holds)
        self.rounds = RoundState()
        self._broadcast: tuple[np.ndarray, np.ndarray] | None = None
        self._on_round_end: Callable[[ServerState], None] | None = None
        #: the run's number of rounds (set by [`run`][fedhead.strategies.HeadAveraging.run]): its last
        #: evaluate message says ``final-round``
        self.num_rounds: int | None = None

    @property
    def gamma(self) -> float:
        """The clients' moment-correction strength (``Sigma_cen`` travels when positive)."""
        return self.settings.gamma

    @property
    def centered(self) -> bool:
        """Whether the clients centre their targets."""
        return self.settings.centered

    def summary(self) -> None:
        """Log the strategy's terms (flwr calls it when the rounds start)."""
        st = self.settings
        args = (type(self).__name__, st.lambda_h, st.lambda_w, st.gamma, st.centered, st.num_clients)
        log.info("%s: lambda_h=%g lambda_w=%g gamma=%g centered=%s clients=%d", *args)

    # ---------------------------------------------------------------- moment exchange
    def aggregate_moments(
        self, replies: Iterable[Message], *, expected_nodes: Sequence[int] | None = None
    ) -> MomentExchange:
        """Sets and returns [`exchange`][fedhead.strategies.HeadAveraging.exchange] from clear query replies:
        moments, diagnosis and reference Grams of the valid ones, failed clients dropped
        ([`fedhead.strategies.exchange.collect_moments`][fedhead.strategies.exchange.collect_moments])."""
        self.exchange = collect_moments(replies, self.settings, expected_nodes=expected_nodes)
        return self.exchange

    def exchange_moments(self, grid: Grid) -> MomentExchange:
        """Run the one-time moment exchange over ``grid`` and report it to the observer."""
        node_ids = self._wait_for_nodes(grid)
        self.exchange = self.aggregator.exchange(self.settings, grid, node_ids)
        for line in self.exchange.diagnosis.format().splitlines():
            log.info("diagnosis: %s", line)
        self.observer.on_exchange(self.exchange)
        return self.exchange

    def check_regime(self) -> None:
        """Refuse to train outside the fully active regime unless allowed (the aggregator's
        [`check_regime`][fedhead.strategies.aggregator.Aggregator.check_regime])."""
        self.aggregator.check_regime(self._exchanged("the regime check"), self.settings, self.allow_outside_regime)

    def _exchanged(self, what: str) -> MomentExchange:
        """The moment exchange's outcome; a clear error when ``what`` comes before the exchange."""
        if self.exchange is None:
            raise RuntimeError(f"exchange_moments must run before {what}")
        return self.exchange

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        """Before the exchange ``min_nodes`` SuperNodes
        ([`wait_for_nodes`][fedhead.strategies.exchange.wait_for_nodes]), then its clients."""
        if self.exchange is not None:
            return sorted(self.exchange.node_ids)
        return wait_for_nodes(grid, self.settings.num_clients, self.settings.timeouts.nodes)

    # ---------------------------------------------------------------- training
    def begin(self, initial_head: tuple[np.ndarray, np.ndarray]) -> RoundRecord:
        """Record round 0 for the initial head (after the
        [`exchange_moments`][fedhead.strategies.HeadAveraging.exchange_moments])."""
        exchange = self._exchanged("training")
        self.check_regime()
        rec = self.rounds.start(exchange.targets, *initial_head, dim=exchange.moments.dim)
        rec.dropped = [d.to_dict() for d in exchange.dropped]  # the sites the exchange left out
        rec.extra.update(self.aggregator.privacy_spent())
        self._round_complete(rec)
        return rec

    # ---------------------------------------------------------------- checkpoint and resume
    def _round_complete(self, rec: RoundRecord) -> None:
        """A round is fully measured: report it, then hand the server state to the checkpointer."""
        self.observer.on_round(rec)
        if self._on_round_end is not None:
            self._on_round_end(self.server_state())

    def server_state(self) -> ServerState:
        """Everything needed to continue after the last complete round
        ([`fedhead.federation.checkpoint`][fedhead.federation.checkpoint])."""
        return self.rounds.server_state(self._exchanged("a server state").moments, self._extra_state())

    def restore(self, state: ServerState) -> None:
        """Continue after checkpointed round ``state.round`` (the exchange's moments must be its)."""
        exchange = self._exchanged("a restore")
        self.rounds.restore(state, exchange.moments, exchange.targets)
        self.check_regime()
        self._restore_extra(state.extra)

    def _extra_state(self) -> dict[str, np.ndarray]:  # hook: strategy state beyond the head to checkpoint
        return {}

    def _restore_extra(self, extra: dict[str, np.ndarray]) -> None:  # restore what _extra_state saved
        pass

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        head_arrays = ArrayRecord({k: arrays[k] for k in (protocol.WEIGHT, protocol.BIAS)})
        self._broadcast = protocol.read_head(head_arrays)
        self._grid = grid
        sigma_cen = None
        if self.settings.gamma > 0:  # correcting clients receive Sigma_cen
            sigma_cen = self._exchanged("the corrected procedure's training").moments.sigma_cen
        config = self._phase_config(server_round, config)
        content = train_content(head_arrays, config, sigma_cen)
        messages = self._phase_messages(grid, "train", MessageType.TRAIN, content, arrays)
        return self.aggregator.address(self._phase("train", self.rounds.round(server_round), keep=True), messages)

    def _phase_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """A phase's config record: the run's round number and
        [`message_config`][fedhead.strategies.exchange.ExchangeSettings.message_config]."""
        config[protocol.SERVER_ROUND] = self.rounds.round(server_round)
        config.update(self.settings.message_config)
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

    def _phase(self, kind: str, server_round: int, keep: bool = False) -> Phase:
        """The phase ``kind`` of the run's round ``server_round`` for the aggregator (its nodes kept if ``keep``)."""
        return Phase(
            kind=kind,
            server_round=server_round,
            exchange=self._exchanged("aggregation"),
            settings=self.settings,
            sent=self._sent.get(kind) if keep else self._sent.pop(kind, None),
            grid=self._grid,
            head_shape=self.rounds.head_shape,
            broadcast=self._broadcast,
            checks=self,
            next_sum=next_phase(kind, server_round, self.evaluate_mse, self.num_rounds),
        )

    def check_reply(self, msg: Message, weight: np.ndarray) -> None:
        """Hook: a variant's own checks of one training reply seen in the clear (its head ``weight``); raising
        [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] drops the client."""

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]:
        """Hook: measurements over the kept replies seen in the clear; returns scalars to log with the round."""
        return {}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.rounds.round(server_round)
        summed = self.aggregator.aggregate_train(self._phase("train", server_round), replies)
        assert self._broadcast is not None
        rec = self.rounds.record_train(server_round, summed, self._broadcast[0], self.aggregator.privacy_spent())
        arrays = protocol.head_record(summed.weight, summed.bias)
        self._add_aggregate(arrays, summed)
        out_metrics = MetricRecord({k: float(v) for k, v in rec.scalars().items() if "/" not in k})
        if not self.evaluate_mse:
            self._round_complete(rec)
        return arrays, out_metrics

    def _add_aggregate(self, arrays: ArrayRecord, summed: HeadSum) -> None:
        """Hook for variants that use the round's heads beyond their average (``summed``, before the round
        record is reported)."""

    # ---------------------------------------------------------------- evaluation (MSE)
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self.evaluate_mse:
            return []
        head = ArrayRecord({k: arrays[k] for k in (protocol.WEIGHT, protocol.BIAS)})
        config = self._phase_config(server_round, ConfigRecord(dict(config)))  # a fresh record per round
        if self.num_rounds is not None and config[protocol.SERVER_ROUND] == self.num_rounds:
            config[protocol.FINAL_ROUND] = True  # the final shared head: each client saves its model
        self._grid = grid
        content = RecordDict({protocol.HEAD: head, protocol.CONFIG: config})
        messages = self._phase_messages(grid, "evaluate", MessageType.EVALUATE, content, arrays)
        return self.aggregator.address(self._phase("evaluate", self.rounds.round(server_round), keep=True), messages)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if not self.evaluate_mse:
            return None
        server_round = self.rounds.round(server_round)
        mse = self.aggregator.aggregate_evaluate(self._phase("evaluate", server_round), replies)
        assert self.rounds.tracker is not None
        rec = self.rounds.tracker.set_mse(server_round, mse.train, mse.test)
        rec.extra.update(self.aggregator.privacy_spent())
        rec.dropped.extend(d.to_dict() for d in mse.dropped)
        self._round_complete(rec)
        out: dict[str, MetricRecordValues] = {protocol.TRAIN_MSE: mse.train}
        if mse.test is not None:
            out[protocol.TEST_MSE] = mse.test
        return MetricRecord(out)

    # ---------------------------------------------------------------- the whole run
    def run(
        self,
        grid: Grid,
        initial_head: InitialHead,
        num_rounds: int,
        *,
        train_config: ConfigRecord | None = None,
        diagnose_only: bool = False,
        resume: ServerState | None = None,
        on_round_end: Callable[[ServerState], None] | None = None,
        on_resume: Callable[[list[RoundRecord]], None] | None = None,
        on_exchange: Callable[[MomentExchange], None] | None = None,
    ) -> Result | None:
        """Moment exchange, diagnosis, then ``num_rounds`` rounds of flwr's ``Strategy.start``.

        ``initial_head`` is ``(W_0 (C,P), b_0 (C,))`` or a function of ``C`` (known after the
        exchange) returning it. ``resume`` (a [`ServerState`][fedhead.federation.checkpoint.ServerState])
        continues after its round instead (the exchange must give the same moments); ``on_resume``
        then receives the restored records. ``on_round_end`` (the checkpointer) receives the
        server state after every complete round, round 0 included; ``on_exchange`` the exchange,
        before anything is restored or trained (it may refuse the resume by raising).
        """
        self._on_round_end = on_round_end
        self.num_rounds = int(num_rounds)
        exchange = self.exchange_moments(grid)
        if on_exchange is not None:
            on_exchange(exchange)
        if diagnose_only:
            return None
        if resume is not None:
            arrays = self._resume(resume, on_resume)
            log.info("resuming after round %d of %d", resume.round, num_rounds)
        else:
            if callable(initial_head):
                initial_head = initial_head(exchange.moments.dim)
            self.begin(initial_head)
            arrays = protocol.head_record(*initial_head)
        return self.start(
            grid=grid,
            initial_arrays=arrays,
            num_rounds=num_rounds - self.rounds.offset,
            timeout=self.settings.timeouts.round,
            train_config=train_config or ConfigRecord(),
        )

    def _resume(self, state: ServerState, on_resume: Callable[[list[RoundRecord]], None] | None) -> ArrayRecord:
        """Restore ``state``, hand its records to ``on_resume``; the head to broadcast next."""
        self.restore(state)
        assert self.rounds.tracker is not None and self.rounds.head is not None
        if on_resume is not None:
            on_resume(list(self.rounds.tracker.records))
        return protocol.head_record(*self.rounds.head)
