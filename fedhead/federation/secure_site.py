"""A site's side of one secure sum: [`SecureSumClient`][fedhead.federation.secure_site.SecureSumClient]
(the protocol, its stages and why a deviating server learns nothing more:
[`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]).

Every refusal is one [`SecureSumError`][fedhead.federation.secure_sum.SecureSumError] line naming the
rule, never a key or a share; it ends the site's part in the sum (a later stage is refused too).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping

import numpy as np
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
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

from fedhead.analysis.constraints import ConfigError
from fedhead.federation import shamir
from fedhead.federation.ring_encoding import RingFixedPoint, ring_add, ring_sub
from fedhead.federation.roster import (
    Roster,
    UsedSumIds,
    check_sum_id,
    public_key,
    sign_advertisement,
    sign_survivors,
    verify_survivors,
)
from fedhead.federation.secure_sum import (
    _SEED_BYTES,
    KeyShares,
    PublicKeys,
    RevealedShares,
    SecureSumError,
    Unmasking,
    _b64,
    _check_site_ids,
    _pair_mask,
    _seed_digest,
    _self_mask,
    _sum_tag,
    _unb64,
    check_key_book,
    check_threshold,
    mask_key_secret,
)

log = logging.getLogger(__name__)

_STAGES = ("advertise", "share keys", "mask", "sign the survivors", "reveal")
_MOVED = len(_STAGES) + 1  # ``_refused`` of a sum whose input moved to a fresh sum


def _refuse(message: str) -> SecureSumError:
    return SecureSumError(f"secure sum: {message}")


class SecureSumClient:
    """One site's side of one secure sum; its stages run once each, in order, and a refused one ends it.

    Parameters
    ----------
    site : int
        This site's id (the Flower node id), unique among the participants.
    name : str
        This site's name in ``roster``, whose key is ``signing_key``'s.
    sum_id : str
        The sum's id; refused when ``used`` holds it, else added to ``used`` (which the caller keeps).
    roster : Roster
        The federation's roster, as this site holds it.
    signing_key : Ed25519PrivateKey
        This site's long-term signing key.
    used : UsedSumIds
        The sum ids this site took part in.
    min_survivors : int
        This site's floor ``f`` (at least 2): the smallest threshold it accepts, so the fewest sites
        whose sum it helps unmask; it masks with ``max(t, f) - 1`` peers or more.
    """

    def __init__(
        self,
        site: int,
        name: str,
        *,
        sum_id: str,
        roster: Roster,
        signing_key: Ed25519PrivateKey,
        used: UsedSumIds,
        min_survivors: int,
    ):
        self.site = _check_site_ids([site])[0]
        try:
            self.sum_id = check_sum_id(sum_id)
        except ConfigError as exc:
            raise SecureSumError(str(exc)) from None
        self.name, self._roster, self._signing_key = name, roster, signing_key
        self._check_identity()
        if isinstance(min_survivors, bool) or not isinstance(min_survivors, int | np.integer) or min_survivors < 2:
            raise ConfigError(f"secure sum: min_survivors must be an integer >= 2, got {min_survivors!r}")
        self.min_survivors = int(min_survivors)
        if sum_id in used:
            raise _refuse(f"site {self.site} already took part in a sum with id {sum_id!r}; refused")
        used.add(sum_id)
        self._stage, self._refused = 0, 0
        self._enc_key, enc_public = generate_key_pairs()
        self._mask_key, mask_public = generate_key_pairs()
        self._public = self._advertisement(public_key_to_bytes(enc_public), public_key_to_bytes(mask_public))
        self._book: dict[int, PublicKeys] = {}
        self._threshold = 0
        self._seed = b""
        self._seed_shares: dict[int, bytes] = {}
        self._key_shares: dict[int, bytes] = {}
        self._peers: tuple[int, ...] = ()
        self._signed: Unmasking | None = None

    def _check_identity(self) -> None:
        if self._roster.keys.get(self.name) != public_key(self._signing_key):
            raise ConfigError(f"secure sum: the signing key of site {self.name!r} is not its key in the roster")

    def _advertisement(self, encryption: bytes, mask: bytes) -> PublicKeys:
        sig = sign_advertisement(self._signing_key, self.sum_id, self.site, self.name, encryption, mask)
        return PublicKeys(encryption, mask, self.name, sig)

    # ----------------------------------------------------------------------------------------
    # the state a ClientApp keeps between messages
    # ----------------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """This site's state (its private mask keys included, not its signing key) as bytes, for a ClientApp
        that keeps it between messages in its node's own state; never sent
        ([`from_bytes`][fedhead.federation.secure_site.SecureSumClient.from_bytes])."""
        signed = self._signed
        state = {
            "site": self.site,
            "name": self.name,
            "sum": self.sum_id,
            "roster": self._roster.digest(),
            "floor": self.min_survivors,
            "stage": self._stage,
            "refused": self._refused,
            "keys": [_b64(private_key_to_bytes(k)) for k in (self._enc_key, self._mask_key)],
            "public": _b64(self._public.signature),
            "book": {
                str(s): [_b64(k.encryption), _b64(k.mask), k.name, _b64(k.signature)] for s, k in self._book.items()
            },
            "threshold": self._threshold,
            "seed": _b64(self._seed),
            "seed_shares": {str(s): _b64(v) for s, v in self._seed_shares.items()},
            "key_shares": {str(s): _b64(v) for s, v in self._key_shares.items()},
            "peers": list(self._peers),
            "signed": None if signed is None else [list(signed.survivors), list(signed.dropped)],
        }
        return json.dumps(state).encode()

    @classmethod
    def from_bytes(cls, blob: bytes, roster: Roster, signing_key: Ed25519PrivateKey) -> SecureSumClient:
        """The site of [`to_bytes`][fedhead.federation.secure_site.SecureSumClient.to_bytes], with the roster and
        signing key it began with (refused otherwise)."""
        try:
            state = json.loads(blob)
            self = cls.__new__(cls)
            self.site, self.name, self.sum_id = int(state["site"]), str(state["name"]), str(state["sum"])
            self._roster, self._signing_key = roster, signing_key
            self.min_survivors, self._stage, self._refused = (int(state[k]) for k in ("floor", "stage", "refused"))
            self._enc_key, self._mask_key = (bytes_to_private_key(_unb64(k)) for k in state["keys"])
            enc, mask = (public_key_to_bytes(k.public_key()) for k in (self._enc_key, self._mask_key))
            self._public = PublicKeys(enc, mask, self.name, _unb64(state["public"]))
            self._book = {
                int(s): PublicKeys(_unb64(e), _unb64(m), n, _unb64(g)) for s, (e, m, n, g) in state["book"].items()
            }
            self._threshold = int(state["threshold"])
            self._seed = _unb64(state["seed"])
            self._seed_shares = {int(s): _unb64(v) for s, v in state["seed_shares"].items()}
            self._key_shares = {int(s): _unb64(v) for s, v in state["key_shares"].items()}
            self._peers = tuple(int(p) for p in state["peers"])
            signed = state["signed"]
            if signed is not None:
                alive, gone = ([int(s) for s in ids] for ids in signed)
                signed = Unmasking(tuple(alive), tuple(gone))
            self._signed = signed
            digest = state["roster"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SecureSumError(f"secure sum: the site's stored state does not parse ({type(exc).__name__})") from None
        if digest != roster.digest():
            raise SecureSumError("secure sum: the roster differs from the one this site began the sum with")
        self._check_identity()
        return self

    # ----------------------------------------------------------------------------------------
    # the stages
    # ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _stage_of(self, stage: int) -> Iterator[None]:
        """Run stage ``stage`` (1-based) once, after the one before; a failure ends the site's part."""
        name = _STAGES[stage - 1]
        if self._refused == _MOVED:
            raise _refuse(f"site {self.site} moved its input out of this sum to a fresh one; it takes no further part")
        if self._refused:
            raise _refuse(f"site {self.site} refused this sum at stage {self._refused}; it takes no further part")
        try:
            if self._stage != stage - 1:
                done = f"after stage {self._stage}" if self._stage else "before stage 1"
                raise _refuse(f"site {self.site} asked for stage {stage} ({name}) {done}")
            self._stage = stage
            yield
        except Exception:
            self._refused = stage
            raise

    def advertise(self) -> PublicKeys:
        """Stage 1: this site's two public keys, its name and its signature of them."""
        with self._stage_of(1):
            return self._public

    def share_keys(self, key_book: Mapping[int, PublicKeys], threshold: int) -> KeyShares:
        """Stage 2: check the key book and ``t``, Shamir-share a fresh ``b_u`` and ``sk_s`` and encrypt one pair
        of shares per peer.

        Parameters
        ----------
        key_book : mapping site -> PublicKeys
            Every participant's signed advertisement, this site's own included.
        threshold : int
            ``t``: a majority of the book, at least this site's floor.

        Returns
        -------
        KeyShares
            ``{peer: ciphertext}`` for every other participant, and the commitment to ``b_u``.
        """
        with self._stage_of(2):
            sites = check_key_book(key_book, self._roster, self.sum_id, self.site, self._public)
            try:
                self._threshold = check_threshold(threshold, len(sites))
            except ConfigError as exc:
                raise SecureSumError(str(exc)) from None
            if self._threshold < self.min_survivors:
                raise _refuse(f"the threshold {threshold} is below site {self.site}'s floor of {self.min_survivors}")
            self._book = {s: key_book[s] for s in sites}
            self._seed = os.urandom(_SEED_BYTES)
            seed_shares = shamir.split(self._seed, self._threshold, len(sites))
            key_shares = shamir.split(mask_key_secret(self._mask_key), self._threshold, len(sites))
            ciphertexts = {}
            for site, seed_share, key_share in zip(sites, seed_shares, key_shares, strict=True):
                if site == self.site:
                    self._seed_shares[site], self._key_shares[site] = seed_share, key_share
                    continue
                key = generate_shared_key(self._enc_key, bytes_to_public_key(self._book[site].encryption))
                plain = _sum_tag(self.sum_id) + share_keys_plaintext_concat(self.site, site, seed_share, key_share)
                ciphertexts[site] = encrypt(key, plain)
            log.debug("secure sum: site %d shared its keys with %d peers", self.site, len(ciphertexts))
            return KeyShares(ciphertexts, _seed_digest(self._seed, self.sum_id))

    def mask(self, ciphertexts: Mapping[int, bytes], values: np.ndarray, encoding: RingFixedPoint) -> np.ndarray:
        """Stage 3: keep the peers' shares and return ``y_u``, the masked encoding of ``values``.

        Parameters
        ----------
        ciphertexts : mapping peer -> bytes
            The stage-2 ciphertexts addressed to this site; their senders are its peers ``U2_u``.
        values : ndarray, shape (L,)
            This site's input (float64, every entry at most ``encoding.bound`` in magnitude).
        encoding : RingFixedPoint
            The encoding the server fixed for this sum (``k = encoding.words``).

        Returns
        -------
        ndarray of uint64, shape (encoding.width(L),)
            ``enc(x_u) + G(b_u) + sum_{v > u} G(s_uv) - sum_{v < u} G(s_uv)`` in ``Z_{2^(64k)}``.
        """
        with self._stage_of(3):
            if not isinstance(encoding, RingFixedPoint):
                raise TypeError(f"secure sum: encoding must be a RingFixedPoint, got {type(encoding).__name__}")
            encoding.check_sites(len(self._book))
            x = np.asarray(values, dtype=np.float64)
            if x.ndim != 1 or x.size == 0:
                raise ValueError(f"secure sum: the input must be a non-empty flat vector, got shape {x.shape}")
            for peer, token in ciphertexts.items():
                self._open(peer, token)
            self._peers = tuple(sorted(ciphertexts))
            need = max(self._threshold, self.min_survivors) - 1
            if len(self._peers) < need:
                raise _refuse(
                    f"site {self.site} holds the key shares of {len(self._peers)} peers; it masks with at least {need}"
                )
            k = encoding.words
            y = ring_add(encoding.encode(x), _self_mask(self._seed, self.sum_id, encoding.width(x.size)), k)
            for peer in self._peers:
                pair = _pair_mask(self._mask_key, self._book[peer].mask, self.sum_id, y.size)
                y = ring_add(y, pair, k) if peer > self.site else ring_sub(y, pair, k)
            return y

    def mask_and_sign(
        self, ciphertexts: Mapping[int, bytes], values: np.ndarray, encoding: RingFixedPoint
    ) -> tuple[np.ndarray, bytes]:
        """Stages 3 and 4 in one message, for a sum where no site is expected to drop: ``y_u``
        ([`mask`][fedhead.federation.secure_site.SecureSumClient.mask]) and this site's signature of the list
        in which every peer survived, ``(sum id, U2_u + {u}, {})``, the one list it signs in this sum. Should a
        peer drop, no list of this sum can unmask it; the site's input may then move to a fresh sum
        ([`move_out`][fedhead.federation.secure_site.SecureSumClient.move_out])."""
        y = self.mask(ciphertexts, values, encoding)
        return y, self.sign_survivors(Unmasking(tuple(sorted({*self._peers, self.site})), ()))

    def move_out(self) -> None:
        """End this sum unrevealed so that the site's input may enter a fresh sum: only once the site signed its
        full list ([`mask_and_sign`][fedhead.federation.secure_site.SecureSumClient.mask_and_sign]) and before it
        revealed; every later stage is refused. So a site reveals for one sum of an input at most: two sums of it
        unmasked over different sites would give the server their difference."""
        if self._refused:
            raise _refuse(f"site {self.site} refused this sum at stage {self._refused}; its input does not move")
        full = Unmasking(tuple(sorted({*self._peers, self.site})), ())
        if self._stage != 4 or self._signed != full:
            done = "revealed for it" if self._stage >= 5 else f"is at stage {self._stage} of it"
            raise _refuse(
                f"site {self.site} {done}: an input moves to a fresh sum only from a sum whose full list the site "
                "signed, before it reveals; refused"
            )
        self._refused = _MOVED

    def _open(self, peer: int, token: bytes) -> None:
        """Decrypt ``peer``'s key shares for this site (this sum, this pair) and keep them."""
        if peer == self.site or peer not in self._book:
            raise _refuse(f"site {self.site} got key shares from unknown site {peer}")
        key = generate_shared_key(self._enc_key, bytes_to_public_key(self._book[peer].encryption))
        try:
            plain = decrypt(key, token)
        except InvalidToken:
            raise _refuse(
                f"site {self.site} cannot decrypt the key shares from site {peer} (tampered, wrong key)"
            ) from None
        tag = _sum_tag(self.sum_id)
        if not plain.startswith(tag):
            raise _refuse(f"the key shares from site {peer} belong to another sum; refused")
        src, dst, seed_share, key_share = share_keys_plaintext_separate(plain[len(tag) :])
        if src != peer or dst != self.site:
            raise _refuse(f"key shares routed from site {peer} to site {self.site} name {src} -> {dst}")
        self._seed_shares[peer], self._key_shares[peer] = seed_share, key_share

    def sign_survivors(self, unmasking: Unmasking) -> bytes:
        """Stage 4: this site's signature of ``(sum id, U3, D)``, given once, when it is a survivor, ``U3`` holds
        at least ``t`` sites within its peers and itself, and ``D`` is the rest of its peers."""
        with self._stage_of(4):
            alive, gone = set(unmasking.survivors), set(unmasking.dropped)
            peers = set(self._peers)
            if alive & gone:
                raise _refuse(f"site {self.site} was asked for both shares of site(s) {sorted(alive & gone)}; refused")
            if self.site not in alive:
                raise _refuse(f"site {self.site} was asked to unmask but is not named a survivor")
            if not alive <= peers | {self.site}:
                raise _refuse(f"site {self.site} holds no shares of survivor(s) {sorted(alive - peers - {self.site})}")
            if gone != peers - alive:
                raise _refuse(
                    f"the dropped sites {sorted(gone)} are not the rest of site {self.site}'s peers "
                    f"{sorted(peers - alive)}; refused"
                )
            if len(alive) < self._threshold:
                raise _refuse(f"{len(alive)} sites survived, the threshold is {self._threshold}")
            self._signed = Unmasking(tuple(sorted(alive)), tuple(sorted(gone)))
            return sign_survivors(self._signing_key, self.sum_id, alive, gone)

    def reveal(self, unmasking: Unmasking) -> RevealedShares:
        """Stage 5: the ``b``-shares of ``U3`` and the ``sk``-shares of ``D`` of the list this site signed, when
        ``unmasking`` names that list and carries valid signatures of it by at least ``t`` members of ``U3``."""
        with self._stage_of(5):
            signed = self._signed
            asked = (tuple(sorted(set(unmasking.survivors))), tuple(sorted(set(unmasking.dropped))))
            if signed is None or asked != (signed.survivors, signed.dropped):
                raise _refuse(f"site {self.site} was asked to reveal for another list than the one it signed; refused")
            bad = sorted(
                s
                for s, sig in unmasking.signatures.items()
                if s not in signed.survivors
                or not verify_survivors(self._roster, sig, self._book[s].name, self.sum_id, *asked)
            )
            if bad:
                raise _refuse(f"the survivor-list signature(s) of site(s) {bad} do not verify; refused")
            if len(unmasking.signatures) < self._threshold:
                raise _refuse(
                    f"{len(unmasking.signatures)} sites signed the survivor list, the reveal needs {self._threshold}"
                )
            return RevealedShares(
                {s: self._seed_shares[s] for s in signed.survivors}, {s: self._key_shares[s] for s in signed.dropped}
            )
