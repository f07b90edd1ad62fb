"""benchmarks/bench_privacy_cost.py --quick: it runs the federation and writes its points and figure
(the outputs' shape, not their values)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_privacy_cost.py"


@pytest.mark.slow  # the benchmark's whole quick run; its refusal of a missing file stays in the default suite
def test_quick_writes_points_and_figure(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    with open(tmp_path / "points.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["setting"], float(r["noise"])) for r in rows] == [("tutorial", 0.0), ("tutorial", 0.001)]
    no_noise, noised = rows
    assert no_noise["status"] == "ok" and math.isinf(float(no_noise["epsilon"]))
    assert float(no_noise["e_f_true"]) >= 0 and int(no_noise["sites"]) == 3
    assert float(noised["epsilon"]) > 0 and int(noised["releases"]) == 2  # the exchange and one round
    assert noised["status"] == "ok" or noised["status"].startswith("failed: ")
    if noised["status"] == "ok":  # results.json's privacy.dp, the federation's own accounting
        assert float(noised["e_f_true"]) >= 0 and int(noised["sites"]) == 3
    meta = json.loads((tmp_path / "points.json").read_text())
    (setting,) = meta["settings"]
    assert setting["rows"] == [100, 100, 100] and setting["dp_max_rows"] == 100
    assert setting["dp_clip"] >= max(setting["per_row_norms"].values())
    assert len(setting["g_cen_true"]) == 2 and len(meta["points"]) == 2
    assert (tmp_path / "privacy_cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| tutorial | 0.001 |" in out.stdout


def test_refuses_a_missing_penguins_file(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--csv", str(tmp_path / "none.csv")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "no such file" in out.stderr
