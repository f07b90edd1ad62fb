"""The messages of a secure sum's later steps (``query`` messages of stage ``secure-sum``), as the server
sends and screens them: [`SumMessages`][fedhead.strategies.secure_steps.SumMessages] for one sum, and
[`ask_with_next`][fedhead.strategies.secure_steps.ask_with_next] for a step that also carries the next sum's
key book ([`fedhead.strategies.secure_pipeline`][fedhead.strategies.secure_pipeline])."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.secure_sum import KeyShares
from fedhead.strategies.exchange import ConfigValue
from fedhead.strategies.failures import Dropped, screen
from fedhead.strategies.secure_pipeline import NextBook

log = logging.getLogger(__name__)
T = TypeVar("T")


def stage_messages(
    payloads: Mapping[int, bytes],
    sum_name: str,
    step: str,
    message_config: Mapping[str, ConfigValue],
    following: tuple[str, Mapping[int, bytes]] | None = None,
    sign_now: bool = False,
) -> list[Message]:
    """One ``query`` per site carrying ``step``'s payload of the sum ``sum_name``; ``following``: the next
    sum's id and a payload for some of the sites (its key book, with the survivor list or the reveal);
    ``sign_now``: a mask request asks for the site's signature of its full list with its masked input."""
    out = []
    for node, payload in payloads.items():
        cfg = ConfigRecord({**message_config, protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: sum_name, sr.STEP: step})
        if sign_now:
            cfg[sr.SIGN_NOW] = True
        content = RecordDict({protocol.CONFIG: cfg, sr.SECURE: ConfigRecord({sr.PAYLOAD: payload})})
        if following is not None and node in following[1]:
            cfg[sr.NEXT_SUM] = following[0]
            content[sr.NEXT] = ConfigRecord({sr.PAYLOAD: following[1][node]})
        out.append(Message(content=content, dst_node_id=int(node), message_type=MessageType.QUERY))
    return out


@dataclass(frozen=True)
class SumMessages:
    """Where the later steps of the secure sum ``sum_id`` (``name`` in messages to people) go and how their
    replies are screened: the ``grid``, the ``timeout`` of each step, the entries of every message
    (``message_config``), the sites' ``partitions`` and the failure policy's ``required`` minimum."""

    grid: Grid
    sum_id: str
    name: str
    timeout: float
    required: int
    message_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    partitions: Mapping[int, int] | None = None

    def send(self, messages: list[Message]) -> list[Message]:
        """The replies to ``messages`` (one step)."""
        return list(self.grid.send_and_receive(messages, timeout=self.timeout))

    def screen(
        self, step: str, replies: list[Message], parse: Callable[[Message], T], needed: int, nodes: Sequence[int]
    ) -> tuple[dict[int, T], list[Dropped]]:
        """The valid replies of ``step`` from ``nodes`` by node, and the sites dropped
        ([`screen`][fedhead.strategies.failures.screen]: fewer than ``needed`` end the run)."""
        wanted = set(nodes)
        kept, lost = screen(
            [m for m in replies if protocol.node_of(m) in wanted],
            parse,
            stage=f"secure sum of {self.name} ({step})",
            required=needed,
            expected_nodes=list(nodes),
            timeout=self.timeout,
            partitions=self.partitions,
        )
        return {protocol.node_of(m): v for m, v in kept}, lost

    def ask(
        self,
        step: str,
        payloads: Mapping[int, bytes],
        parse: Callable[[Message], T],
        needed: int,
        *,
        sign_now: bool = False,
    ) -> tuple[dict[int, T], list[Dropped]]:
        """``step`` sent to the sites of ``payloads``; their screened replies."""
        replies = self.send(stage_messages(payloads, self.sum_id, step, self.message_config, sign_now=sign_now))
        return self.screen(step, replies, parse, needed, list(payloads))


def ask_with_next(
    sums: SumMessages,
    step: str,
    payloads: Mapping[int, bytes],
    following: NextBook | None,
    parse: Callable[[Message], T],
) -> tuple[dict[int, T], dict[int, KeyShares], list[Dropped]]:
    """``step`` to the sites of ``payloads``, with the next sum's stage 2: each of them shares its keys for the
    next sum with its reply; a site in the next sum's book outside ``payloads`` shares its keys in the same
    message phase. The replies of ``step``, the next sum's key shares and the sites that did not answer."""
    book: dict[int, bytes] = {}
    if following is not None:
        book = dict.fromkeys(following.book, sr.pack_book(following.book, following.server.threshold))
    ahead = None if following is None else (following.sum_id, book)
    messages = stage_messages(payloads, sums.sum_id, step, sums.message_config, ahead)
    joining = [n for n in book if n not in payloads]
    if following is not None and joining:
        messages += stage_messages({n: book[n] for n in joining}, following.sum_id, sr.SHARE_KEYS, sums.message_config)
    replies = sums.send(messages)
    answered, lost = sums.screen(step, replies, _with_next_shares(parse), 0, list(payloads))
    shares = {n: s for n, (_, s) in answered.items() if s is not None}
    if joining:
        joined, _ = sums.screen(sr.SHARE_KEYS, replies, parser(sr.unpack_shares), 0, joining)
        shares.update(joined)
    return {n: value for n, (value, _) in answered.items()}, shares, lost


def _with_next_shares(parse: Callable[[Message], T]) -> Callable[[Message], tuple[T, KeyShares | None]]:
    """``parse`` of a step's reply, with the site's key shares for the next sum when it sent them."""

    def parse_both(msg: Message) -> tuple[T, KeyShares | None]:
        value = parse(msg)
        record = msg.content.config_records.get(sr.NEXT)
        if record is None:
            return value, None
        try:
            return value, sr.unpack_shares(sr.payload_of(record))
        except (ValueError, KeyError, TypeError):
            log.info("node %d: its key shares for the next secure sum do not parse", protocol.node_of(msg))
            return value, None

    return parse_both


def parser(unpack: Callable[[bytes], T]) -> Callable[[Message], T]:
    """A step reply's parser: ``unpack`` of its payload; a ``ReplyError`` naming the site when it does not parse."""

    def parse(msg: Message) -> T:
        try:
            return unpack(sr.payload_of(msg.content.config_records.get(sr.SECURE)))
        except (ValueError, KeyError, TypeError) as exc:
            raise agg.ReplyError(protocol.node_of(msg), f"secure step reply does not parse ({exc})") from None

    return parse
