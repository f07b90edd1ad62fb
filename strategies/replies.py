"""Reading client replies on the server: error replies, the metrics record, the partition id."""

from __future__ import annotations

from collections.abc import Sequence

from flwr.app import Message, MetricRecord

from fedhead import aggregation as agg
from fedhead import protocol as P


class FederationError(RuntimeError):
    """A round could not be completed (client error, missing replies, failed verification)."""


def raise_on_errors(replies: Sequence[Message], stage: str, expected: int) -> list[Message]:
    """Fail loudly on error replies or missing replies (never continue with partial state)."""
    errors = [m for m in replies if m.has_error()]
    if errors:
        detail = "; ".join(
            f"node {m.metadata.src_node_id}: {m.error.reason}" for m in errors
        )
        raise FederationError(f"{stage}: {len(errors)} client(s) failed: {detail}")
    if len(replies) != expected:
        raise FederationError(
            f"{stage}: expected {expected} replies, received {len(replies)} (timeout or lost client)"
        )
    return list(replies)


def metrics_of(message: Message) -> MetricRecord:
    """The reply's ``metrics`` record; :class:`fedhead.aggregation.ReplyError` when it is missing."""
    content = message.content
    if P.METRICS not in content.metric_records:
        raise agg.ReplyError(P.node_of(message), f"reply lacks the '{P.METRICS}' MetricRecord")
    return content.metric_records[P.METRICS]


def partition_of(message: Message) -> int:
    """The partition id a reply reports in its metrics."""
    metrics = metrics_of(message)
    if P.PARTITION_ID not in metrics:
        raise agg.ReplyError(P.node_of(message), f"metrics lack '{P.PARTITION_ID}'")
    return int(metrics[P.PARTITION_ID])
