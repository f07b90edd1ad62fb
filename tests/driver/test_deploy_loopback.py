"""The process deployment on loopback, end to end (flwr 1.42, marked ``slow``: about 1.5 min).

One SuperLink with TLS and SuperNode authentication, two SuperNodes (ClientApps in subprocess
isolation) and ``flwr run .`` with a tiny job (model=free, 1 round), all on 127.0.0.1 ports
picked at random. The command lines come from ``tests/deploy_commands.py``, the same functions that
``tests/driver/test_deploy_compose.py`` checks the docker compose files against. Every wait has a
deadline; every process started here (and its children) is killed in teardown.

    pytest -m slow tests/driver/test_deploy_loopback.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_commands import (
    SUPERNODE_ENV,
    ServerTls,
    cli_connection_toml,
    free_ports,
    superlink_command,
    supernode_command,
)
from deploy_helpers import REPO, Processes, flwr, online, run_status, wait

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N_CLIENTS = 2
ROUNDS = 1
RUN_LIMIT_S = 600  # `flwr run` (about 60-90 s on 2 busy cores)


@pytest.fixture
def loopback(tmp_path):
    for tool in ("openssl", "ssh-keygen", "flwr", "flower-superlink", "fedhead-supernode"):
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
        **SUPERNODE_ENV,
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
    wait("the SuperLink (TLS Control API)", lambda: online(env) >= 0, procs)

    for k in range(1, N_CLIENTS + 1):
        res = flwr(
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
    wait(f"{N_CLIENTS} authenticated SuperNodes online", lambda: online(env) == N_CLIENTS, procs)


def test_loopback_deployment_tls_auth(loopback):
    work, certs, link_port, node_ports, env, procs = loopback
    _start_federation(work, certs, link_port, node_ports, env, procs)

    out = work / "out"
    overrides = (
        f"procedure=proximal model=free num_clients={N_CLIENTS} rounds={ROUNDS} local_epochs=2 "
        f"dataset.n_train=40 dataset.cache_dir={work / 'cache'}"
    )
    try:
        run = flwr(
            ["run", ".", "loopback", "--stream", "--run-config", f'overrides="{overrides}" output-dir="{out}"'],
            env,
            limit=RUN_LIMIT_S,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"flwr run took over {RUN_LIMIT_S}s:\n{(err.stdout or b'')[-3000:]!r}\n{procs.tail('superlink')}")
    (work / "logs" / "flwr-run.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run_status(run.stdout, env) == "finished:completed"

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
    started = flwr(
        ["run", ".", "loopback", "--format", "json", "--run-config", f'overrides="{overrides}" output-dir="{out}"'],
        env,
        limit=120,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = json.loads(started.stdout)["run-id"]
    ckpt = checkpoint_path(out / "proximal")
    wait("round 1 checkpointed", lambda: ckpt.is_file() and read_checkpoint(ckpt).round >= 1, procs, limit=RUN_LIMIT_S)
    stop = flwr(["stop", str(run_id), "loopback"], env)
    at = read_checkpoint(ckpt).round
    assert stop.returncode == 0 and at == 1, (at, stop.stdout + stop.stderr)
    wait(
        "the run stopped",
        lambda: "finished" in flwr(["ls", "loopback", "--run-id", str(run_id), "--format", "json"], env).stdout,
        procs,
    )

    other = flwr(
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
    assert run_status(other.stdout, env) == "finished:failed"  # whatever `flwr run --stream` exited with

    resumed = flwr(
        ["run", ".", "loopback", "--stream", "--run-config", f'overrides="{overrides}" output-dir="{out}" resume=true'],
        env,
        limit=RUN_LIMIT_S,
    )
    (work / "logs" / "flwr-resume.log").write_text(resumed.stdout + resumed.stderr)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert run_status(resumed.stdout, env) == "finished:completed"
    results = json.loads((out / "proximal" / "results.json").read_text())
    assert results["status"] == "completed" and results["resumed_after_round"] == 1
    assert [r["round"] for r in results["rounds"]] == [0, 1, 2]
    assert results["provenance"]["fab"]["run_id"] != run_id
    assert read_checkpoint(ckpt).round == 2
