"""A site's own privacy policy (fedhead/clients/policy.py): where it is read from, what each rule
refuses and with which line (the rule, never a row value or a count)."""

from __future__ import annotations

import json

import pytest
from flwr.app import Context, RecordDict

from fedhead.clients.messages import ClientError
from fedhead.clients.policy import (
    DEFAULT_DELTA,
    PolicyRefusal,
    SitePolicy,
    parse_policy,
    release_epsilon,
    site_policy,
)
from fedhead.federation.privacy_noise import privacy_spent
from fedhead.settings.privacy import PrivacyPolicy


def _context(node_config: dict) -> Context:
    return Context(run_id=5, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def test_no_rule_is_the_permissive_default_that_keeps_the_runs_settings():
    policy = site_policy(_context({"partition-id": 0, "data-path": "/x.csv", "state-dir": "/s"}))
    assert policy == SitePolicy() and not policy.enforced and not policy.secure_only
    assert policy.row_minimum(10) == (10, "privacy.min_rows")
    assert policy.row_minimum(3) == (3, "privacy.min_rows")
    policy.check_run(PrivacyPolicy())  # nothing refused
    policy.check_reveal(2, 0)


def test_a_policy_file_in_toml_or_json_and_the_node_config_together(tmp_path):
    toml = tmp_path / "policy.toml"
    toml.write_text('# the site of St. Elsewhere\nmode = "secure"\nmin-survivors = 4\ndp-noise = 1.5\n')
    policy = site_policy(_context({"privacy-policy": str(toml), "min-rows": 50, "epsilon-budget": 8}))
    assert policy == SitePolicy(
        mode="secure", min_rows=50, min_survivors=4, dp_noise=1.5, epsilon_budget=8.0, dp_delta=DEFAULT_DELTA
    )
    assert policy.enforced and policy.secure_only
    assert policy.named("mode") == f"{toml} mode=secure"
    assert policy.named("min-rows") == "node config min-rows=50"
    assert policy.row_minimum(5) == (50, "node config min-rows")
    js = tmp_path / "privacy.json"
    js.write_text(json.dumps({"min-rows": 20, "dp-delta": 1e-7}))
    policy = site_policy(_context({"privacy-policy": str(js), "privacy-mode": "secure"}))
    assert (policy.min_rows, policy.dp_delta, policy.mode) == (20, 1e-7, "secure")
    assert policy.named("mode") == "node config privacy-mode=secure"


def test_a_site_with_a_policy_takes_its_minimum_from_it_never_from_the_run():
    """The run's privacy.min_rows neither lowers nor raises it: one that could raise it would answer, run
    after run, whether the site has that many rows."""
    own = parse_policy({}, "f", {"min-rows": 20})
    for run_min in (1, 10, 20, 500):
        assert own.row_minimum(run_min) == (20, "node config min-rows")
    secure_only = parse_policy({}, "f", {"privacy-mode": "secure"})
    for run_min in (1, 10, 500):
        assert secure_only.row_minimum(run_min) == (10, "site policy default min-rows")


@pytest.mark.parametrize(
    ("rules", "node", "line"),
    [
        ({"mode": "open"}, {}, "f mode must be secure or clear, got 'open'"),
        ({}, {"privacy-mode": "maybe"}, "node config privacy-mode must be secure or clear, got 'maybe'"),
        ({"min-rows": 0}, {}, "f min-rows must be an integer >= 1, got 0"),
        ({}, {"min-rows": "many"}, "node config min-rows must be an integer >= 1, got 'many'"),
        ({"min-rows": 2.0}, {}, "f min-rows must be an integer >= 1, got 2.0"),
        ({"min-survivors": 1}, {}, "f min-survivors must be an integer >= 2, got 1"),
        ({"dp-noise": -1}, {}, "f dp-noise must be a finite number >= 0, got -1"),
        ({"dp-noise": True}, {}, "f dp-noise must be a finite number >= 0, got True"),
        ({"epsilon-budget": 0}, {}, "f epsilon-budget must be a finite number > 0, got 0"),
        ({"epsilon-budget": float("inf")}, {}, "f epsilon-budget must be a finite number > 0, got inf"),
        ({"dp-delta": 1}, {}, "f dp-delta must be a number in (0, 1), got 1"),
        ({"min-row": 5}, {}, "site policy f: unknown rule(s) ['min-row']"),
        (
            {"min-rows": 5},
            {"min-rows": 6},
            "site policy: min-rows is set twice, to different values (f and node config)",
        ),
    ],
)
def test_a_malformed_policy_is_refused_with_one_line_naming_the_rule(rules, node, line):
    with pytest.raises(PolicyRefusal) as err:
        parse_policy(rules, "f", node)
    assert line in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_policy_file_that_cannot_be_read_refuses_every_message(tmp_path):
    bad = tmp_path / "policy.toml"
    bad.write_text("mode = secure\n")  # not TOML: the string lacks its quotes
    for path in (bad, tmp_path / "missing.toml"):
        with pytest.raises(ClientError, match=rf"^site policy {path}: cannot read it \("):
            site_policy(_context({"privacy-policy": str(path)}))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ClientError, match="must hold one table of rules"):
        site_policy(_context({"privacy-policy": str(listed)}))


