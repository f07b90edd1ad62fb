"""A run with per-example DP in local training (train.dp_noise > 0): results.json and the console report, after
every round, the epsilon of the one accountant for the run's history (fedhead/driver/privacy.py)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from app_helpers import InProcessGrid

from fedhead.clients import make_client_app
from fedhead.driver.checks import prepare_data
from fedhead.driver.logs import console
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.federation.run_privacy import TrainingRelease, run_epsilon
from fedhead.results import schema
from fedhead.settings.config import compose_config, load_config

#: A tiny DP-SGD run: 3 sites, 2 rounds of 2 epochs of 5 Poisson-sampled steps (q = 0.2).
_RUN = (
    "model=resmlp_small",
    "model.width=16",
    "model.depth=1",
    "model.feature_dim=8",
    "procedure=proximal",
    "rounds=2",
    "local_epochs=2",
    "local_tol=null",
    "num_clients=3",
    "dataset.n_train=240",
    "train.dp_noise=1.2",
    "train.dp_sample_rate=0.2",
    "train.optimal_bias=false",
    "train.solve_last_layer=false",
    "train.finish_features=false",
    "privacy.dp_delta=1e-4",
)


def test_each_round_reports_the_accountants_epsilon(tmp_path: Path, task_identity, caplog):
    overrides = [*_RUN, f"dataset.cache_dir={tmp_path / 'cache'}"]
    job = load_config(compose_config(overrides)).jobs(tmp_path / "out")[0]
    prepare_data(job)
    recorder = RunRecorder(job, show_progress=False)
    with caplog.at_level(logging.INFO, logger=console.name):
        serve(InProcessGrid(make_client_app(job), 3), job, recorder, show_progress=False)
    res = recorder.finish("completed")
    training = TrainingRelease(1.2, 0.2, 2 * 5)  # local_epochs x int(1 / q) steps a round
    for record in res.rounds:
        assert record.extra["dp_sgd_epsilon"] == run_epsilon((), (), training, record.round, 1e-4)
        assert record.extra["row_epsilon"] == math.inf  # clear mode: the exchange is exact
    assert [r.client_metrics[0]["n_steps"] for r in res.rounds[1:]] == [10, 10]  # pyright: ignore[reportOptionalSubscript]
    assert res.privacy["dp_sgd"]["steps_per_round"] == 10
    assert res.privacy["dp_sgd"]["dp_sgd_epsilon"] == res.rounds[-1].extra["dp_sgd_epsilon"] > 0
    back = schema.read(recorder.dir / schema.FILE_NAME)
    assert back.rounds[2].extra["dp_sgd_epsilon"] == res.rounds[2].extra["dp_sgd_epsilon"]
    lines = [r.getMessage() for r in caplog.records if "round 2/2" in r.getMessage()]
    eps = res.rounds[2].extra["dp_sgd_epsilon"]
    assert lines and lines[0].endswith(f"(row-level epsilon so far inf, DP-SGD alone {eps:.3g})")
