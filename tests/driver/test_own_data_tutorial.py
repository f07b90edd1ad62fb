"""docs/own-data.md's tutorial, run as written (flwr 1.42, marked ``slow``: a real deployment).

The blocks marked ``<!-- tutorial: NAME -->`` in docs/own-data.md run in order, each in ``bash``
from the repository root, after the setup block with only ``WORK`` (a temporary folder),
``LINK_PORT`` and ``NODE_PORT`` (free ports) changed: three per-site CSV files, (a) the
``fedhead-run`` simulation, (b) certificates, a SuperLink with TLS and SuperNode authentication,
one SuperNode per site with only its ``data-path``, ``flwr run``, the comparison, ``kill``.
Then: the per-round Grams (``results.json``) of (a) and (b) agree to 1e-10 and so do the
diagnoses' ``G_cen``, which equal ``G_cen`` of the pooled rows standardised directly; no
process under a SuperNode opened another site's file, and each SuperNode's ClientApps opened
their own (an ``open`` audit hook in every Python process of (b): tests/open_audit/sitecustomize.py);
the processes ran the command lines of ``tests/deploy_commands.py``.

    pytest -m slow tests/driver/test_own_data_tutorial.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from app_helpers import pooled_g_cen
from deploy_commands import ServerTls, cli_connection_toml, free_ports, superlink_command, supernode_command
from deploy_helpers import REPO, Processes, online
from flwr.common.config import parse_config_args

from fedhead.results import schema

DOC = REPO / "docs" / "own-data.md"
AUDIT = REPO / "tests" / "open_audit"
BLOCKS = ("setup", "sites", "simulation", "certs", "superlink", "supernodes", "run", "compare")
SETUP = "export WORK={work} LINK_PORT={link} NODE_PORT={node}\nexport FLWR_HOME=$WORK/flwr-home OMP_NUM_THREADS=1\n"
SITES = ("a", "b", "c")
LIMITS = {"simulation": 600, "run": 960}  # seconds (the run block stops itself at 900); every other block 150


def tutorial_blocks(text: str) -> dict[str, str]:
    """The ```bash blocks of the page, each preceded by ``<!-- tutorial: NAME -->``, by name."""
    found = re.findall(r"<!-- tutorial: (\w+) -->\n```bash\n(.*?)```\n", text, flags=re.S)
    return dict(found)


def _node_port_base(n: int) -> int:
    """A port ``p`` with ``p + 1 .. p + n`` free on 127.0.0.1."""
    for _ in range(50):
        base = free_ports(1)[0]
        try:
            socks = []
            for k in range(1, n + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free run of ports")


def _argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def _tool_args(argv: list[str], tool: str) -> list[str]:
    """``[tool, args...]`` of a console script's command line (``python .../bin/tool args``)."""
    i = next(i for i, a in enumerate(argv) if Path(a).name == tool)
    return [tool, *argv[i + 1 :]]


def _audit_logs(folder: Path) -> list[dict]:
    """One entry per audited process: pid, ancestors, argv, and the opened files under the sites."""
    out = []
    for log in sorted(folder.glob("*.log")):
        first, *rest = log.read_text().splitlines()
        entry = json.loads(first)
        entry["opened"] = set(rest)
        out.append(entry)
    return out


def _targets(path: Path) -> np.ndarray:
    """``(N, 2)``: the columns t1, t2 of one site's CSV file (read here, by the test)."""
    header = path.read_text().splitlines()[0].split(",")
    rows = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    return rows[:, [header.index("t1"), header.index("t2")]]


def test_the_tutorial_runs_one_job_in_simulation_and_deployment():
    """(a) and (b4) name the same job: the same overrides but the files (the simulation's list,
    the deployment's ``dataset.files=[] dataset.num_clients=3``) and the output folder."""
    blocks = tutorial_blocks(DOC.read_text())
    assert tuple(blocks) == BLOCKS
    sim = shlex.split(blocks["simulation"].replace("\\\n", " "))
    assert sim[0] == "fedhead-run"
    files = [f"$WORK/sites/site_{s}.csv" for s in SITES]
    assert f"dataset.files=[{','.join(files)}]" in sim and "output.dir=$WORK/sim" in sim
    run = shlex.split(blocks["run"].replace("\\\n", " "))
    assert run[:6] == ["timeout", "900", "flwr", "run", ".", "loopback"] and run[6:8] == ["--stream", "--run-config"]
    config = parse_config_args([run[8]])
    assert config["output-dir"] == "$WORK/out"
    dep = config["overrides"].split()
    assert {"dataset.files=[]", f"dataset.num_clients={len(SITES)}"} <= set(dep)
    common = set(sim[1:]) - {f"dataset.files=[{','.join(files)}]", "output.dir=$WORK/sim"}
    assert common == set(dep) - {"dataset.files=[]", f"dataset.num_clients={len(SITES)}"}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_own_data_tutorial_runs_as_written(tmp_path):
    for tool in ("bash", "openssl", "ssh-keygen", "flwr", "flower-superlink", "fedhead-supernode", "fedhead-run"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH")
    blocks = tutorial_blocks(DOC.read_text())
    assert tuple(blocks) == BLOCKS, f"docs/own-data.md tutorial blocks changed: {list(blocks)}"
    assert blocks["setup"] == SETUP.format(work="/tmp/fh_own", link=39391, node=39400)

    work = tmp_path / "work"
    link = free_ports(1)[0]
    node = _node_port_base(len(SITES))
    while link in range(node + 1, node + len(SITES) + 1):
        link = free_ports(1)[0]
    setup = SETUP.format(work=work, link=link, node=node)
    audit = tmp_path / "audit"
    audit.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    plain = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    audited = dict(
        plain,
        PYTHONPATH=os.pathsep.join([str(AUDIT), plain["PYTHONPATH"]]),
        FEDHEAD_OPEN_AUDIT=str(audit),
        FEDHEAD_OPEN_AUDIT_UNDER=str(work / "sites"),
    )
    procs = Processes(logs, cwd=REPO)
    seconds: dict[str, float] = {}
    try:
        for name in BLOCKS[1:]:
            t0 = time.monotonic()
            env = audited if name not in ("sites", "simulation") else plain
            out = procs.run(name, ["bash", "-eo", "pipefail", "-c", setup + blocks[name]], env, LIMITS.get(name, 150))
            seconds[name] = time.monotonic() - t0
            if (work / "pids").is_file():
                procs.adopt(int(p) for p in (work / "pids").read_text().split())
            assert procs.procs[name].returncode == 0, f"block {name} exited {procs.procs[name].returncode}:\n{out}"
            assert "not answering" not in out and "not online" not in out, out
            if name == "supernodes":
                env_cli = dict(plain, FLWR_HOME=str(work / "flwr-home"))
                assert online(env_cli) == len(SITES)
                _check_command_lines(work, link, node)
        (logs / "seconds.json").write_text(json.dumps(seconds))
    finally:
        procs.stop()

    files = [work / "sites" / f"site_{s}.csv" for s in SITES]
    assert (work / "flwr-home" / "config.toml").read_text() == cli_connection_toml(
        "loopback", f"127.0.0.1:{link}", str(work / "certs" / "ca.crt")
    )
    sim = schema.read(work / "sim" / "proximal" / "results.json")
    dep = schema.read(work / "out" / "proximal" / "results.json")
    assert sim.status == dep.status == "completed"
    assert [r.round for r in sim.rounds] == [r.round for r in dep.rounds] == [0, 1, 2]
    assert dep.provenance.get("fab", {}).get("fab_hash")  # (b) ran through flwr run
    assert sorted(dep.dataset.counts) == sorted(sim.dataset.counts) == [100] * 3
    for a, b in zip(sim.rounds, dep.rounds):
        np.testing.assert_allclose(b.gram, a.gram, rtol=0, atol=1e-10, err_msg=f"round {a.round}")
    g_cen = pooled_g_cen([_targets(f) for f in files], sim.config["lambda_h"], sim.config["lambda_w"])
    for res in (sim, dep):
        np.testing.assert_allclose(np.asarray(res.targets["g_cen"]), g_cen, rtol=0, atol=1e-10)
    compare = procs.tail("compare")
    assert "completed rounds [0, 1, 2]" in compare and compare.count("max |G_sim - G_dep|") == 3, compare

    _check_site_files_opened(audit, files)
    for k in range(1, len(SITES) + 1):  # private backbones with the SuperNodes, none with the server
        assert list((work / f"node{k}").rglob("*.pt")), f"no private state under node{k}"
    assert not list((work / "out").rglob("*.pt"))
    print(f"own-data tutorial: seconds per block { ({k: round(v) for k, v in seconds.items()}) }")


def _check_command_lines(work: Path, link: int, node: int) -> None:
    """The SuperLink and SuperNodes that the blocks started run the commands of tests/deploy_commands.py."""
    pids = [int(p) for p in (work / "pids").read_text().split()]
    assert len(pids) == 1 + len(SITES)
    certs = work / "certs"
    tls = ServerTls(ca=str(certs / "ca.crt"), cert=str(certs / "superlink.crt"), key=str(certs / "superlink.key"))
    assert _tool_args(_argv(pids[0]), "flower-superlink") == superlink_command(
        host="127.0.0.1", port=link, tls=tls, supernode_auth=True
    )
    for k, (pid, site) in enumerate(zip(pids[1:], SITES), start=1):
        assert _tool_args(_argv(pid), "fedhead-supernode") == supernode_command(
            superlink=f"127.0.0.1:{link}",
            host="127.0.0.1",
            port=node + k,
            partition_id=None,
            num_partitions=None,
            state_dir=str(work / f"node{k}"),
            root_ca=str(certs / "ca.crt"),
            auth_key=str(certs / f"supernode-{k}.auth"),
            data_path=str(work / "sites" / f"site_{site}.csv"),
        )


def _check_site_files_opened(audit: Path, files: list[Path]) -> None:
    """Every process under SuperNode K opened no site file but K's, and one of them opened K's;
    no other audited process (SuperLink, ServerApp, flwr CLI) opened a site file."""
    entries = _audit_logs(audit)
    nodes = {}
    for e in entries:
        if any(Path(a).name == "fedhead-supernode" for a in e["argv"]):
            config = e["argv"][e["argv"].index("--node-config") + 1]
            nodes[e["pid"]] = parse_config_args([config])["data-path"]
    assert sorted(nodes.values()) == sorted(str(f) for f in files), nodes
    seen = dict.fromkeys(nodes, False)
    for e in entries:
        owner = next((p for p in [e["pid"], *e["ancestors"]] if p in nodes), None)
        if owner is None:
            assert not e["opened"], f"{e['argv'][:3]} (pid {e['pid']}, no SuperNode) opened {e['opened']}"
            continue
        assert e["opened"] <= {nodes[owner]}, f"pid {e['pid']} under the SuperNode of {nodes[owner]}: {e['opened']}"
        seen[owner] |= nodes[owner] in e["opened"]
    assert all(seen.values()), f"a SuperNode's ClientApps never opened its file (audit not inherited?): {seen}"
    clientapps = [e for e in entries if e["opened"]]
    assert all(any("clientapp" in a for a in e["argv"]) for e in clientapps), [e["argv"][:3] for e in clientapps]
