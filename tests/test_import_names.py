"""fedhead's Flower-facing folders install as ``fedhead.strategies``, ``fedhead.clients`` and
``fedhead.conf``: a user's project with its own ``clients/`` or ``strategies/`` package keeps it,
and fedhead keeps its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_a_users_own_clients_and_strategies_packages_do_not_collide(tmp_path):
    for name in ("clients", "strategies", "conf"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    code = """
import clients, strategies, conf
from fedhead.clients import make_client_app
from fedhead.strategies import HeadAveraging
import fedhead.conf
from importlib import resources
assert (clients.MINE, strategies.MINE, conf.MINE) == ("clients", "strategies", "conf")
assert callable(make_client_app) and HeadAveraging.__module__ == "fedhead.strategies.head_averaging"
assert resources.files("fedhead.conf").joinpath("config.yaml").is_file()
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
