"""fedhead.federation.deploy_checks: the SuperNodes must match the run (one per partition)."""

import pytest

from fedhead.federation.deploy_checks import FederationMismatch, check_node_count, check_partitions


def test_node_count_exact():
    assert check_node_count([9, 3], 2) == [3, 9]


@pytest.mark.parametrize("nodes", [[1], [1, 2, 3], []])
def test_node_count_wrong(nodes):
    with pytest.raises(FederationMismatch, match="num_clients=2"):
        check_node_count(nodes, 2)


def test_node_count_duplicates_and_bad_m():
    with pytest.raises(FederationMismatch, match="duplicate"):
        check_node_count([4, 4], 2)
    with pytest.raises(FederationMismatch, match=">= 1"):
        check_node_count([], 0)


def test_partitions_ordered_by_partition():
    assert check_partitions([(1, 70), (0, 50), (2, 10)], 3) == [50, 70, 10]


@pytest.mark.parametrize(
    "pairs, message",
    [
        ([(0, 5), (0, 6)], "partition 0 by nodes \\[5, 6\\]"),
        ([(0, 5), (1, 5)], "node 5: \\[0, 1\\]"),
        ([(0, 5), (2, 6)], "outside 0..1"),
        ([(0, 5)], "no node serves partitions \\[1\\]"),
    ],
)
def test_partitions_mismatch(pairs, message):
    with pytest.raises(FederationMismatch, match=message):
        check_partitions(pairs, 2)
