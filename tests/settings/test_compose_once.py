"""The config of a run is composed once: ``fedhead-run``, ``fedhead-sweep`` (once for the sweep,
once per run) and a deployment's job (once per process and run config) each go through Hydra's
config loader the counted number of times."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from flwr.app import RecordDict
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra


@pytest.fixture
def compositions(monkeypatch):
    """The names of the configs Hydra composes (every composition, the CLI's and the compose API's)."""
    names: list[str] = []
    load = ConfigLoaderImpl.load_configuration

    def counting(self, config_name, *args, **kwargs):
        names.append(config_name)
        return load(self, config_name, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counting)
    GlobalHydra.instance().clear()
    yield names
    GlobalHydra.instance().clear()


def test_fedhead_run_composes_once(compositions, monkeypatch, tmp_path):
    from fedhead.cli import run

    started = []
    monkeypatch.setattr(run, "run_experiment", lambda typed, out: started.append(typed))
    monkeypatch.setattr(run, "configure_run_logging", lambda root: None)
    monkeypatch.setattr(sys, "argv", ["fedhead-run", "diagnose_only=true", f"hydra.run.dir={tmp_path / 'run'}"])
    run.main()
    assert len(started) == 1 and started[0].settings.diagnose_only
    assert compositions == ["config"]


def test_a_mistyped_override_is_one_line_and_exit_2_from_the_one_composition(compositions, monkeypatch, capsys):
    from fedhead.cli import run

    monkeypatch.setattr(run, "run_experiment", lambda typed, out: pytest.fail("the run must not start"))
    monkeypatch.setattr(sys, "argv", ["fedhead-run", "foo.bar=1"])
    with pytest.raises(SystemExit) as exit_:
        run.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "fedhead-run: error: Could not override 'foo.bar'. Key 'foo' is not in struct\n"
    assert compositions == ["config"]


def test_fedhead_sweep_composes_once_and_once_per_run(compositions, monkeypatch, tmp_path):
    from fedhead.cli import sweep
    from fedhead.sweep import runner
    from fedhead.sweep.presets import plan

    class Stop(SystemExit):
        """Raised where the sweep would write its manifest: every run's job is built by then."""

    def stop(*args, **kwargs):
        raise Stop(0)

    monkeypatch.setattr(runner, "Manifest", stop)
    argv = ["scale=smoke", f"out={tmp_path / 'sweep'}", "settings=[hopper]", "seeds=[0]"]
    monkeypatch.setattr(sys, "argv", ["fedhead-sweep", *argv])
    with pytest.raises(Stop):
        sweep.main()
    runs = plan("main", "smoke", seeds=[0], settings=["hopper"])
    assert len(runs) >= 2
    assert compositions == ["sweep"] + ["config"] * len(runs)


def test_a_deployment_job_is_composed_once_per_process_and_run_config(compositions, tmp_path):
    """The ClientApp process builds a run config's job once (the client cache keeps it); the
    ServerApp builds it once per run (one ``job_from_context`` call)."""
    from fedhead.client_app import job_of_run
    from fedhead.clients.cache import CLIENT_CACHE

    CLIENT_CACHE.clear()
    run_config = {"overrides": "diagnose_only=true seed=917", "output-dir": str(tmp_path)}
    context = SimpleNamespace(run_config=run_config, state=RecordDict())
    first = job_of_run(context)
    again = job_of_run(context)
    assert again is first and first.settings.seed == 917
    assert compositions == ["config"]
    CLIENT_CACHE.clear()
