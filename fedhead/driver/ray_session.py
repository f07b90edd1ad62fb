"""The Ray session of the simulations: start it without a runtime environment, stop it, and
keep one session for several simulations (``fedhead-sweep``). A run joins only the cluster it is
told to (``resources.ray_address`` or ``RAY_ADDRESS``); otherwise its Ray is its own."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from fedhead.driver.cluster import check_reachable, cluster_address


def start_ray(init_args: dict[str, Any]) -> bool:
    """Start Ray for a simulation unless it is running; return whether this call started it.

    flwr's Ray backend would start it with a ``runtime_env`` (only to pass ``PYTHONPATH``),
    which makes Ray set up a runtime environment before every actor (seconds added to the start,
    whose time benchmarks/bench_overhead.py reports). Starting it here without one, with the same
    ``PYTHONPATH`` exported to the worker processes, no dashboard and ``init_args`` from the
    resources config, lets flwr reuse the running instance (it shuts Ray down at the end).

    With ``init_args["address"]``, else ``RAY_ADDRESS``
    ([`cluster_address`][fedhead.driver.cluster.cluster_address]), it joins that running cluster
    instead, after checking that it answers
    ([`check_reachable`][fedhead.driver.cluster.check_reachable]); ``ray.shutdown()`` then only
    disconnects this driver. Without either, the Ray it starts is always a new one of its own
    (``address="local"``): Ray left to choose would join the cluster that ``ray start`` last
    named in its address file (``ray/ray_current_cluster`` in its temp folder), or, once that
    cluster has stopped, try to reach it for minutes and fail.
    """
    # Ray (seconds to import): only when a simulation starts
    import ray

    if ray.is_initialized():
        return False
    args = dict(init_args)
    address = cluster_address(args.pop("address", None))
    if address:  # join a running cluster: it has its own resources and workers
        check_reachable(address)
        for key in ("num_cpus", "num_gpus", "include_dashboard"):
            args.pop(key, None)
        ray.init(address=address, **args)
        return False  # not started here: leaving disconnects, the cluster keeps running
    paths = [p for p in sys.path if p]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    args.setdefault("include_dashboard", False)
    ray.init(address="local", **args)  # never a cluster found on this host
    return True


def stop_ray() -> None:
    """Shut Ray down if it is still running (idempotent)."""
    # Ray (seconds to import): only when a simulation starts
    import ray

    if ray.is_initialized():
        ray.shutdown()


#: Depth of [`shared_ray_session`][fedhead.driver.ray_session.shared_ray_session] contexts:
#: above 0, simulations leave Ray running for the next one.
_SHARED_DEPTH = 0


@contextlib.contextmanager
def shared_ray_session(init_args: dict[str, Any], *, start: bool = True) -> Iterator[None]:
    """One Ray session for several [`run_federations`][fedhead.driver.simulation.run_federations] calls
    (``fedhead-sweep``, the tests).

    flwr's Ray backend shuts Ray down when a simulation ends (``RayBackend.terminate``); inside
    this context its actors are still terminated but Ray keeps running, so the start of Ray
    (GCS, raylet, workers: seconds) is paid once per sweep, not once per simulation. Ray is shut down
    when the outermost context exits, also on errors.

    Re-entrant: a context opened inside another one (a sweep inside the test session's) reuses
    the outer session and neither starts nor stops Ray. ``start=False`` leaves the start to the
    first simulation (``init_args`` are then that simulation's): a session that may run none
    costs nothing.
    """
    global _SHARED_DEPTH
    if _SHARED_DEPTH > 0:
        _SHARED_DEPTH += 1
        try:
            yield
        finally:
            _SHARED_DEPTH -= 1
        return
    from flwr.server.superlink.fleet.vce.backend import raybackend

    original = raybackend.RayBackend.terminate

    def terminate_actors_only(self) -> None:
        if self.pool:
            self.pool.terminate_all_actors()

    raybackend.RayBackend.terminate = terminate_actors_only
    _SHARED_DEPTH = 1
    try:
        if start:
            start_ray(init_args)
        yield
    finally:
        _SHARED_DEPTH = 0
        raybackend.RayBackend.terminate = original
        stop_ray()


def shared() -> bool:
    """True inside [`shared_ray_session`][fedhead.driver.ray_session.shared_ray_session] (a
    simulation then leaves Ray running)."""
    return _SHARED_DEPTH > 0
