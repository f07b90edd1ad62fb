"""Secure sums driven in-process for the tests: a federation of sites with their signing keys and
roster, and one honest run of the five stages with hooks for dropouts."""

from __future__ import annotations

import numpy as np

from fedhead.federation.ring_encoding import RingFixedPoint, ring_add
from fedhead.federation.roster import UsedSumIds, simulation_roster
from fedhead.federation.secure_server import SecureSumServer
from fedhead.federation.secure_site import SecureSumClient

#: Flower node ids are 64-bit; some above 2^63 check the unsigned packing.
IDS = [2**64 - 1, 17, 2**63 + 5, 3, 123456789, 9, 2**40, 1]
SUM = "run-1/sum-1"


class Federation:
    """Sites ``ids`` with a roster name, a signing key and a record of used sum ids each."""

    def __init__(self, ids):
        self.sites = list(ids)
        self.names = {s: f"site-{i}" for i, s in enumerate(self.sites)}
        self.roster, self.keys = simulation_roster(self.names.values())
        self.used = {s: UsedSumIds() for s in self.sites}

    def client(self, site: int, sum_id: str = SUM, *, min_survivors: int = 2) -> SecureSumClient:
        name = self.names[site]
        return SecureSumClient(
            site,
            name,
            sum_id=sum_id,
            roster=self.roster,
            signing_key=self.keys[name],
            used=self.used[site],
            min_survivors=min_survivors,
        )

    def server(self, length: int, encoding: RingFixedPoint, sites=None, *, sum_id: str = SUM, threshold=None):
        sites = self.sites if sites is None else sites
        return SecureSumServer(sites, length, encoding, sum_id=sum_id, roster=self.roster, threshold=threshold)


def ring_sum(enc: RingFixedPoint, encoded) -> np.ndarray:
    encoded = list(encoded)
    total = np.zeros_like(encoded[0])
    for e in encoded:
        total = ring_add(total, e, enc.words)
    return total


class Run:
    """One honest secure sum of ``m`` sites, driven in-process, with hooks for dropouts."""

    def __init__(self, m: int, length: int = 40, *, bound: float = 1e3, threshold: int | None = None, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.fed = Federation(IDS[:m])
        self.sites = self.fed.sites
        self.enc = RingFixedPoint.for_sites(bound, m, words=2)
        self.xs = {s: rng.uniform(-bound, bound, length) for s in self.sites}
        self.start(length, threshold)

    def start(self, length: int, threshold: int | None) -> None:
        """Stages 1 and 2 over ``self.sites`` with ``self.enc``."""
        self.server = self.fed.server(length, self.enc, threshold=threshold)
        self.clients = {s: self.fed.client(s) for s in self.sites}
        self.book = self.server.collect_keys({s: c.advertise() for s, c in self.clients.items()})
        t = self.server.threshold
        self.routed = self.server.route_shares({s: c.share_keys(self.book, t) for s, c in self.clients.items()})

    def mask(self, skip=()):
        self.masked = {
            s: self.clients[s].mask(self.routed[s], self.xs[s], self.enc) for s in self.sites if s not in skip
        }
        return self.server.collect_masked(self.masked)

    def sign(self, unmasking, unsigned=()):
        """Stage 4: the survivors' signatures (but ``unsigned``'s); the server's unmasking request."""
        signatures = {s: self.clients[s].sign_survivors(unmasking) for s in unmasking.survivors if s not in unsigned}
        return self.server.collect_signatures(signatures)

    def reveal(self, request, silent=()):
        return {s: self.clients[s].reveal(request) for s in request.signatures if s not in silent}

    def run(self, *, drop_before_mask=(), unsigned=(), silent=()):
        request = self.sign(self.mask(drop_before_mask), unsigned)
        return self.server.unmask(self.reveal(request, silent))

    def encoded(self, site):
        return self.enc.encode(self.xs[site])

    def plain(self, sites):
        """The ring sum of the encodings of ``sites``' inputs, unmasked."""
        return ring_sum(self.enc, [self.encoded(s) for s in sites])


class Given(Run):
    """A secure sum of given inputs ``{site: vector}`` under ``encoding``."""

    def __init__(self, xs: dict[int, np.ndarray], encoding: RingFixedPoint):
        self.fed = Federation(sorted(xs))
        self.sites, self.enc, self.xs = self.fed.sites, encoding, xs
        self.start(next(iter(xs.values())).size, None)
