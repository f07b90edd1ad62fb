"""The docker compose files against the tested deployment (no docker needed; fast).

Every service's command (entrypoint + command, after the overlays) must equal what
:mod:`fedhead.driver.deploy` gives for that service: the same functions start the loopback deployment
of ``tests/driver/test_deploy_loopback.py``. The flags must parse with flwr 1.42's own argument
parsers, only the SuperLink's port is published (on ``FEDHEAD_BIND_ADDRESS``, default
127.0.0.1), the TLS overlay mounts only the files each container needs, and
docs/deployment.md's TOML examples parse and its links stay inside the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from deploy_helpers import merged_services

from fedhead.driver.deploy import (
    SUPERLINK_PORT,
    SUPERNODE_RUNTIME_PORT,
    ServerTls,
    superexec_command,
    superlink_command,
    supernode_command,
)

REPO = Path(__file__).resolve().parents[2]
N_NODES = 2
LINK = f"superlink:{SUPERLINK_PORT}"
SECRET = "/certs/superexec.secret"


def _full(spec: dict) -> list[str]:
    return list(spec["entrypoint"]) + list(spec["command"])


def _expected(tls: bool, state: bool) -> dict[str, list[str]]:
    ca = "/certs/ca.crt" if tls else None
    secret = SECRET if tls else None
    out = {
        "superlink": superlink_command(
            host="0.0.0.0",
            port=SUPERLINK_PORT,
            isolation="process",
            supernode_auth=tls,
            tls=ServerTls(ca, "/certs/superlink.crt", "/certs/superlink.key") if tls else None,
            database="/state/state.db" if state else None,
            superexec_secret=secret,
        ),
        "serverapp": superexec_command(runtime_api=LINK, root_ca=ca, superexec_secret=secret),
    }
    for k in range(1, N_NODES + 1):
        out[f"supernode-{k}"] = supernode_command(
            superlink=LINK,
            host="0.0.0.0",
            port=SUPERNODE_RUNTIME_PORT,
            partition_id=k - 1,
            num_partitions=N_NODES,
            state_dir="/data/state",
            root_ca=ca,
            isolation="process",
            auth_key=f"/certs/supernode-{k}.auth" if tls else None,
            runtime_tls=ServerTls(ca, f"/certs/supernode-{k}.crt", f"/certs/supernode-{k}.key") if tls else None,
            superexec_secret=secret,
        )
        out[f"clientapp-{k}"] = superexec_command(
            runtime_api=f"supernode-{k}:{SUPERNODE_RUNTIME_PORT}", root_ca=ca, superexec_secret=secret
        )
    return out


@pytest.mark.parametrize("tls", [False, True], ids=["base", "tls"])
@pytest.mark.parametrize("state", [False, True], ids=["memory", "state"])
def test_compose_commands_match_tested_deployment(tls, state):
    files = ["docker-compose.yml"] + (["with-tls.yml"] if tls else []) + (["with-state.yml"] if state else [])
    services = merged_services(REPO, *files)
    expected = _expected(tls, state)
    assert sorted(services) == sorted(expected)
    for name, cmd in expected.items():
        assert _full(services[name]) == cmd, name


def test_compose_flags_parse_with_flwr():
    from flwr.supercore.cli.flower_superexec import _parse_args as superexec_parser
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    parsers = {
        "flower-superlink": _parse_args_run_superlink,
        "flower-supernode": _parse_args_run_supernode,
        "flower-superexec": superexec_parser,
    }
    for tls in (False, True):
        for name, cmd in _expected(tls, state=True).items():
            args = parsers[cmd[0]]().parse_args(cmd[1:])
            assert getattr(args, "insecure", False) is (not tls), name


def test_only_superlink_port_published_on_chosen_address():
    services = merged_services(REPO, "docker-compose.yml", "with-tls.yml", "with-state.yml", "with-gpu.yml")
    published = {name: spec["ports"] for name, spec in services.items() if spec.get("ports")}
    assert published == {
        "superlink": [f"${{FEDHEAD_BIND_ADDRESS:-127.0.0.1}}:${{FEDHEAD_SUPERLINK_PORT:-8000}}:{SUPERLINK_PORT}"]
    }


def test_tls_overlay_mounts_only_what_each_service_needs():
    services = merged_services(REPO, "docker-compose.yml", "with-tls.yml")
    for name, spec in services.items():
        certs = sorted(Path(v.split(":")[1]).name for v in spec.get("volumes", []) if ":/certs/" in v)
        assert all(v.endswith(":ro") for v in spec.get("volumes", []) if ":/certs/" in v), name
        files = {f for f in _full(spec) if f.startswith("/certs/")}
        assert sorted(Path(f).name for f in files) == certs, name  # mounted == used
        assert "ca.key" not in certs


def test_gpu_overlay_reserves_nvidia_devices_for_clientapps():
    services = yaml.safe_load((REPO / "with-gpu.yml").read_text())["services"]
    assert sorted(services) == [f"clientapp-{k}" for k in range(1, N_NODES + 1)]
    for spec in services.values():
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def _compose_config(*files: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker-compose", *(a for f in files for a in ("-f", f)), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        # Debian's docker-compose runs on the system python: keep the test session's python
        # settings (PYTHONPATH and the like, set by other tests or the venv) away from it
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize(
    "files",
    [
        ("docker-compose.yml", "with-gpu.yml"),  # the GPU overlay (never run on a GPU here) on the base
        ("docker-compose.yml", "with-tls.yml", "with-state.yml", "with-gpu.yml"),
    ],
    ids=["base+gpu", "tls+state+gpu"],
)
def test_docker_compose_config_validates(files):
    """``docker-compose ... config`` accepts the files, and the merged GPU overlay reserves an
    NVIDIA GPU for exactly the clientapp services (the only check of with-gpu.yml: no GPU here)."""
    res = _compose_config(*files)
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    with_gpu = sorted(
        name
        for name, spec in services.items()
        if spec.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    )
    assert with_gpu == [f"clientapp-{k}" for k in range(1, N_NODES + 1)]
    for name in with_gpu:
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["device_ids"] == ["0"]
        assert services[name]["entrypoint"] == ["flower-superexec"]  # the base service, merged


DOC = REPO / "docs" / "deployment.md"


def test_docs_toml_examples_parse():
    text = DOC.read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    blocks += re.findall(r"<<'?EOF'?\n(.*?)\nEOF", text, flags=re.S)  # config.toml heredocs
    assert len(blocks) >= 3
    for block in blocks:
        tomllib.loads(block.replace("$WORK", "/tmp/w").replace("$PWD", "/tmp/p"))


def test_docs_links_stay_inside_repository():
    text = DOC.read_text()
    assert "shared/" not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path = (DOC.parent / target).resolve()
        assert path.is_relative_to(REPO) and path.exists(), target
