"""Secure summation of float64 vectors over M sites (SecAgg, Bonawitz et al. 2017, its actively secure
variant) for ``privacy.mode=secure``: the protocol, what its stages carry, and what both sides share.

Pure and message-free: the strategy and the ClientApp carry what each stage returns (bytes, ints,
numpy arrays) in Flower messages. No torch. One
[`SecureSumClient`][fedhead.federation.secure_site.SecureSumClient] per site and one
[`SecureSumServer`][fedhead.federation.secure_server.SecureSumServer] run one sum, each object once.

Identity: every site holds a long-term Ed25519 signing key, and every party the federation's roster
of the sites' public keys, handed out out of band ([`fedhead.federation.roster`][fedhead.federation.roster]).
Every sum has an id that a site takes part in once
([`UsedSumIds`][fedhead.federation.roster.UsedSumIds]); every signature, every mask stream and every
key-share plaintext binds it, so that nothing of one sum is accepted in another.

Protocol (complete graph: every pair of sites shares a mask; SecAgg+'s sparse neighbourhoods
reduce to this for small M; with the prime-field Shamir of [`fedhead.federation.shamir`][fedhead.federation.shamir]
a sum over 128 sites stays well under a second at the server, ``benchmarks/bench_secure_sum_scale.py``):

1. *advertise*: each site draws two P-384 key pairs (flwr's ``generate_key_pairs``) and sends the
   public keys ``(c_u, s_u)`` (``c`` encrypts the key shares, ``s`` agrees the pairwise masks), its
   roster name, and its signature of ``(sum id, node id, name, c_u, s_u)``.
2. *share keys*: given the key book and the threshold ``t``, a site checks every entry against its
   roster (a roster name, its valid signature, no name, node id or key twice, its own entry as it
   sent it) and ``t`` (a majority of the book and at least the site's own floor ``f``,
   ``min_survivors``), draws a fresh 32-byte self-mask seed ``b_u``, Shamir-shares ``b_u`` and its
   mask private key ``sk_s`` into ``n`` shares (threshold ``t``; share ``i`` belongs to the ``i``-th
   site in id order, the site keeps its own), and encrypts ``(sum id, u, v, b-share, sk-share)`` for
   each peer ``v`` with the ECDH key of the ``c`` keys (Fernet). It commits to ``b_u`` (SHA-256).
3. *mask*: given the ciphertexts addressed to it (their senders are its peers ``U2_u``: the sites
   whose shares it holds), a site returns ``y_u = enc(x_u) + G(b_u) + sum_{v in U2_u, v > u} G(s_uv)
   - sum_{v in U2_u, v < u} G(s_uv)`` in the ring ``Z_{2^(64k)}`` (below), ``s_uv`` the ECDH key of
   the ``s`` keys; it refuses to mask with fewer than ``max(t, f) - 1`` peers.
4. *consistency*: the server names the survivors ``U3`` (whose ``y_u`` arrived) and the dropped
   ``D`` to each survivor; a site signs ``(sum id, U3, D)``, once, only when it is in ``U3``,
   ``|U3| >= t``, ``U3`` lies within ``U2_u`` and itself, and ``D`` is the rest of ``U2_u``.
5. *unmask*: the server sends the lists again with the signatures it collected; a site checks that
   they are the lists it signed and carry valid signatures of at least ``t`` distinct members of
   ``U3``, then returns its ``b``-shares of ``U3`` and its ``sk``-shares of ``D``, never both kinds
   for one site. From ``t`` shares each the server rebuilds ``b_u`` (checked against the commitment)
   and the dropped sites' ``sk_s`` (checked against ``s_d``), removes ``G(b_u)`` and the dropped
   sites' pair masks, and decodes the sum over ``U3``. Pair masks among survivors cancel.

Stages 3 and 4 in one message: when the server asks for it with the mask request, a site returns with
``y_u`` its signature of its *full list* ``(sum id, U2_u + {u}, {})``, the list of stage 4 when none of
its peers dropped, and the one list it signs in this sum
([`SecureSumClient.mask_and_sign`][fedhead.federation.secure_site.SecureSumClient.mask_and_sign]). When no
site drops, the server goes to stage 5 at once: one round trip less. When one drops, no list of this sum
can unmask it (every signer named it a survivor), so the sum cannot finish; each site that masked then
moves its input to a fresh sum, under a fresh id, which runs all five stages
([`SecureSumClient.move_out`][fedhead.federation.secure_site.SecureSumClient.move_out]). A site moves an
input only out of a sum whose full list it signed with its mask, only before it revealed anything of it,
and never reveals for that sum afterwards: it reveals for one sum of an input at most.

PRG: ``G(seed)`` is the ChaCha20 keystream (``cryptography``) under the key
``HKDF-SHA256(seed, info=purpose | sum id)``, read as little-endian uint64, one key per purpose (self
mask, pair mask) and sum. flwr's ``pseudo_rand_gen`` is not used: it folds the seed to 32 bits and
draws from ``np.random.RandomState``, so a server could try all 2^32 seeds and strip a mask. A site
draws fresh keys and a fresh ``b_u`` for every sum and runs each stage once; a stage it refused ends
its part: a mask is never reused (two inputs under one mask would reveal their difference).

Encoding ([`fedhead.federation.ring_encoding`][fedhead.federation.ring_encoding]): ``x``, ``|x| <= bound``,
becomes ``round(x 2^f)`` in two's complement modulo ``2^(64k)``, ``k`` uint64 words
([`RingFixedPoint`][fedhead.federation.ring_encoding.RingFixedPoint]). Encodings, masks (uniform ring
elements) and sums live in this one ring, added with carries between the words, so a masked input is
uniform and the unmasked words are the ring element ``S = sum_u round(x_u 2^f)``, a function of the
sum alone. Exact while ``M round(bound 2^f) < 2^(64k-1)``; each entry of ``S / 2^f`` is then within
``M 2^-(f+1)`` of the exact sum, plus half an ulp of the result.

Threshold: ``t`` is a majority of the key book, ``max(2, floor(n/2) + 1) <= t <= n`` (default
``floor(M/2) + 1``), and each site refuses a ``t`` below its floor ``f``. At least 3 sites: with two,
each would learn the other's input from the sum and its own.

Against a deviating server. The server routes every message: it may withhold, alter, replay or
reorder any, and tell each site something else; it cannot forge a roster signature. Let ``M`` be the
sites of the roster (the server may start a sum with any of them), ``n_C`` the sites colluding with
it and ``f`` the smallest floor of the honest sites.

* Keys: an entry that is not its site's signed advertisement of this sum is refused, so the server
  cannot put a key pair of its own in the book (the shares encrypted under it would be its to read)
  nor replay one of another sum. It can leave genuine entries out, so a site's book may be smaller
  than the roster: what binds the threshold is the site's floor ``f``, not the book it is shown.
* One list: an honest site signs one list per sum and reveals only for that list, on ``t >= f``
  signatures from its members. Two lists would need ``f - n_C`` honest signers each, distinct:
  ``2 (f - n_C) <= M - n_C``. So for ``n_C < 2f - M`` all honest sites reveal for one ``(U3, D)``.
* Moving an input: the sums an input entered (the one it moved from, the one it moved to) are unmasked
  for each honest site in one at most, so two of them decoded would need ``f - n_C`` honest sites
  each, distinct: the same bound as two lists. A sum whose full list was signed reveals no ``sk``-share.
* Withholding: with one list, to read ``x_u`` alone, or the sum of a strict part ``S`` of ``U3``'s
  honest sites (``u`` in ``S``), the server must strip every pair mask between ``S`` and an honest
  site of ``U3`` outside ``S``, and no share of such a mask is ever revealed (sk-shares only of
  ``D``). So ``u``'s honest peers outside ``S`` lie outside ``U3``: at least ``f - |S| - n_C`` of them,
  as ``u`` masks with ``f - 1`` peers or more. A site of ``S`` signs only a ``U3`` within its own
  peers, which would put ``U3``'s honest sites outside ``S`` among them: none of ``S`` signs. The
  honest signers lie in ``U3`` outside ``S``, so outside ``u``'s peers too: at most
  ``(M - n_C) - |S| - max(0, f - |S| - n_C)``, which with the colluders' ``n_C`` signatures is
  ``M - f + n_C`` or ``M - |S|`` (``|S| > f - n_C > M - f``), below ``f`` either way while
  ``n_C < 2f - M``.

So while ``n_C < 2f - M`` the server learns at most the sum over one ``U3`` of at least ``t`` sites
(the colluders' inputs it knows) and who dropped at which stage; a site learns nothing of the
others' inputs. Without collusion that needs a majority floor, ``f >= floor(M/2) + 1``; when sites
may collude with the server, a floor ``f >= floor(2M/3) + 1`` keeps it for ``n_C < 2f - M``, every
``n_C <= M/3`` among them, at the price of more sums failing for dropouts. The bound is tight: with
``n_C = 2f - M`` the withholding attack reads ``u``'s input
(tests/federation/test_secure_sum_malicious.py). An honest-but-curious server with up to ``t - 1``
colluding sites learns only the sum; ``t`` sites hold enough shares to unmask anyone.

Costs, ``n`` sites, ``L`` entries: per site, 2 key pairs, ``n - 1`` ECDH and Fernet encryptions of
a 312-byte ciphertext, ``n`` ChaCha20 streams of ``k L`` words, two Ed25519 signatures and up to
``n`` verifications; ``y_u`` is ``8 k L`` bytes. At the server, one Shamir combine and one stream per
survivor, one combine, ECDH and stream per dropped site and survivor. Four round trips when no site
drops (stages 3 and 4 in one), two when stages 1-2 also travel with the previous sum's messages
([`fedhead.strategies.secure_pipeline`][fedhead.strategies.secure_pipeline]); total
traffic grows as ``n^2`` (key shares, signatures) plus ``8 k L n`` (masked inputs).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.roster import Roster, check_sum_id, verify_advertisement

#: Fewest sites a secure sum starts with (two would reveal each one's input to the other).
MIN_SITES = 3
_SELF_MASK = b"fedhead secure sum: self mask"
_PAIR_MASK = b"fedhead secure sum: pair mask"
_COMMITMENT = b"fedhead secure sum: seed commitment"
_SEED_BYTES = 32
_SCALAR_BYTES = 48  # a P-384 private scalar


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


def check_key_book(
    book: Mapping[int, PublicKeys], roster: Roster, sum_id: str, site: int, own: PublicKeys
) -> list[int]:
    """The book's site ids, sorted, when every entry of ``book`` is its ``roster`` member's signed advertisement of
    the sum ``sum_id`` and ``site``'s entry is ``own`` (what a site checks at stage 2); ``SecureSumError`` otherwise."""
    try:
        sites = _check_site_ids(book)
    except ConfigError as exc:
        raise SecureSumError(str(exc)) from None
    if book.get(site) != own:
        raise SecureSumError(f"secure sum: the key book alters or omits site {site}'s own entry; refused")
    if len(sites) < MIN_SITES:
        raise SecureSumError(
            f"secure sum: the key book holds {len(sites)} sites, a secure sum needs at least {MIN_SITES}; refused"
        )
    names: dict[str, int] = {}
    for s in sites:
        entry = book[s]
        if not isinstance(entry, PublicKeys) or not isinstance(entry.name, str):
            raise SecureSumError(f"secure sum: the key book's entry of site {s} is not a signed advertisement; refused")
        if entry.name not in roster:
            raise SecureSumError(
                f"secure sum: the key book's entry of site {s} names {entry.name!r}, who is not in the roster"
            )
        if entry.name in names:
            raise SecureSumError(
                f"secure sum: sites {names[entry.name]} and {s} both claim roster name {entry.name!r}; refused"
            )
        names[entry.name] = s
        if not verify_advertisement(roster, entry.signature, sum_id, s, entry.name, entry.encryption, entry.mask):
            raise SecureSumError(
                f"secure sum: the key book's entry of site {s} is not {entry.name!r}'s signed advertisement"
            )
    keys = [k for s in sites for k in (book[s].encryption, book[s].mask)]
    if len(set(keys)) != len(keys):
        raise SecureSumError("secure sum: the key book repeats a public key; refused")
    return sites


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


