"""The docker compose files against the tested deployment and the threat model (fast).

Every service's command (entrypoint + command, after the overlays) must equal what
``tests/deploy_commands.py`` gives for that service: the same functions start the loopback deployment
of ``tests/driver/test_deploy_loopback.py``. The base file ``docker-compose.yml`` runs with TLS
and SuperNode authentication (no ``--insecure`` anywhere in it); only ``with-insecure.yml``
turns both off. The flags must parse with flwr 1.42's own argument parsers, only the
SuperLink's port is published and on 127.0.0.1 unless ``FEDHEAD_BIND_ADDRESS`` says otherwise,
every container mounts only the files its command uses, and no private key or SuperExec secret
reaches a service that does not need it (one secret per runtime API: a site's secret never
reaches another site). ``docker-compose config`` (where installed) checks the same on the
merge that compose itself makes, for the base file and every overlay.
docs/deployment.md's TOML examples parse and its links stay inside the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from deploy_commands import (
    SUPERLINK_PORT,
    SUPERNODE_ENV,
    SUPERNODE_RUNTIME_PORT,
    ServerTls,
    superexec_command,
    superlink_command,
    supernode_command,
)
from deploy_helpers import merged_services

REPO = Path(__file__).resolve().parents[2]
N_NODES = 2
LINK = f"superlink:{SUPERLINK_PORT}"
SERVICES = ["superlink", "serverapp"] + [f"{s}-{k}" for s in ("supernode", "clientapp") for k in range(1, N_NODES + 1)]
BASE = "docker-compose.yml"
INSECURE = "with-insecure.yml"
# the base file alone and with every overlay (each combination that the docs name)
SECURE_SETS = [
    (BASE,),
    (BASE, "with-state.yml"),
    (BASE, "with-gpu.yml"),
    (BASE, "with-own-data.yml"),
    (BASE, "with-state.yml", "with-gpu.yml", "with-own-data.yml"),
]
INSECURE_SETS = [(BASE, INSECURE), (BASE, INSECURE, "with-state.yml", "with-gpu.yml")]


def _private_file_owners() -> dict[str, set[str]]:
    """Every private file of ``scripts/make_certs.sh`` -> the services that may mount it."""
    owners = {"superlink.key": {"superlink"}, "superlink.superexec.secret": {"superlink", "serverapp"}}
    for k in range(1, N_NODES + 1):
        owners[f"supernode-{k}.key"] = {f"supernode-{k}"}
        owners[f"supernode-{k}.auth"] = {f"supernode-{k}"}
        owners[f"supernode-{k}.superexec.secret"] = {f"supernode-{k}", f"clientapp-{k}"}
    return owners


def _full(spec: dict) -> list[str]:
    return list(spec["entrypoint"]) + list(spec["command"])


def _expected(tls: bool, state: bool) -> dict[str, list[str]]:
    ca = "/certs/ca.crt" if tls else None
    out = {
        "superlink": superlink_command(
            host="0.0.0.0",
            port=SUPERLINK_PORT,
            isolation="process",
            supernode_auth=tls,
            tls=ServerTls(ca, "/certs/superlink.crt", "/certs/superlink.key") if tls else None,
            database="/state/state.db" if state else None,
            superexec_secret="/certs/superlink.superexec.secret" if tls else None,
        ),
        "serverapp": superexec_command(
            runtime_api=LINK,
            root_ca=ca,
            superexec_secret="/certs/superlink.superexec.secret" if tls else None,
            site=False,
        ),
    }
    for k in range(1, N_NODES + 1):
        secret = f"/certs/supernode-{k}.superexec.secret" if tls else None
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


def _parsed(cmd: list[str]):
    """``cmd`` parsed by the flwr 1.42 parser of its program (fedhead's site programs take flwr's flags; their
    own are left at their defaults)."""
    from flwr.supercore.cli.flower_superexec import _parse_args as superexec_parser
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    parsers = {
        "flower-superlink": _parse_args_run_superlink,
        "flower-supernode": _parse_args_run_supernode,
        "flower-superexec": superexec_parser,
        "fedhead-supernode": _parse_args_run_supernode,
        "fedhead-superexec": superexec_parser,
    }
    return parsers[cmd[0]]().parse_args(cmd[1:])


def _mounts(spec: dict) -> list[tuple[str, str, str]]:
    """(source, container path, mode) of a service's mounts; ``${VAR:-default}`` -> default."""
    out = []
    for volume in spec.get("volumes", []):
        parts = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", volume).split(":")
        out.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"))
    return out


def _cert_sources(services: dict[str, dict]) -> dict[str, set[str]]:
    """File name of every mounted host file under /certs -> the services that mount it."""
    out: dict[str, set[str]] = {}
    for name, spec in services.items():
        for source, target, _ in _mounts(spec):
            if target.startswith("/certs/") and source != "/dev/null":
                out.setdefault(Path(source).name, set()).add(name)
    return out


