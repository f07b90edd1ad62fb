"""Checks that the SuperNodes of a deployment match the job (one SuperNode per partition).

In a deployment the ServerApp sees whichever SuperNodes are connected; each carries its
partition in its node config (``partition-id``, ``num-partitions``), which the ClientApp
reports in its replies. A SuperNode too many or one missing would silently average the wrong
federation; [`check_node_count`][fedhead.federation.deploy_checks.check_node_count] turns that into an
error that names the nodes and the remedy, once the grid has ``num_clients`` nodes and before the
first message (``strategies/exchange.py``, ``wait_for_nodes``). Two SuperNodes claiming one
partition are refused with the replies (``strategies/exchange.py``, ``screen_rows``: both are
dropped). A pure function, no Flower objects: callers pass ids.
"""

from __future__ import annotations

from collections.abc import Iterable


class FederationMismatch(ValueError):
    """The connected SuperNodes do not form the federation that the run config asks for."""


def check_node_count(node_ids: Iterable[int], num_clients: int) -> list[int]:
    """The connected node ids (sorted), or an error when there are not exactly ``num_clients``.

    More SuperNodes than partitions is an error too: the strategy would pick ``num_clients``
    of them at random, and two of them may serve the same partition.
    """
    nodes = sorted(int(n) for n in node_ids)
    m = int(num_clients)
    if m < 1:
        raise FederationMismatch(f"num_clients must be >= 1, got {num_clients}")
    if len(set(nodes)) != len(nodes):
        raise FederationMismatch(f"duplicate node ids {nodes}")
    if len(nodes) != m:
        raise FederationMismatch(
            f"{len(nodes)} SuperNodes connected ({nodes}) but the run has num_clients={m}: "
            f"start exactly one SuperNode per partition (node config partition-id=0..{m - 1}, "
            f"num-partitions={m}), or set num_clients={len(nodes)} in the run's overrides"
        )
    return nodes
