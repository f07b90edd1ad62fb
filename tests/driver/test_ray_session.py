"""The shared Ray session is re-entrant: an inner context neither starts nor stops Ray and keeps
flwr's backend patched until the outermost one exits (no Ray is started there). A run joins only
the cluster it is told to: with neither ``RAY_ADDRESS`` nor ``resources.ray_address`` it starts a
Ray of its own, beside a ``ray start`` cluster on the same host or a dead cluster's address file
(each such test starts Ray in a fresh process, with its own Ray temp folder)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_commands import free_ports

from fedhead.driver import ray_session

#: Starts Ray as a simulation does (``start_ray``) for each init-args dict of ``sys.argv[1]``
#: (``"RAY_ADDRESS"`` in one sets that variable for it), and prints what it got: whether it started
#: Ray, the GCS address, the alive nodes and the CPUs of the cluster.
PROBE = """
import json, os, sys
import ray
from fedhead.driver.ray_session import start_ray, stop_ray
seen = []
for args in json.loads(sys.argv[1]):
    env = args.pop("RAY_ADDRESS", None)
    if env is not None:
        os.environ["RAY_ADDRESS"] = env
    started = start_ray(args)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    cpus = ray.cluster_resources().get("CPU")
    seen.append({"started": started, "gcs": ray.get_runtime_context().gcs_address, "nodes": nodes, "cpus": cpus})
    stop_ray()
    os.environ.pop("RAY_ADDRESS", None)
print(json.dumps(seen))
"""


def test_nested_shared_sessions_keep_the_outer_one():
    """Relative to the state the test finds: the test session's own shared session may already be
    open (it opens when a Ray test runs first in this process)."""
    import ray
    from flwr.server.superlink.fleet.vce.backend import raybackend

    original = raybackend.RayBackend.terminate
    outer, running = ray_session.shared(), ray.is_initialized()
    with ray_session.shared_ray_session({}, start=False):
        patched = raybackend.RayBackend.terminate
        assert ray_session.shared() and (patched is original) == outer
        with ray_session.shared_ray_session({"num_cpus": 1}):  # would start Ray if it were the outermost
            assert ray_session.shared() and raybackend.RayBackend.terminate is patched
        assert ray.is_initialized() == running  # the inner context started nothing
        assert ray_session.shared() and raybackend.RayBackend.terminate is patched
    assert ray_session.shared() == outer and raybackend.RayBackend.terminate is original


def test_flwr_backend_still_does_what_the_shared_session_replaces():
    """shared_ray_session swaps flwr's private ``RayBackend.terminate`` for one that only ends the
    actors: this pins what that method does in the installed flwr, so that an upgrade that
    renames it, stops shutting Ray down there or drops ``pool.terminate_all_actors`` fails here
    instead of leaking Ray sessions or stopping Ray under a sweep."""
    import ast
    import inspect

    from flwr.server.superlink.fleet.vce.backend import raybackend
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    # from the module's file: inside the test session's shared Ray session the class attribute is
    # the replacement itself
    module = inspect.getsource(raybackend)
    (cls,) = [n for n in ast.parse(module).body if isinstance(n, ast.ClassDef) and n.name == "RayBackend"]
    methods = {n.name: ast.get_source_segment(module, n) or "" for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "ray.shutdown()" in methods["terminate"] and "self.pool.terminate_all_actors()" in methods["terminate"]
    assert "self.pool" in methods["__init__"]
    assert callable(getattr(BasicActorPool, "terminate_all_actors", None))
    # flwr starts Ray only when it is not running: the Ray that start_ray chose is the one it uses
    assert "if not ray.is_initialized():" in methods["init_ray"]


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A Ray temp folder of the test's own (``RAY_TMPDIR``: the sessions and the address file
    ``ray/ray_current_cluster``; the user's is never read or written), short enough for Ray's
    socket paths."""
    folder = Path(tempfile.mkdtemp(prefix="fhray-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _env(ray_tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, "RAY_TMPDIR": str(ray_tmp)}


def _probe(env: dict[str, str], *init_args: dict) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(init_args))], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def ray_start_head(env: dict[str, str], logs: Path, cpus: int) -> Iterator[str]:
    """``ray start --head --block`` on free ports, as a user leaves a cluster running on the host;
    yields its address (from the address file it wrote); its process group is ended after."""
    gcs, client, agent = free_ports(3)
    address_file = Path(env["RAY_TMPDIR"]) / "ray" / "ray_current_cluster"
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={gcs}", f"--num-cpus={cpus}"]
    cmd += ["--include-dashboard=false", f"--ray-client-server-port={client}"]
    cmd += [f"--dashboard-agent-listen-port={agent}", "--disable-usage-stats", "--block"]
    with open(logs, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not address_file.is_file():
            assert proc.poll() is None, f"ray start exited with {proc.returncode}: {logs.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"ray start took over 120 s: {logs.read_text()[-3000:]}"
            time.sleep(0.5)
        yield address_file.read_text().strip()
    finally:
        proc.terminate()  # ray start --block ends the cluster's processes on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its group is left
        proc.wait()


@pytest.mark.timeout(300)
def test_a_run_starts_its_own_ray_beside_a_ray_start_cluster(ray_tmp, tmp_path):
    """With a ``ray start`` cluster (3 CPUs) on the host and its address file in Ray's temp folder,
    a run without an address (the default resources: no init args) starts its own Ray (one node,
    another GCS, none of the cluster's nodes); with ``RAY_ADDRESS`` or ``resources.ray_address``
    it joins the cluster."""
    env = _env(ray_tmp)
    with ray_start_head(env, tmp_path / "ray_start.log", cpus=3) as address:
        own, by_env, by_config = _probe(env, {}, {"RAY_ADDRESS": address}, {"address": address})
        assert own["started"] and own["gcs"] != address and len(own["nodes"]) == 1
        assert not set(own["nodes"]) & set(by_env["nodes"])
        for joined in (by_env, by_config):
            assert not joined["started"] and joined["gcs"] == address and joined["cpus"] == 3


@pytest.mark.timeout(300)
def test_a_dead_clusters_address_file_is_not_read(ray_tmp):
    """The address file a stopped ``ray start`` cluster leaves behind names a port nothing listens
    on; a run without an address starts its own Ray instead of failing to connect (which took Ray
    minutes)."""
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_ports(1)[0]}")
    (own,) = _probe(_env(ray_tmp), {})
    assert own["started"] and len(own["nodes"]) == 1
