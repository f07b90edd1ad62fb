"""``fedhead-sweep`` refuses bad input with one line and exit status 2, before writing anything."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _fedhead_sweep_checks(args: list[str]) -> int:
    """What ``fedhead-sweep ARGS`` does before its first output, in process: the composed config,
    :func:`typed_config` (with the preset plan) and the one-line report."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from fedhead.cli.sweep import typed_config
    from fedhead.driver.errors import report

    try:
        GlobalHydra.instance().clear()
        with initialize_config_module(config_module="fedhead.conf", version_base=None):
            cfg = compose(config_name="sweep", overrides=args)
        typed_config(cfg)
    except SystemExit as exc:
        return exc.code
    except Exception as exc:  # noqa: BLE001 - the CLI reports every error as one line
        return report("fedhead-sweep", exc)
    finally:
        GlobalHydra.instance().clear()
    return 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["sweep=foo", "out={out}"], "is not a preset"),
        (["sweep=foo", "out={out}"], "or all"),
        (["scale=huge", "out={out}"], "choose one of ['cpu', 'paper', 'smoke']"),
        (["out={out}", "data_roots.beijing={out}/missing"], "is not a folder"),
        (["out={out}", "data_roots.mnist=/tmp"], "Could not override 'data_roots.mnist'"),
        (["out={out}", "foo.bar=1"], "Could not override 'foo.bar'"),
        (["out={out}", "settings=[mnist]"], "unknown data sets"),
        (["out={out}", "seeds=3"], "seeds must be a list"),
        (["out={out}", "sweep=data_size", "settings=[hopper]"], "has no run on settings"),
        (["out={out}", "sweep=rho", "runs=[rho/nope/*]"], "no run id matches"),
        (["out={out}", "sweep=all", "presets=[main,nope]"], "presets: unknown ['nope']"),
        (["out={out}", "sweep=all", "settings=[mnist]"], "unknown data sets"),
        (["out={out}", "parallel_runs=0"], "parallel_runs must be an integer >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    out = tmp_path / "sweep"
    assert _fedhead_sweep_checks([a.format(out=out) for a in args]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedhead-sweep: error: ") and message in lines[0], lines
    assert not out.exists()


def test_the_console_command_refuses_bad_input_with_one_line_and_exit_2(tmp_path):
    """The same path as a user's shell: the real entry point in its own process."""
    cmd = [sys.executable, "-m", "fedhead.cli.sweep"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith("fedhead-sweep: error: out= is required"), proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_out_folder_of_another_sweep_is_refused(tmp_path):
    from fedhead.analysis.constraints import ConfigError
    from fedhead.sweep.manifest import Manifest

    Manifest(tmp_path, "main", "smoke").write()
    with pytest.raises(ConfigError, match="belongs to sweep=main scale=smoke"):
        Manifest(tmp_path, "rho", "smoke")


@pytest.mark.parametrize("module, prog", [("run", "fedhead-run"), ("data", "fedhead-data")])
def test_a_mistyped_override_of_the_other_hydra_clis_is_one_line(capsys, monkeypatch, module, prog):
    """The console entry points of ``fedhead-run`` and ``fedhead-data``, in process (the sweep's
    runs in a real process in the test above): Hydra's one composition fails, one line, status 2."""
    import importlib

    from hydra.core.global_hydra import GlobalHydra

    main = importlib.import_module(f"fedhead.cli.{module}").main
    monkeypatch.setattr(sys, "argv", [prog, "foo.bar=1"])
    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        GlobalHydra.instance().clear()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == f"{prog}: error: Could not override 'foo.bar'. Key 'foo' is not in struct"
