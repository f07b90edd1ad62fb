"""``privacy:`` (settings/privacy.py): validated once, where the config is built, as every section."""

from __future__ import annotations

import pytest

from fedhead.analysis.procedure import ConfigError
from fedhead.driver.errors import EXIT_USAGE, exit_code
from fedhead.settings.config import compose_config, load_config
from fedhead.settings.privacy import DEFAULT_MIN_ROWS, PrivacyPolicy


def test_the_default_minimum_reaches_every_job():
    cfg = load_config(compose_config(["procedure=exact"]))
    assert cfg.privacy == PrivacyPolicy() and cfg.privacy.min_rows == DEFAULT_MIN_ROWS == 10
    assert all(job.privacy.min_rows == 10 for job in cfg.jobs("out"))
    assert load_config(compose_config(["procedure=exact", "privacy.min_rows=25"])).jobs("out")[0].privacy.min_rows == 25


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("privacy.min_rows=0", "privacy.min_rows must be an integer >= 1 (1: no minimum beyond C + 1 rows), got 0"),
        ("privacy.min_rows=2.5", "privacy.min_rows must be an integer >= 1"),
        ("privacy.min_rows=true", "privacy.min_rows must be an integer >= 1"),
        ("+privacy.mode=secure", "privacy: unknown keys ['mode']; expected some of ['min_rows']"),
    ],
)
def test_a_bad_privacy_setting_is_one_usage_error(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(compose_config(["procedure=exact", override]))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert exit_code(err.value) == EXIT_USAGE


def test_a_site_raises_its_minimum_never_lowers_it():
    policy = PrivacyPolicy(min_rows=10)
    assert policy.at_site(None) == (10, "privacy.min_rows")
    assert policy.at_site(4) == (10, "privacy.min_rows")
    assert policy.at_site(40) == (40, "node config min-rows")
    for bad in (0, "40", 2.0, True):
        with pytest.raises(ConfigError, match="node config min-rows must be an integer >= 1"):
            policy.at_site(bad)
