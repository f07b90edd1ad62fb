"""A deviating server for the secure sum's tests: it drives honest
[`SecureSumClient`][fedhead.federation.secure_site.SecureSumClient]s stage by stage, sends each site
whatever it chooses, keeps everything the sites send back, and rebuilds from it all it can.

``Attacker.candidates`` strips from every subset of the masked inputs each mask whose seed or key the
attacker has rebuilt (from any ``t`` shares it holds, colluding sites' own included);
``assert_nothing_decodes`` checks that no candidate is an honest site's encoded input or the encoded
sum of a strict part of the honest sites (the colluders' inputs, which the attacker knows, added or
not). Colluding sites are honest clients whose state and signing keys the attacker holds: it reads
their shares and signs what it likes in their name.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping

import numpy as np
from flwr.supercore.primitives.asymmetric import public_key_to_bytes
from secure_helpers import IDS, SUM, Federation

from fedhead.federation import shamir
from fedhead.federation.ring_encoding import RingFixedPoint, ring_add, ring_sub
from fedhead.federation.roster import sign_survivors
from fedhead.federation.secure_sum import (
    PublicKeys,
    SecureSumError,
    Unmasking,
    _pair_mask,
    _seed_digest,
    _self_mask,
    mask_key_of,
)

__all__ = ["Attacker", "assert_nothing_decodes", "attempt", "subset_sums"]


def attempt(call: Callable[[], object]) -> str | None:
    """None when ``call`` goes through, else the one-line refusal it raised (SecureSumError)."""
    try:
        call()
    except SecureSumError as exc:
        line = str(exc)
        assert "\n" not in line and line.startswith("secure sum: "), line
        return line
    return None


class Attacker:
    """A server that runs one sum of ``m`` sites its own way; every site is told threshold ``t``.

    Parameters
    ----------
    m, t : int
        Sites and the threshold.
    colluding : collection of int
        Positions (in ``IDS[:m]``) of sites that side with the server.
    floor : int, optional
        Every site's ``min_survivors`` (default ``t``).
    """

    def __init__(
        self,
        m: int,
        t: int,
        *,
        colluding: Collection[int] = (),
        floor: int | None = None,
        seed: int = 0,
        after: Attacker | None = None,
        sites: Iterable[int] | None = None,
    ):
        rng = np.random.default_rng(seed)
        # ``after``: a second sum of the same federation and inputs (fresh id), over ``sites`` of it
        self.fed = Federation(IDS[:m]) if after is None else after.fed
        self.sites = self.fed.sites if sites is None else sorted(sites)
        self.t, self.sum_id = t, SUM if after is None else f"{after.sum_id}~"
        self.colluding = {self.fed.sites[i] for i in colluding}
        self.enc = RingFixedPoint.for_sites(1e3, m, words=2)
        self.xs = {s: rng.uniform(-1e3, 1e3, 8) for s in self.fed.sites} if after is None else after.xs
        self.clients = {
            s: self.fed.client(s, self.sum_id, min_survivors=t if floor is None else floor) for s in self.sites
        }
        self.book: dict[int, PublicKeys] = {s: c.advertise() for s, c in self.clients.items()}
        self.ciphertexts: dict[int, dict[int, bytes]] = {}  # sender -> recipient -> token
        self.digests: dict[int, bytes] = {}
        self.peers: dict[int, tuple[int, ...]] = {}  # the senders whose shares each masking site got
        self.masked: dict[int, np.ndarray] = {}
        self.signatures: dict[tuple, dict[int, bytes]] = defaultdict(dict)  # (survivors, dropped) -> signer -> sig
        self.seed_shares: dict[int, dict[int, bytes]] = defaultdict(dict)  # owner -> share index -> share
        self.key_shares: dict[int, dict[int, bytes]] = defaultdict(dict)

    @property
    def honest(self) -> list[int]:
        return [s for s in self.sites if s not in self.colluding]

    def encoded(self, site: int) -> np.ndarray:
        return self.enc.encode(self.xs[site])

    def share_keys(self, site: int, book: Mapping[int, PublicKeys] | None = None, t: int | None = None) -> None:
        """Stage 2 at ``site`` with ``book`` (default: every advertisement) and ``t``; keep what it sends."""
        reply = self.clients[site].share_keys(self.book if book is None else book, self.t if t is None else t)
        self.ciphertexts[site], self.digests[site] = reply.ciphertexts, reply.seed_digest

    def mask(self, site: int, senders: Iterable[int]) -> None:
        """Hand ``site`` the shares of ``senders`` only; keep its masked input (and a colluder's shares)."""
        senders = tuple(sorted(senders))
        y = self.clients[site].mask({v: self.ciphertexts[v][site] for v in senders}, self.xs[site], self.enc)
        self.peers[site], self.masked[site] = senders, y
        if site in self.colluding:
            self._keep(self.seed_shares, self.clients[site]._seed_shares)
            self._keep(self.key_shares, self.clients[site]._key_shares)

    def mask_and_sign(self, site: int, senders: Iterable[int]) -> None:
        """``mask`` with the site's signature of its full list (kept under that list)."""
        senders = tuple(sorted(senders))
        client = self.clients[site]
        y, signature = client.mask_and_sign({v: self.ciphertexts[v][site] for v in senders}, self.xs[site], self.enc)
        self.peers[site], self.masked[site] = senders, y
        self.signatures[(tuple(sorted({*senders, site})), ())][site] = signature

    def sign(self, site: int, survivors: Iterable[int], dropped: Iterable[int]) -> None:
        """Ask ``site`` to sign the list (a colluder signs whatever it is); keep the signature."""
        lists = (tuple(sorted(survivors)), tuple(sorted(dropped)))
        if site in self.colluding:
            key = self.fed.keys[self.fed.names[site]]
            self.signatures[lists][site] = sign_survivors(key, self.sum_id, *lists)
        else:
            self.signatures[lists][site] = self.clients[site].sign_survivors(Unmasking(*lists))

    def reveal(self, site: int, survivors: Iterable[int], dropped: Iterable[int], signatures=None) -> None:
        """Ask ``site`` to unmask with the list and ``signatures`` (default: all the list's); keep what it reveals."""
        lists = (tuple(sorted(survivors)), tuple(sorted(dropped)))
        sigs = self.signatures[lists] if signatures is None else signatures
        shares = self.clients[site].reveal(Unmasking(*lists, dict(sigs)))
        self._keep(self.seed_shares, shares.seed_shares)
        self._keep(self.key_shares, shares.key_shares)

    @staticmethod
    def _keep(pool: dict[int, dict[int, bytes]], shares: Mapping[int, bytes]) -> None:
        for owner, share in shares.items():
            pool[owner][shamir.parse(share)[0]] = share

    def seeds(self) -> dict[int, bytes]:
        """Every self-mask seed ``b_u`` the attacker can rebuild (checked against its commitment)."""
        out = {s: self.clients[s]._seed for s in self.colluding}
        for owner, shares in self.seed_shares.items():
            if len(shares) >= self.t:
                seed = shamir.combine(list(shares.values())[: self.t])
                assert _seed_digest(seed, self.sum_id) == self.digests[owner], f"a wrong seed of site {owner}"
                out[owner] = seed
        return out

    def mask_keys(self) -> dict[int, object]:
        """Every mask private key ``sk_u`` the attacker can rebuild (checked against the public key)."""
        out: dict[int, object] = {s: self.clients[s]._mask_key for s in self.colluding}
        for owner, shares in self.key_shares.items():
            if len(shares) >= self.t:
                key = mask_key_of(shamir.combine(list(shares.values())[: self.t]))
                assert public_key_to_bytes(key.public_key()) == self.book[owner].mask, f"a wrong key of {owner}"
                out[owner] = key
        return out

    def candidates(self) -> dict[tuple[int, ...], np.ndarray]:
        """For each non-empty subset ``S`` of the masked inputs: their ring sum, less every self mask of ``S`` and
        every pair mask between ``S`` and the rest that the attacker can rebuild."""
        seeds, keys, k = self.seeds(), self.mask_keys(), self.enc.words
        out = {}
        for size in range(1, len(self.masked) + 1):
            for subset in itertools.combinations(sorted(self.masked), size):
                total = np.zeros_like(self.masked[subset[0]])
                for u in subset:
                    total = ring_add(total, self.masked[u], k)
                    if u in seeds:
                        total = ring_sub(total, _self_mask(seeds[u], self.sum_id, total.size), k)
                    for v in self.peers[u]:
                        if v in subset or not (u in keys or v in keys):
                            continue
                        own, other = (u, v) if u in keys else (v, u)
                        pair = _pair_mask(keys[own], self.book[other].mask, self.sum_id, total.size)  # type: ignore[arg-type]
                        total = ring_sub(total, pair, k) if v > u else ring_add(total, pair, k)
                out[subset] = total
        return out

    def recovered(self, site: int) -> bool:
        """Whether the attacker reads ``site``'s encoded input exactly."""
        got = self.candidates().get((site,))
        return got is not None and np.array_equal(got, self.encoded(site))


def subset_sums(encoded: dict[int, np.ndarray], words: int, colluding: Collection[int] = ()) -> dict[bytes, tuple]:
    """The encoded ring sum of every subset of the sites whose honest part is neither empty nor every
    honest site (the colluders' inputs the attacker knows anyway), by its bytes."""
    sites = sorted(encoded)
    honest = {s for s in sites if s not in colluding}
    out = {}
    for size in range(1, len(sites) + 1):
        for subset in itertools.combinations(sites, size):
            if not 0 < len(honest.intersection(subset)) < len(honest):
                continue
            total = np.zeros_like(encoded[sites[0]])
            for s in subset:
                total = ring_add(total, encoded[s], words)
            out[total.tobytes()] = subset
    return out


def assert_nothing_decodes(attacker: Attacker) -> None:
    """No candidate of the attacker is an honest site's encoded input or the sum of a strict part of the
    honest sites (with any colluders' inputs added)."""
    encoded = {s: attacker.encoded(s) for s in attacker.sites}
    sums = subset_sums(encoded, attacker.enc.words, attacker.colluding)
    leaks = {k: sums[c.tobytes()] for k, c in attacker.candidates().items() if c.tobytes() in sums}
    assert not leaks, f"the attacker decodes (its subset -> the sites' sum): {leaks}"
