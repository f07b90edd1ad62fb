"""``procedure.name`` is the folder of a procedure's outputs and client state: a name that
leaves the run folder (``../../x``, ``a/b``) or hides in it is refused when the config is read."""

from __future__ import annotations

import pytest

from fedhead.analysis.constraints import ConfigError, safe_name
from fedhead.driver.errors import EXIT_USAGE, exit_code, one_line
from fedhead.settings.config import compose_config, load_config, load_procedure, procedure_names
from fedhead.settings.procedure import ProcedureConfig
from fedhead.sweep.presets import PRESETS, plan
from fedhead.sweep.scales import SCALES

BAD = ["../../x", "..", "a/b", "/abs", ".hidden", "a..b", "", "-x", "a b", "x\\y", "naïve"]


@pytest.mark.parametrize("bad", BAD)
def test_an_unsafe_procedure_name_is_one_config_error(tmp_path, bad):
    with pytest.raises(ConfigError) as info:
        load_config(compose_config(["procedure=ordinary", f"procedure.name='{bad}'"]))
    msg = one_line(info.value)
    assert "name must be letters, digits" in msg and repr(bad) in msg and "\n" not in str(info.value)
    assert exit_code(info.value) == EXIT_USAGE
    assert not safe_name(bad)


def test_every_built_in_procedure_and_sweep_name_is_safe(tmp_path):
    for name in procedure_names():
        assert load_procedure(name).name == name
    for preset in PRESETS:  # every sweep run's procedure, and its overrides that rename none
        for scale in SCALES:
            for run in plan(preset, scale):
                assert safe_name(run.procedure), run
                assert not any(o.startswith("procedure.name=") for o in run.overrides), run
    jobs = load_config(compose_config(["procedure=ordinary", "procedure.name=my-proc_v2.1"])).jobs(tmp_path / "run")
    assert [j.output_dir for j in jobs] == [tmp_path / "run" / "my-proc_v2.1"]
    assert ProcedureConfig("p2").name == "p2"
