"""``privacy.mode=clear``: [`ClearAggregator`][fedhead.strategies.clear.ClearAggregator]. Each site's
moments, head and errors reach the server one by one; the server checks each reply (the failure and
trust policies), averages the heads with weights ``N_m / N`` and measures every site.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from fedhead.analysis.consistency import gram_errors
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.strategies.aggregator import Aggregator, HeadSum, MseSum, Phase
from fedhead.strategies.exchange import ExchangeSettings, MomentExchange, enforce_regime, query_moments
from fedhead.strategies.failures import Dropped
from fedhead.strategies.phases import TrainReplies, mean_mse, round_inputs, stack_heads
from fedhead.strategies.replies import parse_evaluate_reply, parse_train_reply
from fedhead.strategies.statistics import exchange_statistics

log = logging.getLogger(__name__)


def read_heads(phase: Phase, replies: Iterable[Message]) -> tuple[TrainReplies, list[Dropped]]:
    """The valid training replies by partition (heads of the phase's shape within ``trust.max_abs``, the
    exchange's counts, the variant's own check) and the dropped clients."""
    expected_n = phase.exchange.sample_counts()
    max_abs = phase.settings.trust.max_abs

    def parse(msg: Message) -> tuple[int, np.ndarray, np.ndarray, int]:
        parsed = parse_train_reply(msg, phase.head_shape, expected_n, max_abs=max_abs)
        phase.checks.check_reply(msg, parsed[1])
        return parsed

    kept, dropped = phase.screen(replies, parse)
    return stack_heads(kept), dropped


def averaging_shares(exchange: MomentExchange, present: Sequence[int], counts: np.ndarray) -> np.ndarray:
    """The averaging weights of the clients ``present`` (indices into the exchange): their counts when
    the exchange's weight cap did not bind (``N_m / N`` over them, bit for bit), else their capped
    exchange weights renormalised."""
    if not agg.capped_sites(exchange.moments).any():
        return np.asarray(counts, dtype=np.float64)
    return np.asarray(exchange.moments.weights)[np.asarray(present, dtype=int)]


def consistency(
    phase: Phase, kept: TrainReplies, present: Sequence[int], fit: agg.LocalFit
) -> tuple[list[float], list[str]]:
    """Each returned head's Gram against the optimal Gram of its site
    ([`gram_errors`][fedhead.analysis.consistency.gram_errors]) and a flag (one log line) for a client
    that reports its local optimum but whose Gram is far from it."""
    exchange = phase.exchange
    errors = gram_errors(kept.heads, np.asarray(exchange.targets.client_grams)[np.asarray(present, dtype=int)])
    limit = phase.settings.trust.flag_gram_error
    flags = []
    for msg, pid, err, gap in zip(kept.messages, present, errors, fit.trained_gaps, strict=True):
        if gap <= agg.LOCAL_GAP_THRESHOLD and err > limit:
            flags.append(
                f"node {protocol.node_of(msg)} (partition {exchange.partition_ids[pid]}): "
                f"reports its local optimum (trained_gap {gap:.2g}) but its head's Gram is {err:.3g} "
                f"(relative) from the optimal Gram of the covariance it sent (trust.flag_gram_error={limit:g})"
            )
            log.warning("training: flagged %s", flags[-1])
    return [float(e) for e in errors], flags


def bounded_updates(phase: Phase, kept: TrainReplies) -> tuple[np.ndarray, np.ndarray, int]:
    """The heads and biases to average: each update clipped to ``trust.clip_update`` when set
    ([`clip_updates`][fedhead.federation.aggregation.clip_updates]), and how many were."""
    clip = phase.settings.trust.clip_update
    if clip is None:
        return kept.heads, kept.biases, 0
    assert phase.broadcast is not None
    bounded = agg.clip_updates(kept.heads, kept.biases, phase.broadcast, clip)
    clipped = int(np.count_nonzero(bounded.scale < 1))
    if clipped:
        log.info("training: %d of %d head updates clipped to trust.clip_update=%g", clipped, len(kept.messages), clip)
    return bounded.weight, bounded.bias, clipped


class ClearAggregator(Aggregator):
    """The sites' values one by one: the clear moment (or statistics) exchange, the heads averaged with
    weights ``N_m / N`` ([`average_heads`][fedhead.federation.aggregation.average_heads]), the errors
    weighted by the clients' counts."""

    def exchange(self, settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> MomentExchange:
        """The moment query ([`query_moments`][fedhead.strategies.exchange.query_moments]), or a site-local
        table's statistics exchange ([`exchange_statistics`][fedhead.strategies.statistics.exchange_statistics])."""
        site_local = settings.site_statistics is not None
        return (exchange_statistics if site_local else query_moments)(settings, grid, node_ids)

    def check_regime(self, exchange: MomentExchange, settings: ExchangeSettings, allow_outside_regime: bool) -> None:
        """[`enforce_regime`][fedhead.strategies.exchange.enforce_regime] on the sites' own moments."""
        enforce_regime(exchange, settings.lambda_h, settings.lambda_w, allow_outside_regime)

    def address(self, phase: Phase, messages: list[Message]) -> list[Message]:
        """The messages as they are: a clear phase enters no sum."""
        return messages

    def aggregate_train(self, phase: Phase, replies: Iterable[Message]) -> HeadSum:
        """The heads averaged by ``N_m / N`` over the valid replies (each update clipped when
        ``trust.clip_update`` is set), with every site's fit, metrics and consistency."""
        kept, dropped = read_heads(phase, replies)
        extra = phase.checks.verify_replies(kept.messages, kept.heads)
        fit, present, client_metrics, ignored = round_inputs(
            kept.messages, phase.exchange, phase.settings.trust.extra_metrics
        )
        shares = averaging_shares(phase.exchange, present, kept.counts)
        heads, biases, clipped = bounded_updates(phase, kept)
        avg = agg.average_heads(heads, biases, shares)
        errors, flags = consistency(phase, kept, present, fit)
        return HeadSum(
            avg.weight,
            avg.bias,
            kept=kept,
            shares=shares,
            dropped=dropped,
            client_metrics=client_metrics,
            extra=extra,
            fit=fit,
            present=present,
            ignored_metrics=ignored,
            clipped_updates=clipped,
            gram_errors=errors,
            flags=flags,
        )

    def aggregate_evaluate(self, phase: Phase, replies: Iterable[Message]) -> MseSum:
        """Train and test MSE weighted by the clients' counts ([`mean_mse`][fedhead.strategies.phases.mean_mse])."""
        kept, dropped = phase.screen(replies, parse_evaluate_reply)
        train, test = mean_mse([r[1] for _, r in kept])
        return MseSum(train, test, dropped)
