"""Step ``deploy``: a real Flower federation on the GPU without Ray, the process deployment.

One SuperLink and ``deploy_clients`` SuperNodes on 127.0.0.1 (TLS with the certificates of
``.gpu-data/certs``, made by scripts/make_certs.sh in scripts/gpu_prepare.sh; ClientApps in
subprocess isolation), started with the command lines of ``tests/deploy_commands.py`` as in
tests/driver/test_deploy_loopback.py, then ``flwr run .`` of proximal training on Hopper with the
paper's ResMLP (width 1024, P = 512) and every ClientApp on ``device=cuda``. Records the times to
start, to get the SuperNodes online and of the run, and the run's results.json summary.

    python scripts/gpucheck/step_deploy.py --out DIR --sizes paper|tiny --certs .gpu-data/certs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, SIZES, now, write_json

sys.path.insert(0, str(REPO / "tests"))  # the command lines the deployment tests start
from deploy_commands import (
    ServerTls,
    cli_connection_toml,
    finished_status,
    free_ports,
    superlink_command,
    supernode_command,
)


class Procs:
    """Started processes, each in its own session, killed with their groups at the end."""

    def __init__(self, logs: Path):
        self.logs, self.procs = logs, {}

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.logs, start_new_session=True
            )

    def dead(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                return f"{name} exited with {p.returncode}: {self.tail(name)}"
        return None

    def tail(self, name: str, n: int = 1500) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""

    def stop(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)


def flwr(args: list[str], env: dict[str, str], limit: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["flwr", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=limit)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(what: str, ok, procs: Procs, limit: float) -> float:
    t0 = time.monotonic()
    while not ok():
        dead = procs.dead()
        if dead:
            raise RuntimeError(f"while waiting for {what}: {dead}")
        if time.monotonic() - t0 > limit:
            raise TimeoutError(f"{what}: not within {limit:.0f} s")
        time.sleep(1)
    return time.monotonic() - t0


def overrides(sizes, cache: Path) -> str:
    return " ".join(
        [
            "experiment=single",
            "procedure=proximal",
            "dataset=hopper",
            "model=resmlp",
            f"model.width={sizes.deploy_width}",
            f"model.feature_dim={sizes.deploy_feature_dim}",
            f"num_clients={sizes.deploy_clients}",
            f"rounds={sizes.deploy_rounds}",
            f"local_epochs={sizes.deploy_epochs}",
            f"device={sizes.device}",
            f"dataset.cache_dir={cache}",
            "output.figures=false",
            "timeouts.nodes=240",
            f"resources.evaluate_mse={str(sizes.deploy_evaluate).lower()}",
        ]
    )


def summarize_results(path: Path) -> dict:
    res = json.loads(path.read_text())
    rounds = res.get("rounds", [])
    last = rounds[-1] if rounds else {}
    nums = [v for r in rounds for v in r.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {
        "status": res.get("status"),
        "rounds": [r.get("round") for r in rounds],
        "all_finite": bool(nums) and all(math.isfinite(v) for v in nums),
        "e_f_star_last": last.get("e_f_star"),
        "timing": res.get("timing"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
    ap.add_argument("--certs", type=Path, default=REPO / ".gpu-data" / "certs")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default OUT/deploy-work)")
    ap.add_argument("--run-limit", type=float, default=300)
    args = ap.parse_args(argv)
    # a timeout of the driver sends SIGTERM: stop the SuperLink and SuperNodes (own sessions) on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = SIZES[args.sizes]
    work = (args.work or args.out / "deploy-work").resolve()
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    certs = args.certs.resolve()
    for f in ("ca.crt", "superlink.crt", "superlink.key"):
        if not (certs / f).is_file():
            raise SystemExit(f"deploy: {certs / f} is missing; run scripts/gpu_prepare.sh here and carry .gpu-data")
    cache = Path(os.environ.get("FEDHEAD_CACHE", REPO / ".gpu-data" / "cache")).resolve()
    link_port, *node_ports = free_ports(1 + sizes.deploy_clients)
    env = flwr_env(work, certs, link_port)
    result: dict = {"step": "deploy", "sizes": sizes.name, "device": sizes.device, "clients": sizes.deploy_clients}
    result.update(rounds_asked=sizes.deploy_rounds, local_epochs=sizes.deploy_epochs, width=sizes.deploy_width)
    result["overrides"] = overrides(sizes, cache)
    path = args.out / "deploy.json"
    procs = Procs(logs)
    result["t_start"] = now()
    try:
        result["superlink_up_s"] = start_federation(procs, work, certs, link_port, node_ports, env)
        # no wait for the SuperNodes here: the ServerApp waits for them (timeouts.nodes)
        write_json(path, result)
        run_federation(result, work, logs, env, args.run_limit, procs)
    except Exception as exc:  # noqa: BLE001 - reported in deploy.json
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["logs"] = {name: procs.tail(name, 800) for name in procs.procs}
    finally:
        procs.stop()
        result["t_end"] = now()
        write_json(path, result)
    rs = result.get("results") or {}
    up_s, run_s = result.get("superlink_up_s", math.nan), result.get("run_s", math.nan)
    print(
        f"deploy: {'ok' if result['ok'] else 'FAILED'}; SuperLink up after {up_s:.1f} s, "
        f"flwr run {run_s:.1f} s, rounds {rs.get('rounds')}, status {rs.get('status')}"
        + ("" if result["ok"] else f"\n{result.get('error', '')[-1500:]}"),
        flush=True,
    )
    return 0 if result["ok"] else 1


def flwr_env(work: Path, certs: Path, link_port: int) -> dict[str, str]:
    """The environment of the SuperLink, SuperNodes and ``flwr run``: a private ``FLWR_HOME`` whose
    config.toml names the SuperLink with TLS, this repository on ``PYTHONPATH``, one thread each."""
    env = dict(os.environ, FLWR_HOME=str(work / "flwr-home"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    Path(env["FLWR_HOME"]).mkdir(exist_ok=True)
    (Path(env["FLWR_HOME"]) / "config.toml").write_text(
        cli_connection_toml("gpucheck", f"127.0.0.1:{link_port}", str(certs / "ca.crt"))
    )
    return env


def start_federation(
    procs: Procs, work: Path, certs: Path, link_port: int, node_ports: list[int], env: dict[str, str]
) -> float:
    """Start the SuperLink, wait for its port, start one SuperNode per port; the SuperLink's start seconds."""
    tls = ServerTls(ca=str(certs / "ca.crt"), cert=str(certs / "superlink.crt"), key=str(certs / "superlink.key"))
    procs.start(
        "superlink",
        superlink_command(host="127.0.0.1", port=link_port, tls=tls, database=str(work / "superlink.db")),
        env,
    )
    # a port probe, not the flwr CLI (a Python start per probe loads a small machine)
    up_s = wait_for("the SuperLink's port", lambda: port_open(link_port), procs, 120)
    for k, port in enumerate(node_ports, start=1):
        cmd = supernode_command(
            superlink=f"127.0.0.1:{link_port}",
            host="127.0.0.1",
            port=port,
            partition_id=k - 1,
            num_partitions=len(node_ports),
            state_dir=str(work / f"node{k}"),
            root_ca=str(certs / "ca.crt"),
        )
        procs.start(f"supernode{k}", cmd, env)
    return up_s


