"""The failure policy on the server: [`screen`][fedhead.strategies.failures.screen] sorts one
phase's replies into valid ones and dropped clients (error, invalid, missing or straggling),
continues over the survivors while ``required`` remain, and otherwise stops the run with
[`TooFewReplies`][fedhead.strategies.failures.TooFewReplies] naming every failed node.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from flwr.app import Message

from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.settings.limits import STRAGGLER_ERROR_CODE
from fedhead.strategies.replies import FederationError

log = logging.getLogger(__name__)

T = TypeVar("T")


class TooFewReplies(FederationError, agg.ReplyError):
    """Fewer valid replies than the failure policy requires (names every failed node)."""

    def __init__(self, message: str, dropped: Sequence[Dropped] = ()):
        Exception.__init__(self, message)
        self.node_id = dropped[0].node if dropped else None
        self.dropped = list(dropped)

    @classmethod
    def of(
        cls, stage: str, valid: int, expected: int, required: int, dropped: Sequence[Dropped], short: str = ""
    ) -> TooFewReplies:
        """The error of a phase left with ``valid`` of ``expected`` clients, ``required`` needed:
        one line naming every dropped client and its reason (``short``: what came before them)."""
        detail = "; ".join(d.describe() for d in dropped)
        return cls(
            f"{stage}: {short}{valid} valid of {expected} clients, {required} required (failure.min_clients): {detail}",
            dropped,
        )


@dataclass(frozen=True)
class Dropped:
    """A client left out of one phase: ``kind`` is ``error``, ``invalid`` or ``missing``."""

    stage: str
    node: int | None
    kind: str
    reason: str
    partition: int | None = None

    def describe(self) -> str:
        where = "node ?" if self.node is None else f"node {self.node}"
        if self.partition is not None:
            where += f" (partition {self.partition})"
        return f"{where}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b[^:]*: ")


def condense_reason(reason: str | None, limit: int = 400) -> str:
    """A client's error reason on one line: the raised ``Type: message`` out of the traceback
    that flwr/Ray wrap around it (colour codes and frames dropped), else the text squeezed."""
    text = _ANSI.sub("", str(reason))
    for line in (raw.strip() for raw in text.splitlines()):
        head = line.split(":", 1)[0]
        if _ERROR_LINE.match(line) and "ClientAppException" not in head and not line.startswith("<class"):
            return line[:limit]
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _partition(msg: Message) -> int | None:
    try:
        metrics = msg.content.metric_records.get(protocol.METRICS)
        return (
            None
            if metrics is None or protocol.PARTITION_ID not in metrics
            else protocol.record_int(metrics[protocol.PARTITION_ID])
        )
    except Exception:  # noqa: BLE001 - an error reply has no content
        return None


def screen(
    replies: Iterable[Message],
    parse: Callable[[Message], T],
    *,
    stage: str,
    required: int,
    expected_nodes: Sequence[int] | None = None,
    expected_count: int | None = None,
    timeout: float | None = None,
    partitions: Mapping[int, int] | None = None,
) -> tuple[list[tuple[Message, T]], list[Dropped]]:
    """Valid ``(reply, parse(reply))`` pairs and the dropped clients of one phase.

    ``parse`` raises [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError]
    for an invalid reply. Missing replies are the ``expected_nodes`` that did not answer (or, without
    them, the shortfall against ``expected_count``). ``partitions`` (node -> partition id, known after
    the moment exchange) names the partition of a dropped client (the one it had there, whatever its
    reply says). A SuperNode that stopped sending heartbeats comes back from flwr as an error reply
    ("Node Unavailable"); a straggler given up by the server's rule of
    [`Timeouts`][fedhead.settings.limits.Timeouts] is ``missing``. Every dropped client is logged with
    its node and reason.
    """
    part = dict(partitions or {})
    replies = list(replies)
    kept: list[tuple[Message, T]] = []
    dropped: list[Dropped] = []
    for msg in replies:
        node = int(msg.metadata.src_node_id)
        if msg.has_error():
            if msg.error.code == STRAGGLER_ERROR_CODE:  # made up by the server's straggler rule
                dropped.append(Dropped(stage, node, "missing", str(msg.error.reason), part.get(node)))
                continue
            log.debug("%s: node %s replied with an error:\n%s", stage, node, msg.error.reason)
            dropped.append(Dropped(stage, node, "error", condense_reason(msg.error.reason), part.get(node)))
            continue
        try:
            kept.append((msg, parse(msg)))
        except agg.ReplyError as exc:
            pid = _partition(msg)
            dropped.append(Dropped(stage, node, "invalid", str(exc), part.get(node, pid)))
    waited = "" if timeout is None else f" within {timeout:g} s"
    if expected_nodes is not None:
        answered = {int(m.metadata.src_node_id) for m in replies}
        for node in sorted(set(int(n) for n in expected_nodes) - answered):
            dropped.append(
                Dropped(stage, node, "missing", f"no reply{waited} (timeout or lost client)", part.get(node))
            )
        n_expected = len(set(expected_nodes))
    else:
        n_expected = expected_count if expected_count is not None else len(replies)
        for _ in range(max(0, n_expected - len(replies))):
            dropped.append(Dropped(stage, None, "missing", f"no reply{waited} (timeout or lost client)"))
    if len(kept) < required:
        short = f"expected {n_expected} replies, received {len(replies)}; " if len(replies) < n_expected else ""
        raise TooFewReplies.of(stage, len(kept), n_expected, required, dropped, short)
    for d in dropped:
        log.warning(
            "%s: dropping %s; continuing with %d of %d clients (failure.min_clients=%d)",
            stage,
            d.describe(),
            len(kept),
            n_expected,
            required,
        )
    return kept, dropped
