"""[`HeadAveraging`][fedhead.strategies.head_averaging.HeadAveraging]: fedhead's server strategy on
flwr's Message API (a subclass of flwr's `flwr.serverapp.strategy.Strategy`).

It drives the one-time moment exchange ([`exchange`][fedhead.strategies.exchange]), then each round
broadcasts the head, averages the returned heads with weights ``N_m / N`` and measures the round
(theory.md §11). The steps live in the sibling modules; the strategy does no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from types import MappingProxyType

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, MetricRecordValues, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedhead.analysis.consistency import gram_errors
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.checkpoint import ServerState
from fedhead.federation.privacy_noise import privacy_spent
from fedhead.federation.secure_records import SUM_ID
from fedhead.federation.tracking import RoundRecord
from fedhead.settings.limits import FailurePolicy, Timeouts
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.settings.trust import TrustPolicy
from fedhead.strategies.exchange import (
    ConfigValue,
    ExchangeSettings,
    MomentExchange,
    collect_moments,
    enforce_regime,
    query_moments,
    wait_for_nodes,
)
from fedhead.strategies.failures import Dropped
from fedhead.strategies.observer import NullObserver, RunObserver
from fedhead.strategies.phases import mean_mse, round_inputs, screen_phase, stack_heads, train_content
from fedhead.strategies.replies import FederationError, parse_evaluate_reply, parse_train_reply, partition_of
from fedhead.strategies.rounds import RoundState
from fedhead.strategies.secure import (
    DP_EPSILON,
    DP_RELEASES,
    SITES_AT_OPTIMUM,
    SITES_SUMMED,
    SecureSum,
    SecureSumFailed,
    enforce_reported_regime,
    parse_site_reply,
    run_secure_sum,
    secure_exchange,
)
from fedhead.strategies.statistics import exchange_statistics, node_messages

__all__ = ["FederationError", "HeadAveraging", "MomentExchange", "RunObserver"]

log = logging.getLogger(__name__)

#: A run's initial head ``(W_0 (C, P), b_0 (C,))``, or a function of ``C`` returning it.
InitialHead = tuple[np.ndarray, np.ndarray] | Callable[[int], tuple[np.ndarray, np.ndarray]]


class HeadAveraging(Strategy):
    """Head-only federated averaging with the one-time moment exchange.

    It implements flwr's four hooks itself (no FedAvg code runs);
    [`run`][fedhead.strategies.HeadAveraging.run] is the entry point: the exchange and the diagnosis, then
    flwr's round loop (``Strategy.start``).

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
        ``mode="secure"``: the exchange, every round's heads and every evaluation reach the server only
        as secure sums ([`fedhead.strategies.secure`][fedhead.strategies.secure]); per-site checks and
        measurements are then absent. None: clear mode.
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
    ) -> None:
        if lambda_h <= 0 or lambda_w <= 0:
            raise ValueError(f"lambda_h and lambda_w must be positive, got {lambda_h}, {lambda_w}")
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
        )
        self.settings.trust.check(int(min_nodes))
        self.privacy = privacy or PrivacyPolicy()
        self.privacy.check_sites(int(min_nodes))
        self.privacy.check_trust(self.settings.trust)
        #: secure mode: the server sees only sums ([`fedhead.strategies.secure`][fedhead.strategies.secure])
        self.secure = self.privacy.mode == "secure"
        self._grid: Grid | None = None
        self._secure_replies: list = []  # the current secure phase's first replies (keys, self-checks)
        self._releases = 0  # secure sums the server decoded (differential privacy composes them)
        self.observer: RunObserver = observer or NullObserver()
        self.evaluate_mse = bool(evaluate_mse)
        self.allow_outside_regime = bool(allow_outside_regime)
        self._sent: dict[str, list[int]] = {}  # nodes each phase was sent to (missing replies)
        self._round_dropped: list[Dropped] = []
        self.exchange: MomentExchange | None = None
        #: the head, the measurements and the resume offset between rounds (what a checkpoint holds)
        self.rounds = RoundState()
        self._broadcast: tuple[np.ndarray, np.ndarray] | None = None
        self._on_round_end: Callable[[ServerState], None] | None = None
        #: the run's number of rounds (set by [`run`][fedhead.strategies.HeadAveraging.run]): its last evaluate message
        # says ``final-round``
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
        """Sets and returns [`exchange`][fedhead.strategies.HeadAveraging.exchange]: moments, diagnosis and reference
        Grams of the valid
        query replies, failed clients dropped
        ([`fedhead.strategies.exchange.collect_moments`][fedhead.strategies.exchange.collect_moments])."""
        self.exchange = collect_moments(replies, self.settings, expected_nodes=expected_nodes)
        return self.exchange

    def exchange_moments(self, grid: Grid) -> MomentExchange:
        """Run the one-time moment exchange over ``grid`` and report it to the observer."""
        node_ids = self._wait_for_nodes(grid)
        site_local = self.settings.site_statistics is not None  # a site-local dataset=table run
        if self.secure:
            noised = self.privacy.dp_noise > 0
            self.exchange = secure_exchange(self.settings, grid, node_ids, self.privacy.threshold, noised=noised)
            self._releases = 1
        else:
            self.exchange = (exchange_statistics if site_local else query_moments)(self.settings, grid, node_ids)
        for line in self.exchange.diagnosis.format().splitlines():
            log.info("diagnosis: %s", line)
        self.observer.on_exchange(self.exchange)
        return self.exchange

    def check_regime(self) -> None:
        """Refuse to train outside the fully active regime unless allowed
        ([`enforce_regime`][fedhead.strategies.exchange.enforce_regime]; in secure mode, as the sites report it)."""
        if self.secure:
            enforce_reported_regime(self._exchanged("the regime check"), self.allow_outside_regime)
            return
        enforce_regime(
            self._exchanged("the regime check"),
            self.settings.lambda_h,
            self.settings.lambda_w,
            self.allow_outside_regime,
        )

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
        """Record round 0 for the initial head (after
        [`exchange_moments`][fedhead.strategies.HeadAveraging.exchange_moments])."""
        exchange = self._exchanged("training")
        self.check_regime()
        rec = self.rounds.start(exchange.targets, *initial_head, dim=exchange.moments.dim)
        rec.dropped = [d.to_dict() for d in exchange.dropped]  # the sites the exchange left out
        rec.extra.update(self.privacy_spent())
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
        self._sum_name("train", config)
        content = train_content(head_arrays, config, sigma_cen)
        return self._phase_messages(grid, "train", MessageType.TRAIN, content, arrays)

    def _phase_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """A phase's config record: the run's round number and
        [`message_config`][fedhead.strategies.exchange.ExchangeSettings.message_config]."""
        config[protocol.SERVER_ROUND] = self.rounds.round(server_round)
        config.update(self.settings.message_config)
        return config

    def _sum_name(self, kind: str, config: ConfigRecord) -> None:
        """In secure mode, name the phase's secure sum in its config (the clients then reply with their keys)."""
        if self.secure:
            config[SUM_ID] = f"{kind}-{config[protocol.SERVER_ROUND]}"

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
        """[`fedhead.strategies.phases.screen_phase`][fedhead.strategies.phases.screen_phase] against the nodes the
        phase was sent to."""
        assert self.exchange is not None
        sent = self._sent.pop(kind, None)
        return screen_phase(
            replies,
            parse,
            stage=stage,
            exchange=self.exchange,
            required=self.settings.required,
            sent=sent,
            timeout=self.settings.timeouts.round,
        )

    def parse_train_replies(
        self, replies: Iterable[Message]
    ) -> tuple[list[Message], np.ndarray, np.ndarray, np.ndarray]:
        """Validated heads ``(M,C,P)``, biases ``(M,C)``, counts ``(M,)`` ordered by partition, of the
        surviving clients (the failure policy's drops are kept in
        [`_round_dropped`][fedhead.strategies.HeadAveraging._round_dropped])."""
        expected_n = self._exchanged("training").sample_counts()
        shape = self.rounds.head_shape

        def parse(msg: Message):
            parsed = parse_train_reply(msg, shape, expected_n, max_abs=self.settings.trust.max_abs)
            self.check_reply(msg, parsed[1])
            return parsed

        kept, dropped = self._screen(replies, parse, "training", "train")
        self._round_dropped = list(dropped)
        return stack_heads(kept)

    def check_reply(self, msg: Message, weight: np.ndarray) -> None:
        """Hook: a variant's own checks of one training reply (its head ``weight``); raising
        [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] drops the client."""

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]:
        """Hook: measurements over the kept replies; returns scalars to log with the round."""
        return {}

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        server_round = self.rounds.round(server_round)
        if self.secure:
            return self._aggregate_secure_train(server_round, replies)
        msgs, heads, biases, counts = self.parse_train_replies(replies)
        extra = self.verify_replies(msgs, heads)
        fit, present, client_metrics, ignored = round_inputs(
            msgs, self._exchanged("aggregation"), self.settings.trust.extra_metrics
        )
        assert self.rounds.tracker is not None and self._broadcast is not None
        shares = self._shares(present, counts)
        avg_heads, avg_biases, clipped = heads, biases, 0
        clip = self.settings.trust.clip_update
        if clip is not None:
            bounded = agg.clip_updates(heads, biases, self._broadcast, clip)
            avg_heads, avg_biases, clipped = bounded.weight, bounded.bias, int(np.count_nonzero(bounded.scale < 1))
            if clipped:
                log.info("training: %d of %d head updates clipped to trust.clip_update=%g", clipped, len(msgs), clip)
        avg = agg.average_heads(avg_heads, avg_biases, shares)
        self.rounds.set_head(avg.weight, avg.bias)
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
        rec.ignored_metrics, rec.clipped_updates = ignored, clipped
        rec.gram_errors, rec.flags = self._consistency(msgs, heads, present, fit)
        arrays = protocol.head_record(avg.weight, avg.bias)
        self._add_aggregate(arrays, msgs, shares)
        out_metrics = MetricRecord({k: float(v) for k, v in rec.scalars().items() if "/" not in k})
        if not self.evaluate_mse:
            self._round_complete(rec)
        return arrays, out_metrics

    def _shares(self, present: Sequence[int], counts: np.ndarray) -> np.ndarray:
        """The averaging weights of the clients ``present`` (indices into the exchange): their counts
        when the exchange's weight cap did not bind (``N_m / N`` over them, bit for bit), else their
        capped exchange weights renormalised."""
        moments = self._exchanged("aggregation").moments
        if not agg.capped_sites(moments).any():
            return np.asarray(counts, dtype=np.float64)
        return np.asarray(moments.weights)[np.asarray(present, dtype=int)]

    def _consistency(
        self, msgs: Sequence[Message], heads: np.ndarray, present: Sequence[int], fit: agg.LocalFit
    ) -> tuple[list[float], list[str]]:
        """Each returned head's Gram against the optimal Gram of its site
        ([`fedhead.analysis.consistency.gram_errors`][fedhead.analysis.consistency.gram_errors]) and a flag
        (one log line) for a client that reports its local optimum but whose Gram is far from it."""
        exchange = self._exchanged("aggregation")
        errors = gram_errors(heads, np.asarray(exchange.targets.client_grams)[np.asarray(present, dtype=int)])
        limit = self.settings.trust.flag_gram_error
        flags = []
        for msg, pid, err, gap in zip(msgs, present, errors, fit.trained_gaps, strict=True):
            if gap <= agg.LOCAL_GAP_THRESHOLD and err > limit:
                flags.append(
                    f"node {protocol.node_of(msg)} (partition {exchange.partition_ids[pid]}): "
                    f"reports its local optimum (trained_gap {gap:.2g}) but its head's Gram is {err:.3g} "
                    f"(relative) from the optimal Gram of the covariance it sent (trust.flag_gram_error={limit:g})"
                )
                log.warning("training: flagged %s", flags[-1])
        return [float(e) for e in errors], flags

    def _add_aggregate(self, arrays: ArrayRecord, msgs: Sequence[Message], shares: np.ndarray) -> None:
        """Hook for subclasses that aggregate more than the head (``shares``: the averaging weights, unnormalised)."""

    # ---------------------------------------------------------------- secure mode
    def _secure_phase(
        self, replies: Iterable[Message], stage: str, kind: str, server_round: int, length: int, bound: float
    ) -> tuple[SecureSum, list[Dropped]]:
        """A phase's secure sum: its replies (each site's keys) screened, then stages 2-4
        ([`run_secure_sum`][fedhead.strategies.secure.run_secure_sum]); the sum and the dropped sites."""
        exchange = self._exchanged(stage)
        kept, dropped = screen_phase(
            replies,
            lambda msg: (partition_of(msg), parse_site_reply(msg)),
            stage=stage,
            exchange=exchange,
            required=self.settings.required,
            sent=self._sent.pop(kind, None),
            timeout=self.settings.timeouts.round,
        )
        self._secure_replies = [r for _, (_, r) in kept]
        assert self._grid is not None
        summed = run_secure_sum(
            self._grid,
            {r.node: r.keys for r in self._secure_replies},
            sum_id=f"{kind}-{server_round}",
            name=f"{kind} round {server_round}",
            length=length,
            bound=sr.COUNT_BOUND * bound,
            required=self.settings.required,
            timeout=self.settings.timeouts.round,
            threshold=self.privacy.threshold,
            message_config=self.settings.message_config,
            partitions=dict(zip(exchange.node_ids, exchange.partition_ids)),
        )
        self._releases += 1
        return summed, [*dropped, *summed.dropped]

    def privacy_spent(self) -> dict[str, float]:
        """Under differential privacy, the releases so far and their ``epsilon`` at ``privacy.dp_delta``
        ([`privacy_spent`][fedhead.federation.privacy_noise.privacy_spent]); empty otherwise."""
        pv = self.privacy
        if not (self.secure and pv.dp_noise > 0 and self._releases):
            return {}
        spent = privacy_spent(pv.dp_noise, self._releases, self.settings.num_clients, pv.dp_delta)
        return {DP_RELEASES: float(self._releases), DP_EPSILON: float(spent.epsilon)}

    def _aggregate_secure_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's average head from the secure sum of ``N_m [W_m, b_m, 1]``; per-site values are absent."""
        shape = self.rounds.head_shape
        c, p = shape
        summed, dropped = self._secure_phase(
            replies, "training", "train", server_round, c * p + c + 1, self.settings.trust.max_abs
        )
        weight, bias, count = sr.read_head(summed.total, shape)
        if not count > 0:
            raise SecureSumFailed(
                f"training round {server_round}: the secure sum's count of rows is {count:.3g}, not positive: the "
                "differential privacy noise overwhelms the sites' weights (lower privacy.dp_noise or raise "
                "privacy.dp_max_rows)"
            )
        worst = float(max(np.max(np.abs(weight)), np.max(np.abs(bias)))) if weight.size else 0.0
        if not np.isfinite(worst) or worst > self.settings.trust.max_abs:
            raise SecureSumFailed(
                f"training round {server_round}: the secure average of the heads has an entry of magnitude "
                f"{worst:.3g} beyond trust.max_abs={self.settings.trust.max_abs:g}; a site sent values out of "
                "bounds, and in secure mode the server cannot tell which"
            )
        self.rounds.set_head(weight, bias)
        assert self.rounds.tracker is not None and self._broadcast is not None
        sites = [r for r in self._secure_replies if r.node in summed.survivors]
        at_optimum = sum(1 for r in sites if r.metrics.get(sr.LOCAL_OPTIMUM) == 1)
        rec = self.rounds.tracker.record(
            server_round,
            weight,
            bias,
            broadcast=self._broadcast[0],
            client_heads=np.zeros((0, c, p)),
            client_metrics=[dict(r.metrics) for r in sites],
            extra={SITES_AT_OPTIMUM: float(at_optimum), SITES_SUMMED: float(len(sites)), **self.privacy_spent()},
            dropped=[d.to_dict() for d in dropped],
        )
        if at_optimum < len(sites):
            log.warning(
                "training round %d: %d of %d sites report that they did not reach their local optimum",
                server_round,
                len(sites) - at_optimum,
                len(sites),
            )
        out_metrics = MetricRecord({k: float(v) for k, v in rec.scalars().items() if "/" not in k})
        if not self.evaluate_mse:
            self._round_complete(rec)
        return protocol.head_record(weight, bias), out_metrics

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
        self._sum_name("evaluate", config)
        content = RecordDict({protocol.HEAD: head, protocol.CONFIG: config})
        return self._phase_messages(grid, "evaluate", MessageType.EVALUATE, content, arrays)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if not self.evaluate_mse:
            return None
        server_round = self.rounds.round(server_round)
        if self.secure:
            summed, dropped = self._secure_phase(replies, "evaluation", "evaluate", server_round, sr.MSE_LENGTH, 1.0)
            if not summed.total[1] > 0:
                raise SecureSumFailed(
                    f"evaluation round {server_round}: the secure sum's count of rows is {summed.total[1]:.3g}, not "
                    "positive: the differential privacy noise overwhelms it (lower privacy.dp_noise)"
                )
            train, test = sr.read_mse(summed.total)
        else:
            kept, dropped = self._screen(replies, parse_evaluate_reply, "evaluation", "evaluate")
            train, test = mean_mse([r[1] for _, r in kept])
        assert self.rounds.tracker is not None
        rec = self.rounds.tracker.set_mse(server_round, train, test)
        rec.extra.update(self.privacy_spent())
        rec.dropped.extend(d.to_dict() for d in dropped)
        self._round_complete(rec)
        out: dict[str, MetricRecordValues] = {protocol.TRAIN_MSE: train}
        if test is not None:
            out[protocol.TEST_MSE] = test
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
