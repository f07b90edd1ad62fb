"""The layouts of the secure sums (secure_records), the wide fixed-point encoding and a site's state
between messages: known answers to float64 (exact rationals where the encoding promises exactness)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from fedhead import ufm
from fedhead.analysis.constraints import ConfigError
from fedhead.federation import secure_records as sr
from fedhead.federation.secure_sum import (
    KeyShares,
    PublicKeys,
    RevealedShares,
    SecureSumClient,
    SecureSumError,
    SecureSumServer,
    Unmasking,
    WideFixedPoint,
)


def _exact_sum(rows: list[np.ndarray]) -> list[Fraction]:
    return [sum((Fraction(float(r[i])) for r in rows), Fraction(0)) for i in range(rows[0].size)]


def test_wide_encoding_sums_exactly_and_rounds_once():
    rng = np.random.default_rng(0)
    m, length = 7, 40
    rows = [rng.normal(size=length) * 10.0 ** rng.uniform(-20, 12, size=length) for _ in range(m)]
    enc = WideFixedPoint.for_sites(1e13, m, limbs=6)
    assert enc.frac_bits >= 96
    total = np.sum([enc.encode(r) for r in rows], axis=0, dtype=np.uint64)
    got = enc.decode(total)
    step = Fraction(1, 2**enc.frac_bits)
    for g, exact, r in zip(got, _exact_sum(rows), np.stack(rows, 1), strict=True):
        # the integer sum is the sum of the rounded inputs: within M half-steps, then one float64 rounding
        rounded = sum((Fraction(round(Fraction(float(v)) / step)) * step for v in r), Fraction(0))
        assert g == float(rounded)
        assert abs(Fraction(g) - exact) <= m * step / 2 + abs(exact) * Fraction(1, 2**52)


def test_wide_encoding_negative_values_and_limits():
    enc = WideFixedPoint(frac_bits=80, bound=4.0, limbs=4)
    x = np.array([-1.0, -(2.0**-80), 3.5, 0.0, -4.0])
    np.testing.assert_array_equal(enc.decode(enc.encode(x)), x)
    assert enc.width(5) == 20 and enc.encode(x).dtype == np.uint64
    with pytest.raises(ValueError, match="exceed the bound"):
        enc.encode(np.array([4.5]))
    with pytest.raises(ValueError, match="non-finite"):
        enc.encode(np.array([np.nan]))
    with pytest.raises(ConfigError, match="overflow"):
        enc.check_sites(enc.capacity() + 1)
    best = WideFixedPoint.for_sites(4.0, 10, limbs=4)
    assert 10 * best.max_encoded < 2**127 <= 10 * WideFixedPoint(best.frac_bits + 1, 4.0, 4).max_encoded


def test_encoding_for_grows_limbs_with_the_range():
    small, large = sr.encoding_for(1.0, 8), sr.encoding_for(sr.COUNT_BOUND * 1e200, 8)
    assert small.frac_bits >= sr.FRAC_BITS and large.frac_bits >= sr.FRAC_BITS
    assert small.limbs < large.limbs <= 32


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
    keys = PublicKeys(b"enc", b"mask")
    assert sr.unpack_keys(sr.pack(keys)) == keys
    shares = KeyShares({2**63 + 5: b"ct"}, b"d" * 32)
    assert sr.unpack_shares(sr.pack(shares)) == shares
    rev = RevealedShares({1: b"a"}, {2: b"b"})
    assert sr.unpack_revealed(sr.pack(rev)) == rev
    assert sr.unpack_unmasking(sr.pack(Unmasking((1, 2), (3,)))) == Unmasking((1, 2), (3,))
    book, t = sr.unpack_book(sr.pack_book({7: keys}, 3))
    assert book == {7: keys} and t == 3
    enc = WideFixedPoint(100, 1e6, 6)
    assert sr.unpack_mask_request(sr.pack_mask_request({7: b"x"}, enc)) == ({7: b"x"}, enc)
    for bad in (b"not json", b"[1, 2]", b'{"encryption": 3, "mask": "AA=="}'):
        with pytest.raises((ValueError, KeyError, TypeError)):
            sr.unpack_keys(bad)


def test_a_site_stored_between_every_stage_gives_the_same_sum():
    rng = np.random.default_rng(3)
    sites = [11, 22, 33, 44]
    values = {s: rng.normal(size=6) for s in sites}
    enc = sr.encoding_for(10.0, len(sites))
    server = SecureSumServer(sites, 6, enc)
    clients = {s: SecureSumClient(s) for s in sites}

    def reload():
        return {s: SecureSumClient.from_bytes(c.to_bytes()) for s, c in clients.items()}

    book = server.collect_keys({s: c.advertise() for s, c in clients.items()})
    clients = reload()
    routed = server.route_shares({s: c.share_keys(book, 3) for s, c in clients.items()})
    clients = reload()
    masked = {s: clients[s].mask(routed[s], values[s], enc) for s in sites[:3]}  # site 44 drops
    unmasking = server.collect_masked(masked)
    clients = reload()
    result = server.unmask({s: clients[s].reveal(unmasking.survivors, unmasking.dropped) for s in unmasking.survivors})
    np.testing.assert_allclose(result.total, sum(values[s] for s in sites[:3]), rtol=1e-15, atol=1e-15)
    with pytest.raises(SecureSumError, match="does not parse"):
        SecureSumClient.from_bytes(b"{}")
