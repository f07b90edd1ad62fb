"""benchmarks/bench_local_optimum.py: it runs as a script with its settings module beside it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_local_optimum.py"


def test_help_lists_the_settings_and_caps():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--settings" in out.stdout and "--literal-cap" in out.stdout
