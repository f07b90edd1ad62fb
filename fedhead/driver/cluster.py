"""Joining a running Ray cluster (``resources.ray_address``, else Ray's own ``RAY_ADDRESS``).

[`cluster_address`][fedhead.driver.cluster.cluster_address] names the cluster a run joins (None:
the run starts a Ray of its own on this machine, even where a ``ray start`` cluster runs on it or
a stopped one left its address file behind: Ray's own search for a cluster is never used, see
[`start_ray`][fedhead.driver.ray_session.start_ray]);
[`check_reachable`][fedhead.driver.cluster.check_reachable] refuses an address nothing listens
on within a deadline, before Ray is imported;
[`describe_cluster`][fedhead.driver.cluster.describe_cluster] and
[`check_client_fits`][fedhead.driver.cluster.check_client_fits] read what the cluster has once
joined; [`check_shared_folder`][fedhead.driver.cluster.check_shared_folder] refuses a client state
folder that one of the cluster's nodes cannot read: a client's private backbone between rounds
lives there, and the next round may run on any node. Leaving the session disconnects this
driver only: a cluster fedhead did not start keeps running.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from fedhead.analysis.constraints import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "ClusterError",
    "ClusterInfo",
    "cluster_address",
    "check_reachable",
    "describe_cluster",
    "check_client_fits",
    "check_shared_folder",
]


class ClusterError(ConfigError):
    """The named Ray cluster cannot run this simulation (unreachable, too small, no shared folder)."""


def cluster_address(ray_address: str | None) -> str | None:
    """The cluster a simulation joins: ``resources.ray_address``, else ``RAY_ADDRESS``, else None
    (a Ray of the run's own)."""
    address = ray_address if ray_address not in (None, "") else os.environ.get("RAY_ADDRESS") or None
    return None if address is None else str(address)


def check_reachable(address: str, timeout: float = 10.0) -> None:
    """Refuse, within ``timeout`` seconds, a ``host:port`` address nothing listens on
    (``auto`` and ``ray://`` addresses are left to Ray)."""
    if address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClusterError(
            f"resources.ray_address must be host:port (a Ray head's GCS address) or auto, got {address!r}"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ClusterError(
            f"cannot reach the Ray cluster at {address} within {timeout:g} s ({exc.strerror or exc}); "
            "start it with `ray start --head` or fix resources.ray_address / RAY_ADDRESS"
        ) from None


@dataclass(frozen=True)
class ClusterInfo:
    """The alive nodes of the joined cluster: ``(node id, address, CPUs, GPUs)`` each."""

    nodes: tuple[tuple[str, str, float, float], ...]

    @property
    def cpus(self) -> float:
        return sum(n[2] for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n[3] for n in self.nodes)

    def line(self, address: str) -> str:
        per_node = ", ".join(f"{ip} ({cpu:g} CPUs, {gpu:g} GPUs)" for _, ip, cpu, gpu in self.nodes)
        return (
            f"Ray cluster at {address}: {len(self.nodes)} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs: {per_node}"
        )


def describe_cluster() -> ClusterInfo:
    """The alive nodes of the cluster this process is connected to (``ray.nodes()``)."""
    import ray

    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        nodes.append(
            (str(node["NodeID"]), str(node.get("NodeManagerAddress", "?")), res.get("CPU", 0.0), res.get("GPU", 0.0))
        )
    return ClusterInfo(tuple(nodes))


def check_client_fits(info: ClusterInfo, client_cpus: float, client_gpus: float) -> None:
    """Refuse a cluster on which no node has the CPUs and GPUs one client needs."""
    if not any(cpu >= client_cpus and gpu >= client_gpus for _, _, cpu, gpu in info.nodes):
        biggest = max(((cpu, gpu) for _, _, cpu, gpu in info.nodes), default=(0.0, 0.0))
        raise ClusterError(
            f"no node of the Ray cluster has what one client needs (resources.client_cpus={client_cpus:g}, "
            f"client_gpus={client_gpus:g}); its largest node has {biggest[0]:g} CPUs and {biggest[1]:g} GPUs"
        )


def check_shared_folder(info: ClusterInfo, folder: Path, timeout: float = 60.0) -> None:
    """Refuse unless every node of the cluster reads a file written here into ``folder`` (the
    clients' state folder): a task pinned to each node looks for it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if len(info.nodes) < 2:
        return
    folder.mkdir(parents=True, exist_ok=True)
    token = folder / f".shared-{uuid.uuid4().hex}"
    token.write_text(token.name)
    try:

        @ray.remote(num_cpus=0)
        def reads(path: str) -> bool:
            try:
                return Path(path).read_text() == Path(path).name
            except OSError:
                return False

        refs = {
            ip: reads.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
                str(token)
            )
            for node_id, ip, _, _ in info.nodes
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        seen = {ip: ref in ready and bool(ray.get(ref)) for ip, ref in refs.items()}
    finally:
        token.unlink(missing_ok=True)
    blind = sorted(ip for ip, ok in seen.items() if not ok)
    if blind:
        raise ClusterError(
            f"the clients' state folder {folder} is not shared with the cluster's node(s) {blind} (each client's "
            "private backbone lives there between rounds, and the next round may run on any node): put output.dir "
            "on storage every node mounts at the same path"
        )
