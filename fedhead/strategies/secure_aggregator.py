"""``privacy.mode=secure``: [`SecureAggregator`][fedhead.strategies.secure_aggregator.SecureAggregator].
The exchange, each round's heads and each evaluation reach the server only as secure sums
([`run_secure_sum`][fedhead.strategies.secure.run_secure_sum]); per-site checks and measurements are
then absent, and what the server checks is the sum.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import ConfigRecord, Message
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
    parse_site_reply,
    run_secure_sum,
)
from fedhead.strategies.secure_exchange import PooledExchange, pool_sites, pooled_exchange

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

    def name_sum(self, kind: str, config: ConfigRecord) -> None:
        """The phase's sum ``<tag>/<kind>-<round>``: the clients then reply with their keys."""
        config[sr.SUM_ID] = self.setup.sum_id(f"{kind}-{config[protocol.SERVER_ROUND]}")

    def phase_sum(
        self, phase: Phase, replies: Iterable[Message], length: int, bound: float
    ) -> tuple[SecureSum, list[SiteReply], list[Dropped]]:
        """A phase's secure sum of ``length`` entries each at most ``bound``: its replies (each site's
        keys) screened, then stages 2-5; the sum, the first replies of the sites in it and the dropped sites."""
        kept, dropped = phase.screen(replies, lambda msg: (partition_of(msg), parse_site_reply(msg)))
        sites = [r for _, (_, r) in kept]
        assert phase.grid is not None
        exchange = phase.exchange
        summed = run_secure_sum(
            phase.grid,
            {r.node: r.keys for r in sites},
            sum_id=self.setup.sum_id(f"{phase.kind}-{phase.server_round}"),
            name=f"{phase.kind} round {phase.server_round}",
            length=length,
            bound=bound,
            required=phase.settings.required,
            timeout=phase.settings.timeouts.round,
            setup=self.setup,
            message_config=phase.settings.message_config,
            partitions=dict(zip(exchange.node_ids, exchange.partition_ids)),
        )
        in_sum = [r for r in sites if r.node in summed.survivors]
        return summed, in_sum, [*dropped, *summed.dropped]

    def aggregate_train(self, phase: Phase, replies: Iterable[Message]) -> HeadSum:
        """The round's average head from the secure sum of ``N_m [W_m, b_m, 1]``; per-site values are absent."""
        c, p = phase.head_shape
        max_abs = phase.settings.trust.max_abs
        summed, sites, dropped = self.phase_sum(phase, replies, c * p + c + 1, sr.head_bound(max_abs))
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
        summed, _, dropped = self.phase_sum(phase, replies, sr.MSE_LENGTH, sr.MSE_BOUND)
        if not summed.total[1] > 0:
            raise SecureSumFailed(
                f"evaluation round {phase.server_round}: the secure sum's count of rows is {summed.total[1]:.3g}, "
                "not positive: the differential privacy noise overwhelms it (lower privacy.dp_noise)"
            )
        train, test = sr.read_mse(summed.total)
        return MseSum(train, test, dropped)
