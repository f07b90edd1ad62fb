"""One message phase on the server after the exchange: a training message's content, and the
replies screened by the failure policy against the exchange's clients, ordered by partition and
reduced to what the strategy aggregates (the heads of a training phase, the MSE of an evaluation).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.results.rounds import CLIENT_METRIC_KEYS
from fedhead.strategies.exchange import MomentExchange
from fedhead.strategies.failures import Dropped, screen
from fedhead.strategies.replies import metrics_of, partition_of

log = logging.getLogger(__name__)

T = TypeVar("T", bound=tuple)


def train_content(head: ArrayRecord, config: ConfigRecord, sigma_cen: np.ndarray | None) -> RecordDict:
    """A training message's content: the head, the config and, for correcting clients, the pooled
    ``Sigma_cen (C, C)``."""
    content = RecordDict({protocol.HEAD: head, protocol.CONFIG: config})
    if sigma_cen is not None:
        array = Array(np.asarray(sigma_cen, dtype=np.float64))
        content[protocol.SIGMA_CEN] = ArrayRecord({protocol.SIGMA_CEN_ARRAY: array})
    return content


def screen_phase(
    replies: Iterable[Message],
    parse: Callable[[Message], T],
    *,
    stage: str,
    exchange: MomentExchange,
    required: int,
    sent: Sequence[int] | None,
    timeout: float,
) -> tuple[list[tuple[Message, T]], list[Dropped]]:
    """The valid ``(reply, parse(reply))`` pairs ordered by partition (``parse(reply)[0]``) and
    the dropped clients ([`fedhead.strategies.failures.screen`][fedhead.strategies.failures.screen]
    against the nodes the phase was ``sent`` to, waiting at most ``timeout`` for them).

    A reply must come from a node of the exchange and report the partition that node had there;
    otherwise it is invalid and drops that node like any other invalid reply.
    """
    partitions = dict(zip(exchange.node_ids, exchange.partition_ids))

    def parse_own(msg: Message) -> T:
        node = protocol.node_of(msg)
        if node not in partitions:
            raise agg.ReplyError(node, "this node took no part in the moment exchange")
        pid = partition_of(msg)
        if pid != partitions[node]:
            raise agg.ReplyError(node, f"reports partition {pid}, but it is partition {partitions[node]} of this run")
        return parse(msg)

    kept, dropped = screen(
        replies,
        parse_own,
        stage=stage,
        required=required,
        expected_nodes=sent,
        expected_count=len(exchange.partition_ids),
        timeout=timeout if sent is not None else None,
        partitions=partitions,
    )
    return sorted(kept, key=lambda mr: mr[1][0]), dropped


@dataclass(frozen=True)
class TrainReplies:
    """The kept training replies of one round, in partition order: the messages, heads ``(M, C, P)``,
    biases ``(M, C)`` and counts ``(M,)`` (``M = 0`` when only their sum reached the server)."""

    messages: list[Message]
    heads: np.ndarray
    biases: np.ndarray
    counts: np.ndarray

    @classmethod
    def none(cls, shape: tuple[int, int]) -> TrainReplies:
        """No reply seen one by one, for heads of ``shape`` ``(C, P)``."""
        c, p = shape
        return cls([], np.zeros((0, c, p)), np.zeros((0, c)), np.zeros(0, dtype=int))


def stack_heads(kept: Sequence[tuple[Message, tuple[int, np.ndarray, np.ndarray, int]]]) -> TrainReplies:
    """The kept training replies
    ([`parse_train_reply`][fedhead.strategies.replies.parse_train_reply]), in their order."""
    return TrainReplies(
        [m for m, _ in kept],
        np.stack([r[1] for _, r in kept]),
        np.stack([r[2] for _, r in kept]),
        np.asarray([r[3] for _, r in kept]),
    )


def mean_mse(rows: Sequence[Sequence[float]]) -> tuple[float, float | None]:
    """Train and test MSE weighted by the clients' sample counts, from the evaluation rows
    ([`fedhead.strategies.replies.parse_evaluate_reply`][fedhead.strategies.replies.parse_evaluate_reply]);
    the test MSE only when every client reported one."""
    train_v, train_n = [r[0] for r in rows], [r[1] for r in rows]
    test_v, test_n = [r[2] for r in rows if len(r) > 2], [r[3] for r in rows if len(r) > 2]
    train = agg.weighted_mean(train_v, train_n)
    test = agg.weighted_mean(test_v, test_n) if len(test_v) == len(rows) else None
    return train, test


#: The metric names a client may report (results.json's ``client_metrics``); others are ignored.
DECLARED_METRICS = frozenset(k.name for k in CLIENT_METRIC_KEYS)


def declared_metrics(metrics: Mapping[str, object], extra: Iterable[str] = ()) -> tuple[dict[str, float], int]:
    """A reply's metrics with a declared name
    ([`fedhead.results.rounds.ClientMetric`][fedhead.results.rounds.ClientMetric], or one of ``extra``:
    ``trust.extra_metrics``) and a finite number as value, and how many entries were ignored."""
    allowed = DECLARED_METRICS.union(extra)
    kept = {
        k: float(v)
        for k, v in metrics.items()
        if k in allowed and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    return kept, len(metrics) - len(kept)


def round_inputs(
    msgs: Sequence[Message], exchange: MomentExchange, extra_metrics: Iterable[str] = ()
) -> tuple[agg.LocalFit, list[int], list[dict[str, float]], int]:
    """What a round record takes from the kept training replies: the clients' objective gaps
    ([`fedhead.federation.aggregation.local_fit`][fedhead.federation.aggregation.local_fit]), their
    indices among the exchange's partitions, each client's declared metrics
    ([`declared_metrics`][fedhead.strategies.phases.declared_metrics]) and the number of metric
    entries ignored (one log line per client that sent any)."""
    metrics = [metrics_of(m) for m in msgs]
    fit = agg.local_fit(metrics, [protocol.node_of(m) for m in msgs])
    present = [exchange.partition_ids.index(partition_of(m)) for m in msgs]
    client_metrics, ignored = [], 0
    for msg, m in zip(msgs, metrics, strict=True):
        kept, n_ignored = declared_metrics(m, extra_metrics)
        client_metrics.append(kept)
        if n_ignored:
            log.warning(
                "training: ignored %d metric entries of node %s (undeclared names or values that are not "
                "finite numbers)",
                n_ignored,
                protocol.node_of(msg),
            )
        ignored += n_ignored
    return fit, present, client_metrics, ignored
