"""The run's epsilon in the row unit (fedhead/driver/privacy.py): the exchange of either unit, the later
client-level sums and the rounds' DP-SGD, composed by one accountant."""

from __future__ import annotations

import math

import pytest

from fedhead.driver.privacy import DP_SGD_EPSILON, ROW_EPSILON, row_epsilons
from fedhead.federation.run_privacy import TrainingRelease, release_event, run_accountant, training_event
from fedhead.settings.config import compose_config, load_config

_DP_SGD = (
    "train.dp_noise=1.0",
    "train.dp_sample_rate=0.1",
    "train.optimal_bias=false",
    "train.solve_last_layer=false",
    "train.finish_features=false",
    "local_tol=null",
    "local_epochs=3",
    "procedure=proximal",
    "privacy.dp_delta=1e-4",
)


def _job(tmp_path, *overrides: str):
    return load_config(compose_config([*_DP_SGD, *overrides])).jobs(tmp_path)[0]


def test_the_exchange_the_sums_and_the_training_compose(tmp_path):
    job = _job(tmp_path, "privacy.mode=secure", "privacy.dp_noise=3.0", "privacy.dp_max_rows=100")
    training = training_event(TrainingRelease(1.0, 0.1, 3 * 10))
    # after round 2: the client-level exchange, two heads and two evaluations (5 releases at z / 2 = 1.5), and two
    # rounds of training
    events = [*[release_event(1.5)] * 5, training, training]
    spent = row_epsilons(job, 2, 5.0)
    assert spent[ROW_EPSILON] == pytest.approx(run_accountant(events).get_epsilon(1e-4), rel=1e-12)
    assert spent[DP_SGD_EPSILON] == pytest.approx(run_accountant([training, training]).get_epsilon(1e-4), rel=1e-12)


def test_under_the_row_unit_private_heads_are_no_release_and_the_exchange_is_the_sites_own(tmp_path):
    """Row unit with DP-SGD: the heads are summed un-noised (no release), only the exchange is counted; the
    correction reads each site's own release, so the exchange is accounted at ``z / sqrt(m_min)``."""
    row = ("privacy.mode=secure", "privacy.dp_noise=3.0", "privacy.dp_max_rows=100", "privacy.dp_unit=row")
    training = training_event(TrainingRelease(1.0, 0.1, 3 * 10))
    for procedure, own in (("proximal", False), ("corrected_proximal", True)):
        job = _job(tmp_path, *row, "resources.evaluate_mse=false", f"procedure={procedure}")
        assert job.min_summed_sites == job.settings.num_clients  # the default failure policy: every site
        z = 3.0 / math.sqrt(job.min_summed_sites) if own else 3.0
        assert job.private_heads and job.reads_own_release == own
        assert job.exchange_row_noise == pytest.approx(z, rel=1e-15)
        spent = row_epsilons(job, 2, 1.0)
        expected = run_accountant([release_event(z), training, training]).get_epsilon(1e-4)
        assert spent[ROW_EPSILON] == pytest.approx(expected, rel=1e-12)


def test_an_exact_exchange_or_closed_form_heads_have_no_finite_epsilon(tmp_path):
    assert row_epsilons(_job(tmp_path), 1, None)[ROW_EPSILON] == math.inf  # clear mode
    exact = row_epsilons(_job(tmp_path, "procedure=exact"), 1, None)
    assert exact == {ROW_EPSILON: math.inf, DP_SGD_EPSILON: math.inf}
