"""Secure summation of float64 vectors over M sites (SecAgg, Bonawitz et al. 2017) for ``privacy.mode=secure``.

Pure and message-free: the strategy and the ClientApp carry what each stage returns (bytes, ints,
numpy arrays) in Flower messages. No torch.

Protocol (complete graph: every pair of sites shares a mask; SecAgg+'s sparse neighbourhoods
reduce to this for small M, so it is meant for M up to about 50, see the costs below). One
[`SecureSumClient`][fedhead.federation.secure_sum.SecureSumClient] per site and one
[`SecureSumServer`][fedhead.federation.secure_sum.SecureSumServer] run one sum, each object once:

1. *advertise*: each site draws two P-384 key pairs (flwr's ``generate_key_pairs``) and sends the
   public keys ``(c_u, s_u)``: ``c`` encrypts the key shares, ``s`` agrees the pairwise masks.
2. *share keys*: given every participant's public keys and the threshold ``t``, a site draws a
   fresh 32-byte self-mask seed ``b_u``, Shamir-shares ``b_u`` and its mask private key ``sk_s``
   into ``n`` shares (threshold ``t``; share ``i`` belongs to the ``i``-th site in id order, the
   site keeps its own), and encrypts ``(u, v, b-share, sk-share)`` for each peer ``v`` with the
   ECDH key of the ``c`` keys (Fernet). It also commits to ``b_u`` (SHA-256) so that the server
   can check the seed it reconstructs.
3. *mask*: given the ciphertexts addressed to it (their senders ``U2`` finished stage 2) and its
   input ``x_u``, a site returns ``y_u = enc(x_u) + G(b_u) + sum_{v in U2, v > u} G(s_uv)
   - sum_{v in U2, v < u} G(s_uv)`` in the ring ``Z_{2^(64k)}`` (below) with ``s_uv`` the ECDH key
   of the ``s`` keys.
4. *unmask*: the server names the survivors (sites whose ``y_u`` arrived) and the dropped
   (``U2`` minus the survivors); each survivor returns its ``b``-shares of the survivors and its
   ``sk``-shares of the dropped, and refuses to give both kinds for one site (that would unmask
   it). From ``t`` shares each, the server rebuilds ``b_u`` (checked against the commitment) and
   ``sk_s`` of the dropped (checked against ``s_d``), removes ``G(b_u)`` and the dropped sites'
   pair masks, and decodes the sum over the survivors. Pair masks among survivors cancel.

PRG: ``G(seed)`` is the ChaCha20 keystream (``cryptography``) under the key
``HKDF-SHA256(seed, info=purpose)``, read as little-endian uint64, one key per purpose (self
mask, pair mask). flwr's ``pseudo_rand_gen`` is not used: it folds the seed to 32 bits and draws
from ``np.random.RandomState``, so a server could try all 2^32 seeds and strip a mask. Every
object draws fresh keys and a fresh ``b_u``, and runs its stages once: a mask is never reused
(two inputs under one mask would reveal their difference).

Encoding ([`fedhead.federation.ring_encoding`][fedhead.federation.ring_encoding]): an entry ``x``,
``|x| <= bound``, becomes the integer ``round(x 2^f)`` in two's complement modulo ``2^(64k)``, ``k``
uint64 words ([`RingFixedPoint`][fedhead.federation.ring_encoding.RingFixedPoint]). Encodings, masks
(``k L`` uniform words: a uniform ring element) and their sums all live in this one ring, added with
carries between the words, so a masked input is uniform and the unmasked words are the ring element
``S = sum_u round(x_u 2^f)``: a function of the sum alone. Exact while ``M round(bound 2^f) <
2^(64k-1)``; [`RingFixedPoint.for_sites`][fedhead.federation.ring_encoding.RingFixedPoint.for_sites]
picks the largest such ``f``. Each entry of the decoded sum ``S / 2^f`` (rounded once to float64) is
within ``M 2^-(f+1)`` of the exact sum of the inputs, plus half an ulp of the result. Example: bound
``2^20``, ``M = 100``, ``k = 2`` (128 bits): ``f = 100`` (``100 2^120 < 2^127 <= 100 2^121``), error
at most ``100 2^-101 = 3.9e-29`` on sums that can reach ``1e8``, where half an ulp of the sum itself
is ``7.5e-9``: the secure sum is more accurate than a float64 sum of the same inputs.

Threshold: ``t`` must be a majority of the sites, ``floor(n/2) + 1 <= t <= n``; the default is
``floor(M/2) + 1``. A site answers the unmasking once, with one kind of share per site, so a
server that calls a site dropped to some sites and a survivor to others would need ``t`` answers
of each kind from different sites, ``2t > n`` in all: it cannot unmask that site. At least 3
sites: with two, the sum and one's own input give the other's input to each site that sees the
result. ``t >= 2`` survivors always, so no single input is ever decoded.

What the server learns: the sum over the survivors and who dropped at which stage. A site learns
nothing of the others' inputs. Up to ``t - 1`` sites colluding with an honest-but-curious server
learn nothing beyond that sum; ``t`` or more hold enough shares to rebuild any site's ``b_u`` and
``sk_s`` and unmask its input. Not covered: a server that shows different sites different key
books (the active-adversary variant adds signed keys and a consistency round).

Costs, complete graph, ``n`` sites, ``L`` entries (P-384 PEM keys 215 bytes, b-share 72 bytes,
sk-share 72 bytes, one Fernet ciphertext 312 bytes):

| stage | site -> server | server -> site | work |
|---|---|---|---|
| advertise | 2 keys, 430 B | -- | site: 2 key pairs |
| share keys | (n-1) ciphertexts, 312 B each | key book, 430 n B | site: 2 Shamir splits, n-1 ECDH, n-1 encryptions |
| mask | ``y_u``, 8 k L B | (n-1) ciphertexts | site: n-1 decryptions and ECDH, n ChaCha20 streams of k L words |
| unmask | 72 B per survivor, 72 B per dropped | the two lists | server: see below |

At the server, unmasking costs per survivor one Shamir combine and one stream, and per dropped
site one combine, then one ECDH and one stream per survivor.

Messages: one request and one reply per site and stage (4 round trips). Total traffic grows as
``n^2`` (key shares) plus ``8 k L n`` (masked inputs).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fedhead.analysis.procedure import ConfigError
from fedhead.federation import shamir
from fedhead.federation.aggregation import ReplyError
from fedhead.federation.ring_encoding import RingFixedPoint, ring_add, ring_sub

log = logging.getLogger(__name__)

#: Fewest sites a secure sum starts with (two would reveal each one's input to the other).
MIN_SITES = 3
_SELF_MASK = b"fedhead secure sum: self mask"
_PAIR_MASK = b"fedhead secure sum: pair mask"
_SEED_BYTES = 32


class SecureSumError(RuntimeError):
    """The secure sum cannot go on: too few sites left, or a party broke the protocol."""


# --------------------------------------------------------------------------------------------
# parameters, masks
# --------------------------------------------------------------------------------------------


def default_threshold(sites: int) -> int:
    """A majority of ``sites``: ``floor(sites / 2) + 1``."""
    return sites // 2 + 1


def check_threshold(threshold: int, sites: int) -> int:
    """``threshold`` when it is a majority of ``sites`` and at least 2: ``max(2, floor(n/2)+1) <= t <= n``."""
    low = max(2, default_threshold(sites))
    if isinstance(threshold, bool) or not isinstance(threshold, int | np.integer) or not low <= threshold <= sites:
        raise ConfigError(
            f"secure sum: the threshold must be an integer in [{low}, {sites}] for {sites} sites (a majority, "
            f"so that no two groups of sites can reveal both shares of one site), got {threshold!r}"
        )
    return int(threshold)


def _check_site_ids(sites: Iterable[int]) -> list[int]:
    ids = list(sites)
    if any(isinstance(s, bool) or not isinstance(s, int | np.integer) or not 0 <= s < 2**64 for s in ids):
        raise ConfigError(f"secure sum: site ids must be integers in [0, 2^64), got {ids}")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"secure sum: site ids must be distinct, got {ids}")
    return sorted(int(s) for s in ids)


def _check_length(length: int) -> int:
    if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 1:
        raise ConfigError(f"secure sum: the vector length must be a positive integer, got {length!r}")
    return int(length)


def _stream(seed: bytes, purpose: bytes, length: int) -> np.ndarray:
    """``length`` uint64 words of the ChaCha20 keystream under ``HKDF-SHA256(seed, info=purpose)``."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(seed)
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8").astype(np.uint64)


