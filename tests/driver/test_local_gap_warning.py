"""Clients short of their local optima: the console says so once per run, run.log every round."""

from __future__ import annotations

import logging
from pathlib import Path

from app_helpers import InProcessGrid

from fedhead.clients import make_client_app
from fedhead.driver.checks import prepare_data
from fedhead.driver.logs import LOCAL_GAP, SWEEP, sweep_console
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.settings.config import compose_config, load_config


def test_the_advice_to_train_longer_is_a_warning_once_then_info(tmp_path: Path, task_identity, caplog):
    cfg = load_config(
        compose_config(
            [
                "model=free",
                "procedure=ordinary",
                "rounds=3",
                "local_epochs=1",  # one epoch of the literal training: every round ends far from the optima
                "train.solve_last_layer=false",
                "num_clients=3",
                "dataset.n_train=240",
                f"dataset.cache_dir={tmp_path / 'cache'}",
            ]
        )
    )
    job = cfg.jobs(tmp_path / "out")[0]
    prepare_data(job)
    recorder = RunRecorder(job, show_progress=False)
    with caplog.at_level(logging.INFO, logger=LOCAL_GAP):
        serve(InProcessGrid(make_client_app(job), 3), job, recorder, show_progress=False)
    res = recorder.finish("completed")
    short = [r.round for r in res.rounds if r.max_trained_gap is not None and r.max_trained_gap > 1e-2]
    assert short == [1, 2, 3]
    advice = [r for r in caplog.records if "ended local training at relative gap" in r.getMessage()]
    assert [r.levelno for r in advice] == [logging.WARNING, logging.INFO, logging.INFO]
    assert "raise local_epochs (now 1)" in advice[0].getMessage()
    assert advice[0].getMessage().endswith("(later rounds: run.log)")


def test_a_sweep_console_leaves_the_advice_to_run_log():
    def record(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "text", None, None)

    assert sweep_console(record(SWEEP, logging.INFO))  # one line per run, the plan, the time left
    assert sweep_console(record("fedhead.strategies", logging.WARNING))  # a dropped site, a failure
    assert not sweep_console(record(LOCAL_GAP, logging.WARNING))  # each run's line gives its local gap
    assert not sweep_console(record("fedhead.driver.recorder", logging.INFO))
