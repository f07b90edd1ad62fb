"""The secure sum engine: the four stages, what the server unmasks, dropouts, attacks and faults.

(fedhead.federation.secure_sum)
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

from fedhead.analysis.constraints import ConfigError
from fedhead.federation import secure_records as sr
from fedhead.federation.aggregation import ReplyError
from fedhead.federation.ring_encoding import RingFixedPoint, ring_add
from fedhead.federation.secure_sum import (
    RevealedShares,
    SecureSumClient,
    SecureSumError,
    SecureSumServer,
    check_threshold,
    default_threshold,
)

#: Flower node ids are 64-bit; some above 2^63 check the unsigned packing.
IDS = [2**64 - 1, 17, 2**63 + 5, 3, 123456789, 9, 2**40, 1]


class Run:
    """One secure sum driven in-process, with hooks for dropouts and a server that lies."""

    def __init__(self, m: int, length: int = 40, *, bound: float = 1e3, threshold: int | None = None, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.sites = IDS[:m]
        self.enc = RingFixedPoint.for_sites(bound, m, words=2)
        self.xs = {s: rng.uniform(-bound, bound, length) for s in self.sites}
        self.start(length, threshold)

    def start(self, length: int, threshold: int | None) -> None:
        """Stages 1 and 2 over ``self.sites`` with ``self.enc``."""
        self.server = SecureSumServer(self.sites, length, self.enc, threshold=threshold)
        self.clients = {s: SecureSumClient(s) for s in self.sites}
        self.book = self.server.collect_keys({s: c.advertise() for s, c in self.clients.items()})
        t = self.server.threshold
        self.routed = self.server.route_shares({s: c.share_keys(self.book, t) for s, c in self.clients.items()})

    def mask(self, skip=()):
        self.masked = {
            s: self.clients[s].mask(self.routed[s], self.xs[s], self.enc) for s in self.sites if s not in skip
        }
        return self.server.collect_masked(self.masked)

    def reveal(self, unmasking, silent=()):
        return {
            s: self.clients[s].reveal(unmasking.survivors, unmasking.dropped)
            for s in unmasking.survivors
            if s not in silent
        }

    def run(self, *, drop_before_mask=(), silent=()):
        unmasking = self.mask(drop_before_mask)
        return self.server.unmask(self.reveal(unmasking, silent))

    def encoded(self, site):
        return self.enc.encode(self.xs[site])

    def plain(self, sites):
        """The ring sum of the encodings of ``sites``' inputs, unmasked."""
        return _ring_sum(self.enc, [self.encoded(s) for s in sites])


def _ring_sum(enc, encoded):
    total = np.zeros_like(encoded[0])
    for e in encoded:
        total = ring_add(total, e, enc.words)
    return total


# --------------------------------------------------------------------------------------------
# the protocol
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", range(3, 9))
def test_secure_sum_equals_the_plain_sum(m):
    run = Run(m, seed=m)
    result = run.run()
    assert result.survivors == tuple(sorted(run.sites)) and result.dropped == ()
    np.testing.assert_array_equal(result.encoded, run.plain(run.sites))  # the integer sum, exactly
    xs = [run.xs[s] for s in run.sites]
    for s, j in zip(run.enc.integers(result.encoded), range(40), strict=True):
        exact = sum((Fraction(float(x[j])) for x in xs), Fraction(0))
        assert abs(Fraction(s, 2**run.enc.frac_bits) - exact) <= Fraction(m, 2 ** (run.enc.frac_bits + 1))
    exact = np.array([math.fsum(x[j] for x in xs) for j in range(40)])
    bound = m * 2.0 ** -(run.enc.frac_bits + 1) + np.spacing(np.abs(exact))
    assert np.all(np.abs(result.total - exact) <= bound)


class Given(Run):
    """A secure sum of given inputs ``{site: vector}`` under ``encoding``."""

    def __init__(self, xs: dict[int, np.ndarray], encoding: RingFixedPoint):
        self.sites, self.enc, self.xs = sorted(xs), encoding, xs
        self.start(next(iter(xs.values())).size, None)


