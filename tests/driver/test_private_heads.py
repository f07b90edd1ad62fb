"""``privacy.dp_unit=row`` with DP-SGD in local training (``train.dp_noise > 0``), in process (real ClientApps,
no Ray): the rounds' heads enter their secure sums without client-level noise, so the run's releases are the
exchange's alone and its epsilon composes the row-level exchange with the DP-SGD rounds; each site's ledger
charges its training rounds, not the heads' sums, while a head of a run without DP-SGD is still charged."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from app_helpers import simulated_sites
from test_dp_sgd_run import _RUN
from test_secure_mode import SECURE, RecordingGrid

from fedhead.clients import make_client_app
from fedhead.clients.ledger import SiteLedger
from fedhead.driver.privacy import ROW_EPSILON, row_epsilons
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.row_privacy import exchange_event
from fedhead.federation.run_privacy import TrainingRelease, run_epsilon
from fedhead.settings.config import compose_config, load_config

Z = 0.05  # the row-level exchange's noise multiplier
ROW = (
    SECURE,
    "privacy.dp_unit=row",
    f"privacy.dp_noise={Z}",
    "privacy.dp_max_rows=100",
    "privacy.dp_clip=10",
    "resources.evaluate_mse=false",
    "local_epochs=1",
    "train.dp_noise=2",  # the accountant converges faster than at test_dp_sgd_run's 1.2
    "output.tensorboard=false",
    "output.figures=false",
)
#: each site's policy: a row-unit budget no run here reaches, so that its ledger charges every release
POLICY = {"epsilon-budget": 1e9, "dp-unit": "row", "dp-delta": 1e-4}


def _job(tmp_path: Path, *overrides: str):
    cfg = load_config(compose_config([*_RUN, *ROW, f"dataset.cache_dir={tmp_path.parent / 'cache'}", *overrides]))
    return cfg.jobs(tmp_path / "out")[0]


def _run_with_ledgers(job, tmp_path: Path):
    """The run, its sites with a ``state-dir`` (their ledgers) and the row-unit budget; its results and each
    site's ledgered releases, and the grid."""
    grid = RecordingGrid(make_client_app(job, simulated_sites(3)), 3)
    for context in grid.contexts.values():
        context.node_config = {**context.node_config, "state-dir": str(tmp_path / "state"), **POLICY}
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False, roster=simulated_sites(3).roster)
    ledgers = [SiteLedger(c).read()["releases"] for c in grid.contexts.values()]
    return recorder.finish("completed"), ledgers, grid


def test_private_heads_are_no_release_and_their_training_is_charged(tmp_path, task_identity):
    job = _job(tmp_path)
    assert job.private_heads
    res, ledgers, grid = _run_with_ledgers(job, tmp_path)
    trains = [m.content.config_records["config"] for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trains) == 2 * 3 and all(sr.SUM_ID in c for c in trains)  # each head into a secure sum ...
    assert all(protocol.HEAD not in r.content.array_records for r in grid.replies)  # ... never sent as is
    assert res.status == "completed" and [r.round for r in res.rounds] == [0, 1, 2]  # no head drowned in noise
    assert res.privacy["dp"]["releases"] == 1  # the exchange only
    training = TrainingRelease(2.0, 0.2, 1 * 5)  # local_epochs x int(1 / q) steps a round
    predicted = [row_epsilons(job, t, 1)[ROW_EPSILON] for t in (0, 1, 2)]  # one release: the exchange
    assert [r.extra[ROW_EPSILON] for r in res.rounds] == predicted
    assert [r.extra["dp_releases"] for r in res.rounds] == [1, 1, 1]
    assert predicted[0] < predicted[1] < predicted[2]  # each round's DP-SGD adds to the exchange's epsilon
    assert predicted[2] == run_epsilon([exchange_event(Z)[0]], (), training, 2, 1e-4)  # the row-level exchange
    for releases in ledgers:  # the row exchange and the two training rounds; no head sum
        assert [(r["sum"].rsplit("/", 1)[-1], r.get("unit")) for r in releases] == [
            ("exchange", "row"),
            ("training round 1", "row"),
            ("training round 2", "row"),
        ]


def test_heads_without_dp_sgd_are_still_charged_under_the_row_unit(tmp_path, task_identity):
    job = _job(tmp_path, "train.dp_noise=0")
    assert not job.private_heads
    res, ledgers, _ = _run_with_ledgers(job, tmp_path)
    assert res.privacy["dp"]["releases"] == 3  # the exchange and the two rounds' heads
    for releases in ledgers:  # each head's sum a client-level release at the run's noise
        assert [(r["sum"].rsplit("/", 1)[-1], r.get("unit"), r["noise"]) for r in releases] == [
            ("exchange", "row", Z),
            ("train-1", None, Z),
            ("train-2", None, Z),
        ]


def test_the_correction_under_dp_sgd_reads_each_sites_own_release(tmp_path, task_identity, monkeypatch):
    """``corrected_proximal`` with DP-SGD under the row unit: each site trains with the ``Sigma_m`` of its own
    row-level release (kept in its node's state), never its rows' own; the exchange is then accounted, in
    results.json and in each ledger, at ``z / sqrt(m_min)``."""
    import fedhead.clients.app as client_app

    job = _job(tmp_path, "procedure=corrected_proximal")
    assert job.reads_own_release and job.min_summed_sites == 3
    read: list[np.ndarray] = []
    released = client_app.released_moments

    def recorded(*args):
        out = released(*args)
        read.append(out[1])
        return out

    monkeypatch.setattr(client_app, "released_moments", recorded)
    res, ledgers, _ = _run_with_ledgers(job, tmp_path)
    assert res.status == "completed" and [r.round for r in res.rounds] == [0, 1, 2]
    assert len(read) == 2 * 3  # every site, every round
    sigma_cen = np.asarray(res.moments["sigma_cen"])
    for sigma in read:  # a noised covariance of the site's own rows: PSD, of the exchange's shape
        assert sigma.shape == sigma_cen.shape and np.linalg.eigvalsh(sigma).min() >= -1e-12
    own = Z / math.sqrt(3)
    exchange_alone = run_epsilon([exchange_event(own)[0]], (), None, 0, 1e-4)
    assert res.rounds[0].extra[ROW_EPSILON] == pytest.approx(exchange_alone, rel=1e-12)
    assert exchange_alone > run_epsilon([exchange_event(Z)[0]], (), None, 0, 1e-4)  # the own release costs more
    for releases in ledgers:
        assert [(r["sum"].rsplit("/", 1)[-1], r["noise"]) for r in releases][0] == ("exchange", pytest.approx(own))
