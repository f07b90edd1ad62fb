"""A deviating server for the secure sum's tests: it drives honest
[`SecureSumClient`][fedhead.federation.secure_sum.SecureSumClient]s stage by stage, sends each site
whatever it chooses, keeps everything the sites send back, and rebuilds from it all it can.

``Attacker.candidates`` strips from every subset of the masked inputs each mask whose seed or key
the attacker has rebuilt (from any ``t`` shares it holds, colluding sites' own included);
``assert_nothing_decodes`` checks that no candidate is a site's encoded input or the encoded sum
of a strict subset of the sites. Colluding sites are honest clients whose state the attacker reads.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Collection, Iterable

import numpy as np
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, public_key_to_bytes

from fedhead.federation.secure_sum import (
    _SELF_MASK,
    FixedPoint,
    SecureSumClient,
    SecureSumError,
    _pair_mask,
    _seed_digest,
    _share_index,
    _stream,
)

#: Flower node ids (64-bit), one per site.
IDS = [2**64 - 1, 17, 2**63 + 5, 3, 123456789, 9, 2**40, 1]

__all__ = ["IDS", "Attacker", "assert_nothing_decodes", "subset_sums"]


class Attacker:
    """A server that runs one sum of ``m`` sites with threshold ``t`` its own way.

    Parameters
    ----------
    m, t : int
        Sites and the threshold every site is told.
    colluding : collection of int
        Positions (in ``IDS[:m]``) of sites that side with the server.
    """

    def __init__(self, m: int, t: int, *, colluding: Collection[int] = (), length: int = 8, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.sites = IDS[:m]
        self.t = t
        self.colluding = {self.sites[i] for i in colluding}
        self.enc = FixedPoint.for_sites(1e3, m)
        self.xs = {s: rng.uniform(-1e3, 1e3, length) for s in self.sites}
        self.clients = {s: SecureSumClient(s) for s in self.sites}
        self.book = {s: c.advertise() for s, c in self.clients.items()}
        replies = {s: c.share_keys(self.book, t) for s, c in self.clients.items()}
        self.ciphertexts = {s: r.ciphertexts for s, r in replies.items()}  # sender -> recipient -> token
        self.digests = {s: r.seed_digest for s, r in replies.items()}
        self.peers: dict[int, tuple[int, ...]] = {}  # the senders whose shares each masking site got
        self.masked: dict[int, np.ndarray] = {}
        self.seed_shares: dict[int, dict[int, bytes]] = defaultdict(dict)  # owner -> share index -> share
        self.key_shares: dict[int, dict[int, bytes]] = defaultdict(dict)

    def encoded(self, site: int) -> np.ndarray:
        return self.enc.encode(self.xs[site])

    def mask(self, site: int, senders: Iterable[int]) -> np.ndarray:
        """Hand ``site`` the shares of ``senders`` only; keep its masked input (and a colluder's shares)."""
        senders = tuple(sorted(senders))
        y = self.clients[site].mask({v: self.ciphertexts[v][site] for v in senders}, self.xs[site], self.enc)
        self.peers[site], self.masked[site] = senders, y
        if site in self.colluding:
            client = self.clients[site]
            self._keep(self.seed_shares, client._seed_shares)
            self._keep(self.key_shares, client._key_shares)
        return y

    def reveal(self, site: int, survivors: Iterable[int], dropped: Iterable[int]) -> None:
        """Ask ``site`` to unmask with these lists; keep what it reveals (a refusal propagates)."""
        shares = self.clients[site].reveal(tuple(survivors), tuple(dropped))
        self._keep(self.seed_shares, shares.seed_shares)
        self._keep(self.key_shares, shares.key_shares)

    def try_reveal(self, site: int, survivors: Iterable[int], dropped: Iterable[int]) -> str | None:
        """``reveal``, or the site's one-line refusal."""
        try:
            self.reveal(site, survivors, dropped)
        except SecureSumError as exc:
            return str(exc)
        return None

    @staticmethod
    def _keep(pool: dict[int, dict[int, bytes]], shares: dict[int, bytes]) -> None:
        for owner, share in shares.items():
            pool[owner][_share_index(share)] = share

    def seeds(self) -> dict[int, bytes]:
        """Every self-mask seed ``b_u`` the attacker can rebuild (checked against its commitment)."""
        out = {}
        for owner, shares in self.seed_shares.items():
            if len(shares) >= self.t:
                seed = combine_shares(list(shares.values())[: self.t])
                assert _seed_digest(seed) == self.digests[owner], f"a wrong seed of site {owner}"
                out[owner] = seed
        for site in self.colluding:
            out[site] = self.clients[site]._seed
        return out

    def mask_keys(self) -> dict[int, object]:
        """Every mask private key ``sk_u`` the attacker can rebuild (checked against the public key)."""
        out: dict[int, object] = {s: self.clients[s]._mask_key for s in self.colluding}
        for owner, shares in self.key_shares.items():
            if len(shares) >= self.t:
                key = bytes_to_private_key(combine_shares(list(shares.values())[: self.t]))
                assert public_key_to_bytes(key.public_key()) == self.book[owner].mask, f"a wrong key of {owner}"
                out[owner] = key
        return out

    def candidates(self) -> dict[tuple[int, ...], np.ndarray]:
        """For each non-empty subset ``S`` of the masked inputs: their sum, less every self mask of ``S``
        and every pair mask between ``S`` and the rest that the attacker can rebuild."""
        seeds, keys = self.seeds(), self.mask_keys()
        width = next(iter(self.masked.values())).size
        out = {}
        for k in range(1, len(self.masked) + 1):
            for subset in itertools.combinations(sorted(self.masked), k):
                total = np.zeros(width, dtype=np.uint64)
                for u in subset:
                    total += self.masked[u]
                    if u in seeds:
                        total -= _stream(seeds[u], _SELF_MASK, width)
                    for v in self.peers[u]:
                        if v in subset or not (u in keys or v in keys):
                            continue
                        own, other = (u, v) if u in keys else (v, u)
                        pair = _pair_mask(keys[own], self.book[other].mask, width)  # type: ignore[arg-type]
                        total = total - pair if v > u else total + pair
                out[subset] = total
        return out

    def recovered(self, site: int) -> bool:
        """Whether the attacker reads ``site``'s encoded input exactly."""
        got = self.candidates().get((site,))
        return got is not None and np.array_equal(got, self.encoded(site))


def subset_sums(encoded: dict[int, np.ndarray]) -> dict[bytes, tuple[int, ...]]:
    """The encoded sum of every non-empty strict subset of the sites, by its bytes."""
    sites = sorted(encoded)
    out = {}
    for k in range(1, len(sites)):
        for subset in itertools.combinations(sites, k):
            total = np.zeros_like(encoded[sites[0]])
            for s in subset:
                total += encoded[s]
            out[total.tobytes()] = subset
    return out


def assert_nothing_decodes(attacker: Attacker) -> None:
    """No candidate of the attacker is a site's encoded input or the sum of a strict subset of the sites."""
    sums = subset_sums({s: attacker.encoded(s) for s in attacker.sites})
    leaks = {k: sums[c.tobytes()] for k, c in attacker.candidates().items() if c.tobytes() in sums}
    assert not leaks, f"the attacker decodes (its subset -> the sites' sum): {leaks}"