@pytest.mark.parametrize("encoding", ["production", "one word"])
@pytest.mark.parametrize("dropped", [0, 1])
def test_inputs_of_equal_sum_unmask_to_the_same_words(encoding, dropped):
    """What the server unmasks is a function of the sum alone: inputs moved between sites (signs
    flipped, carries changed) give the same words bit for bit, dropouts included."""
    m, length, bound = 5, 40, 1e3
    enc = sr.encoding_for(bound, m) if encoding == "production" else RingFixedPoint(8, bound, 1)
    rng = np.random.default_rng(dropped)
    dyadic = lambda scale, n: np.round(rng.uniform(-scale, scale, n) * 256) / 256  # noqa: E731 - exact sums
    first = {s: dyadic(bound / 4, length) for s in IDS[:m]}
    moved = [np.zeros(length), *(dyadic(3 * bound / 8, length) for _ in range(m - 1 - dropped)), np.zeros(length)]
    second = {s: first[s] + moved[i + 1 - dropped] - moved[i - dropped] for i, s in enumerate(IDS[:m]) if i >= dropped}
    second.update({s: -first[s] for s in IDS[:dropped]})  # a dropped site's input is in no sum
    assert all(np.max(np.abs(x)) <= bound for x in second.values())
    survivors = IDS[dropped:m]
    assert np.mean([np.sign(first[s]) != np.sign(second[s]) for s in survivors]) > 0.3
    np.testing.assert_array_equal(sum(first[s] for s in survivors), sum(second[s] for s in survivors))
    a, b = Given(first, enc), Given(second, enc)
    ra, rb = a.run(drop_before_mask=IDS[:dropped]), b.run(drop_before_mask=IDS[:dropped])
    assert ra.encoded.dtype == np.uint64 and ra.encoded.shape == (enc.width(length),)
    np.testing.assert_array_equal(ra.encoded, rb.encoded)  # every word, bit for bit
    np.testing.assert_array_equal(ra.total, rb.total)
    np.testing.assert_array_equal(ra.total, sum(first[s] for s in survivors))
    assert not any(np.array_equal(a.encoded(s), b.encoded(s)) for s in survivors)  # each site's input moved


def test_no_masked_input_and_no_partial_sum_shows_the_encodings():
    run = Run(6)
    run.run()
    for s, y in run.masked.items():
        assert np.count_nonzero(y == run.encoded(s)) == 0
    for k in range(1, 7):  # every subset, the whole set included (self masks stay until the unmasking)
        for subset in itertools.combinations(run.sites, k):
            masked = _ring_sum(run.enc, [run.masked[s] for s in subset])
            assert not np.array_equal(masked, run.plain(subset)), subset


def test_masks_are_fresh_in_every_run():
    first, second = Run(4, seed=7), Run(4, seed=7)
    a, b = first.run(), second.run()
    np.testing.assert_array_equal(a.encoded, b.encoded)
    for s in first.sites:
        np.testing.assert_array_equal(first.xs[s], second.xs[s])
        assert np.count_nonzero(first.masked[s] == second.masked[s]) == 0


def test_a_site_silent_after_masking_still_counts():
    run = Run(5)
    dead = run.sites[1]
    result = run.run(silent=(dead,))
    assert dead in result.survivors and result.dropped == ()
    np.testing.assert_array_equal(result.encoded, run.plain(run.sites))


@pytest.mark.parametrize("m, gone", [(5, 1), (7, 2), (8, 3)])
def test_sites_dropped_before_masking_are_unmasked_from_their_key_shares(m, gone):
    run = Run(m)
    dead = tuple(sorted(run.sites[:gone]))
    unmasking = run.mask(dead)
    assert unmasking.dropped == dead
    alive = [s for s in run.sites if s not in dead]
    result = run.server.unmask(run.reveal(unmasking))
    np.testing.assert_array_equal(result.encoded, run.plain(alive))
    assert result.dropped == dead and result.survivors == tuple(sorted(alive))


def test_dropouts_at_every_stage_together():
    run = Run(8, seed=3)
    assert run.server.threshold == 5
    # site 0 never advertises keys, site 1 never shares them: they are in no mask
    server = SecureSumServer(run.sites, 40, run.enc)
    clients = {s: SecureSumClient(s) for s in run.sites}
    book = server.collect_keys({s: c.advertise() for s, c in clients.items() if s != run.sites[0]})
    shares = {s: clients[s].share_keys(book, server.threshold) for s in book if s != run.sites[1]}
    routed = server.route_shares(shares)
    masked = {s: clients[s].mask(routed[s], run.xs[s], run.enc) for s in routed if s != run.sites[2]}
    unmasking = server.collect_masked(masked)
    assert unmasking.dropped == (run.sites[2],)
    reveal = {s: clients[s].reveal(unmasking.survivors, unmasking.dropped) for s in unmasking.survivors}
    result = server.unmask(reveal)  # 5 survivors of 8: exactly the threshold
    alive = run.sites[3:]
    np.testing.assert_array_equal(result.encoded, run.plain(alive))


