"""results.json's ``local_steps``: the recorder sums each client's epochs and optimiser steps over
hand-made round records and sets them against the fixed recipe (E epochs in each of T rounds)."""

from __future__ import annotations

import pytest
from results_helpers import typed_results

from fedhead.driver.console import local_steps_line
from fedhead.driver.local_summary import local_steps
from fedhead.driver.recorder import RunRecorder
from fedhead.results import schema
from fedhead.results.rounds import ClientMetric, RoundRecord
from fedhead.results.schema import ABSENT
from fedhead.settings.config import compose_config, load_config

PID, EPOCHS, STEPS = ClientMetric.PARTITION_ID.name, ClientMetric.LOCAL_EPOCHS.name, ClientMetric.N_STEPS.name


def _record(t: int, replies: list[tuple[int, int, int]]) -> RoundRecord:
    """Round ``t`` whose ``client_metrics`` are ``(partition, epochs, steps)`` in reply order."""
    none = dict.fromkeys(
        ("gram", "bias", "e_f_star", "e_f_cen", "e_f_within", "d_star", "d_cen", "d_within", "e_f_reference")
    )
    none.update(recursion_gram=None, e_f_recursion=None, trajectory_error=None, predicted_gram=None)
    metrics = [{PID: float(m), EPOCHS: float(e), STEPS: float(k), "num-examples": 10.0} for m, e, k in replies]
    return RoundRecord(round=t, client_metrics=metrics, **none)


#: E = 5, M = 3, T = 2; steps per epoch 2, 3, 4; client 2 dropped from round 2; replies out of order
RECORDS = [
    _record(0, []),
    _record(1, [(1, 2, 6), (0, 5, 10), (2, 1, 4)]),
    _record(2, [(0, 3, 6), (1, 1, 3)]),
]


def test_sums_fixed_recipe_and_median_ratio():
    ls = local_steps(RECORDS, 5, 3)
    assert ls.local_epochs == 5 and ls.rounds == [2, 2, 1]
    assert ls.epochs == [8, 3, 1] and ls.steps == [16, 9, 4]
    assert ls.fixed_epochs == [10, 10, 5] and ls.fixed_steps == [20, 30, 20]
    assert ls.ratios == pytest.approx([1.25, 10 / 3, 5.0], rel=1e-15)
    assert ls.median_ratio == pytest.approx(10 / 3, rel=1e-15)


def test_no_epochs_no_fixed_steps_and_no_replies_no_section():
    exact = local_steps([_record(0, []), _record(1, [(0, 0, 0), (1, 0, 0)])], 5, 2)
    assert exact.fixed_epochs == [5, 5] and exact.fixed_steps == [None, None]
    assert exact.ratios == [None, None] and exact.median_ratio is None
    assert local_steps_line(_with(exact)) is None
    assert local_steps([_record(0, [])], 5, 2) is None


def _with(ls) -> schema.Results:
    """A hand-made run of ``ordinary`` with ``local_steps = ls``."""
    res = typed_results({})
    res.local_steps = ls
    return res


def test_console_line():
    line = local_steps_line(_with(local_steps(RECORDS, 5, 3)))
    assert line == "[ordinary] local steps: 29 of the fixed recipe's 70 (E × T = 5 × 2), ratio 3.33"
    assert local_steps_line(_with(ABSENT)) is None


def test_recorder_writes_local_steps_into_results_json(tmp_path):
    cfg = load_config(
        compose_config(
            [
                "model=free",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "experiment.procedures=[ordinary]",
                "num_clients=3",
                "rounds=2",
                "local_epochs=5",
                "output.tensorboard=false",
                "output.figures=false",
            ]
        )
    )
    (job,) = cfg.jobs(tmp_path / "out")
    rec = RunRecorder(job, show_progress=False)
    for r in RECORDS:
        rec.on_round(r)
    rec.finish("completed")
    back = schema.read(rec.path)
    assert back.local_steps == local_steps(RECORDS, 5, 3)
    assert back.local_steps.fixed_steps == [20, 30, 20] and back.local_steps.median_ratio == pytest.approx(10 / 3)
