"""The process deployment on loopback, end to end (flwr 1.42, marked ``slow``: about 1.5 min).

One SuperLink with TLS and SuperNode authentication, two SuperNodes (ClientApps in subprocess
isolation) and ``flwr run .`` with a tiny job (model=free, 1 round), all on 127.0.0.1 ports
picked at random. The command lines come from :mod:`fedhead.driver.deploy`, the same functions that
``tests/driver/test_deploy_compose.py`` checks the docker compose files against. Every wait has a
deadline; every process started here (and its children) is killed in teardown.

    pytest -m slow tests/driver/test_deploy_loopback.py
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedhead.driver.deploy import ServerTls, cli_connection_toml, free_ports, superlink_command, supernode_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
N_CLIENTS = 2
ROUNDS = 1
RUN_LIMIT_S = 600  # `flwr run` (about 60-90 s on 2 busy cores)
START_LIMIT_S = 90  # SuperLink answering, SuperNodes online


def _descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Processes:
    """Started processes, each in its own session; ``stop`` kills them and their children."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.logs, start_new_session=True
        )
        log.close()
        self.procs[name] = proc
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, n: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""

    def stop(self) -> None:
        victims = {}
        for proc in self.procs.values():
            victims[proc.pid] = None
            victims.update(dict.fromkeys(_descendants(proc.pid)))
        for proc in self.procs.values():
            with _quiet():
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for pid in victims:  # the groups and the detached SuperExec children
            with _quiet():
                os.killpg(pid, signal.SIGKILL)
            with _quiet():
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs.values():
            with _quiet():
                proc.wait(timeout=5)


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, typ, *_):
        return typ is not None and issubclass(typ, (ProcessLookupError, PermissionError, subprocess.TimeoutExpired))


