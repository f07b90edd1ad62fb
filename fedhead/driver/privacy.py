"""What a run with per-example DP in local training (``train.dp_noise > 0``) has spent, in the row unit:
the round scalars ``row_epsilon`` and ``dp_sgd_epsilon`` of results.json and the console.

Everything here is public: the run config's noise multipliers, clip, sample rate and epochs, and the
count of noised releases so far. One accountant
([`run_epsilon`][fedhead.federation.run_privacy.run_epsilon]) composes the exchange, every noised
release and every round's DP-SGD steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from fedhead.federation.row_privacy import exchange_event
from fedhead.federation.run_privacy import client_release_in_rows, job_training, run_epsilon
from fedhead.settings.config import JobConfig

__all__ = ["DP_SGD_EPSILON", "ROW_EPSILON", "dp_sgd_settings", "exchange_in_rows", "row_epsilons"]

#: The run's epsilon after round t, row unit: the exchange, every noised release and every round's DP-SGD.
ROW_EPSILON = "row_epsilon"
#: The epsilon of the DP-SGD steps alone after round t (what training adds to the exchange's).
DP_SGD_EPSILON = "dp_sgd_epsilon"


def exchange_in_rows(job: JobConfig, releases: float | None) -> tuple[Sequence[float] | None, Sequence[float]]:
    """The exchange's and the later releases' noise multipliers in the row unit, from the noised releases
    counted so far (``releases``, the exchange included; None: none noised): a row-level exchange
    (``privacy.dp_unit=row``) at [`JobConfig.exchange_row_noise`][fedhead.settings.job.JobConfig.exchange_row_noise]
    (``z``, or ``z / sqrt(m_min)`` when a site's own release is used), a client-level one at ``z / 2``, every
    later (client-level) sum at ``z / 2``. ``(None, ())`` where the exchange was exact: clear or secure mode
    without noise."""
    z = job.privacy.dp_noise
    if z <= 0 or not releases:
        return None, ()
    per_release = client_release_in_rows(z)
    exchange = exchange_event(job.exchange_row_noise)[0] if job.privacy.row_level else per_release
    return [exchange], [per_release] * (int(releases) - 1)


def row_epsilons(job: JobConfig, rounds: int, releases: float | None) -> dict[str, float]:
    """``row_epsilon`` (``inf`` after an exact exchange or with closed-form heads from a site's exact
    statistics) and ``dp_sgd_epsilon`` after ``rounds`` rounds, at ``privacy.dp_delta``."""
    delta = job.privacy.dp_delta
    training = job_training(job)
    exchange, later = exchange_in_rows(job, releases)
    whole = math.inf if training is None else run_epsilon(exchange, later, training, rounds, delta)
    alone = math.inf if training is None else run_epsilon((), (), training, rounds, delta)
    return {ROW_EPSILON: whole, DP_SGD_EPSILON: alone}


def dp_sgd_settings(job: JobConfig) -> dict[str, Any]:
    """results.json's ``privacy.dp_sgd`` settings: ``noise_multiplier, clip, sample_rate, steps_per_round,
    delta, accountant``."""
    training = job_training(job)
    return {
        "noise_multiplier": job.train.dp_noise,
        "clip": job.train.dp_clip,
        "sample_rate": job.train.dp_sample_rate,
        "steps_per_round": None if training is None else training.steps,
        "delta": job.privacy.dp_delta,
        "accountant": "rdp (dp-accounting), add-or-remove-one row",
    }
