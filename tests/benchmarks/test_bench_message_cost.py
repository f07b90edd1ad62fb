"""benchmarks/bench_message_cost.py: its command line and flwr's waits it reports (no timing assertions)."""

from __future__ import annotations

import inspect
import runpy
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_message_cost.py"


def test_help_and_a_refused_repeat_count():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--repeat" in out.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--repeat", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--repeat must be at least 1" in bad.stderr


def test_the_waits_it_reports_are_flwrs():
    from flwr.supercore.superexec import run_superexec
    from flwr.supernode import start_client_internal

    polls = runpy.run_path(str(SCRIPT))["POLLS"]
    assert polls["SuperExec task poll (default)"] == run_superexec._DEFAULT_TASK_POLL_INTERVAL_SECONDS
    assert run_superexec._TASK_POLL_INTERVAL_ENV == "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
    source = inspect.getsource(start_client_internal)
    assert f"time.sleep({polls['SuperNode pull when idle']:g})" in source
    assert f"time.sleep({polls['reply wait']:g})" in source
