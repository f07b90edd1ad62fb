"""fedhead.federation.deploy_checks: the SuperNodes must match the run (one per partition)."""

import pytest

from fedhead.federation.deploy_checks import FederationMismatch, check_node_count


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
