"""Process helpers of the real deployment tests (importable: ``tests/`` is on sys.path).

``tests/driver/test_deploy_loopback.py`` and ``tests/driver/test_own_data_tutorial.py`` start
SuperLinks, SuperNodes and shell blocks with :class:`Processes`, wait with :func:`wait` (every
wait has a deadline) and talk to the SuperLink with :func:`flwr`; :meth:`Processes.stop` kills
every process they started and their children. :func:`start_site_federation` starts a TLS federation
of one SuperNode per site file (``tests/driver/test_deploy_secure.py``, ``benchmarks/bench_deploy.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from deploy_commands import finished_status

REPO = Path(__file__).resolve().parents[1]
START_LIMIT_S = 90  # SuperLink answering, SuperNodes online


def descendants(pid: int) -> list[int]:
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
    """Started processes, each in its own session; ``stop`` kills them and their children.

    ``logs`` holds ``<name>.log`` (stdout and stderr) of every process; ``cwd`` is where they
    run (default: ``logs``).
    """

    def __init__(self, logs: Path, cwd: Path | None = None):
        self.logs = logs
        self.cwd = cwd or logs
        self.procs: dict[str, subprocess.Popen] = {}
        self.extra: set[int] = set()  # pids started by a finished shell block (killed in ``stop``)

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd, start_new_session=True
        )
        log.close()
        self.procs[name] = proc
        return proc

    def run(self, name: str, cmd: list[str], env: dict[str, str], limit: float) -> str:
        """Run ``cmd`` to its end (at most ``limit`` s) and return its output; what it left
        running in the background (its process group) is stopped with the others."""
        proc = self.start(name, cmd, env)
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} took over {limit}s:\n{self.tail(name)}")
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def adopt(self, pids: Iterable[int]) -> None:
        """Also stop these processes (and their children) in :meth:`stop`."""
        self.extra.update(int(p) for p in pids)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, n: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""

    def stop(self) -> None:
        roots = [proc.pid for proc in self.procs.values()] + sorted(self.extra)
        victims = dict.fromkeys(roots)
        for pid in roots:
            victims.update(dict.fromkeys(descendants(pid)))
        for pid in roots:
            with _quiet():
                os.killpg(pid, signal.SIGTERM)
            with _quiet():
                os.kill(pid, signal.SIGTERM)
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


def flwr(args: list[str], env: dict[str, str], limit: float = 30) -> subprocess.CompletedProcess:
    """``flwr <args>`` from the repository root (the app is ``.``)."""
    return subprocess.run(["flwr", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=limit)


def wait(what: str, ok: Callable[[], bool], procs: Processes, limit: float = START_LIMIT_S) -> float:
    """Poll ``ok`` every second until it is true (returns the seconds it took); fail after
    ``limit`` s or when a started process exited."""
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


def online(env: dict[str, str], connection: str = "loopback") -> int:
    """SuperNodes online at the SuperLink of ``connection`` (-1 while it does not answer)."""
    res = flwr(["supernode", "ls", connection, "--format", "json"], env)
    if res.returncode != 0:
        return -1
    return sum(n["status"] == "online" for n in json.loads(res.stdout)["nodes"])


def run_status(output: str, env: dict[str, str], connection: str = "loopback", limit: float = 60) -> str:
    """The status the SuperLink records for the run that ``flwr run`` started (``output``: its output),
    by ``deploy_commands.finished_status``; fails when ``output`` names no run."""
    status = finished_status(
        output, lambda run_id: flwr(["ls", connection, "--run-id", run_id, "--format", "json"], env), limit
    )
    if status is None:
        pytest.fail(f"flwr run started no run:\n{output[-3000:]}")
    return status


# ------------------------------------------------------------------ docker compose files
def mount_target(volume: str) -> str:
    """A compose mount's container path (``${VAR:-default}`` in the source removed first)."""
    return re.sub(r"\$\{[^}]*\}", "", volume).split(":")[1]


