"""``privacy:`` (settings/privacy.py): validated once, where the config is built, as every section."""

from __future__ import annotations

import pytest

from fedhead.analysis.constraints import ConfigError
from fedhead.driver.errors import EXIT_USAGE, exit_code
from fedhead.federation.secure_sum import check_threshold
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
        (
            "+privacy.noise=1",
            "privacy: unknown keys ['noise']; expected some of ['dp_clip', 'dp_delta', 'dp_head_clip', "
            "'dp_max_rows', 'dp_noise', 'dp_unit', 'min_rows', 'mode', 'threshold']",
        ),
        ("privacy.mode=open", "privacy.mode must be 'clear' or 'secure', got 'open'"),
        ("privacy.threshold=1", "privacy.threshold must be an integer >= 2 or null (a majority of the sites), got 1"),
        ("privacy.dp_noise=-0.5", "privacy.dp_noise must be a finite number >= 0 (0: no noise), got -0.5"),
        ("privacy.dp_noise=.inf", "privacy.dp_noise must be a finite number >= 0"),
        ("privacy.dp_clip=0", "privacy.dp_clip must be a finite number > 0, got 0"),
        ("privacy.dp_max_rows=0", "privacy.dp_max_rows must be an integer >= 1 or null, got 0"),
        ("privacy.dp_max_rows=2.5", "privacy.dp_max_rows must be an integer >= 1 or null, got 2.5"),
        ("privacy.dp_delta=1", "privacy.dp_delta must be a number in (0, 1), got 1"),
        ("privacy.dp_delta=0", "privacy.dp_delta must be a number in (0, 1), got 0"),
        ("privacy.threshold=3", "privacy.threshold=3 needs privacy.mode=secure (it is the secure sum's threshold), "),
        (
            "privacy.dp_noise=1.0",
            "privacy.dp_noise=1.0 needs privacy.mode=secure, so that the server never sees an un-noised sum, got "
            "privacy.mode=clear",
        ),
        (
            "privacy.mode=secure privacy.dp_noise=1.0",
            "privacy.dp_noise=1.0 needs privacy.dp_max_rows (the public cap K",
        ),
        (
            "num_clients=2 privacy.mode=secure",
            "privacy.mode=secure needs at least 3 sites: with two, each learns the "
            "other's statistics from the sum and its own (num_clients=2)",
        ),
        (
            "num_clients=5 privacy.mode=secure privacy.threshold=2",
            "privacy.threshold must be an integer in [3, 5] for num_clients=5 (a majority of the sites, so that no "
            "two groups of sites can reveal both shares of one site), got 2",
        ),
        ("num_clients=5 privacy.mode=secure privacy.threshold=6", "privacy.threshold must be an integer in [3, 5]"),
        (
            "privacy.mode=secure trust.clip_update=1.0 trust.max_count=100",
            "privacy.mode=secure: trust.max_count, trust.clip_update need each site's count or head",
        ),
        ("privacy.mode=secure procedure=full_model", "procedure(s) ['full_model'] average the backbones in the clear"),
        ("privacy.mode=secure measure_mismatch=true", "measure_mismatch=true needs each site's objectives"),
        ("privacy.dp_unit=rows", "privacy.dp_unit must be 'site' or 'row', got 'rows'"),
        (
            "privacy.mode=secure privacy.dp_unit=row",
            "privacy.dp_unit=row needs privacy.dp_noise > 0 (the noise multiplier of the row-level exchange)",
        ),
        (
            "privacy.mode=secure privacy.dp_noise=1 privacy.dp_max_rows=50 resume=somewhere",
            "privacy.dp_noise > 0 cannot resume: the exchange would be released again",
        ),
    ],
)
def test_a_bad_privacy_setting_is_one_usage_error(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(compose_config(["procedure=exact", *override.split()]))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert exit_code(err.value) == EXIT_USAGE


def test_the_secure_and_private_settings_reach_every_job():
    assert PrivacyPolicy() == PrivacyPolicy(
        min_rows=10, mode="clear", threshold=None, dp_noise=0.0, dp_clip=1.0, dp_max_rows=None, dp_delta=1e-5
    )
    overrides = [
        "procedure=exact",
        "num_clients=5",
        "privacy.mode=secure",
        "privacy.threshold=4",
        "privacy.dp_noise=2",
        "privacy.dp_clip=3",
        "privacy.dp_max_rows=200",
        "privacy.dp_delta=1e-6",
    ]
    policy = load_config(compose_config(overrides)).jobs("out")[0].privacy
    assert policy == PrivacyPolicy(
        mode="secure", threshold=4, dp_noise=2.0, dp_clip=3.0, dp_max_rows=200, dp_delta=1e-6
    )
    assert policy.secure and policy.threshold_for(5) == 4
    assert all(isinstance(getattr(policy, k), float) for k in ("dp_noise", "dp_clip", "dp_delta"))


def test_secure_mode_without_noise_needs_no_row_cap():
    policy = PrivacyPolicy(mode="secure")
    policy.check_sites(3)
    assert policy.threshold_for(3) == 2 and policy.threshold_for(4) == 3 and policy.threshold_for(7) == 4
    PrivacyPolicy().check_sites(2)  # clear mode: two sites are fine


@pytest.mark.parametrize("sites", range(3, 12))
def test_the_threshold_range_is_the_secure_sums(sites):
    """The settings may not import the secure sum: its range is restated there, and kept equal here."""
    for threshold in range(2, sites + 3):
        try:
            check_threshold(threshold, sites)
            accepted = True
        except ConfigError:
            accepted = False
        policy = PrivacyPolicy(mode="secure", threshold=threshold)
        if accepted:
            policy.check_sites(sites)
        else:
            with pytest.raises(ConfigError, match="privacy.threshold must be an integer in"):
                policy.check_sites(sites)
    check_threshold(PrivacyPolicy(mode="secure").threshold_for(sites), sites)


def test_the_row_unit_refuses_a_site_local_table_in_units_derived_from_the_sites():
    """``dp_unit=row`` clips rows in public units: a site-local table whose standardisation comes from the sites'
    statistics is refused in one line; one kept in its files' units, the default unit and built-in data sets are
    not."""
    row = PrivacyPolicy(mode="secure", dp_noise=4.5, dp_max_rows=100, dp_unit="row")
    assert row.row_level and not PrivacyPolicy().row_level
    for derived in [("pooled", "pooled"), ("none", "pooled"), ("pooled", "none"), ("none", "site")]:
        with pytest.raises(ConfigError, match=r"^privacy.dp_unit=row needs the targets in public units") as err:
            row.check_units(derived)
        assert "\n" not in str(err.value)
    row.check_units(("none", "none"))
    row.check_units(None)
    PrivacyPolicy(mode="secure", dp_noise=4.5, dp_max_rows=100).check_units(("pooled", "pooled"))


#: a row-level secure run whose sites train with DP-SGD
ROW_DP_SGD = ("privacy.mode=secure", "privacy.dp_unit=row", "privacy.dp_noise=1", "privacy.dp_max_rows=100")
#: DP-SGD's recipe: nothing reads a site's rows outside the private steps
DP_SGD = (
    "train.dp_noise=1.2",
    "local_tol=null",
    "train.optimal_bias=false",
    "train.solve_last_layer=false",
    "train.finish_features=false",
)


def test_a_row_level_dp_sgd_run_refuses_evaluations():
    """``privacy.dp_unit=row`` with ``train.dp_noise > 0``: an evaluation's errors would be a client-level release
    at a row-level noise multiplier; a procedure that trains is refused in one line naming the setting that
    avoids it, an exact one (nothing trained), ``resources.evaluate_mse=false``, no DP-SGD and the site unit are
    not."""
    for trains in ("procedure=proximal", "experiment.procedures=[exact,proximal]"):  # one procedure that trains
        with pytest.raises(ConfigError) as err:
            load_config(compose_config([trains, *ROW_DP_SGD, *DP_SGD]))
        message = str(err.value)
        assert message.startswith("privacy.dp_unit=row with train.dp_noise > 0: each evaluation's errors would be")
        assert "\n" not in message and "set resources.evaluate_mse=false" in message
        assert exit_code(err.value) == EXIT_USAGE
    accepted = {
        ("procedure=exact", *DP_SGD): True,  # nothing trained: closed forms of the site's own release
        ("experiment.procedures=[exact]", *DP_SGD): True,
        ("procedure=proximal", *DP_SGD, "resources.evaluate_mse=false"): True,
        ("procedure=proximal", "train.dp_noise=0"): False,  # heads noised as client-level releases
        ("procedure=exact", "train.dp_noise=0"): True,
    }
    for overrides, private_heads in accepted.items():
        (job,) = load_config(compose_config([*ROW_DP_SGD, *overrides])).jobs("out")
        assert job.private_heads is private_heads, overrides
    site_unit = [o for o in ROW_DP_SGD if o != "privacy.dp_unit=row"]
    (job,) = load_config(compose_config(["procedure=proximal", *site_unit, *DP_SGD])).jobs("out")
    assert not job.private_heads  # client-level releases: every head noised and counted
