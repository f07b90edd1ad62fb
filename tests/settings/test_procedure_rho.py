"""A procedure is what its name says: the top-level ``rho=`` sets the proximal weight of the
procedures that have a proximal term only, and ``procedure.rho=`` that would give ``ordinary``,
``corrected`` or ``centered`` one is refused with one line."""

from __future__ import annotations

import pytest

from fedhead.analysis.constraints import ConfigError
from fedhead.settings.config import compose_config, load_config


def _rhos(tmp_path, *overrides: str) -> dict[str, float]:
    cfg = load_config(compose_config(list(overrides)))
    return {job.procedure.name: job.procedure.rho for job in cfg.jobs(tmp_path)}


@pytest.mark.parametrize("name", ["ordinary", "corrected", "centered"])
def test_the_default_experiments_rho_leaves_procedures_without_a_proximal_term_alone(tmp_path, name):
    # the default experiment (quickstart) sets rho: 1e-5 at the top level
    assert _rhos(tmp_path, f"procedure={name}") == {name: 0.0}
    assert _rhos(tmp_path, f"procedure={name}", "rho=1e-2") == {name: 0.0}


def test_the_top_level_rho_sets_the_procedures_with_a_proximal_term(tmp_path):
    assert _rhos(tmp_path) == {"proximal": 1e-5, "corrected_proximal": 1e-5}
    assert _rhos(tmp_path, "procedure=proximal", "rho=1e-4") == {"proximal": 1e-4}
    assert _rhos(tmp_path, "procedure=proximal", "rho=0") == {"proximal": 0.0}  # the rho sweep's rho = 0
    assert _rhos(tmp_path, "experiment=single", "procedure=proximal") == {"proximal": 1e-3}


def test_an_experiment_list_applies_rho_to_its_proximal_procedures_only(tmp_path):
    rhos = _rhos(tmp_path, "experiment.procedures=[ordinary,proximal,corrected,corrected_proximal]", "rho=1e-2")
    assert rhos == {"ordinary": 0.0, "proximal": 1e-2, "corrected": 0.0, "corrected_proximal": 1e-2}


@pytest.mark.parametrize("name", ["ordinary", "corrected", "centered"])
def test_giving_a_procedure_without_a_proximal_term_one_is_refused(name):
    with pytest.raises(ConfigError, match=rf"^procedure {name} has no proximal term .*procedure=proximal") as err:
        load_config(compose_config([f"procedure={name}", "procedure.rho=1e-3"]))
    assert "\n" not in str(err.value)
