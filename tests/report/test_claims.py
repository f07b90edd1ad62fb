"""Verdict logic of the paper's claims on hand-made runs, and the paper values beside the cells."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from fedhead.report.claims import FAILS, HOLDS, NOT_MEASURED, NOT_TESTABLE, evaluate
from fedhead.report.collect import Collection, RunEntry, RunRef
from fedhead.report.paper import attach
from fedhead.report.paper_claims import CLAIMS
from fedhead.report.render import to_csv, to_markdown
from fedhead.report.tables import Cell, Table, label

CLAIM = {c.id: c for c in CLAIMS}


def _run(procedure: str, seed: int, endpoint: float, gap: float, sweep: str = "main") -> RunEntry:
    """A run whose last round has e_F(G_T, G_star) = ``endpoint`` and trained gap ``gap``."""
    rnd = SimpleNamespace(
        round=2, e_f_reference=endpoint, e_f_star=endpoint, e_f_cen=0.5, trajectory_error=endpoint,
        delta=0.1, d_star=0.01, d_cen=0.5, max_trained_gap=gap, trained_gaps=[gap], objective_gaps=[gap],
    )  # fmt: skip
    results = SimpleNamespace(
        rounds=[rnd], reference="star", gamma=0.0, procedure={"name": procedure}, config={},
        local_optimality=None, targets={"fully_active": True}, round_at=lambda t: rnd if t == 2 else None,
    )  # fmt: skip
    ref = RunRef("/sweeps/main", f"runs/{procedure}/s{seed}")
    return RunEntry(ref, sweep, "smoke", ref.run_dir, "hopper", "hopper", "free", procedure, seed, results=results)


def _verdict(claim_id: str, runs: list[RunEntry]):
    return evaluate(CLAIM[claim_id], Collection([], runs, []), lambda runs: {})


def test_c2_holds_when_proximal_is_lower_in_every_pair_of_optimal_runs():
    runs = [_run("ordinary", s, 1e-2, 1e-5) for s in (0, 1)] + [_run("proximal", s, 3e-4, 1e-5) for s in (0, 1)]
    v = _verdict("C2", runs)
    assert v.status == HOLDS and "lower in 2/2 pairs" in v.detail
    assert {r.run_dir for r in v.runs} == {r.ref.run_dir for r in runs}


def test_c2_does_not_hold_on_optimal_runs_is_a_finding():
    runs = [_run("ordinary", 0, 1e-2, 1e-5), _run("proximal", 0, 3e-2, 1e-5)]
    assert _verdict("C2", runs).status == FAILS


def test_c2_not_testable_when_clients_stopped_before_their_optima():
    runs = [_run("ordinary", 0, 1e-2, 0.05), _run("proximal", 0, 3e-2, 0.05)]
    v = _verdict("C2", runs)
    assert v.status == NOT_TESTABLE
    assert "clients stopped at gap 0.05 > 0.001" in v.detail and "measures the optimiser" in v.detail


def test_runs_that_stopped_early_are_left_out_and_named():
    runs = [_run("ordinary", s, 1e-2, 1e-5) for s in (0, 1)] + [_run("proximal", 0, 3e-4, 1e-5)]
    runs.append(_run("proximal", 1, 5e-2, 0.02))  # the only losing pair stopped early
    v = _verdict("C2", runs)
    assert v.status == HOLDS and "lower in 1/1 pairs" in v.detail and "left out" in v.detail


def test_not_measured_without_the_sweep_or_the_quantity():
    v = _verdict("C13", [_run("ordinary", 0, 1e-2, 1e-5)])
    assert v.status == NOT_MEASURED and "sweep=rho" in v.detail
    v = _verdict("C30", [_run("ordinary", 0, 1e-2, 1e-5, "prediction")])
    assert v.status == NOT_MEASURED
    v = _verdict("C20", [])  # a UFM experiment: no network run can test it, and the reason says so
    assert v.status == NOT_TESTABLE and "fedhead-ufm" in v.detail
    v = _verdict("C9", [_run("ordinary", 0, 1e-2, 1e-5)])  # MPIIGaze only: file-only data
    assert v.status == NOT_MEASURED and "data_roots.mpiigaze" in v.detail


def test_c4_trajectory_criterion_is_1e_minus_3():
    ordi = _run("ordinary", 0, 3e-2, 1e-5)
    assert _verdict("C4", [ordi, _run("proximal", 0, 9e-4, 1e-5)]).status == HOLDS
    assert _verdict("C4", [ordi, _run("proximal", 0, 2e-3, 1e-5)]).status == FAILS


def test_fully_active_does_not_depend_on_local_optima():
    assert _verdict("C32", [_run("ordinary", 0, 1e-2, 0.5)]).status == HOLDS


def test_paper_value_and_ratio_attached_to_table4_proximal_endpoint():
    row = {"procedure": label("proximal"), "endpoint": Cell(5.8e-4, n=2), "delta_last": Cell(0.1, n=2)}
    other = {"procedure": label("exact"), "endpoint": Cell(1e-3, n=2), "delta_last": Cell(0.1, n=2)}
    values = [("endpoint", "e"), ("delta_last", "d")]
    table = attach(Table("table4", "t", [("procedure", "procedure")], values, [row, other]))
    cell = table.row(procedure="proximal")["endpoint"]
    assert cell.paper == 2.90e-4 and cell.ratio == pytest.approx(2.0)
    assert table.row(procedure="proximal")["delta_last"].paper == 4.47e-3
    assert table.row(procedure="exact")["endpoint"].paper is None
    assert "0.00058 (paper 0.00029, ×2)" in to_markdown(table)
    head, prox, _ = to_csv(table).splitlines()
    cols = dict(zip(head.split(","), prox.split(",")))
    assert float(cols["endpoint_paper"]) == 2.90e-4 and float(cols["endpoint_ratio"]) == pytest.approx(2.0)


def test_table5_rows_are_matched_by_rho():
    rows = [{"rho": label(f"{r:g}"), "endpoint": Cell(1e-3, n=1)} for r in (0.0, 1e-3, 1.0)]
    table = attach(Table("table5", "t", [("rho", "ρ")], [("endpoint", "e")], rows))
    assert [r["endpoint"].paper for r in table.rows] == [1.71e-2, 3.08e-4, 3.80e-1]


def test_every_check_is_attached_to_the_claim_its_docstring_names():
    """A check is named for what it tests and its docstring starts with its claim's id, so a check
    attached to the wrong claim in CLAIMS fails here."""
    checks = [c for c in CLAIMS if c.check is not None]
    assert len(checks) == 31
    for claim in checks:
        assert (claim.check.__doc__ or "").startswith(f"{claim.id}: "), claim.id
        assert not re.fullmatch(r"c\d+", claim.check.__name__), claim.check.__name__
    assert len({c.check.__name__ for c in checks}) == len(checks)
