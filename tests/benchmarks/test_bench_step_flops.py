"""benchmarks/bench_step_flops.py: the scale=cpu shapes, the FLOP accounting and a quick run (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_step_flops.py"


@pytest.fixture(scope="module")
def bench():
    yield load_script(SCRIPT)
    sys.modules.pop(SCRIPT.stem, None)


def test_the_step_is_a_hopper_client_of_scale_cpu(bench):
    s = bench.Shapes.cpu_scale()
    assert (s.rows, s.inputs, s.targets, s.width, s.depth, s.features) == (100, 11, 3, 256, 3, 64)
    assert s.lr == 3e-3 and s.lambda_h == s.lambda_w == 0.01
    assert s.linears()[0] == (11, 256) and s.linears()[-1] == (64, 3) and len(s.linears()) == 2 + 2 * 3 + 1


def test_the_flop_counter_counts_the_steps_gemms(bench, one_torch_thread):
    """The step's counted FLOPs are exactly those of the GEMM list the benchmark times."""
    s = bench.Shapes.cpu_scale()
    small = bench.Shapes(
        rows=7, inputs=5, targets=2, width=16, depth=2, features=8, lr=1e-3, lambda_h=0.1, lambda_w=0.1
    )
    for shapes in (s, small):
        assert bench.step_flops(shapes) == bench.Gemms(shapes).flops
    assert round(bench.step_flops(s) / 1e6, 1) == 247.0


def _run(tmp_path, *args: str) -> tuple[list[str], dict]:
    """The script's table (the header line first) and its JSON, run with ``args``."""
    out = tmp_path / "step.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("threads"))
    return lines[header:], json.loads(out.read_text())


def test_quick_run_prints_one_row_and_writes_json(tmp_path):
    table, data = _run(tmp_path, "--quick")
    row = table[1].split()
    assert row[0] == "1" and row[-1] in ("met", "MISSED")
    (r,) = data["results"]
    assert r["threads"] == 1 and r["steps"] == 20 and r["step_flops"] == data["gemm_flops"]
    assert r["before_gflops"] > 0 and r["after_gflops"] > 0 and r["after_of_gemms"] > 0


@pytest.mark.slow  # the two-process variant of the quick run above
def test_two_one_thread_processes_give_one_row_of_both(tmp_path):
    """The ``2 x 1`` row: two processes stepping at once, each pair of each process in the medians."""
    table, data = _run(tmp_path, "--threads", "1", "--steps", "5", "--repeats", "1", "--processes", "2")
    assert table[1].split()[0] == "1"
    assert table[2].split()[:3] == ["2", "x", "1"]
    one, both = data["results"]
    assert "processes" not in one and both["processes"] == 2 and both["threads"] == 1
    assert len(both["after_ms_each"]) == len(both["gemms_gflops_each"]) == 2
    assert min(both["after_ms_each"]) <= both["after_ms"] <= max(both["after_ms_each"])
