"""The secure sum engine: the five stages, what the server unmasks, dropouts, faults and the server's
checks (fedhead.federation.secure_sum, secure_site, secure_server). The sites' refusals of a
deviating server: test_secure_site_rules.py and test_secure_sum_malicious.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from flwr.common.secure_aggregation.crypto.symmetric_encryption import encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat
from flwr.supercore.primitives.asymmetric import bytes_to_public_key
from secure_helpers import IDS, SUM, Federation, Given, Run, ring_sum

from fedhead.analysis.constraints import ConfigError
from fedhead.federation import secure_records as sr
from fedhead.federation.reply_checks import ReplyError
from fedhead.federation.ring_encoding import RingFixedPoint
from fedhead.federation.secure_sum import (
    PublicKeys,
    RevealedShares,
    SecureSumError,
    _seed_digest,
    _self_mask,
    _stream,
    _sum_tag,
    check_threshold,
    default_threshold,
)

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
            masked = ring_sum(run.enc, [run.masked[s] for s in subset])
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
    result = run.server.unmask(run.reveal(run.sign(unmasking)))
    np.testing.assert_array_equal(result.encoded, run.plain(alive))
    assert result.dropped == dead and result.survivors == tuple(sorted(alive))


def test_dropouts_at_every_stage_together():
    run = Run(8, seed=3)
    assert run.server.threshold == 5
    # site 0 never advertises keys, site 1 never shares them: they are in no mask
    server = run.fed.server(40, run.enc, sum_id="sum-2")
    clients = {s: run.fed.client(s, "sum-2") for s in run.sites}
    book = server.collect_keys({s: c.advertise() for s, c in clients.items() if s != run.sites[0]})
    shares = {s: clients[s].share_keys(book, server.threshold) for s in book if s != run.sites[1]}
    routed = server.route_shares(shares)
    masked = {s: clients[s].mask(routed[s], run.xs[s], run.enc) for s in routed if s != run.sites[2]}
    unmasking = server.collect_masked(masked)
    assert unmasking.dropped == (run.sites[2],)
    request = server.collect_signatures({s: clients[s].sign_survivors(unmasking) for s in unmasking.survivors})
    result = server.unmask({s: clients[s].reveal(request) for s in request.signatures})  # 5 of 8: the threshold
    np.testing.assert_array_equal(result.encoded, run.plain(run.sites[3:]))


def test_sites_that_neither_sign_nor_reveal_still_count():
    run = Run(7)
    assert run.server.threshold == 4
    result = run.run(drop_before_mask=run.sites[:1], unsigned=run.sites[1:2], silent=run.sites[2:3])
    assert result.survivors == tuple(sorted(run.sites[1:])) and result.dropped == (run.sites[0],)
    np.testing.assert_array_equal(result.encoded, run.plain(run.sites[1:]))


def test_too_few_survivors_is_one_line_naming_the_threshold():
    run = Run(5)
    assert run.server.threshold == 3
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites survived, the threshold is 3$"):
        run.mask(run.sites[:3])
    run = Run(5)
    unmasking = run.mask()
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites signed the survivor list, the threshold is 3$"):
        run.sign(unmasking, unsigned=run.sites[:3])
    run = Run(5)
    request = run.sign(run.mask())
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites answered the unmasking, the threshold is 3$"):
        run.server.unmask(run.reveal(request, silent=run.sites[:3]))
    fed = Federation(IDS[:5])
    server = fed.server(4, RingFixedPoint(10, 1.0))
    with pytest.raises(SecureSumError, match=r"^secure sum: 2 sites advertised keys, the threshold is 3$"):
        server.collect_keys({s: fed.client(s).advertise() for s in IDS[:2]})


def test_threshold_rules():
    assert [default_threshold(m) for m in range(3, 9)] == [2, 3, 3, 4, 4, 5]
    assert check_threshold(5, 5) == 5
    for t, m in [(2, 4), (1, 3), (6, 5), (True, 3), (2.5, 4)]:
        with pytest.raises(ConfigError, match="threshold must be an integer in") as err:
            check_threshold(t, m)
        assert "\n" not in str(err.value)
    fed = Federation(IDS[:6])
    with pytest.raises(ConfigError, match=r"needs at least 3 sites, got 2 \(with two, each site learns"):
        fed.server(4, RingFixedPoint(10, 1.0), IDS[:2])
    with pytest.raises(ConfigError, match="threshold"):
        fed.server(4, RingFixedPoint(10, 1.0), threshold=3)  # 2t <= n: a minority
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


def _forged_shares(run: Run, u: int, v: int, plain: bytes) -> bytes:
    """``plain`` encrypted from ``v`` to ``u`` under their true shared key."""
    key = generate_shared_key(run.clients[v]._enc_key, bytes_to_public_key(run.book[u].encryption))
    return encrypt(key, plain)


def test_key_shares_naming_the_wrong_sender_recipient_or_sum_are_refused():
    for src, dst in [(2, 0), (1, 2)]:  # positions in the site list; site 1 sends to site 0
        run = Run(4)
        u, v = run.sites[0], run.sites[1]
        named = (run.sites[src], run.sites[dst])
        plain = _sum_tag(SUM) + share_keys_plaintext_concat(*named, b"x" * 52, b"y" * 324)
        run.routed[u][v] = _forged_shares(run, u, v, plain)
        with pytest.raises(SecureSumError, match=f"routed from site {v} to site {u} name {named[0]} -> {named[1]}"):
            run.clients[u].mask(run.routed[u], run.xs[u], run.enc)
    run = Run(4)
    u, v = run.sites[0], run.sites[1]
    plain = _sum_tag("run-1/sum-0") + share_keys_plaintext_concat(v, u, b"x" * 52, b"y" * 324)
    run.routed[u][v] = _forged_shares(run, u, v, plain)
    with pytest.raises(
        SecureSumError, match=f"^secure sum: the key shares from site {v} belong to another sum; refused$"
    ):
        run.clients[u].mask(run.routed[u], run.xs[u], run.enc)


def test_every_mask_and_commitment_binds_the_sum_id():
    seed = bytes(range(32))
    assert not np.array_equal(_self_mask(seed, "a", 8), _self_mask(seed, "b", 8))
    assert not np.array_equal(_self_mask(seed, "a", 8), _stream(seed, b"fedhead secure sum: pair mask", "a", 8))
    assert _seed_digest(seed, "a") != _seed_digest(seed, "b")
    assert _sum_tag("ab") != _sum_tag("a") and not _sum_tag("ab").startswith(_sum_tag("a"))


def test_a_wrong_share_is_detected_not_summed():
    for kind in ("seed", "key"):
        run = Run(5)
        request = run.sign(run.mask(run.sites[:1]))
        reveal = run.reveal(request)
        liar = min(reveal)  # among the shares the server uses
        shares = reveal[liar].seed_shares if kind == "seed" else reveal[liar].key_shares
        owner = request.survivors[-1] if kind == "seed" else request.dropped[0]
        bad = bytearray(shares[owner])
        bad[10] ^= 1
        shares[owner] = bytes(bad)
        with pytest.raises(SecureSumError, match=f"shares of site {owner}'s mask {kind} do not rebuild it"):
            run.server.unmask(reveal)


def test_the_server_refuses_another_sites_or_missing_shares():
    for case in ("stolen", "partial", "unsigned"):
        run = Run(4)
        request = run.sign(run.mask(), unsigned=run.sites[-1:])
        reveal = run.reveal(request)
        a, b = sorted(request.signatures)[:2]
        if case == "stolen":  # a site replays another site's shares
            reveal[a] = RevealedShares(reveal[b].seed_shares, reveal[b].key_shares)
            msg = f"client node {a}: secure sum: a share is malformed or not this site's"
        elif case == "partial":
            reveal[a] = RevealedShares({a: reveal[a].seed_shares[a]}, {})
            msg = "must name exactly the survivors and the dropped sites"
        else:
            reveal[run.sites[-1]] = reveal[a]
            msg = f"client node {run.sites[-1]}: .* a site that did not sign the survivor list"
        with pytest.raises(ReplyError, match=msg):
            run.server.unmask(reveal)


def test_the_server_refuses_bad_keys_key_shares_and_signatures():
    fed = Federation(IDS[:4])
    sites = fed.sites
    clients = {s: fed.client(s) for s in sites}
    keys = {s: c.advertise() for s, c in clients.items()}
    enc = RingFixedPoint(10, 1.0)
    for bad, msg in [
        ({**keys, sites[1]: keys[sites[0]]}, f"client node {sites[1]}: .* not roster member 'site-0'"),
        ({**keys, 99999: keys[sites[0]]}, "outside the sum"),
        ({**keys, sites[2]: replace(keys[sites[2]], encryption=b"not a key")}, "does not parse"),
        ({**keys, sites[2]: replace(keys[sites[2]], signature=b"x" * 64)}, "not roster member 'site-2'"),
    ]:
        with pytest.raises(ReplyError, match=msg):
            fed.server(8, enc).collect_keys(bad)
    server = fed.server(8, enc)
    book = server.collect_keys(keys)
    shares = {s: c.share_keys(book, 3) for s, c in clients.items()}
    del shares[sites[0]].ciphertexts[sites[1]]
    with pytest.raises(ReplyError, match="one ciphertext for each of sites"):
        server.route_shares(shares)
    run = Run(4)
    unmasking = run.mask()
    signatures = {s: run.clients[s].sign_survivors(unmasking) for s in run.sites}
    a, b = run.sites[:2]
    for bad, msg in [
        ({**signatures, a: signatures[b]}, f"client node {a}: secure sum: the survivor-list signature does not"),
        ({**signatures, 5: signatures[b]}, "client node 5: .* not a survivor"),
    ]:
        server = run.fed.server(40, run.enc, sum_id=SUM)
        server._stage, server._book, server._unmasking = 3, run.book, unmasking  # as after stage 3
        with pytest.raises(ReplyError, match=msg):
            server.collect_signatures(bad)


def test_the_server_refuses_bad_masked_inputs():
    for bad in (np.zeros(80, dtype=np.int64), np.zeros(79, dtype=np.uint64), np.zeros((80, 1), dtype=np.uint64)):
        run = Run(3)
        masked = {s: run.clients[s].mask(run.routed[s], run.xs[s], run.enc) for s in run.sites}
        masked[run.sites[0]] = bad
        with pytest.raises(ReplyError, match="the masked input must be uint64"):
            run.server.collect_masked(masked)


def test_a_site_checks_its_input_and_the_server_its_stages():
    run = Run(3, bound=1.0)
    u = run.sites[0]
    with pytest.raises(ValueError, match="exceed the bound 1"):
        run.clients[u].mask(run.routed[u], np.full(40, 2.0), run.enc)
    with pytest.raises(SecureSumError, match="server's stage 3"):
        Federation(IDS[:3]).server(4, RingFixedPoint(10, 1.0)).collect_masked({})
    assert isinstance(run.book[u], PublicKeys) and run.book[u].name == "site-0"
    assert sr.unpack_book(sr.pack_book(run.book, 2)) == (run.book, 2)
