"""Joining a running Ray cluster (``resources.ray_address`` / ``RAY_ADDRESS``).

The default suite checks the address rules and the refusals that come before Ray; the slow test
starts a 2-node cluster on this host (``ray.cluster_utils.Cluster``, each node its own raylet)
and runs ``fedhead-run`` on it twice: the first run leaves the cluster running for the second.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedhead.analysis.constraints import ConfigError
from fedhead.driver.cluster import ClusterError, ClusterInfo, check_client_fits, check_reachable, cluster_address
from fedhead.settings.job import ResourcesConfig

RUN = [
    sys.executable,
    "-m",
    "fedhead.cli.run",
    "model=free",
    "dataset.n_train=200",
    "num_clients=2",
    "procedure=proximal",
    "rounds=1",
    "local_epochs=5",
    "resources.evaluate_mse=false",
    "output.tensorboard=false",
    "output.figures=false",
]


@contextlib.contextmanager
def two_nodes() -> Iterator[Any]:
    """A 2-node Ray cluster on this host (``ray.cluster_utils.Cluster``, 1 CPU each), shut down after.

    Its Ray temp folder is its own (``RAY_TMPDIR``, also for the runs started meanwhile): the
    address file that ``Cluster`` writes, and removes at shutdown, is not the user's."""
    from ray.cluster_utils import Cluster

    saved = os.environ.get("RAY_TMPDIR")
    ray_tmp = tempfile.mkdtemp(prefix="fhray-")  # short: Ray's socket paths live under it
    os.environ["RAY_TMPDIR"] = ray_tmp
    try:
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
        try:
            cluster.add_node(num_cpus=1)
            yield cluster
        finally:
            cluster.shutdown()
    finally:
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is


def test_the_address_comes_from_the_config_then_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address(None) == "10.0.0.1:6379"
    assert cluster_address("127.0.0.1:6380") == "127.0.0.1:6380"


def test_a_cluster_decides_its_resources():
    with pytest.raises(ConfigError, match="ray_num_cpus and ray_num_gpus must be null with resources.ray_address"):
        ResourcesConfig(ray_address="127.0.0.1:6379", ray_num_cpus=4)


