"""A site's ledger (fedhead/clients/ledger.py): it survives a restart of the node, refuses a release over
the site's epsilon budget before it is recorded, refuses a sum id begun before (in any run, from its one
record of them), and is written atomically."""

from __future__ import annotations

import json
import os

import pytest
from flwr.app import Context, RecordDict

from fedhead.clients.ledger import LEDGER_DIR, SiteLedger, run_scope
from fedhead.clients.policy import PolicyRefusal, parse_policy, release_epsilon


def _context(tmp_path, run_id: int = 3, **node) -> Context:
    config = {"data-path": "/site/a.csv", "state-dir": str(tmp_path / "state"), **node}
    return Context(run_id=run_id, node_id=9, node_config=config, state=RecordDict(), run_config={})


def test_the_ledger_survives_a_restart_and_refuses_over_the_budget(tmp_path):
    one = release_epsilon([1.0], 3, 1e-5)
    budget = release_epsilon([1.0, 1.0, 1.0, 20.0], 3, 1e-5) * 1.0001  # three releases at z = 1 and one at 20
    policy = parse_policy({"epsilon-budget": budget}, "f")
    first = SiteLedger(_context(tmp_path, run_id=1))
    first.begin_sum("run 1", "exchange", policy, noise=1.0, sites=3)
    first.begin_sum("run 1", "train-1", policy, noise=1.0, sites=3)
    assert first.spent(3, 1e-5) == pytest.approx(release_epsilon([1.0] * 2, 3, 1e-5))
    assert first.spent(3, 1e-5) < 2 * one  # Renyi composition within a noise level
    # the node restarts: a fresh context, the same state-dir
    again = SiteLedger(_context(tmp_path, run_id=2))
    assert again.file == first.file and again.file is not None
    assert again.file.parent.name == LEDGER_DIR
    again.begin_sum("run 2", "exchange", policy, noise=1.0, sites=3)
    with pytest.raises(PolicyRefusal) as err:
        again.begin_sum("run 2", "train-1", policy, noise=1.0, sites=3)
    assert str(err.value) == (
        f"refused by this site's privacy policy (f epsilon-budget={budget}): this release would take the site "
        "over its budget"
    )
    assert len(again.read()["releases"]) == 3  # the refused release was not recorded
    assert release_epsilon([1.0] * 4, 3, 1e-5) > budget  # a fourth at z = 1 would not fit ...
    # ... but more noise costs less: a release at z = 20 still fits
    again.begin_sum("run 2", "train-1", policy, noise=20.0, sites=3)
    assert again.spent(3, 1e-5) <= budget


