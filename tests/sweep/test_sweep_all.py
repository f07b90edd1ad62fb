"""``fedhead-sweep sweep=all``: every preset into one folder, restart after an interrupt without
recomputing a finished run (also one that another preset ran), the time left, one report with a
verdict or a reason for every claim.

The runs train the free-feature model for 2 rounds on Hopper (``run_overrides``): the sweep's
bookkeeping is tested, not the backbones; the slow test runs every preset and checks that every
claim gets a verdict."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest

from fedhead.report.claims import FAILS, HOLDS, NOT_MEASURED, NOT_TESTABLE, VERDICTS
from fedhead.sweep import SweepConfig
from fedhead.sweep import reproduce as reproduce_mod
from fedhead.sweep import runner as runner_mod
from fedhead.sweep.reproduce import ALL, Eta, plan_all, run_all

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("ray_session")]

TINY = ("model=free", "model.feature_dim=8", "local_epochs=40", "rounds=2")


def _cfg(out: Path, cache: Path, settings: tuple[str, ...] = ("hopper",), tiny: tuple[str, ...] = TINY) -> SweepConfig:
    return SweepConfig(
        sweep="all",
        scale="smoke",
        out=out,
        settings=settings,
        run_overrides=(f"dataset.cache_dir={cache}", *tiny),
        show_progress=False,
    )


def _results(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.glob("*/runs/**/results.json")}


def _manifest(out: Path, preset: str) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads((out / preset / "manifest.json").read_text())["runs"]}


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


#: The three tests of one interrupted ``sweep=all`` (about 2 minutes of a worker) run with ``-m slow``;
#: the default suite keeps the faster tests of the same code: a restarted sweep recomputes nothing
#: (tests/sweep/test_sweep_run.py), the time left (below), the plan of every preset (below) and the
#: report's claims (tests/report/test_report.py).
@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """``sweep=all`` of main, centering and fixed_e on Hopper, interrupted after 2 of main's 4 runs,
    then started again (console lines kept), then a third time."""
    root = tmp_path_factory.mktemp("all")
    cfg = _cfg(root / "all", root / "cache")
    presets = ("main", "centering", "fixed_e")
    real = runner_mod.run_federations

    def interrupted(jobs, **kw):
        real(jobs[:2], **kw)
        raise KeyboardInterrupt

    runner_mod.run_federations = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            run_all(cfg, presets)
    finally:
        runner_mod.run_federations = real
    first = _results(cfg.out)
    done = {rid for rid, r in _manifest(cfg.out, "main").items() if r["status"] == "completed"}
    plans = {p.name: p for p in plan_all(cfg, presets)}
    lines = _Lines()
    console = logging.getLogger("fedhead.console.sweep")
    console.addHandler(lines)
    old_level = console.level
    console.setLevel(logging.INFO)
    try:
        again = run_all(cfg, presets)
    finally:
        console.removeHandler(lines)
        console.setLevel(old_level)
    third = run_all(cfg, presets)
    return {"cfg": cfg, "first": first, "done": done, "plans": plans, "again": again, "third": third, "log": lines}


@pytest.mark.slow
def test_an_interrupted_sweep_all_restarts_without_recomputing(swept):
    """The restart runs main's other 2 runs, centering's centred run and fixed_e's 4, copies
    centering's ordinary run from main's (same config) and leaves the first 2 as they were; a
    third start runs nothing."""
    cfg, first, done, plans = swept["cfg"], swept["first"], swept["done"], swept["plans"]
    assert len(first) == len(done) == 2
    assert (len(plans["main"].finished), len(plans["main"].todo)) == (2, 2)
    assert plans["centering"].copied == {"centering/hopper/ordinary/s0"}  # main runs it first
    assert len(swept["again"].ran) == 7 and not set(swept["again"].ran) & done
    assert {k: v for k, v in _results(cfg.out).items() if k in first} == first
    copied = _manifest(cfg.out, "centering")["centering/hopper/ordinary/s0"]
    assert copied["status"] == "completed" and copied["reused_from"].endswith("runs/main/hopper/ordinary/s0")
    assert swept["third"].ran == [] and swept["third"].counts["completed"] == 10


@pytest.mark.slow
def test_the_console_shows_each_preset_and_the_time_left(swept):
    text = "\n".join(swept["log"].lines)
    assert "main" in text and "2 to run" in text and "1 copied from other presets" in text
    assert "time left: main ~" in text and ", all ~" in text and "time left: fixed_e ~" in text


@pytest.mark.slow
def test_one_report_with_a_verdict_or_a_reason_for_every_claim(swept):
    """Every claim has one of the verdicts and a line saying why (the numbers, the sweep to run, the
    file it needs); C5 and C8 are shown with the tolerance stop and with fixed E side by side."""
    from fedhead.report.build import build_report

    out = swept["cfg"].out
    rep = build_report([out], out / "report")
    assert len(rep.claims) == 32
    for claim, v in rep.claims:
        assert v.status in VERDICTS and v.detail, claim.id
    by_id = {c.id: v for c, v in rep.claims}
    assert by_id["C2"].status in (HOLDS, FAILS)
    assert by_id["C20"].status == NOT_TESTABLE and "fedhead-ufm" in by_id["C20"].detail
    assert by_id["C13"].status == NOT_MEASURED and "sweep=rho" in by_id["C13"].detail
    assert rep.fixed_e is not None and rep.fixed_e.pairs == 1
    assert {k for k in rep.fixed_e.verdicts} == {(c, v) for c in ("C5", "C8") for v in ("tolerance stop", "fixed E")}
    fixed = rep.tables["table4_fixed_e"]
    assert fixed.value("warm_epochs", variant="fixed E", procedure="ordinary") == 40  # E in every round
    text = rep.markdown.read_text()
    assert "## C5 and C8: the tolerance stop against the paper's fixed E" in text and "The numbers " in text


def test_the_time_left_comes_from_finished_runs_else_the_scale(tmp_path):
    """A preset's run time: the median of its finished runs' wall times in the manifests (copied
    runs left out), else the scale's estimate; unknown where neither exists."""
    (tmp_path / "rho").mkdir()
    runs = [
        {"id": "rho/hopper/rho0/proximal/s0", "status": "completed", "wall_seconds": 100.0},
        {"id": "rho/hopper/rho1e-05/proximal/s0", "status": "completed", "wall_seconds": 300.0},
        {"id": "rho/hopper/rho0.0001/proximal/s0", "status": "completed", "wall_seconds": 5.0, "reused_from": "x"},
    ]
    (tmp_path / "rho" / "manifest.json").write_text(json.dumps({"runs": runs}))
    from fedhead.sweep.presets import plan

    specs = plan("rho", "cpu", settings=["hopper", "dsprites"])
    p = reproduce_mod.PresetPlan("rho", specs, todo=[s for s in specs if s.id not in {r["id"] for r in runs}])
    eta = Eta(tmp_path, "cpu", [p])
    assert eta.run_seconds("rho", "tabular") == (200.0, True)  # measured here
    assert eta.run_seconds("rho", "image") == (None, False)  # no run, no estimate at this scale
    assert eta.run_seconds("main", "image")[1] is False
    left, unknown = eta.preset_left("rho")
    assert unknown == 7 and left == 200.0 * 4  # 4 Hopper runs left, 7 dSprites runs of unknown time


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_preset_at_smoke_scale_gives_every_claim_a_verdict(tmp_path, monkeypatch):
    """Every preset on Hopper, dSprites and 3D Shapes with the free-feature model (the smoke scale's
    image overrides without the CNN's width, which the free model has not; prediction and full-model
    averaging with the smoke scale's models), 2 rounds, each preset's own E: every claim holds, does not hold or is not
    testable, except C9, which rests on MPIIGaze alone (file-only: not measured, with the key that
    runs it); the paper's figures are drawn. About 125 runs: 6 min 31 s on 2 busy cores."""
    import dataclasses

    from fedhead.report.build import build_report
    from fedhead.sweep.scales import SCALES

    smoke = SCALES["smoke"]
    image = tuple(o for o in smoke.image if not o.startswith(("model.width", "model.groups")))
    monkeypatch.setitem(SCALES, "smoke", dataclasses.replace(smoke, image=image, image_widths=()))
    free = ("model=free", "model.feature_dim=8", "rounds=2")
    cfg = _cfg(tmp_path / "all", tmp_path / "cache", settings=("hopper", "dsprites", "shapes3d"), tiny=free)
    real_models = ("prediction", "full_model")
    result = run_all(cfg, [p for p in ALL if p not in real_models])
    assert set(result.results) == set(ALL) - set(real_models) and result.counts["failed"] == 0
    # a test MSE needs a backbone that maps test samples, full-model averaging one of the same shape
    # at every client: the smoke scale's models, on one setting of each kind
    monkeypatch.undo()
    real = dataclasses.replace(
        cfg, settings=("hopper", "dsprites"), run_overrides=(f"dataset.cache_dir={tmp_path / 'cache'}", "rounds=2")
    )
    assert run_all(real, real_models).counts["failed"] == 0
    rep = build_report([cfg.out], cfg.out / "report")
    for claim, v in rep.claims:
        if claim.id == "C9":
            assert v.status == NOT_MEASURED and "data_roots.mpiigaze" in v.detail
        else:
            assert v.status in (HOLDS, FAILS, NOT_TESTABLE), (claim.id, v)
    names = {f.name for f in rep.figures}
    assert {"epochs.png", "rho.png", "centering_gap.png", "mse_change.png"} <= names
    assert rep.fixed_e is not None and "table4_fixed_e" in rep.tables


def test_a_dry_run_plans_every_preset_and_runs_nothing(tmp_path, caplog):
    """``dry_run=true``: one line per preset (a preset without a run on these settings says so) and
    the time left; no run, no manifest. Composing the runs' configs (about a minute at scale=cpu)
    shows progress: off a terminal, one line."""
    cfg = dataclasses.replace(_cfg(tmp_path / "all", tmp_path / "cache"), show_progress=True)
    with caplog.at_level(logging.INFO):
        result = run_all(cfg, ("main", "data_size", "rho"), dry_run=True)
    assert result.results == {} and result.ran == [] and not list(tmp_path.glob("all/*/manifest.json"))
    assert set(result.skipped_presets) == {"data_size"}
    text = caplog.text
    assert "main" in text and "4 to run" in text and "no run here" in text and "time left: ~" in text
    assert re.search(r"planning: run configs composed: \d+ runs in [\d.]+ s", text)
