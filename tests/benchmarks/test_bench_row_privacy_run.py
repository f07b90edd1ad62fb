"""benchmarks/bench_row_privacy_run.py: every run it makes is a valid config (the row-level DP-SGD runs, the
closed forms, the reference), its table and figure come from the points, and (slow) the closed forms at 3 x 300
rows reach the noised G_cen from the sites' own releases at a finite epsilon."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from script_helpers import load_script

from fedhead.settings.config import compose_config, load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_row_privacy_run.py"


def _bench():
    return load_script(SCRIPT)


def test_every_run_of_the_benchmark_is_a_valid_config(tmp_path):
    bench = _bench()
    make_sites = [sys.executable, str(ROOT / "examples/own-data/make_sites.py"), "--rows", "30", "--out", str(tmp_path)]
    subprocess.run(make_sites, check=True, capture_output=True)
    base = bench.common(bench.Sites("tutorial", [tmp_path / f"site_{c}.csv" for c in "abc"], ("t1", "t2"), [1000] * 3))
    row = ["privacy.mode=secure", "privacy.dp_noise=4.53", "privacy.dp_clip=8", "privacy.dp_max_rows=800"]
    dp_sgd = ["train.dp_noise=1.2", "train.dp_sample_rate=0.02", "train.dp_clip=1.0", "privacy.dp_unit=row"]
    trained = load_config(compose_config([*base, *row, *dp_sgd, "procedure=corrected_proximal"])).jobs(tmp_path)[0]
    assert trained.private_heads and trained.reads_own_release
    assert trained.privacy.dp_delta == pytest.approx(1 / 2400, rel=1e-12)
    closed = [*base, *row, "privacy.dp_unit=row", "+procedure.gamma=1.0", "procedure=exact"]
    job = load_config(compose_config(closed)).jobs(tmp_path)[0]
    assert job.procedure.exact and job.procedure.gamma == 1.0 and job.private_heads and job.reads_own_release
    assert job.exchange_row_noise == pytest.approx(4.53 / math.sqrt(3), rel=1e-15)


def test_the_table_and_the_figure_come_from_the_points(tmp_path, capsys):
    bench = _bench()
    points = [
        {"run": "closed", "e_f_true": [0.77, 0.02], "row_epsilon": [1.2, 1.2], "g_cen_e_f": 0.02},
        {"run": "no DP", "e_f_true": [0.77, 0.3], "row_epsilon": [None, None], "g_cen_e_f": 0.0},
        {"run": "client-level", "error": "fedhead-run: error: the noised count is not positive"},
    ]
    (tmp_path / "points.json").write_text(json.dumps({"args": {"rows": 1000}, "points": points}))
    bench.main(["--replot", str(tmp_path), str(tmp_path), "--figure", str(tmp_path / "f.png")])
    table = capsys.readouterr().out
    assert table.count("1,000 rows per site") == 2  # one table per folder, with that run's settings
    assert "| closed | 0.770 / 0.020 | 1.20 / 1.20 | 0.020 |" in table
    assert "| no DP | 0.770 / 0.300 | - / - | 0.000 |" in table
    assert "| client-level | refused: fedhead-run: error: the noised count is not positive | | |" in table
    assert (tmp_path / "f.png").stat().st_size > 0


@pytest.mark.slow  # three fedhead-run processes, about a minute
def test_the_closed_forms_reach_the_noised_g_cen_at_a_finite_epsilon(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(SCRIPT), "--rows", "300", "--rounds", "2", "--sigma", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    (closed,) = json.loads((out / "points.json").read_text())["points"]
    assert "error" not in closed, closed
    assert closed["e_f_true"][-1] == pytest.approx(closed["g_cen_e_f"], rel=1e-9)  # G_T = the noised G_cen
    assert 0 < closed["row_epsilon"][-1] < 10
