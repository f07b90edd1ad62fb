"""The command lines of a fedhead deployment on Flower 1.42, in one place.

The loopback deployment test (``tests/driver/test_deploy_loopback.py``) starts its processes from
these functions, and ``tests/driver/test_deploy_compose.py`` checks that every service of
``docker-compose.yml`` (TLS and SuperNode authentication; alone, with ``with-state.yml`` and
with the loopback-only ``with-insecure.yml``) runs exactly the command these functions give for
that service's paths and addresses. One list of flags therefore serves the tested process
deployment and the compose files; the GPU check's deployment step
(``scripts/gpucheck/step_deploy.py``) starts its processes from it too. No part of the fedhead
package runs these commands, so they live here, beside the tests that hold them (importable:
``tests/`` is on the tests' ``sys.path``; the script puts it there itself).

Topology (flwr 1.42): one SuperLink serves the Fleet, Control and runtime APIs on one HTTP(S)
port; each SuperNode serves its own runtime API; the ServerApp / ClientApps run either as
subprocesses of SuperLink / SuperNode (``isolation="subprocess"``, the loopback test) or in
separate ``flower-superexec`` processes that connect to those runtime APIs
(``isolation="process"``, one container each in docker compose).

Security: TLS is on unless ``tls`` is None (``--insecure``); SuperNode authentication
(``--enable-supernode-auth`` on the SuperLink, ``--auth-supernode-private-key`` on each
SuperNode, the public keys registered beforehand with ``flwr supernode register``) is on when
``supernode_auth`` / ``auth_key`` are given; ``superexec_secret`` (``process`` isolation) is the
file of the secret shared by one runtime API and the SuperExec that connects to it.
``scripts/make_certs.sh`` makes a local CA, the server certificates, the SuperNode key pairs
and one SuperExec secret per runtime API (SuperLink, each SuperNode).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

SUPERLINK_PORT = 8000  # Fleet + Control + ServerApp runtime API (flwr 1.42 default)
SUPERNODE_RUNTIME_PORT = 9094  # ClientApp runtime API of a SuperNode (flwr 1.42 default)
#: The environment of a SuperNode (and its SuperExec child; in docker compose, each clientapp-K SuperExec): the
#: SuperExec looks for a pending message every 0.2 s instead of flwr's 1 s (docs/deployment.md, "What a message
#: costs"; benchmarks/bench_message_cost.py).
SUPERNODE_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2"}
#: A site's programs: fedhead's SuperNode (flwr's with a 0.5 s idle pull, starting fedhead's SuperExec in
#: subprocess isolation) and fedhead's SuperExec (ClientApp processes forked from a warm parent), or flwr's own
#: (``flwr_programs=True``: the benchmark's baseline). The ServerApp's SuperExec is always flwr's.
SITE_PROGRAMS = {False: ("fedhead-supernode", "fedhead-superexec"), True: ("flower-supernode", "flower-superexec")}


@dataclass(frozen=True)
class ServerTls:
    """Files of a TLS server: CA certificate, server certificate and its private key."""

    ca: str
    cert: str
    key: str

    def flags(self) -> list[str]:
        return ["--ssl-ca-certfile", self.ca, "--ssl-certfile", self.cert, "--ssl-keyfile", self.key]


def node_config(
    partition_id: int | None,
    num_partitions: int | None,
    state_dir: str | None = None,
    data_path: str | None = None,
    identity: tuple[str, str] | None = None,
) -> str:
    """The ``--node-config`` value read by the fedhead ClientApp (fedhead/clients/state.py,
    fedhead/clients/site.py): ``partition-id`` and ``num-partitions``, or, for ``dataset=table``,
    the node's own file ``data-path`` (then no partition: the server numbers the nodes), the
    ``state-dir``, and for secure mode ``identity``, the site's ``signing-key`` and the ``roster``
    (fedhead/clients/identity.py)."""
    if partition_id is None and data_path is None:
        raise ValueError("a SuperNode needs a partition-id or a data-path")
    parts = [] if partition_id is None else [f"partition-id={int(partition_id)}"]
    parts += [] if num_partitions is None else [f"num-partitions={int(num_partitions)}"]
    key_path, roster = identity or (None, None)
    pairs = (("data-path", data_path), ("state-dir", state_dir), ("signing-key", key_path), ("roster", roster))
    for key, value in pairs:
        if value is not None:
            if "'" in value or " " in value:
                raise ValueError(f"{key} must not contain quotes or spaces: {value!r}")
            parts.append(f"{key}='{value}'")
    return " ".join(parts)


def superlink_command(
    *,
    host: str,
    port: int = SUPERLINK_PORT,
    tls: ServerTls | None,
    supernode_auth: bool = False,
    isolation: str = "subprocess",
    database: str | None = None,
    superexec_secret: str | None = None,
) -> list[str]:
    """``flower-superlink`` with TLS (or ``--insecure``), optional SuperNode auth and database.

    The app's dependencies are installed in the image / virtual environment, so the runtime
    installation of dependencies (``uv sync`` per run) is always disabled.
    """
    cmd = ["flower-superlink"]
    if database is not None:
        cmd += ["--database", database]
    cmd += tls.flags() if tls is not None else ["--insecure"]
    if supernode_auth:
        cmd += ["--enable-supernode-auth"]
    cmd += ["--isolation", _isolation(isolation), "--host", host, "--port", str(int(port))]
    if superexec_secret is not None:
        if isolation != "process":
            raise ValueError("superexec_secret only applies to isolation='process'")
        cmd += ["--superexec-auth-secret-file", superexec_secret]
    cmd += ["--disable-runtime-dependency-installation"]
    return cmd


def supernode_command(
    *,
    superlink: str,
    host: str,
    port: int = SUPERNODE_RUNTIME_PORT,
    partition_id: int | None,
    num_partitions: int | None,
    state_dir: str | None,
    root_ca: str | None,
    auth_key: str | None = None,
    isolation: str = "subprocess",
    runtime_tls: ServerTls | None = None,
    superexec_secret: str | None = None,
    data_path: str | None = None,
    identity: tuple[str, str] | None = None,
    flwr_programs: bool = False,
) -> list[str]:
    """``fedhead-supernode`` (``flower-supernode`` with ``flwr_programs``) for one partition (or one site's file,
    ``data_path``); ``identity``: the site's signing key and the roster files of secure mode.

    ``root_ca`` None means ``--insecure`` (no TLS to the SuperLink). ``runtime_tls`` secures
    the SuperNode's own runtime API, which the ClientApp's SuperExec reaches over the network
    in ``process`` isolation; in ``subprocess`` isolation it only listens on ``host``.
    """
    cmd = [SITE_PROGRAMS[flwr_programs][0]]
    cmd += ["--root-certificates", root_ca] if root_ca is not None else ["--insecure"]
    cmd += ["--superlink", superlink]
    if auth_key is not None:
        if root_ca is None:
            raise ValueError("SuperNode authentication needs TLS (give root_ca)")
        cmd += ["--auth-supernode-private-key", auth_key]
    cmd += ["--isolation", _isolation(isolation), "--host", host, "--port", str(int(port))]
    if runtime_tls is not None:
        cmd += runtime_tls.flags()
    if superexec_secret is not None:
        if isolation != "process":
            raise ValueError("superexec_secret only applies to isolation='process'")
        cmd += ["--superexec-auth-secret-file", superexec_secret]
    cmd += ["--node-config", node_config(partition_id, num_partitions, state_dir, data_path, identity)]
    return cmd


def superexec_command(
    *, runtime_api: str, root_ca: str | None, superexec_secret: str | None = None, site: bool = True
) -> list[str]:
    """``fedhead-superexec`` running the ClientApps of one SuperNode (its runtime API), or with ``site=False``
    ``flower-superexec`` running the ServerApp (runtime API of the SuperLink), for ``process`` isolation."""
    cmd = [SITE_PROGRAMS[False][1] if site else "flower-superexec"]
    cmd += ["--root-certificates", root_ca] if root_ca is not None else ["--insecure"]
    cmd += ["--runtime-api-address", runtime_api]
    if superexec_secret is not None:
        cmd += ["--superexec-auth-secret-file", superexec_secret]
    return cmd


def cli_connection_toml(name: str, address: str, root_ca: str | None) -> str:
    """A ``[superlink.<name>]`` entry of the flwr CLI's ``$FLWR_HOME/config.toml`` (valid TOML),
    made the default connection."""
    lines = ["[superlink]", f'default = "{name}"', "", f"[superlink.{name}]", f'address = "{address}"']
    lines += [f'root-certificates = "{root_ca}"'] if root_ca is not None else ["insecure = true"]
    return "\n".join(lines) + "\n"


def finished_status(
    output: str, ls: Callable[[str], subprocess.CompletedProcess], limit: float = 60, poll: float = 1.0
) -> str | None:
    """The status the SuperLink records for the run that ``flwr run`` started: ``finished:completed``,
    ``finished:failed``, ``finished:stopped`` (or the last one seen after ``limit`` s); None when
    ``output`` (``flwr run``'s, streamed or ``--format json``) names no run.

    ``flwr run --stream`` exits 0 when the ServerApp fails, so a deployment's outcome is this status
    (and the run's results.json), never ``flwr run``'s exit code. ``ls(run_id)`` runs ``flwr ls
    <connection> --run-id <run_id> --format json``; it is polled until the run has finished."""
    found = re.search(r"Successfully started run (\d+)", output) or re.search(r'"run-id": "(\d+)"', output)
    if found is None:
        return None
    deadline = time.monotonic() + limit
    while True:
        res = ls(found[1])
        status = json.loads(res.stdout)["runs"][0]["status"] if res.returncode == 0 else ""
        if status.startswith("finished") or time.monotonic() > deadline:
            return status or f"unknown ({res.stdout[-300:]}{res.stderr[-300:]})"
        time.sleep(poll)


def _isolation(isolation: str) -> str:
    if isolation not in ("subprocess", "process"):
        raise ValueError(f"isolation must be 'subprocess' or 'process', got {isolation!r}")
    return isolation


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together while chosen, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
