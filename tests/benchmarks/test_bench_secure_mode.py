"""benchmarks/bench_secure_mode.py: ``--quick`` runs and prints its table (no timing assertions); the
split of a job's phases into its exchange and rounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_secure_mode.py"


def _bench():
    return load_script(SCRIPT)


def test_job_times_split_the_exchange_and_the_rounds():
    bench = _bench()
    p = bench.Phase
    phases = [
        p("query", 0.0, 1.0, {1: 10, 2: 10}, {1: 100, 2: 100}),
        p("query", 1.5, 2.0, {1: 30, 2: 30}, {1: 0, 2: 0}, measuring=0.25),
        p("train", 3.0, 8.0, {1: 1000, 2: 1000}, {1: 500, 2: 500}),
        p("evaluate", 8.5, 9.0, {1: 1000, 2: 1000}, {1: 50, 2: 50}),
        p("train", 10.0, 14.0, {1: 3000, 2: 3000}, {1: 500, 2: 500}),
    ]
    t = bench.job_times(phases, end=15.0)
    assert t.exchange_s == pytest.approx(3.0 - 0.25)  # the sizing time is left out
    assert t.rounds_s == pytest.approx([7.0, 5.0])
    assert t.work_s == pytest.approx([5.5, 4.0]) and t.rest_s == pytest.approx([1.5, 1.0])
    assert t.exchange_bytes == (40, 100)
    assert t.round_bytes == (pytest.approx(2500), pytest.approx(525))
    assert t.phases == 5
    with pytest.raises(ValueError, match="no training round"):
        bench.job_times(phases[:2], end=3.0)
    both = bench.combine([t, t])
    assert both.rounds_s == pytest.approx([7.0, 5.0, 7.0, 5.0]) and both.exchange_s == pytest.approx(2.75)


def test_pairs_alternate_their_order():
    assert _bench().job_order(["a", "b"], 3) == [
        ("a", "clear"),
        ("a", "secure"),
        ("a", "secure"),
        ("a", "clear"),
        ("a", "clear"),
        ("a", "secure"),
        ("b", "clear"),
        ("b", "secure"),
        ("b", "secure"),
        ("b", "clear"),
        ("b", "clear"),
        ("b", "secure"),
    ]


@pytest.mark.slow  # the benchmark's whole quick run; the three-phase round is held by test_secure_strategy
@pytest.mark.usefixtures("ray_session")  # one Ray start for the session (tests/conftest.py)
@pytest.mark.timeout(300)
def test_quick_run_prints_the_side_by_side_table(capsys):
    bench = _bench()
    assert bench.main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("M = 3 sites, Ray simulation")
    assert lines[1].split() == ["setting", "measure", "clear", "secure", "secure-clear", "secure/clear"]
    rows = lines[2:11]
    measures = [" ".join(r.split()[1:-4]) for r in rows]
    assert measures == [
        "exchange s",
        "round s (mean of 1)",
        "round: train+evaluate phases s",
        "round: the rest s",
        "exchange KiB/site received",
        "exchange KiB/site sent",
        "round KiB/site received",
        "round KiB/site sent",
        "message phases (whole job)",
    ]
    for r in rows:
        assert r.split()[0] == "tiny"
        clear, secure, diff, ratio = (float(v) for v in r.split()[-4:])
        assert clear > 0 and secure > 0 and diff == pytest.approx(secure - clear, abs=0.1)
        assert ratio > 0
    # secure mode: the exchange's query and its 4 SecAgg steps (the run's first sum), then the round's training
    # and its evaluation, each with 2 (their keys and key shares came with the sum before)
    assert rows[-1].split()[-4:-2] == ["3.00", "11.00"]
    assert lines[11].startswith("tiny: exchange secure - clear ") and "goal <= 2 s" in lines[11]
    assert lines[12].startswith("tiny: G_cen secure vs clear ")
    g_cen, gram = (float(w) for w in lines[12].replace(",", "").split() if w[0].isdigit() and "e" in w)
    assert g_cen < 1e-9 and gram < 1e-6
