"""The statistics exchange's server steps (strategies/statistics.py) on hand-made rows."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedhead.federation import protocol
from fedhead.federation.aggregation import ReplyError
from fedhead.strategies.failures import TooFewReplies
from fedhead.strategies.statistics import StatsRow, number_clients, parse_statistics_reply, refuse_other_columns

COLS = ("f1", "f2", "t1", "t2")


def _row(node: int, key: str, columns=COLS, partition=None) -> StatsRow:
    return StatsRow(partition, node, key, tuple(columns), 10, np.zeros(2), np.eye(2), np.zeros(2), np.ones(2))


def test_the_runs_columns_are_the_majoritys_even_when_the_first_node_differs():
    rows = [_row(1, "aa", COLS + ("extra",)), _row(2, "bb"), _row(3, "cc")]
    dropped: list = []
    kept = refuse_other_columns(rows, dropped, required=2, expected=3)
    assert [r.node for r in kept] == [2, 3]
    (d,) = dropped
    assert d.node == 1 and d.reason == "its columns differ from the run's (missing [], extra ['extra'])"
    with pytest.raises(TooFewReplies, match=r"2 valid of 3 clients, 3 required .*node 1: its columns differ"):
        refuse_other_columns(rows, [], required=3, expected=3)


def test_nodes_without_partition_are_numbered_by_site_key_then_node():
    rows = [_row(7, "ff"), _row(3, "0a"), _row(5, "0a")]
    numbered, assigned = number_clients(rows)
    assert assigned and [(r.node, r.partition) for r in numbered] == [(3, 0), (5, 1), (7, 2)]
    again, _ = number_clients(list(reversed(rows)))  # the same numbers whatever the reply order
    assert [(r.node, r.partition) for r in again] == [(3, 0), (5, 1), (7, 2)]
    given = [_row(7, "ff", partition=0), _row(3, "0a", partition=1)]
    kept, assigned = number_clients(given)
    assert not assigned and [r.partition for r in kept] == [0, 1]  # node configs' partition ids kept


def _statistics_reply(columns: object) -> Message:
    """A site's statistics reply as a SuperNode sends it, with ``columns`` as given."""
    ask = Message(RecordDict(), dst_node_id=7, message_type="query")
    arrays = {
        protocol.Y_MEAN: np.zeros(2),
        protocol.Y_COV: np.eye(2),
        protocol.X_MEAN: np.zeros(2),
        protocol.X_VAR: np.ones(2),
    }
    content = RecordDict(
        {
            protocol.SITE_STATS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            protocol.SITE: ConfigRecord({protocol.COLUMNS: columns, protocol.SITE_KEY: "ab"}),
            protocol.METRICS: MetricRecord({protocol.NUM_EXAMPLES: 10}),
        }
    )
    return Message(content, reply_to=ask)


@pytest.mark.usefixtures("task_identity")
def test_a_statistics_reply_whose_columns_are_not_a_list_is_refused_not_fatal():
    row = parse_statistics_reply(_statistics_reply(list(COLS)))
    assert row.node == 7 and row.columns == COLS and row.n == 10
    for bad in (3, "f1"):  # a number, or one name where the list belongs
        with pytest.raises(ReplyError, match="'columns' must be a list of column names"):
            parse_statistics_reply(_statistics_reply(bad))