def _pair_mask(private_key: ec.EllipticCurvePrivateKey, peer_key: bytes, length: int) -> np.ndarray:
    """``G(s_uv)``: the same stream at both ends of the pair (ECDH of the mask keys)."""
    shared = base64.urlsafe_b64decode(generate_shared_key(private_key, bytes_to_public_key(peer_key)))
    return _stream(shared, _PAIR_MASK, length)


def _seed_digest(seed: bytes) -> bytes:
    return hashlib.sha256(b"fedhead secure sum: seed commitment" + seed).digest()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


# --------------------------------------------------------------------------------------------
# what the stages carry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicKeys:
    """A site's stage-1 advertisement: PEM public keys ``encryption`` (``c_u``) and ``mask`` (``s_u``)."""

    encryption: bytes
    mask: bytes


@dataclass(frozen=True)
class KeyShares:
    """A site's stage-2 reply: ``ciphertexts`` ``{peer: Fernet token}``, ``seed_digest`` committing to ``b_u``."""

    ciphertexts: dict[int, bytes]
    seed_digest: bytes


@dataclass(frozen=True)
class Unmasking:
    """The server's stage-4 request: ``survivors`` (whose masked input arrived) and ``dropped`` (the rest of ``U2``)."""

    survivors: tuple[int, ...]
    dropped: tuple[int, ...]


