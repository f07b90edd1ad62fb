"""with-own-data.yml (each SuperNode reads only its own site's file, key and roster) against tests/deploy_commands.py.

No docker needed: with-own-data.yml is ``scripts/compose_sites.py 2``'s output; the merged commands
equal ``supernode_command`` (``tests/deploy_commands.py``) with ``data_path``, the signing key and the
roster, and no partition, parse with flwr 1.42's parsers (the node config too), and each site's
folder and signing key are mounted read-only into its own clientapp container and nowhere else, the
roster into the clientapps and the serverapp. ``docker-compose config`` validates the files (also
with 3 sites) where docker-compose is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_commands import SUPERLINK_PORT, SUPERNODE_RUNTIME_PORT, ServerTls, node_config, supernode_command
from deploy_helpers import merged_services, mount_target
from script_helpers import load_script

REPO = Path(__file__).resolve().parents[2]


def _load_compose_sites():
    return load_script(REPO / "scripts" / "compose_sites.py")


compose_sites = _load_compose_sites()
render, KEY_PATH, ROSTER_PATH = compose_sites.render, compose_sites.KEY_PATH, compose_sites.ROSTER_PATH
FILES = ("docker-compose.yml", "with-own-data.yml")
DATA_PATH = "/data/site/site.csv"


def _expected_supernode(k: int) -> list[str]:
    ca = "/certs/ca.crt"
    return supernode_command(
        superlink=f"superlink:{SUPERLINK_PORT}",
        host="0.0.0.0",
        port=SUPERNODE_RUNTIME_PORT,
        partition_id=None,
        num_partitions=None,
        state_dir="/data/state",
        root_ca=ca,
        isolation="process",
        auth_key=f"/certs/supernode-{k}.auth",
        runtime_tls=ServerTls(ca, f"/certs/supernode-{k}.crt", f"/certs/supernode-{k}.key"),
        superexec_secret=f"/certs/supernode-{k}.superexec.secret",
        data_path=DATA_PATH,
        identity=(KEY_PATH, ROSTER_PATH),
    )


def test_supernodes_name_their_file_and_parse_with_flwr():
    from flwr.common.config import parse_config_args
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    services = merged_services(REPO, *FILES)
    for k in (1, 2):
        cmd = list(services[f"supernode-{k}"]["entrypoint"]) + list(services[f"supernode-{k}"]["command"])
        assert cmd == _expected_supernode(k)
        args = _parse_args_run_supernode().parse_args(cmd[1:])
        assert parse_config_args([args.node_config]) == {
            "data-path": DATA_PATH,
            "state-dir": "/data/state",
            "signing-key": KEY_PATH,
            "roster": ROSTER_PATH,
        }


def test_the_overlay_is_the_generators_output_for_two_sites():
    assert (REPO / "with-own-data.yml").read_text() == render(2)
    with pytest.raises(ValueError, match="at least one site"):
        render(0)


def _mounted_at(services: dict[str, dict], target: str) -> dict[str, list[str]]:
    """Service -> its mounts at ``target`` (services without one left out)."""
    mounts = {
        name: [v for v in spec.get("volumes", []) if mount_target(v) == target] for name, spec in services.items()
    }
    return {name: v for name, v in mounts.items() if v}


def test_each_site_key_is_mounted_into_its_own_clientapp_the_roster_also_into_the_serverapp():
    services = merged_services(REPO, *FILES)
    assert _mounted_at(services, KEY_PATH) == {
        f"clientapp-{k}": [f"${{FEDHEAD_KEYS:-./keys}}/site-{k}.key:{KEY_PATH}:ro"] for k in (1, 2)
    }
    roster = [f"${{FEDHEAD_KEYS:-./keys}}/roster.json:{ROSTER_PATH}:ro"]
    assert _mounted_at(services, ROSTER_PATH) == {name: roster for name in ("serverapp", "clientapp-1", "clientapp-2")}


def test_each_site_is_mounted_read_only_into_its_own_clientapp_only():
    services = merged_services(REPO, *FILES)
    assert _mounted_at(services, "/data/site") == {
        f"clientapp-{k}": [f"${{FEDHEAD_SITES:-./sites}}/site-{k}:/data/site:ro"] for k in (1, 2)
    }
    assert all(f"client-{k}:/data" in services[f"clientapp-{k}"]["volumes"] for k in (1, 2))  # private state kept


def test_node_config_needs_a_partition_or_a_data_path():
    assert node_config(None, None, None, "/d/a.csv") == "data-path='/d/a.csv'"
    assert node_config(0, 2, "/s") == "partition-id=0 num-partitions=2 state-dir='/s'"
    with pytest.raises(ValueError, match="partition-id or a data-path"):
        node_config(None, None, "/s")
    with pytest.raises(ValueError, match="data-path must not contain quotes or spaces"):
        node_config(None, None, None, "/my data/a.csv")


def _compose_config(files: list[str], **env_vars: str) -> dict:
    """``docker-compose -f ... config`` of ``files`` (in the repository), parsed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(env_vars)
    res = subprocess.run(
        ["docker-compose", *(a for f in files for a in ("-f", f)), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    return yaml.safe_load(res.stdout)


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_validates_three_sites(tmp_path):
    (tmp_path / "with-sites.yml").write_text(render(3))
    config = _compose_config(["docker-compose.yml", str(tmp_path / "with-sites.yml")])
    assert sorted(s for s in config["services"] if s.startswith(("supernode-", "clientapp-"))) == [
        f"{s}-{k}" for s in ("clientapp", "supernode") for k in (1, 2, 3)
    ]
    assert sorted(config["volumes"]) == ["client-1", "client-2", "client-3", "results"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_docker_compose_config_validates_the_overlay():
    services = _compose_config(list(FILES), FEDHEAD_SITES="/srv/sites")["services"]
    one, two = str(services["clientapp-1"]["volumes"]), str(services["clientapp-2"]["volumes"])
    assert "/srv/sites/site-1:/data/site:ro" in one and "/srv/sites/site-1" not in two
    assert "/srv/sites/site-2:/data/site:ro" in two and "/srv/sites/site-2" not in one
