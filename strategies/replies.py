"""Reading client replies on the server: error replies, the metrics record, the partition id, and
the validated content of a training reply (:func:`parse_train_reply`) and of an evaluation reply
(:func:`parse_evaluate_reply`). Each parser raises :class:`fedhead.federation.aggregation.ReplyError` naming
the node, which the failure policy (:func:`fedhead.strategies.failures.screen`) turns into a dropped client.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Message, MetricRecord

from fedhead.federation import aggregation as agg
from fedhead.federation import protocol as P


class FederationError(RuntimeError):
    """A round could not be completed (client error, missing replies, failed verification)."""


def metrics_of(message: Message) -> MetricRecord:
    """The reply's ``metrics`` record; :class:`fedhead.federation.aggregation.ReplyError` when it is missing."""
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


def parse_train_reply(
    msg: Message, head_shape: tuple[int, int], expected_n: Mapping[int, object]
) -> tuple[int, np.ndarray, np.ndarray, int]:
    """``(partition id, W (C, P), b (C,), N_m)`` of one training reply, validated.

    The head must have ``head_shape``, the sample count must be the one of the moment exchange
    (``expected_n``: partition id -> ``N_m``), and the metrics must carry the objective gaps
    every round record needs (:func:`fedhead.federation.aggregation.local_fit`).
    """
    node = P.node_of(msg)
    if P.HEAD not in msg.content.array_records:
        raise agg.ReplyError(node, f"training reply lacks the '{P.HEAD}' ArrayRecord")
    try:
        w, b = P.read_head(msg.content.array_records[P.HEAD])
    except (KeyError, TypeError, ValueError) as exc:
        raise agg.ReplyError(node, f"unreadable head record ({exc})") from None
    metrics = metrics_of(msg)
    pid = partition_of(msg)
    w, b, n = agg.validate_head(w, b, metrics.get(P.NUM_EXAMPLES), node_id=node, shape=head_shape)
    n_exp = expected_n.get(pid)
    if n_exp is not None and n != int(n_exp):
        raise agg.ReplyError(node, f"reported {n} samples, but {int(n_exp)} in the moment exchange")
    agg.local_fit([metrics], [node])  # the objective gaps every round record needs
    return pid, w, b, n


def parse_evaluate_reply(msg: Message) -> tuple[int, list[float]]:
    """``(partition id, [train MSE, N_m] (+ [test MSE, N_test] when reported))`` of one
    evaluation reply, validated."""
    node = P.node_of(msg)
    m = metrics_of(msg)
    pid = partition_of(msg)
    if P.TRAIN_MSE not in m:
        raise agg.ReplyError(node, f"evaluation reply lacks '{P.TRAIN_MSE}'")
    row = [
        float(agg.validate_array(m[P.TRAIN_MSE], (), node_id=node, name=P.TRAIN_MSE)),
        agg.validate_count(m.get(P.NUM_EXAMPLES), node_id=node),
    ]
    if P.TEST_MSE in m:
        row += [
            float(agg.validate_array(m[P.TEST_MSE], (), node_id=node, name=P.TEST_MSE)),
            agg.validate_count(m.get(P.NUM_TEST_EXAMPLES), node_id=node),
        ]
    return pid, row