def run_federation(result: dict, work: Path, logs: Path, env: dict[str, str], limit: float, procs: Procs) -> None:
    """``flwr run .`` with the step's overrides; its time, log, results.json summary and verdict go into ``result``."""
    out = work / "run-out"
    t_run = time.monotonic()
    run_config = f'overrides="{result["overrides"]}" output-dir="{out}"'
    run = flwr(["run", ".", "gpucheck", "--stream", "--run-config", run_config], env, limit=limit)
    result["run_s"] = time.monotonic() - t_run
    (logs / "flwr-run.log").write_text(run.stdout + run.stderr)
    result["run_returncode"] = run.returncode
    res_path = out / "proximal" / "results.json"
    if res_path.is_file():
        result["results"] = summarize_results(res_path)
    # the run's own status: `flwr run --stream` exits 0 when the ServerApp fails
    ls = lambda run_id: flwr(["ls", "gpucheck", "--run-id", run_id, "--format", "json"], env)  # noqa: E731
    result["run_status"] = finished_status(run.stdout, ls)
    ok = run.returncode == 0 and result["run_status"] == "finished:completed"
    ok = ok and result.get("results", {}).get("status") == "completed"
    result["ok"] = ok
    if not ok:
        result["error"] = (run.stdout[-2000:] + run.stderr[-2000:]) or procs.tail("superlink")


if __name__ == "__main__":
    raise SystemExit(main())