def _flwr(args: list[str], env: dict[str, str], limit: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["flwr", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=limit)


def _wait(what: str, ok, procs: Processes, limit: float = START_LIMIT_S) -> float:
    t0 = time.monotonic()
    while True:
        procs.check_alive()
        try:
            if ok():
                return time.monotonic() - t0
        except (subprocess.TimeoutExpired, ValueError, KeyError):
            pass
        if time.monotonic() - t0 > limit:
            pytest.fail(
                f"timeout after {limit}s waiting for {what}:\n"
                + "\n".join(f"--- {n}\n{procs.tail(n, 1500)}" for n in procs.procs)
            )
        time.sleep(1)


def _online(env: dict[str, str]) -> int:
    res = _flwr(["supernode", "ls", "loopback", "--format", "json"], env)
    if res.returncode != 0:
        return -1
    return sum(n["status"] == "online" for n in json.loads(res.stdout)["nodes"])


@pytest.fixture
def loopback(tmp_path):
    for tool in ("openssl", "ssh-keygen", "flwr", "flower-superlink", "flower-supernode"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH")
    certs = tmp_path / "certs"
    subprocess.run(
        ["bash", str(REPO / "scripts/make_certs.sh"), str(certs), str(N_CLIENTS)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    link_port, *node_ports = free_ports(1 + N_CLIENTS)
    env = dict(
        os.environ,
        FLWR_HOME=str(tmp_path / "flwr-home"),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    Path(env["FLWR_HOME"]).mkdir()
    (Path(env["FLWR_HOME"]) / "config.toml").write_text(
        cli_connection_toml("loopback", f"127.0.0.1:{link_port}", str(certs / "ca.crt"))
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        yield tmp_path, certs, link_port, node_ports, env, procs
    finally:
        procs.stop()


def _start_federation(work, certs, link_port, node_ports, env, procs) -> None:
    """The SuperLink (TLS, SuperNode authentication), the keys registered, the SuperNodes online."""
    tls = ServerTls(ca=str(certs / "ca.crt"), cert=str(certs / "superlink.crt"), key=str(certs / "superlink.key"))
    procs.start(
        "superlink",
        superlink_command(
            host="127.0.0.1", port=link_port, tls=tls, supernode_auth=True, database=str(work / "superlink.db")
        ),
        env,
    )
    _wait("the SuperLink (TLS Control API)", lambda: _online(env) >= 0, procs)

    for k in range(1, N_CLIENTS + 1):
        res = _flwr(
            ["supernode", "register", str(certs / f"supernode-{k}.auth.pub"), "loopback", "--format", "json"], env
        )
        assert res.returncode == 0 and json.loads(res.stdout)["success"], res.stdout + res.stderr
    for k, port in enumerate(node_ports, start=1):
        procs.start(
            f"supernode{k}",
            supernode_command(
                superlink=f"127.0.0.1:{link_port}",
                host="127.0.0.1",
                port=port,
                partition_id=k - 1,
                num_partitions=N_CLIENTS,
                state_dir=str(work / f"node{k}"),
                root_ca=str(certs / "ca.crt"),
                auth_key=str(certs / f"supernode-{k}.auth"),
            ),
            env,
        )
    _wait(f"{N_CLIENTS} authenticated SuperNodes online", lambda: _online(env) == N_CLIENTS, procs)


def test_loopback_deployment_tls_auth(loopback):
    work, certs, link_port, node_ports, env, procs = loopback
    _start_federation(work, certs, link_port, node_ports, env, procs)

    out = work / "out"
    overrides = (
        f"procedure=proximal model=free num_clients={N_CLIENTS} rounds={ROUNDS} local_epochs=2 "
        f"dataset.n_train=40 dataset.cache_dir={work / 'cache'}"
    )
    try:
        run = _flwr(
            ["run", ".", "loopback", "--stream", "--run-config", f'overrides="{overrides}" output-dir="{out}"'],
            env,
            limit=RUN_LIMIT_S,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"flwr run took over {RUN_LIMIT_S}s:\n{(err.stdout or b'')[-3000:]!r}\n{procs.tail('superlink')}")
    (work / "logs" / "flwr-run.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    results = json.loads((out / "proximal" / "results.json").read_text())
    assert results["status"] == "completed"
    rounds = results["rounds"]
    assert [r["round"] for r in rounds] == list(range(ROUNDS + 1))
    numbers = [v for r in rounds for v in r.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert numbers and all(math.isfinite(v) for v in numbers)
    assert math.isfinite(rounds[-1]["e_f_star"]) and rounds[-1]["train_mse"] is not None
    assert results["provenance"].get("fab", {}).get("fab_hash")
    # private backbones stay with the SuperNodes' state folders, none under the server's output
    for k in range(1, N_CLIENTS + 1):
        assert list((work / f"node{k}").rglob("*.pt")), f"no private state under node{k}"
    assert not list(out.rglob("*.pt"))
    print(f"loopback deployment ok: {sys.argv[0]} rounds {[r['round'] for r in rounds]}")


def test_loopback_deployment_stopped_and_resumed(loopback):
    """``flwr stop`` once round 1 is checkpointed, then ``flwr run ... resume=true`` with the same
    overrides and output-dir: the ServerApp continues after round 1 and the clients from their
    SuperNodes' state-dir (another run id); another config is refused with one line."""
    from fedhead.federation.checkpoint import checkpoint_path, read_checkpoint

    work, certs, link_port, node_ports, env, procs = loopback
    _start_federation(work, certs, link_port, node_ports, env, procs)
    out = work / "out"
    overrides = (
        f"procedure=proximal model=free num_clients={N_CLIENTS} rounds=2 local_epochs=2 "
        f"dataset.n_train=40 dataset.cache_dir={work / 'cache'}"
    )
    started = _flwr(
        ["run", ".", "loopback", "--format", "json", "--run-config", f'overrides="{overrides}" output-dir="{out}"'],
        env,
        limit=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = json.loads(started.stdout)["run-id"]
    ckpt = checkpoint_path(out / "proximal")
    _wait("round 1 checkpointed", lambda: ckpt.is_file() and read_checkpoint(ckpt).round >= 1, procs, limit=RUN_LIMIT_S)
    stop = _flwr(["stop", str(run_id), "loopback"], env)
    at = read_checkpoint(ckpt).round
    assert stop.returncode == 0 and at == 1, (at, stop.stdout + stop.stderr)
    _wait(
        "the run stopped",
        lambda: "finished" in _flwr(["ls", "loopback", "--run-id", str(run_id), "--format", "json"], env).stdout,
        procs,
    )

    other = _flwr(
        [
            "run",
            ".",
            "loopback",
            "--stream",
            "--run-config",
            f'overrides="{overrides} seed=1" output-dir="{out}" resume=true',
        ],
        env,
        limit=RUN_LIMIT_S,
    )
    assert (
        "ResumeError: cannot resume" in other.stdout + other.stderr
        or "cannot resume" in (out / "proximal" / "run.log").read_text()
    ), other.stdout[-3000:]

    resumed = _flwr(
        ["run", ".", "loopback", "--stream", "--run-config", f'overrides="{overrides}" output-dir="{out}" resume=true'],
        env,
        limit=RUN_LIMIT_S,
    )
    (work / "logs" / "flwr-resume.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    results = json.loads((out / "proximal" / "results.json").read_text())
    assert results["status"] == "completed" and results["resumed_after_round"] == 1
    assert [r["round"] for r in results["rounds"]] == [0, 1, 2]
    assert results["provenance"]["fab"]["run_id"] != run_id
    assert read_checkpoint(ckpt).round == 2
