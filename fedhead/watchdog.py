"""Noticing a dead simulation engine from the ServerApp thread.

flwr's :func:`flwr.simulation.run_simulation` runs the ServerApp in a (non-daemon) thread and the
simulation engine (Ray backend) in the calling thread. When the engine crashes, the call raises
but the ServerApp thread keeps waiting for replies that will never come, and the process never
exits. The driver trips an :class:`EngineWatch` when the engine call ends (crash or not); every
wait of the ServerApp (:class:`fedhead.recorder.ProgressGrid`, the strategy's node wait) checks
it and ends with :class:`EngineDied`.
"""

from __future__ import annotations

import threading


class EngineDied(RuntimeError):
    """The simulation engine stopped while the server was waiting for it."""


class EngineWatch:
    """A one-way switch with the reason the engine stopped."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    @property
    def tripped(self) -> bool:
        return self._event.is_set()

    def trip(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    def check(self) -> None:
        if self._event.is_set():
            raise EngineDied(f"the simulation engine stopped: {self.reason}")