def test_a_budget_needs_a_state_dir(tmp_path):
    context = Context(run_id=1, node_id=9, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    ledger = SiteLedger(context)
    assert ledger.file is None  # the context state: a simulation's sites
    with pytest.raises(PolicyRefusal, match=r"\(f epsilon-budget=1.0\): the ledger needs the node config state-dir"):
        ledger.begin_sum("run 1", "exchange", parse_policy({"epsilon-budget": 1.0}, "f"), noise=1.0, sites=3)
    ledger.begin_sum("run 1", "exchange", parse_policy({}, "f"), noise=0.0, sites=3)
    assert ledger.read() == {"runs": {}, "releases": []}  # nothing charged, no id recorded until the sum begins


def test_runs_are_kept_apart_and_a_refusal_stays(tmp_path):
    context = _context(tmp_path, run_id=4)
    assert run_scope(context) == "run 4" and run_scope(context, "abc") == "run 4 job abc"
    ledger = SiteLedger(context)
    ledger.answer_once("run 4", "regime")
    with pytest.raises(PolicyRefusal, match="^refused: this site answers the regime question once per run$"):
        ledger.answer_once("run 4", "regime")
    ledger.answer_once("run 4 job abc", "regime")
    assert ledger.refusal("run 4") is None
    ledger.refuse_run("run 4", "first line")
    assert str(ledger.refuse_run("run 4", "second line")) == "first line"  # the first refusal's line stays
    assert SiteLedger(_context(tmp_path, run_id=5)).refusal("run 4") == "first line"  # after a restart too
    assert ledger.refusal("run 4 job abc") is None


def test_each_site_of_a_shared_state_dir_has_its_own_ledger(tmp_path):
    a = SiteLedger(_context(tmp_path))
    b = SiteLedger(_context(tmp_path, **{"data-path": "/site/b.csv"}))
    c = SiteLedger(_context(tmp_path, **{"data-path": "", "partition-id": 2}))
    assert len({a.file, b.file, c.file}) == 3 and c.file is not None and c.file.name == "partition-2.json"


def test_a_write_is_atomic_and_a_damaged_ledger_refuses(tmp_path, monkeypatch):
    ledger = SiteLedger(_context(tmp_path))
    policy = parse_policy({"epsilon-budget": 100.0}, "f")
    ledger.begin_sum("run 1", "exchange", policy, noise=1.0, sites=3)
    assert ledger.file is not None
    before = ledger.file.read_bytes()

    def crash(src, dst):
        raise OSError("the disk is gone")

    monkeypatch.setattr(os, "replace", crash)  # the write fails before the new file takes the old one's place
    with pytest.raises(OSError):
        ledger.begin_sum("run 1", "train-1", policy, noise=1.0, sites=3)
    monkeypatch.undo()
    assert ledger.file.read_bytes() == before  # the previous ledger, whole
    assert [p.name for p in ledger.file.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert json.loads(before)["releases"] == [{"run": "run 1", "sum": "exchange", "noise": 1.0}]
    ledger.file.write_text("{not json")
    with pytest.raises(PolicyRefusal, match="^refused: this site's privacy ledger is damaged"):
        ledger.begin_sum("run 1", "train-1", policy, noise=1.0, sites=3)
    with pytest.raises(PolicyRefusal, match="damaged"):
        ledger.refusal("run 1")


def _take_part(ledger: SiteLedger, scope: str, name: str) -> None:
    """What a site does for a phase message naming a sum: the ledger's check, then the sum's record of its id
    (fedhead.clients.secure.begin_sum)."""
    ledger.begin_sum(scope, name, parse_policy({}, "f"), noise=0.0, sites=3)
    ledger.with_used_sum_ids(lambda used: used.add(name))


@pytest.mark.parametrize("state_dir", [True, False])
def test_a_sum_id_is_refused_in_its_run_and_every_other_from_one_record(tmp_path, state_dir):
    """One record of the sum ids: a replayed phase message (the same run) and a repeated id (another run, after
    the node restarted: a fresh context on the same state-dir) get the same refusal; the record holds
    digests only."""
    node = {} if state_dir else {"state-dir": ""}
    ledger = SiteLedger(_context(tmp_path, run_id=1, **node))
    _take_part(ledger, "run 1", "tag/exchange")
    line = r"^refused: secure sum tag/exchange was begun before \(one release per sum id, over all runs\)$"
    with pytest.raises(PolicyRefusal, match=line):
        ledger.begin_sum("run 1", "tag/exchange", parse_policy({}, "f"), noise=0.0, sites=3)
    later = SiteLedger(_context(tmp_path, run_id=2, **node)) if state_dir else ledger
    with pytest.raises(PolicyRefusal, match=line):
        later.begin_sum("run 2", "tag/exchange", parse_policy({}, "f"), noise=0.0, sites=3)
    _take_part(later, "run 2", "tag/train-1")
    doc = later.read()
    assert set(doc) == {"runs", "releases", "used-sum-ids"} and "exchange" not in json.dumps(doc)
    with pytest.raises(PolicyRefusal, match=r"^refused: secure sum: a sum id is 1 to 256 printable characters"):
        later.begin_sum("run 2", "bad\nid", parse_policy({}, "f"), noise=0.0, sites=3)


def test_a_row_budget_charges_row_releases_and_refuses_over_it(tmp_path):
    """``dp-unit = "row"``: a row-level release is charged at its noise multiplier, a client-level one at half of
    it (one row moves a site's term by twice the site's sensitivity); over the budget is refused in one line
    naming the rule, and a site-unit budget refuses a row-level release (it has no site-level epsilon)."""
    budget = release_epsilon([2.0, 1.0], 3, 1e-6) * 1.0001  # the row exchange at z = 2 and a round at z_c = 2
    policy = parse_policy({"epsilon-budget": budget, "dp-unit": "row", "dp-delta": 1e-6}, "f")
    assert policy.dp_unit == "row"
    ledger = SiteLedger(_context(tmp_path))
    ledger.begin_sum("run 1", "exchange", policy, noise=2.0, sites=3, unit="row")
    ledger.begin_sum("run 1", "train-1", policy, noise=2.0, sites=3)
    assert ledger.spent(3, 1e-6, unit="row") == pytest.approx(release_epsilon([2.0, 1.0], 3, 1e-6))
    assert ledger.read()["releases"][0]["unit"] == "row" and "unit" not in ledger.read()["releases"][1]
    with pytest.raises(PolicyRefusal) as err:
        ledger.begin_sum("run 2", "exchange", policy, noise=2.0, sites=3, unit="row")
    assert str(err.value) == (
        f"refused by this site's privacy policy (f epsilon-budget={budget}): this release would take the site "
        "over its budget"
    )
    assert "\n" not in str(err.value) and len(ledger.read()["releases"]) == 2  # not recorded
    site_unit = parse_policy({"epsilon-budget": 100.0}, "g")
    other = SiteLedger(_context(tmp_path / "other"))
    with pytest.raises(PolicyRefusal, match=r"\(g epsilon-budget=100.0\): a row-level release has no site-level"):
        other.begin_sum("run 1", "exchange", site_unit, noise=50.0, sites=3, unit="row")
    assert other.read()["releases"] == []
    with pytest.raises(PolicyRefusal, match=r"dp-unit must be site or row, got 'person'"):
        parse_policy({"dp-unit": "person"}, "f")


def test_a_training_round_over_the_budget_is_refused_in_the_row_unit(tmp_path):
    """A round's DP-SGD is charged before training, composed with the releases by one accountant; over the
    budget, a round trained twice and a site-unit budget are refused in one line naming the rule."""
    from fedhead.federation.run_privacy import TrainingRelease, run_epsilon

    training = TrainingRelease(noise_multiplier=1.0, sample_rate=0.1, steps=20)
    # the exchange (client-level z = 4, z / 2 = 2 in the row unit) and two rounds fit, a third does not
    budget = run_epsilon([2.0], (), training, 2, 1e-5) * 1.0001
    assert run_epsilon([2.0], (), training, 3, 1e-5) > budget
    policy = parse_policy({"epsilon-budget": budget, "dp-unit": "row"}, "f")
    ledger = SiteLedger(_context(tmp_path))
    ledger.begin_sum("run 1", "exchange", policy, noise=4.0, sites=3)
    ledger.charge_training("run 1", 1, policy, training)
    ledger.charge_training("run 1", 2, policy, training)
    spent = run_epsilon([2.0], (), training, 2, 1e-5)
    assert ledger.spent(3, 1e-5, unit="row") == pytest.approx(spent, rel=1e-12)
    with pytest.raises(PolicyRefusal) as err:
        ledger.charge_training("run 1", 3, policy, training)
    assert str(err.value) == (
        f"refused by this site's privacy policy (f epsilon-budget={budget}): this training round would take the "
        "site over its budget"
    )
    assert len(ledger.read()["releases"]) == 3  # the refused round was not recorded
    with pytest.raises(PolicyRefusal, match=r"^refused: training round 2 was already trained in this run"):
        ledger.charge_training("run 1", 2, policy, TrainingRelease(1.0, 0.1, 1))
    ledger.charge_training("run 1", 3, parse_policy({}, "f"), training)  # no budget: nothing charged
    assert len(ledger.read()["releases"]) == 3
    site_unit = parse_policy({"epsilon-budget": 100.0}, "g")
    with pytest.raises(PolicyRefusal, match=r"\(g epsilon-budget=100.0\): a training round has no site-level"):
        SiteLedger(_context(tmp_path / "other")).charge_training("run 1", 1, site_unit, training)
