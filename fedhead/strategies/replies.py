"""Reading client replies on the server: the metrics record, the partition id and the validated
content of a training or evaluation reply. Each parser raises
[`ReplyError`][fedhead.federation.aggregation.ReplyError] naming the node, which the failure
policy turns into a dropped client.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Message, MetricRecord

from fedhead.federation import aggregation as agg
from fedhead.federation import protocol


class FederationError(RuntimeError):
    """A round could not be completed (client error, missing replies, failed verification)."""


def metrics_of(message: Message) -> MetricRecord:
    """The reply's ``metrics`` record;
    [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] when it is missing."""
    content = message.content
    if protocol.METRICS not in content.metric_records:
        raise agg.ReplyError(protocol.node_of(message), f"reply lacks the '{protocol.METRICS}' MetricRecord")
    return content.metric_records[protocol.METRICS]


def partition_of(message: Message) -> int:
    """The partition id a reply reports in its metrics."""
    metrics = metrics_of(message)
    if protocol.PARTITION_ID not in metrics:
        raise agg.ReplyError(protocol.node_of(message), f"metrics lack '{protocol.PARTITION_ID}'")
    try:
        return protocol.record_int(metrics[protocol.PARTITION_ID])
    except (TypeError, ValueError):
        raise agg.ReplyError(protocol.node_of(message), f"'{protocol.PARTITION_ID}' is not an integer") from None


def parse_train_reply(
    msg: Message, head_shape: tuple[int, int], expected_n: Mapping[int, int], *, max_abs: float | None = None
) -> tuple[int, np.ndarray, np.ndarray, int]:
    """``(partition id, W (C, P), b (C,), N_m)`` of one training reply, validated.

    The head must have ``head_shape`` and entries at most ``max_abs`` (``trust.max_abs``), the
    sample count must be the one of the moment exchange (``expected_n``: partition id -> ``N_m``),
    and the metrics must carry the objective gaps every round record needs
    ([`fedhead.federation.aggregation.local_fit`][fedhead.federation.aggregation.local_fit]).
    """
    node = protocol.node_of(msg)
    if protocol.HEAD not in msg.content.array_records:
        raise agg.ReplyError(node, f"training reply lacks the '{protocol.HEAD}' ArrayRecord")
    try:
        w, b = protocol.read_head(msg.content.array_records[protocol.HEAD])
    except (KeyError, TypeError, ValueError) as exc:
        raise agg.ReplyError(node, f"unreadable head record ({exc})") from None
    metrics = metrics_of(msg)
    pid = partition_of(msg)
    w, b, n = agg.validate_head(
        w, b, metrics.get(protocol.NUM_EXAMPLES), node_id=node, shape=head_shape, max_abs=max_abs
    )
    n_exp = expected_n.get(pid)
    if n_exp is not None and n != n_exp:
        raise agg.ReplyError(node, f"reported {n} samples, but {n_exp} in the moment exchange")
    agg.local_fit([metrics], [node])  # the objective gaps every round record needs
    return pid, w, b, n


def parse_evaluate_reply(msg: Message) -> tuple[int, list[float]]:
    """``(partition id, [train MSE, N_m] (+ [test MSE, N_test] when reported))`` of one
    evaluation reply, validated."""
    node = protocol.node_of(msg)
    m = metrics_of(msg)
    pid = partition_of(msg)
    if protocol.TRAIN_MSE not in m:
        raise agg.ReplyError(node, f"evaluation reply lacks '{protocol.TRAIN_MSE}'")
    row = [
        float(agg.validate_array(m[protocol.TRAIN_MSE], (), node_id=node, name=protocol.TRAIN_MSE)),
        agg.validate_count(m.get(protocol.NUM_EXAMPLES), node_id=node),
    ]
    if protocol.TEST_MSE in m:
        row += [
            float(agg.validate_array(m[protocol.TEST_MSE], (), node_id=node, name=protocol.TEST_MSE)),
            agg.validate_count(m.get(protocol.NUM_TEST_EXAMPLES), node_id=node),
        ]
    return pid, row
