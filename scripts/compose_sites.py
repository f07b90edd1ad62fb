"""Write the docker compose overlay of N sites, each with its own file, signing key and the roster.

The site count is this one argument: the overlay (re)defines ``supernode-K`` and ``clientapp-K`` for
K = 1..N on the TLS base file ``docker-compose.yml`` (a site beyond the base file's two gets its whole
service, and its private volume ``client-K``). ``with-own-data.yml`` is this script's output for 2
sites (``tests/driver/test_own_data_compose.py`` holds them equal); secure mode needs 3 sites or more::

    python scripts/compose_sites.py 3 > with-sites.yml
    docker-compose -f docker-compose.yml -f with-state.yml -f with-sites.yml up -d

Each SuperNode's command is ``supernode_command`` of ``tests/deploy_commands.py`` (the flags of the
tested loopback deployment) with the node config ``data-path='/data/site/site.csv'
state-dir='/data/state' signing-key='/keys/site.key' roster='/keys/roster.json'``. Site K's ClientApps
run in ``clientapp-K`` ("process" isolation) and read those paths there, so only ``clientapp-K``
mounts, read-only: ``$FEDHEAD_SITES/site-K`` (default ``./sites``) at ``/data/site``,
``$FEDHEAD_KEYS/site-K.key`` (default ``./keys``; ``fedhead-keys new-site site-K``) at
``/keys/site.key`` and ``$FEDHEAD_KEYS/roster.json`` (``fedhead-keys roster``) at
``/keys/roster.json``. The ``serverapp`` mounts the roster at the same path, which the run config names
(``roster='/keys/roster.json'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tested command lines
from deploy_commands import (
    SUPERLINK_PORT,
    SUPERNODE_ENV,
    SUPERNODE_RUNTIME_PORT,
    ServerTls,
    superexec_command,
    supernode_command,
)

DATA_PATH = "/data/site/site.csv"
STATE_DIR = "/data/state"
KEY_PATH = "/keys/site.key"
ROSTER_PATH = "/keys/roster.json"
CERTS = "${FEDHEAD_CERTS:-./certs}"
SITES = "${FEDHEAD_SITES:-./sites}"
KEYS = "${FEDHEAD_KEYS:-./keys}"

HEADER = """\
# Overlay: {n} sites, each with its own file, signing key and the roster, on the (TLS) base file:
#   docker-compose -f docker-compose.yml [-f with-state.yml] -f <this file> ...
# Written by `python scripts/compose_sites.py {n}` (the site count is its one argument; do not edit by
# hand). It sets the SuperNodes' whole commands (TLS, SuperNode authentication): never combine it
# with with-insecure.yml.
# Site K (K = 1..{n}) keeps on its host, each mounted read-only into clientapp-K only (its ClientApps
# run there in "process" isolation, and read the paths its SuperNode's node config names):
#   ${{FEDHEAD_SITES:-./sites}}/site-K/site.csv  at /data/site/site.csv  node config data-path
#   ${{FEDHEAD_KEYS:-./keys}}/site-K.key         at {key}        node config signing-key
#                                                 (`fedhead-keys new-site site-K`, private)
#   ${{FEDHEAD_KEYS:-./keys}}/roster.json        at {roster}     node config roster
#                                                 (`fedhead-keys roster`, the same file everywhere)
# The serverapp mounts the roster at {roster} too; the run config names it there
# (`roster='{roster}'`; secure mode, 3 sites or more). The SuperNodes carry no partition-id: the
# ServerApp numbers them after the statistics exchange; the run config's overrides say dataset=table
# 'dataset.files=[]' dataset.num_clients={n} 'dataset.targets=[...]' (docs/own-data.md). Edit
# data-path for .parquet or .npz files. Checked by tests/driver/test_own_data_compose.py.
"""


def _list(items: list[str]) -> str:
    return json.dumps(items)


def _site(k: int) -> list[str]:
    """The lines of ``supernode-K`` and ``clientapp-K``."""
    ca, secret = "/certs/ca.crt", f"/certs/supernode-{k}.superexec.secret"
    node = supernode_command(
        superlink=f"superlink:{SUPERLINK_PORT}",
        host="0.0.0.0",
        port=SUPERNODE_RUNTIME_PORT,
        partition_id=None,
        num_partitions=None,
        state_dir=STATE_DIR,
        root_ca=ca,
        isolation="process",
        auth_key=f"/certs/supernode-{k}.auth",
        runtime_tls=ServerTls(ca, f"/certs/supernode-{k}.crt", f"/certs/supernode-{k}.key"),
        superexec_secret=secret,
        data_path=DATA_PATH,
        identity=(KEY_PATH, ROSTER_PATH),
    )
    apps = superexec_command(runtime_api=f"supernode-{k}:{SUPERNODE_RUNTIME_PORT}", root_ca=ca, superexec_secret=secret)
    node_files = ["ca.crt", f"supernode-{k}.crt", f"supernode-{k}.key", f"supernode-{k}.auth", secret[7:]]
    env = {"OMP_NUM_THREADS": "1", **SUPERNODE_ENV}
    return [
        f"  supernode-{k}:",
        "    image: fedhead:latest",
        "    restart: unless-stopped",
        f"    entrypoint: {_list(node[:1])}",
        f"    command: {_list(node[1:])}",
        "    depends_on: [superlink]",
        "    volumes:",
        *(f"      - {CERTS}/{name}:/certs/{name}:ro" for name in node_files),
        f"  clientapp-{k}:",
        "    image: fedhead:latest",
        "    restart: unless-stopped",
        "    environment:",
        *(f"      {key}: {json.dumps(value)}" for key, value in env.items()),
        f"    entrypoint: {_list(apps[:1])}",
        f"    command: {_list(apps[1:])}",
        f"    depends_on: [supernode-{k}]",
        "    volumes:",
        f"      - client-{k}:/data",
        f"      - {CERTS}/ca.crt:/certs/ca.crt:ro",
        f"      - {CERTS}/{secret[7:]}:{secret}:ro",
        f"      - {SITES}/site-{k}:/data/site:ro",
        f"      - {KEYS}/site-{k}.key:{KEY_PATH}:ro",
        f"      - {KEYS}/roster.json:{ROSTER_PATH}:ro",
    ]


def render(n: int) -> str:
    """The overlay of ``n`` sites (YAML text)."""
    if n < 1:
        raise ValueError(f"a federation needs at least one site, got {n}")
    lines = [HEADER.format(n=n, key=KEY_PATH, roster=ROSTER_PATH), "services:"]
    lines += ["  serverapp:", "    volumes:", f"      - {KEYS}/roster.json:{ROSTER_PATH}:ro"]
    for k in range(1, n + 1):
        lines += _site(k)
    lines += ["", "volumes:", *(f"  client-{k}:" for k in range(1, n + 1))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sites", type=int, help="the number of sites (SuperNodes)")
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.sites))


if __name__ == "__main__":
    main()
