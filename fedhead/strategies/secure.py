"""The server's side of ``privacy.mode=secure``: every sum it needs comes from a secure sum
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]), so it never holds a site's
statistics or head, only their sums over the surviving sites.

[`run_secure_sum`][fedhead.strategies.secure.run_secure_sum] drives stages 2-5 over the grid after a
phase message (stage 1: the sites reply with their public keys); the one-time exchange of pooled
moments is [`secure_exchange`][fedhead.strategies.secure_exchange.secure_exchange], each round's sums
[`SecureAggregator`][fedhead.strategies.secure_aggregator.SecureAggregator]. What needs per-site values
(``G_star``, the gap terms, per-site margins, local gaps, ``delta``) is absent, with
[`ABSENT_REASON`][fedhead.strategies.secure.ABSENT_REASON].
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead.analysis.regime import OutsideRegimeError
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.roster import Roster
from fedhead.federation.secure_server import SecureSumServer
from fedhead.federation.secure_sum import MIN_SITES, PublicKeys, SecureSumError, default_threshold
from fedhead.strategies.exchange import ConfigValue, MomentExchange
from fedhead.strategies.failures import Dropped, TooFewReplies, screen
from fedhead.strategies.replies import FederationError, metrics_of

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Why results.json holds no per-site quantity in secure mode.
ABSENT_REASON = (
    "privacy.mode=secure: the server holds only sums over the sites, so G_star, the gap terms, the per-site "
    "margins, outlier scores, local gaps and delta (which need each site's statistics or head) are not computed"
)
#: Quantities that need per-site values (null in a secure run's results.json).
ABSENT = (
    "g_star",
    "gap terms (trace_m_mu, trace_m_sigma, trace_m_a)",
    "margins",
    "outlier_scores",
    "moments.counts/means/covs",
    "targets.grams/client_grams",
    "rounds[t].delta, objective_gaps, trained_gaps, e_f_star, recursion",
)


#: Round scalars of a secure run (``rounds[t].extra``): the sites in the sum, and those of them that
#: report they reached their local optimum (their own pass or fail).
SITES_SUMMED = "secure_sites"
SITES_AT_OPTIMUM = "secure_sites_at_local_optimum"
#: Round scalars under differential privacy: the releases so far (exchange, rounds, evaluations) and their epsilon.
DP_RELEASES = "dp_releases"
DP_EPSILON = "dp_epsilon"


def enforce_reported_regime(exchange: MomentExchange, allow_outside_regime: bool) -> None:
    """Refuse to train when a site reports a non-positive margin of its own, unless allowed (then one warning)."""
    if exchange.diagnosis.fully_active:
        return
    text = (
        f"outside the fully active regime: {exchange.diagnosis.recommendation} (privacy.mode=secure: the server "
        "sees each site's margin only as pass or fail)"
    )
    if not allow_outside_regime:
        raise OutsideRegimeError(f"{text}; set dataset.allow_outside_regime=true to train anyway")
    log.warning("%s; training anyway (dataset.allow_outside_regime=true)", text)


#: The secure sum of the one-time exchange (a phase's sum is ``<kind>-<round>``).
EXCHANGE_SUM = "exchange"


@dataclass(frozen=True)
class SumSetup:
    """What every secure sum of a run shares: the federation's ``roster``, the Shamir ``threshold`` (None: a
    majority of the sites and of the roster) and ``tag``, fresh for every strategy, so that each sum's id
    ``<tag>/<name>`` is new to every site (a site takes part in a sum of one id once, over all its runs)."""

    roster: Roster
    threshold: int | None = None
    tag: str = field(default_factory=lambda: secrets.token_hex(8))

    def sum_id(self, name: str) -> str:
        """The id of the run's sum ``name`` (``exchange``, ``train-3``)."""
        return f"{self.tag}/{name}"

    def threshold_of(self, sites: int) -> int:
        """``t`` of a sum over ``sites`` sites: ``threshold`` (within ``[2, sites]``), else a majority of the
        sites and of the roster (what a site accepts unless its policy says otherwise)."""
        if self.threshold is None:
            return max(default_threshold(sites), default_threshold(len(self.roster)))
        return min(max(self.threshold, 2), sites)


class SecureSumFailed(FederationError):
    """A secure sum cannot finish: too few sites left for its threshold, or a site broke the protocol."""


@dataclass(frozen=True)
class SiteReply:
    """What a site's first reply of a secure sum carries: its keys and its pass/fail self-checks."""

    node: int
    partition: int | None
    keys: PublicKeys
    metrics: Mapping[str, float]
    site: Mapping[str, object] | None = None  # a site-local table's columns and key


@dataclass(frozen=True)
class SecureSum:
    """A finished secure sum: ``total`` over ``survivors`` (node ids) and the sites it ``dropped``."""

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[Dropped, ...]


def parse_site_reply(msg: Message) -> SiteReply:
    """The keys and metrics of a secure phase reply;
    [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] otherwise."""
    node = protocol.node_of(msg)
    try:
        keys = sr.unpack_keys(sr.payload_of(msg.content.config_records.get(sr.SECURE)))
    except (ValueError, KeyError, TypeError) as exc:
        raise agg.ReplyError(node, f"secure reply without valid public keys ({exc})") from None
    metrics = metrics_of(msg)
    values = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    pid = values.get(protocol.PARTITION_ID)
    site = msg.content.config_records.get(protocol.SITE)
    return SiteReply(node, None if pid is None else int(pid), keys, values, None if site is None else dict(site))


