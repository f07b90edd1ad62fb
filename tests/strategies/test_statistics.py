"""The statistics exchange's server steps (strategies/statistics.py) on hand-made rows."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.strategies.failures import TooFewReplies
from fedhead.strategies.statistics import StatsRow, number_clients, refuse_other_columns

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
