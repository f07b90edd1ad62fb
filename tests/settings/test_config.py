"""The Hydra reader: the procedures a run knows are the files of ``conf/procedure/``, and a
procedure that combines existing switches differently is one new yaml file."""

from __future__ import annotations

import shutil

import pytest

from fedhead.settings import config as config_module
from fedhead.settings.config import ConfigError, compose_config, conf_dir, load_config, procedure_names
from fedhead.train import LocalProblem

#: a procedure no code names: centring combined with the proximal term
NEW_PROCEDURE = """\
_target_: fedhead.settings.procedure.ProcedureConfig
name: centered_proximal
rho: 2.0e-3
centered: true
"""


@pytest.fixture
def conf_copy(tmp_path, monkeypatch):
    """A copy of the config tree with one new procedure file, used as the run's config tree."""
    root = tmp_path / "conf"
    shutil.copytree(str(conf_dir()), root, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    (root / "procedure" / "centered_proximal.yaml").write_text(NEW_PROCEDURE)
    monkeypatch.setattr(config_module, "conf_dir", lambda: root)
    return root


def test_the_procedures_are_the_files_of_conf_procedure():
    names = procedure_names()
    files = sorted(p.name.removesuffix(".yaml") for p in conf_dir().joinpath("procedure").iterdir())
    assert names == tuple(files)
    assert {"ordinary", "proximal", "corrected", "centered", "exact", "full_model"} <= set(names)
    with pytest.raises(ConfigError, match=r"unknown procedures \['nope'\]; choose from \("):
        load_config(compose_config(["experiment=single", "experiment.procedures=[ordinary,nope]"]))


def test_a_procedure_of_existing_switches_is_one_yaml_file(conf_copy, tmp_path):
    from fedhead.driver.server import make_job_strategy
    from fedhead.strategies import HeadAveraging

    assert "centered_proximal" in procedure_names()
    # selected on its own ...
    job = load_config(compose_config(["experiment=single", "procedure=centered_proximal", "lambda_h=0.02"])).jobs(
        tmp_path
    )[0]
    proc = job.procedure
    assert (proc.name, proc.rho, proc.gamma, proc.centered, proc.align, proc.full_model, proc.exact) == (
        "centered_proximal",
        2e-3,
        0.0,
        True,
        False,
        False,
        False,
    )
    assert proc.reference == "within" and proc.strategy_kind == "head"
    assert job.output_dir == tmp_path / "centered_proximal"
    # ... the trainer and the server act on its switches
    assert job.local_problem() == LocalProblem(
        epochs=job.settings.local_epochs, lambda_h=0.02, lambda_w=job.settings.lambda_w, rho=2e-3, center_targets=True
    )
    strategy = make_job_strategy(job, observer=None)
    assert type(strategy) is HeadAveraging and strategy.centered and strategy.gamma == 0.0
    # ... and in an experiment's list, read from its file
    cfg = load_config(compose_config(["experiment=single", "experiment.procedures=[ordinary,centered_proximal]"]))
    assert [p.name for p in cfg.procedures] == ["ordinary", "centered_proximal"]
    assert cfg.procedures[1] == proc


def test_a_procedure_file_must_carry_its_own_name(conf_copy):
    (conf_copy / "procedure" / "renamed.yaml").write_text(NEW_PROCEDURE)
    with pytest.raises(ConfigError, match=r"renamed.yaml declares name 'centered_proximal'"):
        load_config(compose_config(["experiment=single", "experiment.procedures=[renamed]"]))
