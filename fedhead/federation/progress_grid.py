"""A Flower Grid wrapper that shows and times every message phase, with the deadlines of the
server's waits (the phase timeout, a dead engine, the straggler rule) and, in a simulation, a
window of messages in flight ([`ProgressGrid`][fedhead.federation.progress_grid.ProgressGrid])."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flwr.app import Error, Message
from flwr.serverapp import Grid

from fedhead.federation.watchdog import EngineWatch
from fedhead.progress import progress
from fedhead.settings.limits import STRAGGLER_ERROR_CODE, Timeouts, straggler_reason

#: seconds between two hand-overs of stored messages to the clients in flwr's simulation engine
#: (``vce_api.add_messages_to_queue``)
ENGINE_TICK = 0.1

log = logging.getLogger(__name__)


class ProgressGrid(Grid):
    """A Grid that shows per-client progress of every message phase and times the phases.

    Delegates to the real grid; ``send_and_receive`` pushes, then pulls replies as they arrive
    (a tqdm bar counts clients), and records ``(message type, seconds)`` in
    [`phases`][fedhead.federation.progress_grid.ProgressGrid.phases].

    Every wait ends: at the phase's ``timeout``, when the engine dies
    ([`watch`][fedhead.federation.progress_grid.ProgressGrid.watch]), or, with
    [`timeouts`][fedhead.federation.progress_grid.ProgressGrid.timeouts] set, by the straggler rule
    ([`fedhead.settings.limits.Timeouts.straggler_deadline`][fedhead.settings.limits.Timeouts.straggler_deadline]): the
    clients still outstanding then get an error reply made up here (code
    [`fedhead.settings.limits.STRAGGLER_ERROR_CODE`][fedhead.settings.limits.STRAGGLER_ERROR_CODE], the reason says
    which rule and how long), which the failure policy treats as a missing client (dropped, or the run stops naming it).
    ``window`` (the simulation driver sets it): at most this many messages of a phase are
    pushed and unanswered at once, the next ones pushed in order as replies arrive. flwr's
    simulation engine scans every stored message for every node on each 0.1 s tick, a cost of
    ``M`` x the number stored; with everything pushed at once that is ``M^2`` per tick and eats
    the CPU the clients train on. A window that drains completely between two polls, or of which
    half is answered within one engine tick (fast replies, e.g. evaluation), is doubled, so short
    phases are not held to one window per tick.
    None (deployments, where every node pulls its own): push all.
    """

    def __init__(self, grid: Grid, *, label: str = "", show: bool = True, poll: float = 0.02):
        self._grid = grid
        self.label = label
        self.show = show
        self.poll = poll
        self.phases: list[tuple[str, float, float]] = []  # (type, start, seconds)
        self.watch: EngineWatch | None = None  # a dead engine ends every wait
        self.timeouts: Timeouts | None = None  # the straggler rule (None: off)
        self.concurrency: int | None = None  # clients that run at once (a simulation's slots; None: all)
        self.stragglers: list[tuple[str, int]] = []  # (message type, node) given up on, in order
        self.window: int | None = None

    def check_alive(self) -> None:
        """Raise [`fedhead.federation.watchdog.EngineDied`][fedhead.federation.watchdog.EngineDied] when the engine
        serving the grid died."""
        if self.watch is not None:
            self.watch.check()

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def push_messages(self, messages):
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None):
        messages = list(messages)
        t0 = time.perf_counter()
        if not messages:
            return []
        kind = messages[0].metadata.message_type
        window = max(1, self.window) if self.window else len(messages)
        ids = set(self._grid.push_messages(messages[:window]))
        rest = messages[window:]
        sent = {m.metadata.message_id: m for m in messages[:window]}
        n_sent = len(messages)
        bar = progress(  # off a terminal: no line (results.json times every phase)
            total=len(ids) + len(rest),
            desc=f"{self.label} {kind}".strip(),
            unit="client",
            disable=not self.show,
            summary=False,
        )
        out: list[Message] = []
        arrived: list[float] = []  # seconds since t0 of every reply
        end = None if timeout is None else t0 + timeout
        try:
            while ids and (end is None or time.perf_counter() < end):
                self.check_alive()
                got = list(self._grid.pull_messages(ids))
                if got:
                    out.extend(got)
                    ids.difference_update(m.metadata.reply_to_message_id for m in got)
                    arrived.extend([time.perf_counter() - t0] * len(got))
                    bar.update(len(got))
                    if rest:  # top up to `window` outstanding, in order
                        if not ids or self._tick_bound(arrived, window, time.perf_counter() - t0):
                            window = min(2 * window, len(messages))  # fast replies: widen the window
                        more, rest = rest[: window - len(ids)], rest[window - len(ids) :]
                        ids.update(self._grid.push_messages(more))
                        sent.update((m.metadata.message_id, m) for m in more)
                elif not rest and self._stragglers_due(n_sent, arrived, t0):
                    out.extend(self._give_up(kind, [sent[i] for i in ids if i in sent], arrived, n_sent, t0))
                    ids.clear()
                else:
                    # each pull looks up every outstanding reply: poll less often when many are
                    # outstanding (server CPU competes with the clients), at most flwr's 0.1 s
                    time.sleep(min(0.1, max(self.poll, 4e-4 * len(ids))))
        finally:
            bar.close()
        self.phases.append((kind, t0, time.perf_counter() - t0))
        return out

    @staticmethod
    def _tick_bound(arrived: list[float], window: int, now: float) -> bool:
        """Whether half the window was answered within the engine's last tick: the clients then
        wait for the engine's 0.1 s hand-over of new messages, not the other way round."""
        recent = sum(1 for a in arrived[-window:] if a >= now - ENGINE_TICK)
        return 2 * recent >= window

    def _stragglers_due(self, n_sent: int, arrived: list[float], t0: float) -> bool:
        if self.timeouts is None:
            return False
        due = self.timeouts.straggler_deadline(n_sent, arrived, self.concurrency)
        return due is not None and time.perf_counter() - t0 >= due

    def _give_up(
        self, kind: str, pending: list[Message], arrived: list[float], n_sent: int, t0: float
    ) -> list[Message]:
        """Error replies for the clients the straggler rule gives up on (one line each in the log)."""
        assert self.timeouts is not None  # only called once _stragglers_due, which needs timeouts
        reason = straggler_reason(
            self.timeouts,
            waited=time.perf_counter() - t0,
            latest=max(arrived),
            replied=len(arrived),
            n_clients=n_sent,
            concurrency=self.concurrency,
        )
        nodes = sorted(int(m.metadata.dst_node_id) for m in pending)
        log.warning(
            "%s%s: giving up on node(s) %s: %s",
            f"[{self.label}] " if self.label else "",
            kind,
            ", ".join(map(str, nodes)),
            reason,
        )
        self.stragglers.extend((kind, n) for n in nodes)
        return [Message(Error(code=STRAGGLER_ERROR_CODE, reason=reason), reply_to=m) for m in pending]