def assert_secure(services: dict[str, dict]) -> None:
    """TLS on every connection, SuperNode authentication, a SuperExec secret on every runtime
    API, every used file mounted read-only from the certs folder, private files only where
    needed, and the only published port on 127.0.0.1 by default."""
    assert sorted(services) == sorted(SERVICES)
    for name, spec in services.items():
        cmd = _full(spec)
        assert "--insecure" not in cmd, name
        args = _parsed(cmd)
        assert args.insecure is False and args.superexec_auth_secret_file, name
        if name == "superlink":
            assert args.ssl_ca_certfile and args.ssl_certfile and args.ssl_keyfile
            assert args.enable_supernode_auth is True
        elif name.startswith("supernode-"):
            assert args.root_certificates and args.auth_supernode_private_key, name
            assert args.ssl_ca_certfile and args.ssl_certfile and args.ssl_keyfile, name  # its runtime API
        else:
            assert args.root_certificates, name
        used = {f for f in cmd if f.startswith("/certs/")}
        mounted = {target: (source, mode) for source, target, mode in _mounts(spec) if target.startswith("/certs/")}
        assert sorted(mounted) == sorted(used), name  # mounted == used
        assert all(mode == "ro" and source != "/dev/null" for source, mode in mounted.values()), name
    owners = _private_file_owners()
    private = {f: s for f, s in _cert_sources(services).items() if not f.endswith((".crt", ".pub"))}
    assert private == owners  # ca.key nowhere, each secret only in its pair of services
    _assert_ports_on_loopback(services)


def _assert_ports_on_loopback(services: dict[str, dict]) -> None:
    published = {name: spec["ports"] for name, spec in services.items() if spec.get("ports")}
    assert list(published) == ["superlink"]
    (port,) = published["superlink"]
    assert re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", port).startswith("127.0.0.1:"), port
    assert re.fullmatch(rf"(.*):{SUPERLINK_PORT}(/tcp)?", port), port


def assert_insecure(services: dict[str, dict]) -> None:
    """``--insecure`` on every Flower process, no authentication, no host file under /certs."""
    assert sorted(services) == sorted(SERVICES)
    for name, spec in services.items():
        args = _parsed(_full(spec))
        assert args.insecure is True and args.superexec_auth_secret_file is None, name
        assert not getattr(args, "enable_supernode_auth", False), name
        assert not getattr(args, "auth_supernode_private_key", None), name
    assert _cert_sources(services) == {}
    _assert_ports_on_loopback(services)


@pytest.mark.parametrize("insecure", [False, True], ids=["base", "insecure"])
@pytest.mark.parametrize("state", [False, True], ids=["memory", "state"])
def test_compose_commands_match_tested_deployment(insecure, state):
    files = [BASE] + ([INSECURE] if insecure else []) + (["with-state.yml"] if state else [])
    services = merged_services(REPO, *files)
    expected = _expected(not insecure, state)
    assert sorted(services) == sorted(expected)
    for name, cmd in expected.items():
        assert _full(services[name]) == cmd, name


@pytest.mark.parametrize("files", SECURE_SETS + INSECURE_SETS, ids=lambda f: "+".join(f))
def test_every_clientapp_superexec_has_the_supernodes_settings(files):
    """Each site's SuperExec (its clientapp-K container) polls for messages as the loopback SuperNodes' do."""
    services = merged_services(REPO, *files)
    for k in range(1, N_NODES + 1):
        env = services[f"clientapp-{k}"].get("environment") or {}
        assert {key: env.get(key) for key in SUPERNODE_ENV} == SUPERNODE_ENV, k


def test_base_file_has_no_insecure_flag():
    """Nothing in the base file (commands, entrypoints, anchors) says --insecure."""

    def strings(node) -> list[str]:
        if isinstance(node, dict):
            return [s for k, v in node.items() for s in strings(k) + strings(v)]
        if isinstance(node, list):
            return [s for v in node for s in strings(v)]
        return [node] if isinstance(node, str) else []

    found = strings(yaml.safe_load((REPO / BASE).read_text()))
    assert "--insecure" not in found and len(found) > 50


@pytest.mark.parametrize("files", SECURE_SETS, ids=lambda f: "+".join(f))
def test_base_file_and_overlays_are_secure(files):
    assert_secure(merged_services(REPO, *files))


@pytest.mark.parametrize("files", INSECURE_SETS, ids=lambda f: "+".join(f))
def test_insecure_overlay_turns_tls_and_authentication_off(files):
    assert_insecure(merged_services(REPO, *files))


def test_a_shared_secret_is_caught():
    """The secret check fails when one site's SuperExec secret reaches another site."""
    services = merged_services(REPO, BASE)
    assert_secure(services)
    spec = services["clientapp-2"]  # site 2's ClientApps given site 1's secret
    spec["volumes"] = [v.replace("supernode-2.superexec", "supernode-1.superexec") for v in spec["volumes"]]
    spec["command"] = [c.replace("supernode-2.superexec", "supernode-1.superexec") for c in spec["command"]]
    with pytest.raises(AssertionError, match="supernode-1.superexec.secret"):
        assert_secure(services)