def test_too_few_survivors_is_one_line_naming_the_threshold():
    run = Run(5)
    assert run.server.threshold == 3
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites survived, the threshold is 3$"):
        run.mask(run.sites[:3])
    run = Run(5)
    unmasking = run.mask()
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites answered the unmasking, the threshold is 3$"):
        run.server.unmask(run.reveal(unmasking, silent=run.sites[:3]))
    server = SecureSumServer(IDS[:5], 4, RingFixedPoint(10, 1.0))
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites advertised keys, the threshold is 3$"):
        server.collect_keys({s: SecureSumClient(s).advertise() for s in IDS[:2]})


def test_threshold_rules():
    assert [default_threshold(m) for m in range(3, 9)] == [2, 3, 3, 4, 4, 5]
    assert check_threshold(5, 5) == 5
    for t, m in [(2, 4), (1, 3), (6, 5), (True, 3), (2.5, 4)]:
        with pytest.raises(ConfigError, match="threshold must be an integer in") as err:
            check_threshold(t, m)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"needs at least 3 sites, got 2 \(with two, each site learns"):
        SecureSumServer(IDS[:2], 4, RingFixedPoint(10, 1.0))
    with pytest.raises(ConfigError, match="threshold"):
        SecureSumServer(IDS[:6], 4, RingFixedPoint(10, 1.0), threshold=3)  # 2t <= n: a minority
    # t = M tolerates no dropout
    run = Run(4, threshold=4)
    with pytest.raises(SecureSumError, match="3 sites survived, the threshold is 4"):
        run.mask(run.sites[:1])


# --------------------------------------------------------------------------------------------
# attacks and faults
# --------------------------------------------------------------------------------------------


def test_a_tampered_ciphertext_is_refused():
    run = Run(4)
    u, v = run.sites[0], run.sites[1]
    token = bytearray(run.routed[u][v])
    token[40] = ord("A") if token[40] != ord("A") else ord("B")
    run.routed[u][v] = bytes(token)
    with pytest.raises(SecureSumError, match=f"site {u} cannot decrypt the key shares from site {v}"):
        run.clients[u].mask(run.routed[u], run.xs[u], run.enc)


def test_a_ciphertext_routed_to_the_wrong_site_is_refused():
    run = Run(4)
    u, v, w = run.sites[:3]
    run.routed[u][v] = run.routed[w][v]  # v's shares for w, handed to u as if for u
    with pytest.raises(SecureSumError, match="cannot decrypt"):
        run.clients[u].mask(run.routed[u], run.xs[u], run.enc)


def test_key_shares_naming_the_wrong_sender_or_recipient_are_refused():
    for src, dst in [(2, 0), (1, 2)]:  # positions in the site list; site 1 sends to site 0
        run = Run(4)
        u, v = run.sites[0], run.sites[1]
        # v encrypts for u under their true shared key, but the plaintext names another pair
        key = generate_shared_key(run.clients[v]._enc_key, bytes_to_public_key(run.book[u].encryption))
        named = (run.sites[src], run.sites[dst])
        run.routed[u][v] = encrypt(key, share_keys_plaintext_concat(*named, b"x" * 52, b"y" * 324))
        with pytest.raises(SecureSumError, match=f"routed from site {v} to site {u} name {named[0]} -> {named[1]}"):
            run.clients[u].mask(run.routed[u], run.xs[u], run.enc)


def test_a_site_refuses_to_reveal_both_shares_of_one_site():
    run = Run(5)
    unmasking = run.mask()
    u, target = unmasking.survivors[0], unmasking.survivors[1]
    with pytest.raises(SecureSumError, match=rf"asked for both shares of site\(s\) \[{target}\]; refused"):
        run.clients[u].reveal(unmasking.survivors, (target,))


@pytest.mark.parametrize(
    "who, msg",
    [
        ("stranger", "holds no shares of site"),
        ("not me", "is not named a survivor"),
        ("two", "2 sites survived, the threshold is 3"),
    ],
)
def test_a_site_refuses_a_dishonest_unmasking_request(who, msg):
    run = Run(5)
    alive = run.mask().survivors
    survivors = {"stranger": (*alive, 424242), "not me": alive[1:], "two": alive[:2]}[who]
    with pytest.raises(SecureSumError, match=msg):
        run.clients[alive[0]].reveal(survivors, ())


def test_a_site_runs_each_stage_once_so_no_mask_is_reused():
    run = Run(3)
    u = run.sites[0]
    run.clients[u].mask(run.routed[u], run.xs[u], run.enc)
    with pytest.raises(SecureSumError, match="stage 3 .mask. after stage 3"):
        run.clients[u].mask(run.routed[u], run.xs[u] + 1.0, run.enc)
    with pytest.raises(SecureSumError, match="stage 2"):
        run.clients[u].share_keys(run.book, 2)
    with pytest.raises(SecureSumError, match="stage 4 .reveal. before stage 1"):
        SecureSumClient(5).reveal((), ())
    with pytest.raises(SecureSumError, match="server's stage 3"):
        SecureSumServer(IDS[:3], 4, RingFixedPoint(10, 1.0)).collect_masked({})