def merged_services(repo: Path, *names: str) -> dict[str, dict]:
    """The services of compose files ``names`` (in ``repo``) after compose's override rules for
    the keys the tests check: later files replace a key, mounts merge by container path."""
    import yaml

    services: dict[str, dict] = {}
    for name in names:
        for svc, spec in (yaml.safe_load((repo / name).read_text()).get("services") or {}).items():
            merged = services.setdefault(svc, {})
            for key, value in spec.items():
                if key == "volumes":  # compose merges mounts by container path
                    mounts = {mount_target(v): v for v in merged.get("volumes", [])}
                    mounts.update({mount_target(v): v for v in value})
                    merged["volumes"] = list(mounts.values())
                else:
                    merged[key] = value
    return services


# ------------------------------------------------------------------ a federation of site files
def site_federation_env(work: Path, link_port: int, ca: Path) -> dict[str, str]:
    """The environment of a loopback federation's processes and of ``flwr``: a private ``FLWR_HOME`` whose
    config.toml names the SuperLink ``loopback`` (TLS with ``ca``), this repository on ``PYTHONPATH``, one
    thread each, and the SuperNodes' settings (``SUPERNODE_ENV``)."""
    from deploy_commands import SUPERNODE_ENV, cli_connection_toml

    env = dict(os.environ, FLWR_HOME=str(work / "flwr-home"), OMP_NUM_THREADS="1", **SUPERNODE_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    Path(env["FLWR_HOME"]).mkdir(parents=True, exist_ok=True)
    (Path(env["FLWR_HOME"]) / "config.toml").write_text(
        cli_connection_toml("loopback", f"127.0.0.1:{link_port}", str(ca))
    )
    return env


def start_site_federation(
    work: Path,
    files: list[Path],
    identities: list[tuple[str, str]],
    procs: Processes,
    env_extra: dict | None = None,
    flwr_programs: bool = False,
) -> dict[str, str]:
    """One SuperLink with TLS and SuperNode authentication (certificates of ``scripts/make_certs.sh`` under
    ``work/certs``), and one SuperNode per site file (``data-path``, ``state-dir`` ``work/node<k>``, the site's
    ``(signing key, roster)`` of ``identities``; ClientApps in subprocess isolation), started by ``procs`` and
    online. Returns the environment for ``flwr`` (connection ``loopback``); ``env_extra`` is added to it. The
    SuperNodes are ``fedhead-supernode``, or ``flower-supernode`` with ``flwr_programs`` (``SITE_PROGRAMS``)."""
    from deploy_commands import ServerTls, free_ports, superlink_command, supernode_command

    n = len(files)
    certs = work / "certs"
    subprocess.run(
        ["bash", str(REPO / "scripts/make_certs.sh"), str(certs), str(n)], check=True, capture_output=True, timeout=120
    )
    link_port, *node_ports = free_ports(1 + n)
    env = {**site_federation_env(work, link_port, certs / "ca.crt"), **(env_extra or {})}
    tls = ServerTls(ca=str(certs / "ca.crt"), cert=str(certs / "superlink.crt"), key=str(certs / "superlink.key"))
    link = superlink_command(
        host="127.0.0.1", port=link_port, tls=tls, supernode_auth=True, database=str(work / "link.db")
    )
    procs.start("superlink", link, env)
    wait("the SuperLink (TLS Control API)", lambda: online(env) >= 0, procs)
    for k in range(1, n + 1):
        res = flwr(
            ["supernode", "register", str(certs / f"supernode-{k}.auth.pub"), "loopback", "--format", "json"], env
        )
        if res.returncode != 0 or not json.loads(res.stdout)["success"]:
            raise RuntimeError(f"flwr supernode register failed: {res.stdout}{res.stderr}")
    for k, (port, path, identity) in enumerate(zip(node_ports, files, identities, strict=True), start=1):
        node = supernode_command(
            superlink=f"127.0.0.1:{link_port}",
            host="127.0.0.1",
            port=port,
            partition_id=None,
            num_partitions=None,
            state_dir=str(work / f"node{k}"),
            root_ca=str(certs / "ca.crt"),
            auth_key=str(certs / f"supernode-{k}.auth"),
            data_path=str(path),
            identity=identity,
            flwr_programs=flwr_programs,
        )
        procs.start(f"supernode{k}", node, env)
    wait(f"{n} authenticated SuperNodes online", lambda: online(env) == n, procs)
    return env
