"""benchmarks/bench_deploy.py: its command line and the grouping of a run's phases (default suite); one run of
3 sites, deployed and simulated, clear and secure, prints its table and equal results (slow)."""

from __future__ import annotations

import math
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_deploy.py"


def _run(*args: str, limit: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=limit)


def test_help_and_refused_arguments():
    out = _run("--help")
    assert out.returncode == 0 and "--sites" in out.stdout and "--where" in out.stdout, out.stderr
    two = _run("--sites", "2")
    assert two.returncode == 2 and "secure mode needs at least 3 sites" in two.stderr
    rounds = _run("--rounds", "0")
    assert rounds.returncode == 2 and "--rounds must be at least 1" in rounds.stderr


def test_the_phases_group_into_the_exchange_and_round_one():
    bench = runpy.run_path(str(SCRIPT))
    phases = [("query", 2.0), ("query", 3.0), ("query", 5.0), ("query", 4.0), ("train", 10.0), ("query", 1.0)]
    phases += [("train", 7.0), ("query", 1.5)]
    got = bench["measures"](bench["Run"](phases, 40.0, np.eye(2)))
    assert got["phases"] == 8 and got["whole run"] == 40.0
    assert got["first query phase"] == 2.0 and got["later query phases (median)"] == 4.0
    assert got["exchange"] == 14.0 and got["round 1"] == 11.0  # up to round 2's training phase
    clear = bench["measures"](bench["Run"]([("query", 2.0), ("train", 6.0)], 9.0, np.eye(2)))
    assert math.isnan(clear["later query phases (median)"]) and clear["round 1"] == 6.0
    with pytest.raises(ValueError, match="no training phase"):
        bench["measures"](bench["Run"]([("query", 2.0)], 3.0, np.eye(2)))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_three_sites_deployed_and_simulated_print_the_table_and_equal_grams():
    out = _run("--sites", "3", limit=1700)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    head = next(line for line in lines if line.startswith("M = 3 sites"))
    for column in ("dep clear", "dep secure", "sim clear", "sim secure", "dep sec/clr", "dep/sim sec"):
        assert column in head
    for mode in ("clear", "secure"):
        line = next(line for line in lines if line.startswith(f"{mode} Gram, deployment vs simulation"))
        assert float(line.split(": ")[1].split()[0]) < 1e-6, line
    assert any(line.startswith("secure / clear round 1, 3 sites, deployment") for line in lines)


def test_the_profile_splits_a_message_by_its_supernodes_log_lines(tmp_path):
    bench = runpy.run_path(str(SCRIPT))

    def log(name: str, *lines: tuple[str, str]) -> None:
        text = [f"\x1b[92mDEBUG 2026-12-06 12:00:{sec},{ms}\x1b[0m:     {msg}" for sec, ms, msg in lines]
        (tmp_path / name).write_text("\n".join(["INFO:     127.0.0.1:1 - POST", *text]) + "\n")

    log("superlink.log", ("10", "000", "Runtime.PushMessages"), ("30", "000", "Runtime.PushMessages"))
    log(
        "supernode1.log",
        ("11", "500", "[RUN 1]"),
        ("11", "500", "Receiving: query message (ID: 1)"),
        ("12", "000", "DEBUG logs enabled. Do not use this in production"),
        ("14", "000", "Start `flwr-clientapp` process"),
        ("14", "250", "[flwr-clientapp] Start FAB installation."),
        ("14", "750", "[flwr-clientapp] Start `ClientApp` Loading."),
        ("16", "000", "Sending: query message (ID: 2)"),  # before the task's end: counted from it
        ("16", "100", "Finished task 7 of run 1"),
        ("16", "600", "Sent successfully"),
        ("31", "000", "Receiving: train message (ID: 3)"),
        ("35", "000", "Sent successfully"),
    )
    pieces = bench["message_pieces"](tmp_path)
    query = pieces["query"][0]
    expected = [1.5, 0.5, 2.0, 0.25, 0.5, 1.35, -0.1, 0.6]
    assert [round(query[name], 3) for name, _ in bench["PIECES"]] == expected
    assert pieces["train"] == [{"SuperNode's pull wait": 1.0, "send to the SuperLink": 4.0}]
    lines = bench["profile"](tmp_path)
    assert lines[0].startswith("query messages (1 at the sites)") and "push to the reply at the SuperLink" in lines[9]