def _sum_tag(sum_id: str) -> bytes:
    """The sum id as bytes, length first (2 bytes): no tag is the start of another."""
    raw = check_sum_id(sum_id).encode()
    return len(raw).to_bytes(2, "big") + raw


def _stream(seed: bytes, purpose: bytes, sum_id: str, length: int) -> np.ndarray:
    """``length`` uint64 words of the ChaCha20 keystream under ``HKDF-SHA256(seed, info=purpose | sum id)``."""
    info = purpose + _sum_tag(sum_id)
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(seed)
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8").astype(np.uint64)


def _self_mask(seed: bytes, sum_id: str, length: int) -> np.ndarray:
    """``G(b_u)``: site ``u``'s self mask in sum ``sum_id``."""
    return _stream(seed, _SELF_MASK, sum_id, length)


def _pair_mask(private_key: ec.EllipticCurvePrivateKey, peer_key: bytes, sum_id: str, length: int) -> np.ndarray:
    """``G(s_uv)``: the same stream at both ends of the pair (ECDH of the mask keys) in sum ``sum_id``."""
    shared = base64.urlsafe_b64decode(generate_shared_key(private_key, bytes_to_public_key(peer_key)))
    return _stream(shared, _PAIR_MASK, sum_id, length)


def _seed_digest(seed: bytes, sum_id: str) -> bytes:
    """The commitment to ``b_u`` in sum ``sum_id``."""
    return hashlib.sha256(_COMMITMENT + _sum_tag(sum_id) + seed).digest()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def mask_key_secret(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The mask private key as the secret its Shamir shares carry: its P-384 scalar, 48 bytes big-endian."""
    return key.private_numbers().private_value.to_bytes(_SCALAR_BYTES, "big")


def mask_key_of(secret: bytes) -> ec.EllipticCurvePrivateKey:
    """The mask private key of [`mask_key_secret`][fedhead.federation.secure_sum.mask_key_secret]'s
    secret (``ValueError`` for a scalar that is no P-384 key)."""
    return ec.derive_private_key(int.from_bytes(secret, "big"), ec.SECP384R1())


# --------------------------------------------------------------------------------------------
# what the stages carry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicKeys:
    """A site's stage-1 advertisement: PEM public keys ``encryption`` (``c_u``) and ``mask`` (``s_u``), its
    roster ``name`` and its ``signature`` of ``(sum id, node id, name, c_u, s_u)``
    ([`sign_advertisement`][fedhead.federation.roster.sign_advertisement])."""

    encryption: bytes
    mask: bytes
    name: str
    signature: bytes


@dataclass(frozen=True)
class KeyShares:
    """A site's stage-2 reply: ``ciphertexts`` ``{peer: Fernet token}``, ``seed_digest`` committing to ``b_u``."""

    ciphertexts: dict[int, bytes]
    seed_digest: bytes


@dataclass(frozen=True)
class Unmasking:
    """The server's survivor list: ``survivors`` ``U3`` (whose masked input arrived) and ``dropped`` (the rest of
    ``U2``). Stage 4 asks each survivor to sign it; stage 5 sends it again with the ``signatures``
    ``{site: Ed25519 signature}`` collected (empty in stage 4)."""

    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    signatures: Mapping[int, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class RevealedShares:
    """A site's stage-5 reply: ``seed_shares`` ``{survivor: b-share}``, ``key_shares`` ``{dropped: sk-share}``."""

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
