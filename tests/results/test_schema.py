"""results.json's schema: round trip, version and key checks, agreement with docs/outputs.md."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedhead.results import schema
from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import (
    ABSENT,
    DatasetInfo,
    LocalOptimality,
    LocalSteps,
    Results,
    SchemaError,
    Timing,
)
from fedhead.results.schema_doc import replace_section

SCHEMA_PAGE = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"


def _round(t: int, **kw) -> RoundRecord:
    rng = np.random.default_rng(t)
    a = rng.normal(size=(2, 2))
    return RoundRecord(
        round=t,
        gram=a @ a.T,
        bias=rng.normal(size=2),
        e_f_star=0.1 * t,
        e_f_cen=None,
        e_f_within=0.3,
        d_star=0.01,
        d_cen=0.02,
        d_within=0.03,
        e_f_reference=0.1 * t,
        recursion_gram=None if t == 0 else np.eye(2),
        e_f_recursion=0.0,
        trajectory_error=None,
        predicted_gram=2 * np.eye(2),
        **kw,
    )


def _results() -> Results:
    return Results(
        schema_version=schema.SCHEMA_VERSION,
        status="completed",
        procedure={"name": "ordinary", "gamma": 0.0},
        reference="star",
        config={"seed": 0},
        seeds={"seed": 0},
        git_revision="abc",
        provenance={"git_revision": "abc"},
        dataset=DatasetInfo(name="hopper", num_clients=2, counts=[3, 4]),
        diagnosis={"rel_gap": 0.2},
        moments=None,
        targets={"g_star": np.eye(2).tolist(), "g_cen": None},
        rounds=[
            _round(0),
            _round(
                1,
                objective_gaps=[1e-3, 2e-3],
                client_metrics=[{"train_seconds": 1.5}, {"train_seconds": 2.0}],
                extra={"mismatch_removed": 0.5, "alignment_gram_error": None},
            ),
        ],
        timing=Timing(startup_seconds=None, total_seconds=3.0, round_local_seconds=[1.0]),
        local_optimality=LocalOptimality(
            threshold=1e-2,
            rounds_above_threshold=[],
            last_round_max_trained_gap=2e-3,
            last_round_max_objective_gap=2e-3,
            reached=True,
        ),
    )


def test_round_trip(tmp_path):
    res = _results()
    path = schema.write(tmp_path / "results.json", res)
    raw = json.loads(path.read_text())
    assert "error" not in raw and "figures" not in raw  # ABSENT keys are left out
    assert raw["timing"] == {"startup_seconds": None, "round_local_seconds": [1.0], "total_seconds": 3.0}
    assert raw["rounds"][1]["mismatch_removed"] == 0.5 and raw["rounds"][1]["alignment_gram_error"] is None
    back = schema.read(path)
    assert back.to_dict() == raw
    assert back.error is ABSENT and back.timing.total_seconds == 3.0 and back.timing.startup_seconds is None
    assert isinstance(back.rounds[1].recursion_gram, np.ndarray) and back.rounds[0].recursion_gram is None
    np.testing.assert_array_equal(back.rounds[1].gram, res.rounds[1].gram)
    assert back.rounds[1].extra == {"mismatch_removed": 0.5, "alignment_gram_error": None}
    assert back.last.e_f_star == pytest.approx(0.1) and back.name == "ordinary"
    assert back.local_optimality.reached is True


@pytest.mark.parametrize("version", [0, 2, "1", None, True])
def test_unknown_version_is_refused(tmp_path, version):
    raw = _results().to_dict()
    raw["schema_version"] = version
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(SchemaError, match=r"schema_version .* is not one this fedhead reads"):
        schema.read(path)


def test_the_previous_version_is_read_through_its_upgrade(tmp_path, monkeypatch):
    """A bump: ``git_revision`` changes meaning in version 2 (say, upper case); a version-1 file
    is still read, through its upgrade."""

    def upgrade(d):
        return {**d, "git_revision": d["git_revision"].upper(), "schema_version": 2}

    raw = _results().to_dict()
    path = tmp_path / "results.json"
    path.write_text(json.dumps(raw))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(schema, "UPGRADES", {1: upgrade})
    res = schema.read(path)
    assert res.schema_version == 2 and res.git_revision == "ABC"
    monkeypatch.setattr(schema, "UPGRADES", {1: lambda d: d})  # an upgrade that forgets the version
    with pytest.raises(SchemaError, match="did not give 2"):
        schema.read(path)
    monkeypatch.setattr(schema, "UPGRADES", {})
    with pytest.raises(SchemaError, match=r"schema_version 1 is not one this fedhead reads \(2\)"):
        schema.read(path)


def _local_steps() -> LocalSteps:
    return LocalSteps(
        local_epochs=5,
        rounds=[2, 2],
        epochs=[4, 10],
        steps=[8, 30],
        fixed_epochs=[10, 10],
        fixed_steps=[20, 30],
        ratios=[2.5, 1.0],
        median_ratio=1.75,
    )


def test_local_steps_round_trip_and_old_files_without_them_load(tmp_path):
    res = _results()
    res.local_steps = _local_steps()
    path = schema.write(tmp_path / "results.json", res)
    raw = json.loads(path.read_text())
    assert raw["local_steps"]["fixed_steps"] == [20, 30] and raw["local_steps"]["median_ratio"] == 1.75
    back = schema.read(path)
    assert back.local_steps == _local_steps() and back.to_dict() == raw
    # a results.json written before local_steps existed: same version, the key absent
    del raw["local_steps"]
    path.write_text(json.dumps(raw))
    old = schema.read(path)
    assert old.local_steps is ABSENT and old.schema_version == 1 and "local_steps" not in old.to_dict()
    raw["local_steps"] = {"local_epochs": 5}
    with pytest.raises(SchemaError, match="local_steps: missing key.*rounds"):
        schema.from_dict(raw)


def test_missing_keys_are_named(tmp_path):
    raw = _results().to_dict()
    del raw["status"]
    with pytest.raises(SchemaError, match="missing key.*status"):
        schema.from_dict(raw)
    raw = _results().to_dict()
    del raw["rounds"][1]["e_f_cen"]
    with pytest.raises(SchemaError, match="e_f_cen"):
        schema.from_dict(raw)
    raw = _results().to_dict()
    del raw["timing"]
    with pytest.raises(SchemaError, match="timing"):
        schema.from_dict(raw)
    path = tmp_path / "results.json"
    path.write_text("{not json")
    with pytest.raises(SchemaError, match="not JSON"):
        schema.read(path)


def test_array_fields_are_declared_not_listed():
    arrays = {f for f, meta in RoundRecord.__dataclass_fields__.items() if meta.metadata["array"]}
    assert arrays == {"gram", "bias", "recursion_gram", "predicted_gram"}
    rec = RoundRecord.from_dict(_round(1).to_dict())
    assert all(isinstance(getattr(rec, f), np.ndarray) for f in arrays)


def test_schema_page_matches_the_schema():
    text = SCHEMA_PAGE.read_text(encoding="utf-8")
    assert replace_section(text) == text, (
        "docs/outputs.md's results.json section is stale: python -m fedhead.results.schema_doc docs/outputs.md"
    )
    for key in ("client_local_seconds", "round_local_seconds", "figures_wait_seconds", "local_seconds"):
        assert f"`{key}`" in text
