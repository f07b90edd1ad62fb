"""The server's side of one secure sum: [`SecureSumServer`][fedhead.federation.secure_server.SecureSumServer]
(the protocol: [`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]).

The server checks every reply it can against the roster, so that a site that breaks the protocol is
named ([`ReplyError`][fedhead.federation.aggregation.ReplyError]) before the others refuse; the sites
check everything again and trust nothing of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.supercore.primitives.asymmetric import bytes_to_public_key, public_key_to_bytes

from fedhead.analysis.constraints import ConfigError
from fedhead.federation import shamir
from fedhead.federation.reply_checks import ReplyError
from fedhead.federation.ring_encoding import RingFixedPoint, ring_add, ring_sub
from fedhead.federation.roster import Roster, check_sum_id, verify_advertisement, verify_survivors
from fedhead.federation.secure_sum import (
    MIN_SITES,
    KeyShares,
    PublicKeys,
    RevealedShares,
    SecureSumError,
    SecureSumResult,
    Unmasking,
    _check_length,
    _check_site_ids,
    _pair_mask,
    _seed_digest,
    _self_mask,
    check_threshold,
    default_threshold,
    mask_key_of,
)

log = logging.getLogger(__name__)


class SecureSumServer:
    """The server's side of one secure sum: routes the key shares, sums the masked inputs, collects the
    survivor-list signatures, unmasks.

    Parameters
    ----------
    sites : iterable of int
        The sampled sites (at least 3, distinct ids).
    length : int or None
        ``L``, the number of float64 entries every site sums (None: fixed later, before stage 3, by
        [`fix_input`][fedhead.federation.secure_server.SecureSumServer.fix_input]: a sum set up before its
        input is known).
    encoding : RingFixedPoint or None
        Must keep sums over ``len(sites)`` inputs exact
        ([`RingFixedPoint.for_sites`][fedhead.federation.ring_encoding.RingFixedPoint.for_sites] picks one);
        None with ``length``.
    sum_id : str
        The sum's id (unique per run: a site takes part in a sum of one id once).
    roster : Roster
        The federation's roster.
    threshold : int, optional
        ``t``; default a majority ``floor(M/2) + 1``
        ([`check_threshold`][fedhead.federation.secure_sum.check_threshold]).
    """

    def __init__(
        self,
        sites: Iterable[int],
        length: int | None,
        encoding: RingFixedPoint | None,
        *,
        sum_id: str,
        roster: Roster,
        threshold: int | None = None,
    ):
        self.sites = tuple(_check_site_ids(sites))
        m = len(self.sites)
        if m < MIN_SITES:
            raise ConfigError(
                f"secure sum: needs at least {MIN_SITES} sites, got {m} (with two, each site learns the other's "
                "input from the sum and its own)"
            )
        self._stage, self.length, self.width = 0, 0, 0
        self.encoding: RingFixedPoint | None = None
        if length is not None or encoding is not None:
            self.fix_input(length, encoding)
        self.threshold = check_threshold(default_threshold(m) if threshold is None else threshold, m)
        self.sum_id, self.roster = check_sum_id(sum_id), roster
        self._book: dict[int, PublicKeys] = {}
        self._digests: dict[int, bytes] = {}
        self._sum = np.zeros(0, dtype=np.uint64)
        self._unmasking = Unmasking((), ())

    def fix_input(self, length: int | None, encoding: RingFixedPoint | None) -> None:
        """Fix ``L`` and the encoding of a sum set up without them, before its masked inputs (stage 3)."""
        if self._stage >= 3 or self.length:
            raise SecureSumError("secure sum: the input's length and encoding are fixed once, before stage 3")
        length = _check_length(0 if length is None else length)
        if not isinstance(encoding, RingFixedPoint):
            raise ConfigError(f"secure sum: encoding must be a RingFixedPoint, got {type(encoding).__name__}")
        encoding.check_sites(len(self.sites))
        self.length, self.encoding = length, encoding
        self.width = encoding.width(length)  # uint64 words of each masked input

    @property
    def _ring(self) -> RingFixedPoint:
        if self.encoding is None:
            raise SecureSumError("secure sum: the input's length and encoding were never fixed")
        return self.encoding

    def _enter(self, stage: int, name: str) -> None:
        if self._stage != stage - 1:
            raise SecureSumError(f"secure sum: the server's stage {stage} ({name}) came after stage {self._stage}")
        self._stage = stage

    def _enough(self, count: int, what: str) -> None:
        if count < self.threshold:
            raise SecureSumError(f"secure sum: {count} sites {what}, the threshold is {self.threshold}")

    def collect_keys(self, keys: Mapping[int, PublicKeys]) -> dict[int, PublicKeys]:
        """Stage 1: the replies ``{site: PublicKeys}``; returns the key book to send to every participant."""
        self._enter(1, "collect keys")
        seen: dict[bytes | str, int] = {}
        for site, pk in keys.items():
            if site not in self.sites:
                raise ReplyError(site, "secure sum: public keys from a site outside the sum")
            if not isinstance(pk, PublicKeys) or not isinstance(pk.name, str):
                raise ReplyError(site, f"secure sum: public keys must be PublicKeys, got {type(pk).__name__}")
            for key in (pk.encryption, pk.mask):
                try:
                    bytes_to_public_key(key)
                except (ValueError, TypeError):
                    raise ReplyError(site, "secure sum: a public key does not parse as a PEM EC key") from None
            if not verify_advertisement(self.roster, pk.signature, self.sum_id, site, pk.name, pk.encryption, pk.mask):
                raise ReplyError(site, f"secure sum: the keys are not roster member {pk.name!r}'s signed advertisement")
            for key in (pk.encryption, pk.mask, pk.name):
                if key in seen:
                    raise ReplyError(site, f"secure sum: a public key or the name repeats one of site {seen[key]}")
                seen[key] = site
        self._enough(len(keys), "advertised keys")
        self._book = {s: keys[s] for s in sorted(keys)}
        return dict(self._book)

    def route_shares(self, shares: Mapping[int, KeyShares]) -> dict[int, dict[int, bytes]]:
        """Stage 2: the replies ``{site: KeyShares}``; returns ``{recipient: {sender: ciphertext}}`` over ``U2``."""
        self._enter(2, "route shares")
        for site, reply in shares.items():
            if site not in self._book:
                raise ReplyError(site, "secure sum: key shares from a site that advertised no keys")
            if (
                not isinstance(reply, KeyShares)
                or not isinstance(reply.seed_digest, bytes)
                or len(reply.seed_digest) != 32
            ):
                raise ReplyError(site, "secure sum: key shares must be KeyShares with a 32-byte seed digest")
            want = set(self._book) - {site}
            if set(reply.ciphertexts) != want or not all(isinstance(c, bytes) for c in reply.ciphertexts.values()):
                raise ReplyError(
                    site, f"secure sum: key shares must hold one ciphertext for each of sites {sorted(want)}"
                )
        self._enough(len(shares), "shared their keys")
        self._digests = {s: shares[s].seed_digest for s in sorted(shares)}
        return {
            dst: {src: shares[src].ciphertexts[dst] for src in self._digests if src != dst} for dst in self._digests
        }

    def collect_masked(self, masked: Mapping[int, np.ndarray]) -> Unmasking:
        """Stage 3: the masked inputs ``{site: y_u}``; sums them and returns the list each survivor signs."""
        ring = self._ring
        self._enter(3, "collect masked inputs")
        total = np.zeros(self.width, dtype=np.uint64)
        for site, y in masked.items():
            if site not in self._digests:
                raise ReplyError(site, "secure sum: a masked input from a site that did not share its keys")
            arr = np.asarray(y)
            if arr.dtype != np.uint64 or arr.shape != (self.width,):
                raise ReplyError(
                    site,
                    f"secure sum: the masked input must be uint64 ({self.width},), got {arr.dtype} {arr.shape}",
                )
            total = ring_add(total, arr, ring.words)
        survivors = tuple(sorted(masked))
        self._enough(len(survivors), "survived")
        self._sum = total
        self._unmasking = Unmasking(survivors, tuple(s for s in self._digests if s not in masked))
        if self._unmasking.dropped:
            log.info("secure sum: site(s) %s dropped after sharing keys", list(self._unmasking.dropped))
        return self._unmasking

    def _signature_fault(self, site: int, signature: bytes) -> str | None:
        """Why ``site``'s signature of the survivor list (after stage 3) is no valid survivor's; None if it is."""
        alive, gone = self._unmasking.survivors, self._unmasking.dropped
        if site not in alive:
            return "secure sum: a survivor-list signature from a site that is not a survivor"
        if not verify_survivors(self.roster, signature, self._book[site].name, self.sum_id, alive, gone):
            return "secure sum: the survivor-list signature does not verify"
        return None

    def verified(self, signatures: Mapping[int, bytes]) -> dict[int, bytes]:
        """The ``signatures`` of the survivor list (after stage 3) that are survivors' and verify; another is left
        out with a log line (its site's input still counts, only its signature does not)."""
        kept = {}
        for site, signature in signatures.items():
            fault = self._signature_fault(site, signature)
            if fault is None:
                kept[site] = signature
            else:
                log.info("site %d: %s; left out", site, fault)
        return kept

    def collect_signatures(self, signatures: Mapping[int, bytes]) -> Unmasking:
        """Stage 4: the survivors' signatures of the list ``{site: signature}``; returns the unmasking request
        (the list and every signature) to send to the sites that signed."""
        self._enter(4, "collect signatures")
        alive, gone = self._unmasking.survivors, self._unmasking.dropped
        for site, signature in signatures.items():
            fault = self._signature_fault(site, signature)
            if fault is not None:
                raise ReplyError(site, fault)
        self._enough(len(signatures), "signed the survivor list")
        self._unmasking = Unmasking(alive, gone, {s: signatures[s] for s in sorted(signatures)})
        return self._unmasking

    def unmask(self, revealed: Mapping[int, RevealedShares]) -> SecureSumResult:
        """Stage 5: the signers' replies ``{site: RevealedShares}``; returns the sum over the survivors."""
        self._enter(5, "unmask")
        alive, gone = self._unmasking.survivors, self._unmasking.dropped
        index = {s: i + 1 for i, s in enumerate(self._book)}
        for site, reply in revealed.items():
            if site not in self._unmasking.signatures:
                raise ReplyError(site, "secure sum: unmasking shares from a site that did not sign the survivor list")
            if (
                not isinstance(reply, RevealedShares)
                or set(reply.seed_shares) != set(alive)
                or set(reply.key_shares) != set(gone)
            ):
                raise ReplyError(
                    site, "secure sum: unmasking shares must name exactly the survivors and the dropped sites"
                )
            for share in (*reply.seed_shares.values(), *reply.key_shares.values()):
                if not shamir.is_share(share, index[site]):
                    raise ReplyError(site, "secure sum: a share is malformed or not this site's")
        self._enough(len(revealed), "answered the unmasking")
        return self._unmasked(revealed)

    def _unmasked(self, revealed: Mapping[int, RevealedShares]) -> SecureSumResult:
        """The sum over the survivors, from ``t`` helpers' shares of each mask."""
        alive, gone = self._unmasking.survivors, self._unmasking.dropped
        helpers = sorted(revealed)[: self.threshold]
        ring = self._ring
        total, k = self._sum.copy(), ring.words
        for site in alive:
            seed = self._combine([revealed[h].seed_shares[site] for h in helpers], site, "mask seed")
            if _seed_digest(seed, self.sum_id) != self._digests[site]:
                raise SecureSumError(
                    f"secure sum: the shares of site {site}'s mask seed do not rebuild it (a wrong share)"
                )
            total = ring_sub(total, _self_mask(seed, self.sum_id, self.width), k)
        for site in gone:
            secret = self._combine([revealed[h].key_shares[site] for h in helpers], site, "mask key")
            try:
                key = mask_key_of(secret)
                rebuilt = public_key_to_bytes(key.public_key())
            except (ValueError, TypeError):
                rebuilt = b""
            if rebuilt != self._book[site].mask:
                raise SecureSumError(
                    f"secure sum: the shares of site {site}'s mask key do not rebuild it (a wrong share)"
                )
            for peer in alive:
                pair = _pair_mask(key, self._book[peer].mask, self.sum_id, self.width)
                total = ring_sub(total, pair, k) if site > peer else ring_add(total, pair, k)
        return SecureSumResult(ring.decode(total), total, alive, gone)

    @staticmethod
    def _combine(shares: Sequence[bytes], site: int, what: str) -> bytes:
        if len({len(s) for s in shares}) != 1:
            raise SecureSumError(f"secure sum: the shares of site {site}'s {what} differ in length (a wrong share)")
        try:
            return shamir.combine(shares)
        except ValueError:
            raise SecureSumError(
                f"secure sum: the shares of site {site}'s {what} do not rebuild it (a wrong share)"
            ) from None
