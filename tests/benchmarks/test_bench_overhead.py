"""benchmarks/bench_overhead.py: its command line and its accounting (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from results_helpers import typed_results
from script_helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_overhead.py"


def _bench():
    return load_script(SCRIPT)


def test_help_works_without_hydra():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--clients" in out.stdout


def test_fifo_makespan_is_the_phase_time_with_free_messaging():
    bench = _bench()
    # 2 actors take clients 0..3 in order: A runs 8 + 12 + 20, B runs 22
    assert bench.fifo_makespan([8.0, 22.0, 12.0, 20.0], 2) == pytest.approx(40.0)
    assert bench.fifo_makespan([5.0, 5.0], 4) == pytest.approx(5.0)
    res = typed_results(
        {"client_metrics": []},
        {
            "client_metrics": [
                {"train_seconds": 1.0, "local_seconds": 2.0},
                {"train_seconds": 3.0, "local_seconds": 4.0},
            ]
        },
    )
    makespan, mean = bench.local_training(res, 1)
    assert makespan == pytest.approx(6.0) and mean == pytest.approx(4.0)