def test_insecure_overlay_documents_loopback_only():
    head = (REPO / INSECURE).read_text().split("services:")[0]
    assert "loopback only" in head and "127.0.0.1" in head


@pytest.mark.skipif(
    shutil.which("openssl") is None or shutil.which("ssh-keygen") is None, reason="openssl or ssh-keygen missing"
)
def test_make_certs_makes_every_file_the_base_file_mounts(tmp_path):
    """``scripts/make_certs.sh certs 2`` writes exactly the files the base file mounts (plus the
    CA key and the public keys, mounted nowhere); private files are owner-only."""
    subprocess.run(["bash", str(REPO / "scripts/make_certs.sh"), str(tmp_path), str(N_NODES)], check=True, timeout=60)
    made = {p.name for p in tmp_path.iterdir()} - {"ca.srl"}
    mounted = set(_cert_sources(merged_services(REPO, BASE)))
    pubs = {f"supernode-{k}.auth.pub" for k in range(1, N_NODES + 1)}
    assert made == mounted | {"ca.key"} | pubs
    for name in set(_private_file_owners()) | {"ca.key"}:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
    secrets = [(tmp_path / f).read_bytes() for f in made if f.endswith(".superexec.secret")]
    assert len(secrets) == N_NODES + 1 and len(set(secrets)) == len(secrets) and all(len(s) == 64 for s in secrets)


def test_compose_flags_parse_with_flwr():
    for tls in (False, True):
        for name, cmd in _expected(tls, state=True).items():
            assert _parsed(cmd).insecure is (not tls), name


def test_gpu_overlay_reserves_nvidia_devices_for_clientapps():
    services = yaml.safe_load((REPO / "with-gpu.yml").read_text())["services"]
    assert sorted(services) == [f"clientapp-{k}" for k in range(1, N_NODES + 1)]
    for spec in services.values():
        (device,) = spec["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def _compose_config(*files: str) -> dict[str, dict]:
    """The services of ``docker-compose -f ... config`` (compose's own merge), with the
    defaults of every variable (FEDHEAD_* unset)."""
    res = subprocess.run(
        ["docker-compose", *(a for f in files for a in ("-f", f)), "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        # Debian's docker-compose runs on the system python: keep the test session's python
        # settings (PYTHONPATH and the like, set by other tests or the venv) away from it
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FEDHEAD_"))},
    )
    assert res.returncode == 0, res.stderr
    return yaml.safe_load(res.stdout)["services"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize("files", SECURE_SETS + INSECURE_SETS, ids=lambda f: "+".join(f))
def test_docker_compose_config_validates(files):
    """``docker-compose ... config`` accepts the files; its merge is secure (or, with the
    insecure overlay, insecure everywhere) and publishes only 127.0.0.1:8000; the GPU overlay
    reserves an NVIDIA GPU for exactly the clientapp services (its only check: no GPU here)."""
    services = _compose_config(*files)
    (assert_insecure if INSECURE in files else assert_secure)(services)
    assert services["superlink"]["ports"] == [f"127.0.0.1:{SUPERLINK_PORT}:{SUPERLINK_PORT}/tcp"]
    with_gpu = sorted(
        name
        for name, spec in services.items()
        if spec.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    )
    assert with_gpu == ([f"clientapp-{k}" for k in range(1, N_NODES + 1)] if "with-gpu.yml" in files else [])
    for name in with_gpu:
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"] and device["device_ids"] == ["0"]
        assert services[name]["entrypoint"] == ["fedhead-superexec"]  # the base service, merged


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


def test_docs_compose_commands_name_existing_files():
    """Every ``docker-compose -f ...`` (and ``FILES=(-f ...)`` of scripts/docker_check.sh) in
    the docs, README, scripts and compose files starts with the base file, names files that
    exist (or ``with-sites.yml``, which ``scripts/compose_sites.py N`` writes), and none runs the
    insecure overlay with real sites' data."""
    sources = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("*.yml"))]
    sources += sorted((REPO / "scripts").glob("*.sh"))
    commands = [
        m
        for src in sources
        for m in re.findall(r"(?:docker[- ]compose|FILES=\()((?:\s*\[?-f\s+[\w.-]+\.yml\]?)+)", src.read_text())
        if src.name != "mkdocs.yml"
    ]
    assert len(commands) >= 8
    for command in commands:
        files = re.findall(r"-f\s+([\w.-]+\.yml)", command)
        assert files[0] == BASE, command
        assert all((REPO / f).is_file() or f == "with-sites.yml" for f in files), command
        assert not (INSECURE in files and {"with-own-data.yml", "with-sites.yml"} & set(files)), command