def stage_messages(
    payloads: Mapping[int, bytes], sum_name: str, step: str, message_config: Mapping[str, ConfigValue]
) -> list[Message]:
    """One ``query`` per site carrying ``step``'s payload of the sum ``sum_name``."""
    out = []
    for node, payload in payloads.items():
        cfg = ConfigRecord({**message_config, protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: sum_name, sr.STEP: step})
        content = RecordDict({protocol.CONFIG: cfg, sr.SECURE: ConfigRecord({sr.PAYLOAD: payload})})
        out.append(Message(content=content, dst_node_id=int(node), message_type=MessageType.QUERY))
    return out


def run_secure_sum(
    grid: Grid,
    sites: Mapping[int, PublicKeys],
    *,
    sum_id: str,
    name: str,
    length: int,
    bound: float,
    required: int,
    timeout: float,
    setup: SumSetup,
    message_config: Mapping[str, ConfigValue] | None = None,
    partitions: Mapping[int, int] | None = None,
) -> SecureSum:
    """Stages 2-5 of the secure sum ``sum_id`` (``name`` in messages to people) of the ``sites`` that advertised
    their keys (stage 1), among the members of ``setup.roster``.

    ``length`` entries per site, each at most ``bound`` in magnitude
    ([`encoding_for`][fedhead.federation.secure_records.encoding_for]); ``setup.threshold`` of the Shamir
    shares (None: a majority of the sites and of the roster, the least a site accepts unless its policy says
    otherwise); ``required``: the failure policy's minimum of sites in the sum. A site whose
    reply fails or is invalid before it sent its masked input leaves the sum (a ``Dropped``); a site
    that fails to help unmask is only missing. Fewer than the threshold (or ``required``) left end the
    run with one line ([`SecureSumFailed`][fedhead.strategies.secure.SecureSumFailed] or
    [`TooFewReplies`][fedhead.strategies.failures.TooFewReplies]).
    """
    config = dict(message_config or {})
    server = _server(sites, length, bound, sum_id, name, setup)
    encoding = server.encoding
    dropped: list[Dropped] = []

    def ask(
        step: str, payloads: Mapping[int, bytes], parse: Callable[[Message], T], needed: int
    ) -> tuple[dict[int, T], list[Dropped]]:
        replies = grid.send_and_receive(stage_messages(payloads, sum_id, step, config), timeout=timeout)
        kept, lost = screen(
            replies,
            parse,
            stage=f"secure sum of {name} ({step})",
            required=needed,
            expected_nodes=list(payloads),
            timeout=timeout,
            partitions=partitions,
        )
        return {protocol.node_of(m): v for m, v in kept}, lost

    try:
        book = server.collect_keys(dict(sites))
        blob = sr.pack_book(book, server.threshold)
        shares, lost = ask(sr.SHARE_KEYS, dict.fromkeys(book, blob), _parser(sr.unpack_shares), required)
        dropped += lost
        routed = server.route_shares(shares)
        requests = {node: sr.pack_mask_request(routed[node], encoding) for node in routed}
        masked, lost = ask(sr.MASK, requests, _masked, required)
        dropped += lost
        unmasking = server.collect_masked(masked)
        signatures, _ = ask(
            sr.SIGN, dict.fromkeys(unmasking.survivors, sr.pack(unmasking)), _parser(sr.unpack_signature), 0
        )
        request = server.collect_signatures(signatures)
        revealed, lost = ask(
            sr.REVEAL, dict.fromkeys(request.signatures, sr.pack(request)), _parser(sr.unpack_revealed), 0
        )
        for d in lost:  # its input is in the sum; only its shares are missing
            log.info("secure sum of %s: %s did not help unmask (%s)", name, f"node {d.node}", d.reason)
        result = server.unmask(revealed)
    except TooFewReplies:
        raise
    except (SecureSumError, agg.ReplyError) as exc:
        raise SecureSumFailed(f"secure sum of {name}: {exc} (privacy.threshold={server.threshold})") from None
    return SecureSum(result.total, result.survivors, tuple(dropped))


def _server(
    sites: Mapping[int, PublicKeys], length: int, bound: float, sum_id: str, name: str, setup: SumSetup
) -> SecureSumServer:
    """The server's side of the sum over ``sites`` (at least 3), with the encoding of ``bound``."""
    if len(sites) < MIN_SITES:
        raise SecureSumFailed(
            f"secure sum of {name}: {len(sites)} sites left, secure mode needs at least {MIN_SITES} (with two, "
            "each learns the other's input from the sum and its own)"
        )
    encoding = sr.encoding_for(bound, len(sites))
    t = setup.threshold_of(len(sites))
    try:
        return SecureSumServer(sorted(sites), length, encoding, sum_id=sum_id, roster=setup.roster, threshold=t)
    except Exception as exc:  # noqa: BLE001 - a threshold or encoding refused for this many sites
        raise SecureSumFailed(f"secure sum of {name}: {exc}") from None


def _parser(unpack: Callable[[bytes], T]) -> Callable[[Message], T]:
    def parse(msg: Message) -> T:
        try:
            return unpack(sr.payload_of(msg.content.config_records.get(sr.SECURE)))
        except (ValueError, KeyError, TypeError) as exc:
            raise agg.ReplyError(protocol.node_of(msg), f"secure step reply does not parse ({exc})") from None

    return parse


def _masked(msg: Message) -> np.ndarray:
    record = msg.content.array_records.get(sr.SECURE)
    if record is None or sr.MASKED not in record:
        raise agg.ReplyError(protocol.node_of(msg), "secure step reply lacks its masked input")
    return record[sr.MASKED].numpy()