def test_each_rule_refuses_a_weaker_run_naming_itself():
    floor = parse_policy({"dp-noise": 1.0}, "/site/policy.toml")
    floor.check_run(PrivacyPolicy(mode="secure", dp_noise=1.0, dp_max_rows=50))
    floor.check_run(PrivacyPolicy(mode="secure", dp_noise=3.0, dp_max_rows=50))
    with pytest.raises(PolicyRefusal) as err:
        floor.check_run(PrivacyPolicy(mode="secure", dp_noise=0.5, dp_max_rows=50))
    assert str(err.value) == (
        "refused by this site's privacy policy (/site/policy.toml dp-noise=1.0): the run's privacy.dp_noise=0.5 "
        "is weaker"
    )
    with pytest.raises(PolicyRefusal, match=r"dp-noise=1.0\): the run's privacy.dp_noise=0 is weaker"):
        floor.check_run(PrivacyPolicy(mode="secure"))
    budget = parse_policy({"epsilon-budget": 5}, "f")
    with pytest.raises(PolicyRefusal, match=r"\(f epsilon-budget=5.0\): the run's privacy.dp_noise=0 releases exact"):
        budget.check_run(PrivacyPolicy(mode="secure"))
    budget.check_run(PrivacyPolicy(mode="secure", dp_noise=0.1, dp_max_rows=50))


def test_a_reveal_over_fewer_survivors_than_the_floor_or_the_noise_is_refused():
    policy = parse_policy({"min-survivors": 4}, "f")
    policy.check_reveal(4, 3)
    with pytest.raises(PolicyRefusal) as err:
        policy.check_reveal(3, 0)
    assert str(err.value) == (
        "refused by this site's privacy policy (f min-survivors=4): the reveal names fewer surviving sites"
    )
    with pytest.raises(PolicyRefusal, match=r"fewer surviving sites than the sum's noise was drawn for \(m_min=5"):
        SitePolicy().check_reveal(4, 5)  # every site: a noised sum over fewer sites than its noise assumed


def test_the_epsilon_of_releases_is_the_accountants():
    assert release_epsilon([], 4, 1e-5) == 0.0
    assert release_epsilon([1.0] * 3, 4, 1e-5) == privacy_spent(1.0, 3, 4, 1e-5).epsilon  # one group: Renyi
    mixed = release_epsilon([1.0, 2.0, 1.0], 4, 1e-5)  # groups of equal noise, summed
    assert mixed == privacy_spent(1.0, 2, 4, 1e-5).epsilon + privacy_spent(2.0, 1, 4, 1e-5).epsilon
    assert release_epsilon([1.0], 4, 1e-5) < release_epsilon([0.5], 4, 1e-5)  # less noise, more epsilon