def test_a_wrong_share_is_detected_not_summed():
    for kind in ("seed", "key"):
        run = Run(5)
        unmasking = run.mask(run.sites[:1])
        reveal = run.reveal(unmasking)
        liar = min(reveal)  # among the shares the server uses
        shares = reveal[liar].seed_shares if kind == "seed" else reveal[liar].key_shares
        owner = unmasking.survivors[-1] if kind == "seed" else unmasking.dropped[0]
        bad = bytearray(shares[owner])
        bad[10] ^= 1
        shares[owner] = bytes(bad)
        with pytest.raises(SecureSumError, match=f"shares of site {owner}'s mask {kind} do not rebuild it"):
            run.server.unmask(reveal)


def test_the_server_refuses_another_sites_or_missing_shares():
    for case in ("stolen", "partial"):
        run = Run(4)
        unmasking = run.mask()
        reveal = run.reveal(unmasking)
        a, b = unmasking.survivors[:2]
        if case == "stolen":  # a site replays another site's shares
            reveal[a] = RevealedShares(reveal[b].seed_shares, reveal[b].key_shares)
            msg = f"client node {a}: secure sum: a share is malformed or not this site's"
        else:
            reveal[a] = RevealedShares({a: reveal[a].seed_shares[a]}, {})
            msg = "must name exactly the survivors and the dropped sites"
        with pytest.raises(ReplyError, match=msg):
            run.server.unmask(reveal)


def test_the_server_refuses_bad_keys_and_key_shares():
    sites = IDS[:4]
    clients = {s: SecureSumClient(s) for s in sites}
    keys = {s: c.advertise() for s, c in clients.items()}
    copied = {**keys, sites[1]: keys[sites[0]]}
    with pytest.raises(ReplyError, match=f"client node {sites[1]}: secure sum: a public key repeats one of site"):
        SecureSumServer(sites, 8, RingFixedPoint(10, 1.0)).collect_keys(copied)
    with pytest.raises(ReplyError, match="outside the sum"):
        SecureSumServer(sites, 8, RingFixedPoint(10, 1.0)).collect_keys({**keys, 99999: keys[sites[0]]})
    garbled = {**keys, sites[2]: type(keys[sites[2]])(b"not a key", keys[sites[2]].mask)}
    with pytest.raises(ReplyError, match="does not parse"):
        SecureSumServer(sites, 8, RingFixedPoint(10, 1.0)).collect_keys(garbled)
    server = SecureSumServer(sites, 8, RingFixedPoint(10, 1.0))
    book = server.collect_keys(keys)
    shares = {s: c.share_keys(book, 3) for s, c in clients.items()}
    del shares[sites[0]].ciphertexts[sites[1]]
    with pytest.raises(ReplyError, match="one ciphertext for each of sites"):
        server.route_shares(shares)


def test_the_server_refuses_bad_masked_inputs():
    for bad in (np.zeros(80, dtype=np.int64), np.zeros(79, dtype=np.uint64), np.zeros((80, 1), dtype=np.uint64)):
        run = Run(3)
        masked = {s: run.clients[s].mask(run.routed[s], run.xs[s], run.enc) for s in run.sites}
        masked[run.sites[0]] = bad
        with pytest.raises(ReplyError, match="the masked input must be uint64"):
            run.server.collect_masked(masked)


def test_a_site_checks_the_key_book_and_its_input():
    sites = IDS[:3]
    clients = {s: SecureSumClient(s) for s in sites}
    keys = {s: c.advertise() for s, c in clients.items()}
    other = SecureSumClient(sites[0])
    with pytest.raises(SecureSumError, match=f"does not hold site {sites[0]}'s own keys"):
        other.advertise()
        other.share_keys(keys, 2)
    repeated = {**keys, sites[2]: keys[sites[1]]}
    with pytest.raises(SecureSumError, match="repeats a public key"):
        clients[sites[0]].share_keys(repeated, 2)
    with pytest.raises(ConfigError, match="threshold"):
        clients[sites[1]].share_keys(keys, 1)
    run = Run(3, bound=1.0)
    u = run.sites[0]
    with pytest.raises(ValueError, match="exceed the bound 1"):
        run.clients[u].mask(run.routed[u], np.full(40, 2.0), run.enc)
