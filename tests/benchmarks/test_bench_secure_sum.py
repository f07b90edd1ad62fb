"""benchmarks/bench_secure_sum.py: both vector sizes run, the sum is checked against its bound (no timing);
bench_secure_sum_scale.py: its table at small M, both Shamirs side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_secure_sum.py"


def _run(*args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120, env=env)


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


SCALE = ROOT / "benchmarks" / "bench_secure_sum_scale.py"


def test_scale_prints_both_shamirs_side_by_side_and_a_dropout():
    out = _run("--sites", "4", "9", "--repeats", "1", "--dropped", "0.25", "--flwr-max-sites", "4", script=SCALE)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "L = 8208 entries, bound 1000, dropped fraction 0.25, least of 1 sums"
    rows = [line.replace("|", " ").split() for line in lines[2:]]
    assert [row[:3] for row in rows] == [["4", "3", "1"], ["9", "5", "2"]]
    site, server, flwr_site, flwr_server, site_x, server_x = map(float, rows[0][3:])
    assert min(site, server, flwr_site, flwr_server) > 0
    # the ratios come from the unrounded times
    assert (site_x, server_x) == pytest.approx((flwr_site / site, flwr_server / server), rel=0.02, abs=0.06)
    assert rows[1][5:] == ["-"] * 4  # flwr's Shamir only up to --flwr-max-sites


def test_scale_refuses_half_the_sites_dropping():
    out = _run("--sites", "4", "--dropped", "0.5", script=SCALE)
    assert out.returncode == 2
    assert "--dropped in [0, 0.5)" in out.stderr