def test_an_unreachable_or_malformed_address_is_one_line():
    t0 = time.perf_counter()
    with pytest.raises(ClusterError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:\d+ within 2 s"):
        check_reachable(f"127.0.0.1:{_closed_port()}", timeout=2)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(ClusterError, match="must be host:port"):
        check_reachable("just-a-host")


def test_a_cluster_without_room_for_one_client_is_refused():
    info = ClusterInfo((("a", "10.0.0.1", 2.0, 0.0), ("b", "10.0.0.2", 1.0, 0.0)))
    check_client_fits(info, 2.0, 0.0)
    with pytest.raises(ClusterError, match="largest node has 2 CPUs and 0 GPUs"):
        check_client_fits(info, 4.0, 0.0)
    with pytest.raises(ClusterError, match="client_gpus=0.5"):
        check_client_fits(info, 1.0, 0.5)
    assert "2 node(s), 3 CPUs, 0 GPUs" in info.line("10.0.0.1:6379")


def test_fedhead_run_refuses_an_unreachable_cluster_before_anything_runs(tmp_path):
    out = subprocess.run(
        [*RUN, f"resources.ray_address=127.0.0.1:{_closed_port()}", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "cannot reach the Ray cluster at 127.0.0.1:" in errors[0], out.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_runs_join_a_two_node_cluster_and_leave_it_running(tmp_path):
    with two_nodes() as cluster:
        for name in ("first", "second"):
            out = subprocess.run(
                [*RUN, f"resources.ray_address={cluster.address}", f"output.dir={tmp_path / name}"],
                capture_output=True,
                text=True,
                timeout=400,
                cwd=tmp_path,
            )
            assert out.returncode == 0, out.stderr[-3000:]
            assert f"Ray cluster at {cluster.address}: 2 node(s), 2 CPUs" in out.stdout + out.stderr
            assert (Path(tmp_path / name / "proximal" / "results.json")).is_file()
        assert cluster.head_node.remaining_processes_alive()  # fedhead did not stop it


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_clients_moving_between_nodes_give_the_single_node_grams(tmp_path):
    """4 clients on a 2-node cluster (1 CPU each: one client at a time per node, so the queue
    moves clients between nodes from round to round); each client's private backbone follows it
    through the shared state folder. The Grams equal a single-node run's to 1e-10."""
    import json

    import numpy as np

    script = Path(__file__).with_name("cluster_run.py")

    def run(out: Path, address: str | None) -> dict:
        done = subprocess.run(
            [sys.executable, str(script), str(out), "4", *([address] if address else [])],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads((out / "proximal" / "results.json").read_text())

    single = run(tmp_path / "single", None)
    with two_nodes() as cluster:
        spread = run(tmp_path / "cluster", cluster.address)
    ran_on = {}
    for f in (tmp_path / "cluster" / "nodes").iterdir():
        pid, _ = f.name.split("_")
        ran_on.setdefault(int(pid), set()).add(f.read_text())
    assert len(set().union(*ran_on.values())) == 2, ran_on  # both nodes trained clients
    assert any(len(n) > 1 for n in ran_on.values()), ran_on  # some client moved between nodes
    for a, b in zip(single["rounds"], spread["rounds"], strict=True):
        np.testing.assert_allclose(b["gram"], a["gram"], rtol=0, atol=1e-10, err_msg=f"round {a['round']}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_16_client_run_killed_on_a_cluster_resumes_with_every_clients_state(tmp_path):
    """16 clients on a 2-node cluster; the driver is killed (SIGKILL) once round 1 is
    checkpointed, then ``resume=`` continues on the same cluster: every client finds its private
    backbone in the shared state folder wherever Ray places it, and the run ends with the Grams
    of an uninterrupted single-node run (1e-10)."""
    import json
    import signal

    import numpy as np

    from fedhead.federation.checkpoint import checkpoint_path, read_checkpoint

    script = Path(__file__).with_name("cluster_run.py")

    def command(out: Path, address: str | None, *extra: str) -> list[str]:
        return [sys.executable, str(script), str(out), "16", *([address] if address else []), *extra]

    single = subprocess.run(command(tmp_path / "single", None), capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-3000:]
    out = tmp_path / "cluster"
    with two_nodes() as cluster:
        proc = subprocess.Popen(
            command(out, cluster.address), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        ckpt = checkpoint_path(out / "proximal")
        deadline = time.monotonic() + 400
        while not (ckpt.is_file() and read_checkpoint(ckpt).round >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before round 1 was checkpointed"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        killed_at = read_checkpoint(ckpt).round
        assert killed_at < 3
        resumed = subprocess.run(command(out, cluster.address, "--resume"), capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads((tmp_path / "single" / "proximal" / "results.json").read_text())
    b = json.loads((out / "proximal" / "results.json").read_text())
    assert b["status"] == "completed" and b["resumed_after_round"] == killed_at
    moved = {}
    for f in (out / "nodes").iterdir():
        moved.setdefault(f.name.split("_")[0], set()).add(f.read_text())
    assert any(len(n) > 1 for n in moved.values()), moved
    for ra, rb in zip(a["rounds"], b["rounds"], strict=True):
        np.testing.assert_allclose(rb["gram"], ra["gram"], rtol=0, atol=1e-10, err_msg=f"round {ra['round']}")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sweep_joins_the_cluster_named_by_ray_address(tmp_path):
    """``fedhead-sweep`` (the smoke preset on Hopper, one round of the free model) joins the
    cluster that Ray's own ``RAY_ADDRESS`` names, says so, completes, and leaves it running."""
    import json

    command = [
        str(Path(sys.executable).with_name("fedhead-sweep")),
        "sweep=main",
        "scale=smoke",
        "settings=[hopper]",
        "seeds=[0]",
        f"out={tmp_path / 'sweep'}",
        f"run_overrides=['dataset.cache_dir={tmp_path / 'cache'}','model=free','model.feature_dim=8',"
        "'local_epochs=30','rounds=1']",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    with two_nodes() as cluster:
        env = {**os.environ, "RAY_ADDRESS": cluster.address}
        done = subprocess.run(command, capture_output=True, text=True, timeout=800, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"Ray cluster at {cluster.address}: 2 node(s), 2 CPUs" in done.stdout + done.stderr, done.stdout
        runs = json.loads((tmp_path / "sweep" / "manifest.json").read_text())["runs"]
        assert runs and all(r["status"] == "completed" for r in runs), runs
        used = set().union(*(r["nodes"] for r in runs))  # the manifest says where the clients trained
        assert len(used) == 2, used  # both nodes
        assert cluster.head_node.remaining_processes_alive()
