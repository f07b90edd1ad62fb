"""The layouts of the secure sums (secure_records), the encoding each sum gets and a site's state
between messages: known answers to float64."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from secure_helpers import Federation

from fedhead import ufm
from fedhead.analysis.constraints import ConfigError
from fedhead.federation import secure_records as sr
from fedhead.federation.ring_encoding import RingFixedPoint
from fedhead.federation.roster import simulation_roster
from fedhead.federation.secure_site import SecureSumClient
from fedhead.federation.secure_sum import (
    KeyShares,
    PublicKeys,
    RevealedShares,
    SecureSumError,
    Unmasking,
)


def _limb_frac_bits(bound: float, sites: int) -> int:
    """The fractional bits of the encoding before the ring (32-bit limbs: ``max(2, ceil(bits / 32))``
    of them, sums below ``2^(32 limbs - 1)``)."""
    limbs = max(2, math.ceil((math.log2(sites * bound) + sr.FRAC_BITS + 2) / 32))
    f = 0
    while sites * round(Fraction(bound) * 2 ** (f + 1)) < 2 ** (32 * limbs - 1):
        f += 1
    return f


@pytest.mark.parametrize("sites", [3, 4, 50])
def test_encoding_for_grows_words_with_the_range_and_keeps_the_precision(sites):
    bounds = [1e-9, 1.0, sr.COUNT_BOUND, sr.COUNT_BOUND * 1e12, sr.COUNT_BOUND * 1e200]
    encodings = [sr.encoding_for(b, sites) for b in bounds]
    words = [e.words for e in encodings]
    assert words == sorted(words) and words[0] < words[-1] <= 16
    for bound, enc in zip(bounds, encodings, strict=True):
        assert enc.frac_bits >= max(sr.FRAC_BITS, _limb_frac_bits(bound, sites))  # at least as precise as before
        enc.check_sites(sites)


def test_moment_layout_gives_sigma_cen_and_sigma_within():
    rng = np.random.default_rng(1)
    ys = [rng.normal(size=(n, 3)) @ rng.normal(size=(3, 3)) + rng.normal(size=3) for n in (20, 35, 50)]
    mom = ufm.TargetMoments.from_targets(ys)
    total = sum(sr.moment_vector(n, mu, cov) for n, mu, cov in zip(mom.counts, mom.means, mom.covs, strict=True))
    pooled = sr.read_moments(total, 3)
    assert pooled.count == 105 and sr.moment_length(3) == total.size
    np.testing.assert_allclose(pooled.mean, np.concatenate(ys).mean(0), rtol=1e-13)
    np.testing.assert_allclose(pooled.cov, mom.sigma_cen, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(pooled.within, mom.sigma_within, rtol=1e-12, atol=1e-14)


def test_statistics_head_and_mse_layouts():
    rng = np.random.default_rng(2)
    xs = [rng.normal(size=(n, 4)) * [1, 10, 0.1, 3] for n in (12, 30)]
    ys = [rng.normal(size=(x.shape[0], 2)) for x in xs]
    total = sum(
        sr.statistics_vector(x.shape[0], y.mean(0), np.cov(y.T, bias=True), x.mean(0), x.var(0))
        for x, y in zip(xs, ys, strict=True)
    )
    pooled, x_mean, x_var = sr.read_statistics(total, 2, 4)
    np.testing.assert_allclose(x_mean, np.concatenate(xs).mean(0), rtol=1e-13)
    np.testing.assert_allclose(x_var, np.concatenate(xs).var(0), rtol=1e-11)
    np.testing.assert_allclose(pooled.cov, np.cov(np.concatenate(ys).T, bias=True), rtol=1e-12)
    heads = [(rng.normal(size=(2, 5)), rng.normal(size=2), n) for n in (3, 7)]
    w, b, n = sr.read_head(sum(sr.head_vector(n, w, b) for w, b, n in heads), (2, 5))
    assert n == 10
    np.testing.assert_allclose(w, (3 * heads[0][0] + 7 * heads[1][0]) / 10, rtol=1e-14)
    np.testing.assert_allclose(b, (3 * heads[0][1] + 7 * heads[1][1]) / 10, rtol=1e-14)
    train, test = sr.read_mse(sr.mse_vector(0.5, 10, 0.2, 5) + sr.mse_vector(1.0, 30, None, 0))
    assert train == pytest.approx(35 / 40, rel=1e-15) and test == pytest.approx(0.2, rel=1e-15)
    assert sr.read_mse(sr.mse_vector(0.5, 10, None, 0))[1] is None


def test_nearest_psd_clips_negative_eigenvalues():
    a = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3, -1
    p = sr.nearest_psd(a)
    np.testing.assert_allclose(np.linalg.eigvalsh(p), [0.0, 3.0], atol=1e-14)
    np.testing.assert_allclose(sr.nearest_psd(np.eye(2)), np.eye(2), atol=0)


def test_payloads_round_trip_and_refuse_garbage():
    keys = PublicKeys(b"enc", b"mask", "site-a", b"s" * 64)
    assert sr.unpack_keys(sr.pack(keys)) == keys
    shares = KeyShares({2**63 + 5: b"ct"}, b"d" * 32)
    assert sr.unpack_shares(sr.pack(shares)) == shares
    rev = RevealedShares({1: b"a"}, {2: b"b"})
    assert sr.unpack_revealed(sr.pack(rev)) == rev
    assert sr.unpack_unmasking(sr.pack(Unmasking((1, 2), (3,)))) == Unmasking((1, 2), (3,))
    signed = Unmasking((1, 2), (3,), {2**64 - 1: b"x" * 64, 2: b"y" * 64})
    assert sr.unpack_unmasking(sr.pack(signed)) == signed
    assert sr.unpack_signature(sr.pack_signature(b"z" * 64)) == b"z" * 64
    book, t = sr.unpack_book(sr.pack_book({7: keys}, 3))
    assert book == {7: keys} and t == 3
    enc = RingFixedPoint(100, 1e6, 3)
    assert sr.unpack_mask_request(sr.pack_mask_request({7: b"x"}, enc)) == ({7: b"x"}, enc)
    for bad in (b"not json", b"[1, 2]", b'{"encryption": 3, "mask": "AA=="}', b'{"encryption": "AA==", "name": 3}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            sr.unpack_keys(bad)


def test_a_site_stored_between_every_stage_gives_the_same_sum():
    rng = np.random.default_rng(3)
    fed = Federation([11, 22, 33, 44])
    sites = fed.sites
    values = {s: rng.normal(size=6) for s in sites}
    enc = sr.encoding_for(10.0, len(sites))
    server = fed.server(6, enc)
    clients = {s: fed.client(s) for s in sites}

    def reload():
        out = {}
        for s, c in clients.items():
            blob = c.to_bytes()
            assert fed.keys[fed.names[s]].private_bytes_raw() not in blob  # the signing key is not in it
            out[s] = SecureSumClient.from_bytes(blob, fed.roster, fed.keys[fed.names[s]])
        return out

    book = server.collect_keys({s: c.advertise() for s, c in clients.items()})
    clients = reload()
    routed = server.route_shares({s: c.share_keys(book, 3) for s, c in clients.items()})
    clients = reload()
    masked = {s: clients[s].mask(routed[s], values[s], enc) for s in sites[:3]}  # site 44 drops
    unmasking = server.collect_masked(masked)
    clients = reload()
    request = server.collect_signatures({s: clients[s].sign_survivors(unmasking) for s in unmasking.survivors})
    clients = reload()
    result = server.unmask({s: clients[s].reveal(request) for s in request.signatures})
    np.testing.assert_allclose(result.total, sum(values[s] for s in sites[:3]), rtol=1e-15, atol=1e-15)
    clients = reload()
    with pytest.raises(SecureSumError, match="stage 5 .reveal. after stage 5"):  # the stored stage holds
        clients[11].reveal(request)


def test_a_stored_site_refuses_damage_another_roster_or_key():
    fed = Federation([11, 22, 33])
    client = fed.client(11)
    blob, key = client.to_bytes(), fed.keys["site-0"]
    with pytest.raises(SecureSumError, match="does not parse"):
        SecureSumClient.from_bytes(b"{}", fed.roster, key)
    other, _ = simulation_roster(fed.names.values())
    with pytest.raises(SecureSumError, match="the roster differs from the one this site began the sum with"):
        SecureSumClient.from_bytes(blob, other, key)
    with pytest.raises(ConfigError, match="the signing key of site 'site-0' is not its key in the roster"):
        SecureSumClient.from_bytes(blob, fed.roster, fed.keys["site-1"])


def test_a_site_takes_only_the_encoding_of_its_bound_and_book():
    own = sr.encoding_for(sr.head_bound(1e6), 5)
    assert sr.check_encoding(own, sr.head_bound(1e6), 5) == own
    for other in (
        sr.encoding_for(sr.head_bound(1e6), 4),  # another book size
        sr.encoding_for(1.0, 5),  # a bound the server chose
        RingFixedPoint(own.frac_bits - 1, own.bound, own.words),  # coarser rounding
        RingFixedPoint(own.frac_bits, own.bound, own.words + 1),
    ):
        with pytest.raises(SecureSumError, match=r"^secure sum: the mask request's encoding \(.*\) is not this sum's"):
            sr.check_encoding(other, sr.head_bound(1e6), 5)


def test_the_layout_bounds_are_the_server_bounds_of_before():
    """Known values: the head and MSE sums kept ``COUNT_BOUND`` times ``trust.max_abs`` and 1, the exchange
    ``COUNT_BOUND max(1, scale)^2`` (the raw statistics: ``scale = 1e100``)."""
    assert sr.head_bound(1e6) == 2.0**53 * 1e6 and sr.MSE_BOUND == 2.0**53
    assert sr.moment_bound(0.5) == 2.0**53 and sr.moment_bound(1e6) == 2.0**53 * 1e12
    assert sr.statistics_bound() == 2.0**53 * 1e200
