"""Noticing a dead simulation engine from the ServerApp thread.

flwr's `flwr.simulation.run_simulation` runs the ServerApp in a (non-daemon) thread and the simulation
engine (Ray backend) in the calling thread. When the engine crashes, the call raises but the ServerApp
thread keeps waiting for replies that will never come, and the process never exits. The driver trips an
[`EngineWatch`][fedhead.federation.watchdog.EngineWatch] when the engine call ends (crash or not); every
wait of the ServerApp
([`fedhead.federation.progress_grid.ProgressGrid`][fedhead.federation.progress_grid.ProgressGrid], the
strategy's node wait) checks it and ends with [`EngineDied`][fedhead.federation.watchdog.EngineDied].

The other way round, flwr's engine waits without a deadline for every ClientApp task it started:
[`end_hung_clients`][fedhead.federation.watchdog.end_hung_clients] ends the Ray actors still busy once the ServerApp has
ended.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time


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


# ------------------------------------------------------------------ after the server ended
#: Process title of a Ray actor while it runs a ClientApp (``ray::ClientAppActor`` when idle).
BUSY_ACTOR_TITLE = "ray::ClientAppActor.run"


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def busy_actor_pids(root: int | None = None, title: str = BUSY_ACTOR_TITLE) -> list[int]:
    """Processes under ``root`` (default: this process) whose title is ``title`` (Linux ``/proc``;
    empty elsewhere): the Ray actors of this process's simulation still running a ClientApp."""
    if not os.path.isdir("/proc"):
        return []
    children = _children_map()
    todo, found = list(children.get(os.getpid() if root is None else root, [])), []
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if cmd.startswith(title):
            found.append(pid)
    return sorted(found)


def end_hung_clients(
    engine_done: threading.Event, *, grace: float = 2.0, deadline: float = 60.0, log: logging.Logger | None = None
) -> list[int]:
    """After the ServerApp ended: end the Ray actors still running a ClientApp.

    flwr's simulation engine waits (without a deadline) for every ClientApp task it started
    before it returns, so a ClientApp that hangs (the client the straggler rule gave up on) would
    keep ``run_simulation`` -- and the process -- waiting forever. Once the server has ended and
    the engine has not returned within ``grace`` seconds, the busy actor processes are killed
    (their results could no longer be used); the engine then reports them as errors and
    returns. Gives up after ``deadline`` seconds. Returns the killed process ids.
    """
    log = log or logging.getLogger(__name__)
    killed: list[int] = []
    end = time.monotonic() + deadline
    while not engine_done.wait(grace) and time.monotonic() < end:
        pids = [p for p in busy_actor_pids() if p not in killed]
        if not pids:
            continue
        log.warning(
            "the server has ended but the simulation engine still waits for %d ClientApp(s) (a client "
            "the server gave up on); ending their Ray actor process(es) %s",
            len(pids),
            pids,
        )
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    return killed
