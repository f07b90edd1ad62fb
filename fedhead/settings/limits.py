"""Deadlines and the failure policy of a run (``timeouts:`` and ``failure:`` in conf/config.yaml).

* [`Timeouts`][fedhead.settings.limits.Timeouts]: every wait of the server has a deadline: the SuperNodes
  to connect (``nodes``), the replies of the moment exchange (``exchange``) and of one training or
  evaluation phase (``round``). A reply that has not arrived by then counts as a failed client (see
  [`FailurePolicy`][fedhead.settings.limits.FailurePolicy]). Within a phase the straggler rule
  (``straggler``, ``straggler_factor``;
  [`Timeouts.straggler_deadline`][fedhead.settings.limits.Timeouts.straggler_deadline]) ends the wait
  for a client that is connected but never answers long before the phase deadline.
* [`FailurePolicy`][fedhead.settings.limits.FailurePolicy]: how many valid replies a phase needs
  (``min_clients``; ``null``: every client). With fewer the run stops with
  [`fedhead.strategies.replies.FederationError`][fedhead.strategies.FederationError]; with at
  least ``min_clients`` the phase continues over the survivors (weights renormalised) and the
  dropped clients are logged and recorded per round in results.json.

No flwr, no torch: the config layer and the strategies both import this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedhead.analysis.constraints import ConfigError, Field, check, integer, number, optional

__all__ = ["STRAGGLER_ERROR_CODE", "FailurePolicy", "Timeouts", "straggler_reason", "straggler_waves"]

#: ``Error.code`` of the reply the server makes up for a client the straggler rule gave up on
#: (flwr's own codes are small non-negative integers; screening maps it to a ``missing`` client).
STRAGGLER_ERROR_CODE = 910


_SECONDS = "must be a finite number of seconds > 0"
_TIMEOUT_RULES = (
    Field("nodes", number(0, low_open=True), _SECONDS),
    Field("exchange", number(0, low_open=True), _SECONDS),
    Field("round", number(0, low_open=True), _SECONDS),
    Field("straggler", optional(number(0, low_open=True)), _SECONDS + " or null (off)"),
    Field("straggler_factor", number(0), "must be a finite number >= 0"),
)
_FAILURE_RULES = (Field("min_clients", optional(integer(2)), "must be an integer >= 2 or null (every client)"),)


@dataclass(frozen=True)
class Timeouts:
    """Deadlines (seconds) of the server's waits.

    ``nodes``: the SuperNodes to connect (a simulation registers them at once; a deployment
    waits for each ``flower-supernode``). ``exchange``: the replies to the moment query.
    ``round``: the replies of one training or one evaluation phase (generous by default:
    a client that trains for longer needs a larger value).

    The straggler rule (``straggler`` seconds, ``straggler_factor``; ``straggler=None`` turns it
    off): once at least half of a phase's clients have replied, each client still outstanding
    must reply within ``max(straggler, straggler_factor * T)`` after the latest reply, where
    ``T`` is the time that latest reply took since the phase began. A client that does not is
    given up (the failure policy decides: drop it, or stop the run). The grace grows with the
    phase: a phase whose replies take an hour of local training gives a late client
    ``straggler_factor`` hours more, a phase of seconds gives it ``straggler`` seconds.
    """

    nodes: float = 45.0
    exchange: float = 600.0
    round: float = 3600.0
    straggler: float | None = 45.0
    straggler_factor: float = 2.0

    def __post_init__(self) -> None:
        check(self, _TIMEOUT_RULES, prefix="timeouts.", error=ConfigError)
        for rule in _TIMEOUT_RULES:
            value = getattr(self, rule.field)
            object.__setattr__(self, rule.field, None if value is None else float(value))

    def straggler_grace(self, latest: float) -> float:
        """Seconds the outstanding clients get after a reply that took ``latest`` seconds."""
        assert self.straggler is not None
        return max(self.straggler, self.straggler_factor * max(0.0, float(latest)))

    def straggler_deadline(
        self, n_clients: int, reply_times: list[float], concurrency: int | None = None
    ) -> float | None:
        """When (seconds since the phase began) the outstanding clients become stragglers.

        ``reply_times``: when each reply so far arrived (seconds since the phase began). None
        while the rule does not apply: it is off, fewer than half of the ``n_clients`` have
        replied, or every client has. ``concurrency``: how many clients run at once (a
        simulation's Ray slots; None: all of them, as in a deployment). The outstanding clients
        then run in ``ceil(outstanding / concurrency)`` waves, and each wave gets the grace.
        """
        if self.straggler is None or not reply_times or len(reply_times) >= n_clients:
            return None
        if 2 * len(reply_times) < n_clients:
            return None
        latest = max(reply_times)
        return latest + straggler_waves(n_clients - len(reply_times), concurrency) * self.straggler_grace(latest)


def straggler_waves(outstanding: int, concurrency: int | None) -> int:
    """Waves in which ``outstanding`` clients run when ``concurrency`` run at once (None: one)."""
    if concurrency is None or concurrency < 1:
        return 1
    return max(1, math.ceil(outstanding / concurrency))


def straggler_reason(
    timeouts: Timeouts, *, waited: float, latest: float, replied: int, n_clients: int, concurrency: int | None = None
) -> str:
    """Why a client counts as a straggler (one line; the failure policy's records carry it)."""
    waves = straggler_waves(n_clients - replied, concurrency)
    return (
        f"no reply {waited - latest:.0f} s after the other {replied} of {n_clients} clients had replied "
        f"(the latest after {latest:.1f} s); straggler rule: max(timeouts.straggler={timeouts.straggler:g} s, "
        f"timeouts.straggler_factor={timeouts.straggler_factor:g} x {latest:.1f} s)"
        + (f" x {waves} waves of {concurrency} clients at once" if waves > 1 else "")
    )


@dataclass(frozen=True)
class FailurePolicy:
    """``min_clients``: valid replies a phase needs to continue (``None``: all clients)."""

    min_clients: int | None = None

    def __post_init__(self) -> None:
        check(self, _FAILURE_RULES, prefix="failure.", error=ConfigError)

    def required(self, num_clients: int) -> int:
        """Valid replies a phase over ``num_clients`` clients needs."""
        return int(num_clients) if self.min_clients is None else min(int(self.min_clients), int(num_clients))

    def check(self, num_clients: int) -> None:
        """Refuse a ``min_clients`` above the client count."""
        if self.min_clients is not None and self.min_clients > num_clients:
            raise ConfigError(f"failure.min_clients={self.min_clients} exceeds num_clients={num_clients}")
