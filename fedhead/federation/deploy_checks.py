"""Checks that the SuperNodes of a deployment match the job (one SuperNode per partition).

In a deployment the ServerApp sees whichever SuperNodes are connected; each carries its
partition in its node config (``partition-id``, ``num-partitions``), which the ClientApp
reports in its replies. A SuperNode too many, one missing, or two SuperNodes serving the same
partition would silently average the wrong federation; these functions turn that into an
error that names the nodes and the remedy. Pure functions, no Flower objects: callers pass ids.

Call sites (the ServerApp / strategy, see docs/deployment.md, "Checks of the federation"):

* [`check_node_count`][fedhead.federation.deploy_checks.check_node_count] once the grid has ``num_clients`` nodes,
before the first message
  (``strategies/exchange.py``, ``wait_for_nodes``: pass ``grid.get_node_ids()``);
* [`check_partitions`][fedhead.federation.deploy_checks.check_partitions] on the moment-exchange replies (``partition id
-> node id`` pairs
  gathered in ``strategies/exchange.py``, ``build_exchange``), which also gives the node order by partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


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


def check_partitions(pairs: Sequence[tuple[int, int]], num_clients: int) -> list[int]:
    """Node ids ordered by partition id, from ``(partition_id, node_id)`` pairs.

    Raises [`FederationMismatch`][fedhead.federation.deploy_checks.FederationMismatch] unless the partition ids are
    exactly ``0..num_clients-1``,
    each served by one node, and no node serves two partitions.
    """
    m = int(num_clients)
    by_pid: dict[int, list[int]] = {}
    by_node: dict[int, list[int]] = {}
    for pid, node in pairs:
        by_pid.setdefault(int(pid), []).append(int(node))
        by_node.setdefault(int(node), []).append(int(pid))
    problems = []
    dup = {p: n for p, n in sorted(by_pid.items()) if len(n) > 1}
    if dup:
        problems.append(
            "partitions served by several nodes: " + ", ".join(f"partition {p} by nodes {n}" for p, n in dup.items())
        )
    twice = {n: p for n, p in sorted(by_node.items()) if len(p) > 1}
    if twice:
        problems.append(
            "nodes answering for several partitions: " + ", ".join(f"node {n}: {p}" for n, p in twice.items())
        )
    outside = sorted(p for p in by_pid if not 0 <= p < m)
    if outside:
        problems.append(f"partition ids {outside} outside 0..{m - 1}")
    missing = sorted(set(range(m)) - set(by_pid))
    if missing:
        problems.append(f"no node serves partitions {missing}")
    if problems:
        raise FederationMismatch(
            f"the SuperNodes do not match num_clients={m}: "
            + "; ".join(problems)
            + f" (check each SuperNode's --node-config partition-id=K num-partitions={m})"
        )
    return [by_pid[p][0] for p in range(m)]
