"""The server's side of ``privacy.mode=secure``: every sum it needs comes from a secure sum
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]), so it never holds a site's
statistics or head, only their sums over the surviving sites.

[`run_secure_sum`][fedhead.strategies.secure.run_secure_sum] drives stages 2-5 over the grid after a
phase message (stage 1: the sites reply with their public keys), and
[`finish_sum`][fedhead.strategies.secure.finish_sum] stages 3-5 of a sum set up within the previous sum's
messages ([`fedhead.strategies.secure_pipeline`][fedhead.strategies.secure_pipeline]); when a site drops
from a sum whose sites signed their full lists with their masked inputs,
[`move_inputs`][fedhead.strategies.secure.move_inputs] moves the others' inputs to a fresh sum (the steps'
messages: [`fedhead.strategies.secure_steps`][fedhead.strategies.secure_steps]). The one-time exchange of pooled
moments is [`secure_exchange`][fedhead.strategies.secure_exchange.secure_exchange], each round's sums
[`SecureAggregator`][fedhead.strategies.secure_aggregator.SecureAggregator]. What needs per-site values
(``G_star``, the gap terms, per-site margins, local gaps, ``delta``) is absent, with
[`ABSENT_REASON`][fedhead.strategies.secure.ABSENT_REASON].
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from flwr.app import Message

from fedhead.analysis.constraints import ConfigError
from fedhead.analysis.regime import OutsideRegimeError
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.roster import Roster
from fedhead.federation.secure_server import SecureSumServer
from fedhead.federation.secure_sum import (
    MIN_SITES,
    PublicKeys,
    SecureSumError,
    default_threshold,
)
from fedhead.strategies.exchange import MomentExchange
from fedhead.strategies.failures import Dropped, TooFewReplies
from fedhead.strategies.replies import FederationError, metrics_of
from fedhead.strategies.secure_pipeline import SumPipeline, next_book, prepare
from fedhead.strategies.secure_steps import SumMessages, ask_with_next, parser

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
#: The sum the exchange's messages set up: the first round's (after a resume, the next sum starts with its keys).
FIRST_ROUND_SUM = "train-1"


@dataclass(frozen=True)
class SumSetup:
    """What every secure sum of a run shares: the federation's ``roster``, the Shamir ``threshold`` (None: a
    majority of the sites and of the roster) and ``tag``, fresh for every strategy, so that each sum's id
    ``<tag>/<name>`` is new to every site (a site takes part in a sum of one id once, over all its runs); its
    ``pipeline`` holds the next sum, set up within the messages of the one before
    ([`fedhead.strategies.secure_pipeline`][fedhead.strategies.secure_pipeline])."""

    roster: Roster
    threshold: int | None = None
    tag: str = field(default_factory=lambda: secrets.token_hex(8))
    pipeline: SumPipeline = field(default_factory=SumPipeline, compare=False)

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
    """What a site's phase reply of a secure sum carries: its keys (a sum that starts with its own key
    messages) or its masked input (a sum set up ahead), its pass/fail self-checks and its keys for the next
    sum (None: it takes no part in it)."""

    node: int
    partition: int | None
    keys: PublicKeys | None
    metrics: Mapping[str, float]
    site: Mapping[str, object] | None = None  # a site-local table's columns and key
    masked: np.ndarray | None = None
    next_keys: PublicKeys | None = None
    signature: bytes | None = None  # its signature of its full list, with its masked input


@dataclass(frozen=True)
class SecureSum:
    """A finished secure sum: ``total`` over ``survivors`` (node ids) and the sites it ``dropped``."""

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[Dropped, ...]


def parse_site_reply(msg: Message) -> SiteReply:
    """The keys (or masked input), next keys and metrics of a secure phase reply;
    [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] otherwise."""
    node = protocol.node_of(msg)
    keys, masked, signature = None, None, None
    if sr.SECURE in msg.content.array_records:
        masked, signature = _masked_signed(msg)
    else:
        try:
            keys = sr.unpack_keys(sr.payload_of(msg.content.config_records.get(sr.SECURE)))
        except (ValueError, KeyError, TypeError) as exc:
            raise agg.ReplyError(node, f"secure reply without valid public keys or masked input ({exc})") from None
    following = None
    if sr.NEXT in msg.content.config_records:
        try:
            following = sr.unpack_keys(sr.payload_of(msg.content.config_records[sr.NEXT]))
        except (ValueError, KeyError, TypeError):
            log.info("node %d: its keys for the next secure sum do not parse; it takes no part in it", node)
    metrics = metrics_of(msg)
    values = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    pid = values.get(protocol.PARTITION_ID)
    site = msg.content.config_records.get(protocol.SITE)
    part = None if pid is None else int(pid)
    return SiteReply(node, part, keys, values, None if site is None else dict(site), masked, following, signature)


def run_secure_sum(
    sums: SumMessages,
    sites: Mapping[int, PublicKeys],
    *,
    length: int,
    bound: float,
    setup: SumSetup,
    next_keys: Mapping[int, PublicKeys] | None = None,
    next_sum: str | None = None,
    sign_now: bool = True,
) -> SecureSum:
    """Stages 2-5 of a sum that starts with its own key messages: the ``sites`` that advertised their keys
    in their phase reply (stage 1), among the members of ``setup.roster``; their ``next_keys`` for the run's
    ``next_sum`` (its id) set it up within this sum's messages
    ([`fedhead.strategies.secure_pipeline`][fedhead.strategies.secure_pipeline]).

    ``length`` entries per site, each at most ``bound`` in magnitude
    ([`encoding_for`][fedhead.federation.secure_records.encoding_for]); ``setup.threshold`` of the Shamir
    shares (None: a majority of the sites and of the roster, the least a site accepts unless its policy says
    otherwise); ``sums.required``: the failure policy's minimum of sites in the sum. A site whose
    reply fails or is invalid before it sent its masked input leaves the sum (a ``Dropped``); a site
    that fails to help unmask is only missing. Fewer than the threshold (or ``required``) left end the
    run with one line ([`SecureSumFailed`][fedhead.strategies.secure.SecureSumFailed] or
    [`TooFewReplies`][fedhead.strategies.failures.TooFewReplies]). ``sign_now``: each site signs its full
    list with its masked input ([`finish_sum`][fedhead.strategies.secure.finish_sum]).
    """
    server = _server(sites, sums.sum_id, sums.name, setup)
    try:
        server.fix_input(length, sr.encoding_for(bound, len(sites)))
        book = server.collect_keys(dict(sites))
        blob = sr.pack_book(book, server.threshold)
        shares, dropped = sums.ask(sr.SHARE_KEYS, dict.fromkeys(book, blob), parser(sr.unpack_shares), sums.required)
        routed = server.route_shares(shares)
        encoding = server.encoding
        assert encoding is not None
        requests = {node: sr.pack_mask_request(routed[node], encoding) for node in routed}
        replies, lost = sums.ask(sr.MASK, requests, _masked_signed, sums.required, sign_now=sign_now)
    except TooFewReplies:
        raise
    except (SecureSumError, agg.ReplyError, ConfigError) as exc:
        raise SecureSumFailed(f"secure sum of {sums.name}: {exc} (privacy.threshold={server.threshold})") from None
    masked = {n: y for n, (y, _) in replies.items()}
    signatures = {n: sig for n, (_, sig) in replies.items() if sig is not None} if sign_now else None
    return finish_sum(
        sums, server, masked, [*dropped, *lost], setup, signatures=signatures, next_keys=next_keys, next_sum=next_sum
    )


def finish_sum(
    sums: SumMessages,
    server: SecureSumServer,
    masked: Mapping[int, np.ndarray],
    dropped: Sequence[Dropped],
    setup: SumSetup,
    *,
    signatures: Mapping[int, bytes] | None = None,
    next_keys: Mapping[int, PublicKeys] | None = None,
    next_sum: str | None = None,
) -> SecureSum:
    """Stages 3-5 from the sites' ``masked`` inputs; the next sum, when its sites shared their keys in these
    messages, is left ready in ``setup.pipeline``.

    ``signatures`` None: the survivor list to sign (with the next sum's key book for the sites that
    advertised keys for it), the reveal, the sum. Otherwise the sites signed their full lists with their
    masked inputs: when none of the sum's sites dropped, the reveal follows at once, with the next sum's key
    book (one message phase fewer); when one did, no list of this sum can unmask it, and the inputs of the
    sites that masked move to a fresh sum ([`move_inputs`][fedhead.strategies.secure.move_inputs])."""
    try:
        unmasking = server.collect_masked(masked)
    except (SecureSumError, agg.ReplyError) as exc:
        raise SecureSumFailed(f"secure sum of {sums.name}: {exc} (privacy.threshold={server.threshold})") from None
    # a site that dropped out of this sum is not set up for the next (it would drop out of that one too); one
    # that was not in this sum, but answered the phase with its keys, is
    next_keys = {n: k for n, k in (next_keys or {}).items() if n not in unmasking.dropped}
    if signatures is not None and unmasking.dropped:
        return move_inputs(sums, server, sorted(masked), dropped, setup, next_keys=next_keys, next_sum=next_sum)
    following = next_book(next_sum, next_keys, setup.roster, setup.threshold_of)
    try:
        if signatures is None:
            survivors = dict.fromkeys(unmasking.survivors, sr.pack(unmasking))
            signatures, shares, _ = ask_with_next(sums, sr.SIGN, survivors, following, parser(sr.unpack_signature))
            request = server.collect_signatures(server.verified(signatures))
            revealed, lost = sums.ask(
                sr.REVEAL, dict.fromkeys(request.signatures, sr.pack(request)), parser(sr.unpack_revealed), 0
            )
        else:
            request = server.collect_signatures(server.verified(signatures))
            signers = dict.fromkeys(request.signatures, sr.pack(request))
            revealed, shares, lost = ask_with_next(sums, sr.REVEAL, signers, following, parser(sr.unpack_revealed))
        for d in lost:  # its input is in the sum; only its shares are missing
            log.info("secure sum of %s: %s did not help unmask (%s)", sums.name, f"node {d.node}", d.reason)
        result = server.unmask(revealed)
    except TooFewReplies:
        raise
    except (SecureSumError, agg.ReplyError) as exc:
        raise SecureSumFailed(f"secure sum of {sums.name}: {exc} (privacy.threshold={server.threshold})") from None
    setup.pipeline.announce(next_sum, None if following is None else prepare(following, shares, setup.roster))
    return SecureSum(result.total, result.survivors, tuple(dropped))


def move_inputs(
    sums: SumMessages,
    server: SecureSumServer,
    sites: Sequence[int],
    dropped: Sequence[Dropped],
    setup: SumSetup,
    *,
    next_keys: Mapping[int, PublicKeys] | None = None,
    next_sum: str | None = None,
) -> SecureSum:
    """A sum whose ``sites`` signed their full lists with their masked inputs, and whose other sites dropped:
    each of ``sites`` moves its input to a fresh sum ``<id>~`` (the ``resum`` step, whose reply is its keys
    for it) and that sum runs its stages 2-5 with a survivor list to sign, so that a site dropping in it
    too is unmasked as usual."""
    fresh = f"{sums.sum_id}~"
    log.info(
        "secure sum of %s: %d site(s) dropped after sharing their keys; the other sites' inputs move to a fresh sum",
        sums.name,
        len(server.sites) - len(sites),
    )
    keys, lost = sums.ask(sr.RESUM, dict.fromkeys(sites, fresh.encode()), parser(sr.unpack_keys), sums.required)
    assert server.encoding is not None
    moved = run_secure_sum(
        dataclasses.replace(sums, sum_id=fresh),
        keys,
        length=server.length,
        bound=server.encoding.bound,
        setup=setup,
        next_keys=next_keys,
        next_sum=next_sum,
        sign_now=False,
    )
    return SecureSum(moved.total, moved.survivors, (*dropped, *lost, *moved.dropped))


def _server(sites: Mapping[int, PublicKeys], sum_id: str, name: str, setup: SumSetup) -> SecureSumServer:
    """The server's side of the sum over ``sites`` (at least 3)."""
    if len(sites) < MIN_SITES:
        raise SecureSumFailed(
            f"secure sum of {name}: {len(sites)} sites left, secure mode needs at least {MIN_SITES} (with two, "
            "each learns the other's input from the sum and its own)"
        )
    t = setup.threshold_of(len(sites))
    try:
        return SecureSumServer(sorted(sites), None, None, sum_id=sum_id, roster=setup.roster, threshold=t)
    except Exception as exc:  # noqa: BLE001 - a threshold refused for this many sites
        raise SecureSumFailed(f"secure sum of {name}: {exc}") from None


def _masked_signed(msg: Message) -> tuple[np.ndarray, bytes | None]:
    """A masked input and, when the site sent it, its signature of its full list."""
    record = msg.content.array_records.get(sr.SECURE)
    if record is None or sr.MASKED not in record:
        raise agg.ReplyError(protocol.node_of(msg), "secure step reply lacks its masked input")
    signed = msg.content.config_records.get(sr.SIGNED)
    try:
        signature = None if signed is None else sr.unpack_signature(sr.payload_of(signed))
    except (ValueError, KeyError, TypeError) as exc:
        node = protocol.node_of(msg)
        raise agg.ReplyError(node, f"the signature with the masked input does not parse ({exc})") from None
    return record[sr.MASKED].numpy(), signature
