"""benchmarks/bench_secure_sum.py: both vector sizes run, the sum is checked against its bound (no timing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_secure_sum.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def test_prints_both_vectors_with_a_dropout():
    out = _run("--sites", "5", "--dropped", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "M = 5 sites, 2 dropped, bound 1000, 2 words, frac_bits 114"
    assert [line.split()[:3] for line in lines[2:]] == [["moments", "(C=16)", "273"], ["head", "(C=16,", "P=512)"]]
    # the max error column: M 2^-(f+1) plus an ulp of sums up to 5000
    assert all(float(line.split()[-1]) <= 5 * 2.0**-115 + 2.0**-40 for line in lines[2:])


def test_refuses_dropouts_below_the_threshold():
    out = _run("--sites", "5", "--dropped", "3")
    assert out.returncode == 2
    assert "--dropped must leave a majority of the 5 sites" in out.stderr