@dataclass(frozen=True)
class RevealedShares:
    """A site's stage-4 reply: ``seed_shares`` ``{survivor: b-share}``, ``key_shares`` ``{dropped: sk-share}``."""

    seed_shares: dict[int, bytes]
    key_shares: dict[int, bytes]


@dataclass(frozen=True)
class SecureSumResult:
    """The outcome: the float64 ``total`` over ``survivors``; ``encoded``, the unmasked ring element ``S`` (uint64
    ``(k L,)``, all the server sees of the inputs); and ``dropped``."""

    total: np.ndarray
    encoded: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]


# --------------------------------------------------------------------------------------------
# a site
# --------------------------------------------------------------------------------------------


class SecureSumClient:
    """One site's side of one secure sum; its stages run once each, in order.

    Parameters
    ----------
    site : int
        This site's id (the Flower node id), unique among the participants.
    """

    def __init__(self, site: int):
        self.site = _check_site_ids([site])[0]
        self._stage = 0
        self._enc_key, enc_public = generate_key_pairs()
        self._mask_key, mask_public = generate_key_pairs()
        self._public = PublicKeys(public_key_to_bytes(enc_public), public_key_to_bytes(mask_public))
        self._book: dict[int, PublicKeys] = {}
        self._threshold = 0
        self._seed = b""
        self._seed_shares: dict[int, bytes] = {}
        self._key_shares: dict[int, bytes] = {}
        self._peers: tuple[int, ...] = ()

    def to_bytes(self) -> bytes:
        """This site's whole state (its private keys included) as bytes, for a ClientApp that keeps it between
        messages in its node's own state; never sent
        ([`from_bytes`][fedhead.federation.secure_sum.SecureSumClient.from_bytes])."""
        state = {
            "site": self.site,
            "stage": self._stage,
            "keys": [_b64(private_key_to_bytes(k)) for k in (self._enc_key, self._mask_key)],
            "book": {str(s): [_b64(k.encryption), _b64(k.mask)] for s, k in self._book.items()},
            "threshold": self._threshold,
            "seed": _b64(self._seed),
            "seed_shares": {str(s): _b64(v) for s, v in self._seed_shares.items()},
            "key_shares": {str(s): _b64(v) for s, v in self._key_shares.items()},
            "peers": list(self._peers),
        }
        return json.dumps(state).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> SecureSumClient:
        """The site of [`to_bytes`][fedhead.federation.secure_sum.SecureSumClient.to_bytes]."""
        try:
            state = json.loads(blob)
            self = cls.__new__(cls)
            self.site = int(state["site"])
            self._stage = int(state["stage"])
            self._enc_key, self._mask_key = (bytes_to_private_key(_unb64(k)) for k in state["keys"])
            self._public = PublicKeys(
                public_key_to_bytes(self._enc_key.public_key()), public_key_to_bytes(self._mask_key.public_key())
            )
            self._book = {int(s): PublicKeys(_unb64(e), _unb64(m)) for s, (e, m) in state["book"].items()}
            self._threshold = int(state["threshold"])
            self._seed = _unb64(state["seed"])
            self._seed_shares = {int(s): _unb64(v) for s, v in state["seed_shares"].items()}
            self._key_shares = {int(s): _unb64(v) for s, v in state["key_shares"].items()}
            self._peers = tuple(int(p) for p in state["peers"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SecureSumError(f"secure sum: the site's stored state does not parse ({type(exc).__name__})") from None
        return self

    def _enter(self, stage: int, name: str) -> None:
        if self._stage != stage - 1:
            done = f"after stage {self._stage}" if self._stage else "before stage 1"
            raise SecureSumError(f"secure sum: site {self.site} asked for stage {stage} ({name}) {done}")
        self._stage = stage

    def advertise(self) -> PublicKeys:
        """Stage 1: this site's two public keys."""
        self._enter(1, "advertise")
        return self._public

    def share_keys(self, key_book: Mapping[int, PublicKeys], threshold: int) -> KeyShares:
        """Stage 2: Shamir-share a fresh ``b_u`` and ``sk_s`` (threshold ``t``) and encrypt one pair per peer.

        Parameters
        ----------
        key_book : mapping site -> PublicKeys
            Every participant's advertised keys, this site's own included.
        threshold : int
            ``t``, a majority of the participants.

        Returns
        -------
        KeyShares
            ``{peer: ciphertext}`` for every other participant, and the commitment to ``b_u``.
        """
        self._enter(2, "share keys")
        sites = _check_site_ids(key_book)
        if self._public != key_book.get(self.site):
            raise SecureSumError(f"secure sum: the key book does not hold site {self.site}'s own keys")
        keys = [k for s in sites for k in (key_book[s].encryption, key_book[s].mask)]
        if len(set(keys)) != len(keys):
            raise SecureSumError("secure sum: the key book repeats a public key")
        self._threshold = check_threshold(threshold, len(sites))
        self._book = {s: key_book[s] for s in sites}
        self._seed = os.urandom(_SEED_BYTES)
        seed_shares = shamir.split(self._seed, self._threshold, len(sites))
        scalar = self._mask_key.private_numbers().private_value.to_bytes(48, "big")  # P-384: 48 bytes
        key_shares = shamir.split(scalar, self._threshold, len(sites))
        ciphertexts = {}
        for site, seed_share, key_share in zip(sites, seed_shares, key_shares, strict=True):
            if site == self.site:
                self._seed_shares[site], self._key_shares[site] = seed_share, key_share
                continue
            key = generate_shared_key(self._enc_key, bytes_to_public_key(self._book[site].encryption))
            ciphertexts[site] = encrypt(key, share_keys_plaintext_concat(self.site, site, seed_share, key_share))
        log.debug("secure sum: site %d shared its keys with %d peers", self.site, len(ciphertexts))
        return KeyShares(ciphertexts, _seed_digest(self._seed))

    def mask(self, ciphertexts: Mapping[int, bytes], values: np.ndarray, encoding: RingFixedPoint) -> np.ndarray:
        """Stage 3: store the peers' shares and return ``y_u``, the masked encoding of ``values``.

        Parameters
        ----------
        ciphertexts : mapping peer -> bytes
            The stage-2 ciphertexts addressed to this site; their senders are the peers ``U2``.
        values : ndarray, shape (L,)
            This site's input (float64, every entry at most ``encoding.bound`` in magnitude);
            several arrays go in one sum concatenated (``np.concatenate([a.ravel() for a in ...])``).
        encoding : RingFixedPoint
            The encoding the server fixed for this sum (``k = encoding.words``).

        Returns
        -------
        ndarray of uint64, shape (encoding.width(L),)
            ``enc(x_u) + G(b_u) + sum_{v > u} G(s_uv) - sum_{v < u} G(s_uv)`` in ``Z_{2^(64k)}``.
        """
        self._enter(3, "mask")
        if not isinstance(encoding, RingFixedPoint):
            raise TypeError(f"secure sum: encoding must be a RingFixedPoint, got {type(encoding).__name__}")
        encoding.check_sites(len(self._book))
        x = np.asarray(values, dtype=np.float64)
        if x.ndim != 1 or x.size == 0:
            raise ValueError(f"secure sum: the input must be a non-empty flat vector, got shape {x.shape}")
        for peer, token in ciphertexts.items():
            if peer == self.site or peer not in self._book:
                raise SecureSumError(f"secure sum: site {self.site} got key shares from unknown site {peer}")
            key = generate_shared_key(self._enc_key, bytes_to_public_key(self._book[peer].encryption))
            try:
                src, dst, seed_share, key_share = share_keys_plaintext_separate(decrypt(key, token))
            except InvalidToken:
                raise SecureSumError(
                    f"secure sum: site {self.site} cannot decrypt the key shares from site {peer} (tampered, wrong key)"
                ) from None
            if src != peer or dst != self.site:
                raise SecureSumError(
                    f"secure sum: key shares routed from site {peer} to site {self.site} name {src} -> {dst}"
                )
            self._seed_shares[peer], self._key_shares[peer] = seed_share, key_share
        self._peers = tuple(sorted(ciphertexts))
        if len(self._peers) + 1 < self._threshold:
            raise SecureSumError(
                f"secure sum: {len(self._peers) + 1} sites shared their keys, the threshold is {self._threshold}"
            )
        k = encoding.words
        y = ring_add(encoding.encode(x), _stream(self._seed, _SELF_MASK, encoding.width(x.size)), k)
        for peer in self._peers:
            pair = _pair_mask(self._mask_key, self._book[peer].mask, y.size)
            y = ring_add(y, pair, k) if peer > self.site else ring_sub(y, pair, k)
        return y

    def reveal(self, survivors: Collection[int], dropped: Collection[int]) -> RevealedShares:
        """Stage 4: the ``b``-shares of ``survivors`` and the ``sk``-shares of ``dropped``.

        Refuses a site named in both sets, a name outside this site's ``U2`` (and itself), this
        site missing from the survivors, and fewer than ``t`` survivors.
        """
        self._enter(4, "reveal")
        alive, gone = set(survivors), set(dropped)
        if alive & gone:
            raise SecureSumError(
                f"secure sum: site {self.site} was asked for both shares of site(s) {sorted(alive & gone)}; refused"
            )
        known = {self.site, *self._peers}
        if not (alive | gone) <= known:
            raise SecureSumError(
                f"secure sum: site {self.site} holds no shares of site(s) {sorted((alive | gone) - known)}"
            )
        if self.site not in alive:
            raise SecureSumError(f"secure sum: site {self.site} was asked to unmask but is not named a survivor")
        if len(alive) < self._threshold:
            raise SecureSumError(f"secure sum: {len(alive)} sites survived, the threshold is {self._threshold}")
        return RevealedShares(
            {s: self._seed_shares[s] for s in sorted(alive)}, {s: self._key_shares[s] for s in sorted(gone)}
        )


# --------------------------------------------------------------------------------------------
# the server
# --------------------------------------------------------------------------------------------


class SecureSumServer:
    """The server's side of one secure sum: routes the key shares, sums the masked inputs, unmasks.

    Parameters
    ----------
    sites : iterable of int
        The sampled sites (at least 3, distinct ids).
    length : int
        ``L``, the number of float64 entries every site sums.
    encoding : RingFixedPoint
        Must keep sums over ``len(sites)`` inputs exact
        ([`RingFixedPoint.for_sites`][fedhead.federation.ring_encoding.RingFixedPoint.for_sites] picks one).
    threshold : int, optional
        ``t``; default a majority ``floor(M/2) + 1``
        ([`check_threshold`][fedhead.federation.secure_sum.check_threshold]).
    """

    def __init__(self, sites: Iterable[int], length: int, encoding: RingFixedPoint, *, threshold: int | None = None):
        self.sites = tuple(_check_site_ids(sites))
        m = len(self.sites)
        if m < MIN_SITES:
            raise ConfigError(
                f"secure sum: needs at least {MIN_SITES} sites, got {m} (with two, each site learns the other's "
                "input from the sum and its own)"
            )
        self.length = _check_length(length)
        if not isinstance(encoding, RingFixedPoint):
            raise ConfigError(f"secure sum: encoding must be a RingFixedPoint, got {type(encoding).__name__}")
        encoding.check_sites(m)
        self.encoding = encoding
        self.width = encoding.width(self.length)  # uint64 words of each masked input
        self.threshold = check_threshold(default_threshold(m) if threshold is None else threshold, m)
        self._stage = 0
        self._book: dict[int, PublicKeys] = {}
        self._digests: dict[int, bytes] = {}
        self._sum = np.zeros(self.width, dtype=np.uint64)
        self._unmasking = Unmasking((), ())

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
        seen: dict[bytes, int] = {}
        for site, pk in keys.items():
            if site not in self.sites:
                raise ReplyError(site, "secure sum: public keys from a site outside the sum")
            if not isinstance(pk, PublicKeys):
                raise ReplyError(site, f"secure sum: public keys must be PublicKeys, got {type(pk).__name__}")
            for key in (pk.encryption, pk.mask):
                try:
                    bytes_to_public_key(key)
                except (ValueError, TypeError):
                    raise ReplyError(site, "secure sum: a public key does not parse as a PEM EC key") from None
                if key in seen:
                    raise ReplyError(site, f"secure sum: a public key repeats one of site {seen[key]}")
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
        """Stage 3: the masked inputs ``{site: y_u}``; sums them and returns whom to unmask."""
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
            total = ring_add(total, arr, self.encoding.words)
        survivors = tuple(sorted(masked))
        self._enough(len(survivors), "survived")
        self._sum = total
        self._unmasking = Unmasking(survivors, tuple(s for s in self._digests if s not in masked))
        if self._unmasking.dropped:
            log.info("secure sum: site(s) %s dropped after sharing keys", list(self._unmasking.dropped))
        return self._unmasking

    def unmask(self, revealed: Mapping[int, RevealedShares]) -> SecureSumResult:
        """Stage 4: the survivors' replies ``{site: RevealedShares}``; returns the sum over the survivors."""
        self._enter(4, "unmask")
        alive, gone = self._unmasking.survivors, self._unmasking.dropped
        index = {s: i + 1 for i, s in enumerate(self._book)}
        for site, reply in revealed.items():
            if site not in alive:
                raise ReplyError(site, "secure sum: unmasking shares from a site that is not a survivor")
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
        helpers = sorted(revealed)[: self.threshold]
        total, k = self._sum.copy(), self.encoding.words
        for site in alive:
            seed = self._combine([revealed[h].seed_shares[site] for h in helpers], site, "mask seed")
            if _seed_digest(seed) != self._digests[site]:
                raise SecureSumError(
                    f"secure sum: the shares of site {site}'s mask seed do not rebuild it (a wrong share)"
                )
            total = ring_sub(total, _stream(seed, _SELF_MASK, self.width), self.encoding.words)
        for site in gone:
            scalar = self._combine([revealed[h].key_shares[site] for h in helpers], site, "mask key")
            try:
                key = ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP384R1())
                rebuilt = public_key_to_bytes(key.public_key())
            except (ValueError, TypeError):
                rebuilt = b""
            if rebuilt != self._book[site].mask:
                raise SecureSumError(
                    f"secure sum: the shares of site {site}'s mask key do not rebuild it (a wrong share)"
                )
            for peer in alive:
                pair = _pair_mask(key, self._book[peer].mask, self.width)
                total = ring_sub(total, pair, k) if site > peer else ring_add(total, pair, k)
        return SecureSumResult(self.encoding.decode(total), total, alive, gone)

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
