"""Deadlines and the failure policy of a run (``timeouts:`` and ``failure:`` in conf/config.yaml).

* :class:`Timeouts`: every wait of the server has a deadline: the SuperNodes to connect
  (``nodes``), the replies of the moment exchange (``exchange``) and of one training or
  evaluation phase (``round``). A reply that has not arrived by then counts as a failed client
  (see :class:`FailurePolicy`).
* :class:`FailurePolicy`: how many valid replies a phase needs (``min_clients``; ``null``: every
  client). With fewer the run stops with :class:`strategies.replies.FederationError`; with at
  least ``min_clients`` the phase continues over the survivors (weights renormalised) and the
  dropped clients are logged and recorded per round in results.json.

No flwr, no torch: the config layer and the strategies both import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhead.procedure import ConfigError

__all__ = ["FailurePolicy", "Timeouts"]


def _positive(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"timeouts.{name} must be a number of seconds > 0, got {value!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise ConfigError(f"timeouts.{name} must be a finite number of seconds > 0, got {value!r}")
    return v


@dataclass(frozen=True)
class Timeouts:
    """Deadlines (seconds) of the server's waits.

    ``nodes``: the SuperNodes to connect (a simulation registers them at once; a deployment
    waits for each ``flower-supernode``). ``exchange``: the replies to the moment query.
    ``round``: the replies of one training or one evaluation phase (generous by default:
    a client that trains for longer needs a larger value).
    """

    nodes: float = 45.0
    exchange: float = 600.0
    round: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("nodes", "exchange", "round"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))


@dataclass(frozen=True)
class FailurePolicy:
    """``min_clients``: valid replies a phase needs to continue (``None``: all clients)."""

    min_clients: int | None = None

    def __post_init__(self) -> None:
        m = self.min_clients
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 2):
            raise ConfigError(f"failure.min_clients must be an integer >= 2 or null (every client), got {m!r}")

    def required(self, num_clients: int) -> int:
        """Valid replies a phase over ``num_clients`` clients needs."""
        return int(num_clients) if self.min_clients is None else min(int(self.min_clients), int(num_clients))

    def check(self, num_clients: int) -> None:
        """Refuse a ``min_clients`` above the client count."""
        if self.min_clients is not None and self.min_clients > num_clients:
            raise ConfigError(f"failure.min_clients={self.min_clients} exceeds num_clients={num_clients}")
