"""One accountant for a whole run in the row unit: the exchange, every noised release and every round's
DP-SGD steps, composed by Google's ``dp-accounting`` RDP accountant.

Pure: ``dp-accounting`` (the library under flwr's ``RdpAccountant``, which takes one sampling method
per accountant and so cannot compose a Poisson-sampled DP-SGD step with an unsampled release) and the
training recipe's public settings. No torch, no messages.

Neighbouring datasets differ by one row of one site (add or remove). The events:

* **A release** ([`release_event`][fedhead.federation.run_privacy.release_event]): one Gaussian
  mechanism, every row in it (no amplification), of noise multiplier ``z`` relative to the release's
  sensitivity to one row. The row-level exchange's ``z`` is
  [`fedhead.federation.row_privacy.exchange_event`][fedhead.federation.row_privacy.exchange_event];
  a client-level release of noise multiplier ``z_c`` counts at ``z_c / 2``
  ([`client_release_in_rows`][fedhead.federation.run_privacy.client_release_in_rows]): one row moves
  a site's clipped, capped term by at most ``2 K Delta``.
* **A round's training** ([`training_event`][fedhead.federation.run_privacy.training_event]): ``steps``
  DP-SGD steps, each a Poisson-sampled Gaussian mechanism (rate ``q``, noise multiplier ``sigma``,
  per-example clip ``C``: [`fedhead.train.private_step`][fedhead.train.private_step]). A site's rows
  are in its own training only, so every site spends the same; the heads it then sends are
  post-processing.

[`run_epsilon`][fedhead.federation.run_privacy.run_epsilon] gives the run's epsilon after the exchange
and ``t`` rounds. A release in the clear has no finite epsilon: its callers pass ``exchange=None`` for
an exact exchange, and the run's epsilon is then ``inf``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dp_accounting import dp_event, privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedhead.train.config import TrainConfig

if TYPE_CHECKING:
    from fedhead.settings.job import JobConfig

__all__ = [
    "TrainingRelease",
    "client_release_in_rows",
    "release_event",
    "job_training",
    "round_training",
    "run_accountant",
    "run_epsilon",
    "training_event",
]


@dataclass(frozen=True)
class TrainingRelease:
    """One round's DP-SGD at a site: ``steps`` Poisson-sampled Gaussian steps.

    Attributes
    ----------
    noise_multiplier : float
        ``sigma > 0`` (``TrainConfig.dp_noise``).
    sample_rate : float
        ``q`` in ``(0, 1]`` (``TrainConfig.dp_sample_rate``).
    steps : int
        ``>= 1``: local epochs times ``int(1 / q)``.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"DP-SGD: the noise multiplier must be finite and > 0, got {self.noise_multiplier!r}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"DP-SGD: the sample rate must be in (0, 1], got {self.sample_rate!r}")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"DP-SGD: the steps must be an integer >= 1, got {self.steps!r}")


def round_training(train: TrainConfig, epochs: int) -> TrainingRelease | None:
    """One round's DP-SGD under the recipe ``train`` for ``epochs`` local epochs (None: not private)."""
    if not train.private:
        return None
    return TrainingRelease(train.dp_noise, train.dp_sample_rate, int(epochs) * train.dp_steps_per_epoch)


def job_training(job: JobConfig) -> TrainingRelease | None:
    """One round's DP-SGD at a site of ``job`` (None: its procedure trains nothing, or not under DP)."""
    return None if job.procedure.exact else round_training(job.train, job.settings.local_epochs)


def client_release_in_rows(noise_multiplier: float) -> float:
    """A client-level release's noise multiplier in the row unit: ``z_c / 2`` (module docstring)."""
    return float(noise_multiplier) / 2.0


def release_event(noise_multiplier: float) -> dp_event.DpEvent:
    """One Gaussian release of noise multiplier ``z`` (row unit), every row in it."""
    return dp_event.GaussianDpEvent(float(noise_multiplier))


def training_event(training: TrainingRelease) -> dp_event.DpEvent:
    """A round's DP-SGD: ``steps`` compositions of the Poisson-sampled Gaussian mechanism."""
    step = dp_event.PoissonSampledDpEvent(training.sample_rate, dp_event.GaussianDpEvent(training.noise_multiplier))
    return dp_event.SelfComposedDpEvent(step, training.steps)


def run_accountant(events: Sequence[dp_event.DpEvent]) -> rdp_privacy_accountant.RdpAccountant:
    """dp-accounting's RDP accountant (its default orders, add-or-remove-one) with ``events`` composed."""
    accountant = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    for event in events:
        accountant.compose(event)
    return accountant


def run_epsilon(
    exchange: Sequence[float] | None,
    releases: Sequence[float],
    training: TrainingRelease | None,
    rounds: int,
    delta: float,
) -> float:
    """The run's epsilon at ``delta`` after ``rounds`` rounds: the exchange, the later releases and
    ``rounds`` times the round's training, composed by one accountant.

    Parameters
    ----------
    exchange : sequence of float or None
        The exchange's releases, each a noise multiplier in the row unit (the row-level exchange's
        [`exchange_event`][fedhead.federation.row_privacy.exchange_event], or a client-level one's
        [`client_release_in_rows`][fedhead.federation.run_privacy.client_release_in_rows]); None: the
        exchange was exact (``inf``).
    releases : sequence of float
        Every noised release since (rounds' heads, evaluations), row unit.
    training : TrainingRelease or None
        One round's DP-SGD at a site (None: the heads are not trained under DP-SGD).
    rounds : int
        ``t >= 0``.
    delta : float
        In ``(0, 1)``.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if exchange is None:
        return math.inf
    events = [release_event(z) for z in (*exchange, *releases)]
    if training is not None and rounds > 0:
        events.append(dp_event.SelfComposedDpEvent(training_event(training), int(rounds)))
    return float(run_accountant(events).get_epsilon(delta)) if events else 0.0
