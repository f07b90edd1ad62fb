"""``privacy.mode=secure``: [`SecureAggregator`][fedhead.strategies.secure_aggregator.SecureAggregator].
The exchange, each round's heads and each evaluation reach the server only as secure sums
([`run_secure_sum`][fedhead.strategies.secure.run_secure_sum]); per-site checks and measurements are
then absent, and what the server checks is the sum.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.strategies.aggregator import Aggregator, HeadSum, MseSum, Phase
from fedhead.strategies.exchange import ExchangeSettings, MomentExchange
from fedhead.strategies.failures import Dropped
from fedhead.strategies.phases import TrainReplies
from fedhead.strategies.replies import partition_of
from fedhead.strategies.secure import (
    SITES_AT_OPTIMUM,
    SITES_SUMMED,
    SecureSum,
    SecureSumFailed,
    SiteReply,
    SumSetup,
    enforce_reported_regime,
    finish_sum,
    parse_site_reply,
    run_secure_sum,
)
from fedhead.strategies.secure_exchange import PooledExchange, pool_sites, pooled_exchange
from fedhead.strategies.secure_steps import SumMessages

log = logging.getLogger(__name__)


class SecureAggregator(Aggregator):
    """Only sums over the sites: a secure sum per phase among the members of ``setup.roster``, of
    ``setup.threshold`` Shamir shares ([`SumSetup`][fedhead.strategies.secure.SumSetup])."""

    def __init__(self, setup: SumSetup) -> None:
        self.setup = setup

    def pool(self, settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> PooledExchange:
        """The exchange's pooled moments and sites ([`pool_sites`][fedhead.strategies.secure_exchange.pool_sites])."""
        return pool_sites(settings, grid, node_ids, self.setup)

    def exchange(self, settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> MomentExchange:
        """The secure exchange ([`secure_exchange`][fedhead.strategies.secure_exchange.secure_exchange])."""
        return pooled_exchange(self.pool(settings, grid, node_ids), settings)

    def check_regime(self, exchange: MomentExchange, settings: ExchangeSettings, allow_outside_regime: bool) -> None:
        """The regime as the sites report it
        ([`enforce_reported_regime`][fedhead.strategies.secure.enforce_reported_regime])."""
        enforce_reported_regime(exchange, allow_outside_regime)

    def _sum_id(self, phase: Phase) -> str:
        """The id of the phase's sum: ``<tag>/<kind>-<round>`` (``+`` when it was announced and not set up)."""
        return self.setup.pipeline.sum_id(self.setup.sum_id(f"{phase.kind}-{phase.server_round}"))

    @staticmethod
    def _input(phase: Phase) -> tuple[int, float]:
        """``(length, bound)`` of a phase's sum: ``N_m [W_m, b_m, 1]`` of entries at most ``trust.max_abs`` per
        row (training), or the four weighted errors (evaluation)."""
        if phase.kind == "train":
            c, p = phase.head_shape
            return c * p + c + 1, sr.head_bound(phase.settings.trust.max_abs)
        return sr.MSE_LENGTH, sr.MSE_BOUND

    def address(self, phase: Phase, messages: list[Message]) -> list[Message]:
        """Each message names the phase's sum ``<tag>/<kind>-<round>`` and the next one (its reply then carries
        the site's keys for it); when the sum was set up within the previous sum's messages, each of its
        sites' messages carries its mask request (its routed key shares and the encoding), and the reply is
        the masked input ([`fedhead.strategies.secure_pipeline`][fedhead.strategies.secure_pipeline])."""
        name = self._sum_id(phase)
        following = None if phase.next_sum is None else self.setup.sum_id(phase.next_sum)
        prepared = self.setup.pipeline.peek(name)
        if prepared is not None and not prepared.server.length:
            length, bound = self._input(phase)
            prepared.server.fix_input(length, sr.encoding_for(bound, len(prepared.server.sites)))
        out = []
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            content = RecordDict(dict(msg.content.items()))
            config = ConfigRecord(dict(content.config_records.get(protocol.CONFIG, ConfigRecord())))
            config[sr.SUM_ID] = name
            if following is not None:
                config[sr.NEXT_SUM] = following
            content[protocol.CONFIG] = config
            if prepared is not None and node in prepared.routed and prepared.server.encoding is not None:
                request = sr.pack_mask_request(prepared.routed[node], prepared.server.encoding)
                content[sr.SECURE] = ConfigRecord({sr.PAYLOAD: request})
                config[sr.SIGN_NOW] = True  # its full list signed with its masked input: no survivor-list phase
            out.append(Message(content=content, dst_node_id=node, message_type=msg.metadata.message_type))
        return out

    def phase_sum(self, phase: Phase, replies: Iterable[Message]) -> tuple[SecureSum, list[SiteReply], list[Dropped]]:
        """A phase's secure sum: its replies screened, then the rest of the sum (stages 3-5 when it was set up
        ahead, else 2-5); the sum, the first replies of the sites in it and the dropped sites."""
        kept, dropped = phase.screen(replies, lambda msg: (partition_of(msg), parse_site_reply(msg)))
        sites = [r for _, (_, r) in kept]
        assert phase.grid is not None
        name = self._sum_id(phase)
        sums = SumMessages(
            phase.grid,
            name,
            f"{phase.kind} round {phase.server_round}",
            phase.settings.timeouts.round,
            phase.settings.required,
            phase.settings.message_config,
            dict(zip(phase.exchange.node_ids, phase.exchange.partition_ids)),
        )
        following = None if phase.next_sum is None else self.setup.sum_id(phase.next_sum)
        next_keys = {r.node: r.next_keys for r in sites if r.next_keys is not None}
        prepared = self.setup.pipeline.take(name)
        if prepared is None:
            length, bound = self._input(phase)
            keys = {r.node: r.keys for r in sites if r.keys is not None}
            summed = run_secure_sum(
                sums, keys, length=length, bound=bound, setup=self.setup, next_keys=next_keys, next_sum=following
            )
        else:
            masked = {r.node: r.masked for r in sites if r.masked is not None and r.node in prepared.routed}
            signatures = {r.node: r.signature for r in sites if r.node in masked and r.signature is not None}
            late = [r for r in sites if r.node not in masked]
            for r in late:  # it missed the sum's set-up: it takes part from the next sum on
                reason = "it was not in the sum set up in the previous sum's messages; it takes part from the next"
                dropped.append(Dropped(phase.stage, r.node, "missing", reason, r.partition))
            summed = finish_sum(
                sums,
                prepared.server,
                masked,
                [],
                self.setup,
                signatures=signatures,
                next_keys=next_keys,
                next_sum=following,
            )
        in_sum = [r for r in sites if r.node in summed.survivors]
        return summed, in_sum, [*dropped, *summed.dropped]

    def aggregate_train(self, phase: Phase, replies: Iterable[Message]) -> HeadSum:
        """The round's average head from the secure sum of ``N_m [W_m, b_m, 1]``; per-site values are absent."""
        max_abs = phase.settings.trust.max_abs
        summed, sites, dropped = self.phase_sum(phase, replies)
        weight, bias, count = sr.read_head(summed.total, phase.head_shape)
        where = f"training round {phase.server_round}"
        if not count > 0:
            raise SecureSumFailed(
                f"{where}: the secure sum's count of rows is {count:.3g}, not positive: the differential privacy "
                "noise overwhelms the sites' weights (lower privacy.dp_noise or raise privacy.dp_max_rows)"
            )
        worst = float(max(np.max(np.abs(weight)), np.max(np.abs(bias)))) if weight.size else 0.0
        if not np.isfinite(worst) or worst > max_abs:
            raise SecureSumFailed(
                f"{where}: the secure average of the heads has an entry of magnitude {worst:.3g} beyond "
                f"trust.max_abs={max_abs:g}; a site sent values out of bounds, and in secure mode the server "
                "cannot tell which"
            )
        at_optimum = sum(1 for r in sites if r.metrics.get(sr.LOCAL_OPTIMUM) == 1)
        if at_optimum < len(sites):
            log.warning(
                "%s: %d of %d sites report that they did not reach their local optimum",
                where,
                len(sites) - at_optimum,
                len(sites),
            )
        return HeadSum(
            weight,
            bias,
            kept=TrainReplies.none(phase.head_shape),
            shares=np.zeros(0),
            dropped=dropped,
            client_metrics=[dict(r.metrics) for r in sites],
            extra={SITES_AT_OPTIMUM: float(at_optimum), SITES_SUMMED: float(len(sites))},
        )

    def aggregate_evaluate(self, phase: Phase, replies: Iterable[Message]) -> MseSum:
        """The train and test MSE from the secure sum of each site's errors times its counts."""
        summed, _, dropped = self.phase_sum(phase, replies)
        if not summed.total[1] > 0:
            raise SecureSumFailed(
                f"evaluation round {phase.server_round}: the secure sum's count of rows is {summed.total[1]:.3g}, "
                "not positive: the differential privacy noise overwhelms it (lower privacy.dp_noise)"
            )
        train, test = sr.read_mse(summed.total)
        return MseSum(train, test, dropped)
