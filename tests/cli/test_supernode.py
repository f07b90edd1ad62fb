"""fedhead-supernode (fedhead/cli/supernode.py): flwr's SuperNode loop with its two fixed waits replaced and
fedhead-superexec started in place of flower-superexec; every other wait and command is flwr's, and a wait
out of range is one ``error:`` line before anything starts."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from fedhead.cli import supernode


def test_the_loop_clock_replaces_only_flwrs_two_waits(monkeypatch):
    slept = []
    monkeypatch.setattr(supernode.time, "sleep", slept.append)
    clock = supernode.LoopClock(idle_pull=0.25, reply_check=0.02)
    for seconds in (3, 0.5, 1.0, 2):
        clock.sleep(seconds)
    assert slept == [0.25, 0.02, 1.0, 2]
    assert clock.monotonic is supernode.time.monotonic


def test_the_launcher_starts_fedhead_superexec_for_flower_superexec():
    started = []
    fake = types.SimpleNamespace(Popen=lambda args, *a, **kw: started.append(args), PIPE=-1)
    launcher = supernode.SuperExecLauncher(fake)
    launcher.Popen(["flower-superexec", "--runtime-api-address", "127.0.0.1:9094", "--insecure"])
    launcher.Popen(["flwr-clientapp", "--help"])
    assert started == [
        ["fedhead-superexec", "--runtime-api-address", "127.0.0.1:9094", "--insecure"],
        ["flwr-clientapp", "--help"],
    ]
    assert launcher.PIPE == -1


def test_tune_replaces_the_names_of_flwrs_loop(monkeypatch):
    loop = importlib.import_module(supernode.SUPERNODE_LOOP)
    monkeypatch.setattr(loop, "time", loop.time)
    monkeypatch.setattr(loop, "subprocess", loop.subprocess)
    real_subprocess = loop.subprocess
    supernode.tune(loop, 0.5, 0.05)
    assert isinstance(loop.time, supernode.LoopClock) and loop.time.waits == {3: 0.5, 0.5: 0.05}
    assert isinstance(loop.subprocess, supernode.SuperExecLauncher) and loop.subprocess.module is real_subprocess
    with pytest.raises(RuntimeError, match="not flwr 1.42's module"):
        supernode.tune(loop, 0.5, 0.05)  # tuned twice: no longer flwr's modules


OUT_OF_RANGE = [("--idle-pull", "0"), ("--idle-pull", "nan"), ("--reply-check", "61"), ("--pull-retry", "x")]


@pytest.mark.parametrize(("flag", "value"), OUT_OF_RANGE)
def test_a_wait_out_of_range_is_one_error_line(flag, value):
    res = subprocess.run(
        [sys.executable, "-m", "fedhead.cli.supernode", flag, value, "--insecure"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(f"fedhead-supernode: error: argument {flag}")


def test_help_shows_fedheads_flags_then_flwrs():
    res = subprocess.run(
        [sys.executable, "-m", "fedhead.cli.supernode", "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    ours, flwrs = res.stdout.index("--idle-pull"), res.stdout.index("--superlink")
    assert ours < flwrs and "--reply-check" in res.stdout and "--pull-retry" in res.stdout
