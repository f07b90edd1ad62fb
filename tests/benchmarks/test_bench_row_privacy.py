"""benchmarks/bench_row_privacy.py --quick: the table is printed, the figure and points written, and the
row-level exchange at 3 x 10,000 rows and epsilon = 1 meets its goals (e_F(G_cen) <= 0.02, corrected proximal's
e_F(G_T) <= 0.05 against the true G_cen)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_row_privacy.py"


def test_quick(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "| gauss10 | 3 x 10,000 |" in out.stdout
    assert (tmp_path / "row_privacy.png").stat().st_size > 0
    points = json.loads((tmp_path / "points.json").read_text())["points"]
    goal = next(p for p in points if (p["rows"], p["epsilon"]) == (10000, 1.0))
    assert goal["row_gcen"] <= 0.02 and goal["row_refused"] == 0
    assert goal["row_gt"] <= 0.05 and goal["row_undefined"] == 0
