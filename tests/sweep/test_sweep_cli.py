"""``fedhead-sweep`` refuses bad input with one line and exit status 2, before writing anything."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "out= is required"),
        (["sweep=foo", "out={out}"], "is not a preset"),
        (["scale=huge", "out={out}"], "choose smoke or paper"),
        (["out={out}", "data_roots.beijing={out}/missing"], "is not a folder"),
        (["out={out}", "data_roots.mnist=/tmp"], "Could not override 'data_roots.mnist'"),
        (["out={out}", "foo.bar=1"], "Could not override 'foo.bar'"),
        (["out={out}", "settings=[mnist]"], "unknown data sets"),
        (["out={out}", "seeds=3"], "seeds must be a list"),
        (["out={out}", "sweep=rho", "settings=[mpiigaze]"], "has no run on settings"),
        (["out={out}", "parallel_runs=0"], "parallel_runs must be an integer >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "fedhead.cli.sweep", *[a.format(out=out) for a in args]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedhead-sweep: error: ") and message in lines[0], proc.stderr
    assert not out.exists()


def test_an_out_folder_of_another_sweep_is_refused(tmp_path):
    from fedhead.analysis.procedure import ConfigError
    from fedhead.sweep.manifest import Manifest

    Manifest(tmp_path, "main", "smoke").write()
    with pytest.raises(ConfigError, match="belongs to sweep=main scale=smoke"):
        Manifest(tmp_path, "rho", "smoke")


@pytest.mark.parametrize("module, prog", [("fedhead.cli.run", "fedhead-run"), ("fedhead.cli.data", "fedhead-data")])
def test_a_mistyped_override_of_the_other_hydra_clis_is_one_line(tmp_path, module, prog):
    proc = subprocess.run(
        [sys.executable, "-m", module, "foo.bar=1"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{prog}: error: Could not override 'foo.bar'. Key 'foo' is not in struct"
    assert list(tmp_path.iterdir()) == []
