"""A site's ledger (fedhead/clients/ledger.py): it survives a restart of the node, refuses a release over
the site's epsilon budget before it is recorded, refuses a sum begun twice, and is written atomically."""

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
    assert "train-1" not in again.read()["runs"]["run 2"]["sums"]
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
    assert ledger.read()["runs"]["run 1"]["sums"] == ["exchange"]
    with pytest.raises(PolicyRefusal, match=r"^refused: secure sum exchange was already begun in this run"):
        ledger.begin_sum("run 1", "exchange", parse_policy({}, "f"), noise=0.0, sites=3)
    ledger.begin_sum("run 2", "exchange", parse_policy({}, "f"), noise=0.0, sites=3)  # another run


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


def test_a_training_round_over_the_budget_is_refused_in_the_row_unit(tmp_path):
    from fedhead.federation.run_privacy import TrainingRelease, run_epsilon

    training = TrainingRelease(noise_multiplier=1.0, sample_rate=0.1, steps=20)
    # the exchange (client-level z = 4, z / 2 = 2 in the row unit) and two rounds fit, a third does not
    budget = run_epsilon([2.0], (), training, 2, 1e-5) * 1.0001
    assert run_epsilon([2.0], (), training, 3, 1e-5) > budget
    policy = parse_policy({"epsilon-budget": budget}, "f")
    ledger = SiteLedger(_context(tmp_path))
    ledger.begin_sum("run 1", "exchange", policy, noise=4.0, sites=3)
    ledger.charge_training("run 1", 1, policy, training)
    ledger.charge_training("run 1", 2, policy, training)
    assert ledger.spent(3, 1e-5) == pytest.approx(run_epsilon([2.0], (), training, 2, 1e-5), rel=1e-12)
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
