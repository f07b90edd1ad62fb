"""fedhead.federation.shamir: round trips, any t shares, t - 1 shares consistent with every secret, refusals."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from fedhead.federation import shamir
from fedhead.federation.shamir import PRIME, Combiner, combine, evaluate, is_share, lagrange_at_zero, parse, split


@pytest.mark.parametrize("length", [1, 31, 32, 48, 63, 64, 65, 128, 200])
@pytest.mark.parametrize(("threshold", "n"), [(1, 1), (1, 3), (2, 3), (3, 5), (5, 5), (33, 64), (65, 128)])
def test_round_trip_of_every_length_and_threshold(length, threshold, n):
    secret = os.urandom(length)
    shares = split(secret, threshold, n)
    assert len(shares) == n
    assert {len(s) for s in shares} == {shamir.share_size(length)}
    assert [parse(s)[:3] for s in shares] == [(i, threshold, length) for i in range(1, n + 1)]
    assert combine(shares[:threshold]) == secret
    assert combine(shares[n - threshold :]) == secret  # other helpers
    assert combine(shares) == secret  # more than t: the same polynomial


def test_leading_zero_bytes_survive():
    for secret in (bytes(32), b"\x00\x00\x01", bytes(64) + b"\x01", b"\xff" * 48):
        assert combine(split(secret, 3, 5)[2:]) == secret


def test_a_seed_and_a_p384_scalar_are_one_element():
    assert shamir.share_size(32) == shamir.share_size(48) == 72
    assert shamir.share_size(65) == 6 + 2 * 66


def test_any_t_shares_suffice_in_any_order():
    rng = random.Random(1)
    secret = os.urandom(48)
    shares = split(secret, 3, 6)
    for subset in itertools.combinations(shares, 3):
        assert combine(list(subset)) == secret
        assert combine(rng.sample(subset, 3)) == secret


def test_fewer_than_t_shares_are_refused():
    shares = split(os.urandom(32), 4, 7)
    with pytest.raises(ValueError, match="3 shares, the threshold is 4"):
        combine(shares[:3])


def _interpolate(points: list[tuple[int, int]]) -> list[int]:
    """Coefficients (lowest first) of the polynomial of degree < len(points) through ``points``, mod p
    (Newton's divided differences, independent of the module's Lagrange coefficients)."""
    xs = [x for x, _ in points]
    table = [y for _, y in points]
    for level in range(1, len(points)):
        for i in range(len(points) - 1, level - 1, -1):
            table[i] = (table[i] - table[i - 1]) * pow(xs[i] - xs[i - level], -1, PRIME) % PRIME
    coefficients = [0] * len(points)
    for i in range(len(points) - 1, -1, -1):  # Horner on the Newton basis
        coefficients = [(c - xs[i] * n) % PRIME for c, n in zip([0, *coefficients[:-1]], coefficients, strict=True)]
        coefficients[0] = (coefficients[0] + table[i]) % PRIME
    return coefficients


@pytest.mark.parametrize(("threshold", "n"), [(2, 3), (3, 5), (5, 9)])
def test_t_minus_one_shares_fit_every_secret(threshold, n):
    """For the t - 1 shares of a secret m, any other secret m' has a polynomial of degree t - 1 giving
    exactly those shares (so the shares cannot tell m from m')."""
    secret, other = os.urandom(32), os.urandom(32)
    shares = split(secret, threshold, n)
    seen = random.Random(threshold).sample(shares, threshold - 1)
    points = [(parse(s)[0], parse(s)[3][0]) for s in seen]
    g = _interpolate([(0, int.from_bytes(other, "big")), *points])
    assert len(g) == threshold  # degree at most t - 1, as split's polynomials
    assert g[0] == int.from_bytes(other, "big")
    assert [evaluate(g, x) for x, _ in points] == [y for _, y in points]
    # and the t-th share of g rebuilds the other secret with the seen ones
    x = next(i for i in range(1, n + 1) if i not in {p[0] for p in points})
    forged = x.to_bytes(2, "big") + threshold.to_bytes(2, "big") + (32).to_bytes(2, "big")
    forged += evaluate(g, x).to_bytes(shamir.ELEMENT, "big")
    assert combine([*seen, forged]) == other != secret


def test_a_combiner_is_reused_across_secrets():
    secrets_ = [os.urandom(length) for length in (32, 48, 32, 100)]
    shares = [split(s, 3, 5) for s in secrets_]
    combiner = Combiner([2, 4, 5])
    assert combiner.coefficients is lagrange_at_zero((2, 4, 5))  # computed once per set of indices
    assert [combiner.combine([sh[1], sh[3], sh[4]]) for sh in shares] == secrets_
    # the coefficients at zero sum to 1 (they interpolate the constant polynomial)
    assert sum(combiner.coefficients) % PRIME == 1
    with pytest.raises(ValueError, match=r"indices are not the combiner's \[2, 4, 5\]"):
        combiner.combine([shares[0][0], shares[0][3], shares[0][4]])


def test_split_refuses_bad_arguments():
    for args in ((b"", 2, 3), (b"x" * 65536, 2, 3), (b"x", 0, 3), (b"x", 4, 3), (b"x", 2, 65536)):
        with pytest.raises(ValueError, match="shamir: "):
            split(*args)
    with pytest.raises(ValueError, match="the secret must be"):
        split("text", 2, 3)  # type: ignore[arg-type]


def test_malformed_shares_are_refused():
    shares = split(os.urandom(32), 2, 3)
    good = shares[0]
    out_of_field = good[:6] + PRIME.to_bytes(shamir.ELEMENT, "big")
    bad = {
        "not bytes": "share",
        "short": good[:5],
        "truncated": good[:-1],
        "index 0": b"\x00\x00" + good[2:],
        "threshold 0": good[:2] + b"\x00\x00" + good[4:],
        "length 0": good[:4] + b"\x00\x00" + good[6:],
        "longer length": good[:4] + (65).to_bytes(2, "big") + good[6:],
        "outside the field": out_of_field,
    }
    for name, share in bad.items():
        assert not is_share(share), name
        with pytest.raises(ValueError, match="shamir: "):
            combine([share, shares[1]])
    assert is_share(good) and is_share(good, 1) and not is_share(good, 2)


def test_mismatched_shares_are_refused():
    a, b = split(os.urandom(32), 2, 3), split(os.urandom(48), 2, 3)
    with pytest.raises(ValueError, match="disagree on the threshold or the secret's length"):
        combine([a[0], b[1]])
    with pytest.raises(ValueError, match="disagree on the threshold"):
        combine([a[0], split(os.urandom(32), 3, 3)[1]])
    with pytest.raises(ValueError, match="distinct and nonzero"):
        combine([a[0], a[0]])
    with pytest.raises(ValueError, match="no shares"):
        combine([])


def test_a_wrong_share_rebuilds_a_wrong_secret_or_is_caught():
    secret = os.urandom(32)
    shares = split(secret, 2, 3)
    # a random wrong value makes the chunk uniform in [0, p): it fits 32 bytes with probability 2^-265
    random_value = shares[0][:6] + (int.from_bytes(os.urandom(66), "big") % PRIME).to_bytes(shamir.ELEMENT, "big")
    with pytest.raises(ValueError, match="do not rebuild a secret of their length"):
        combine([random_value, shares[1]])
    # a small error e in share 1 moves the secret by lambda_1 e = 2 e (helpers 1, 2): a commitment must catch it
    y = parse(shares[0])[3][0]
    flipped = shares[0][:6] + (y ^ 1).to_bytes(shamir.ELEMENT, "big")
    error = (y ^ 1) - y
    rebuilt = combine([flipped, shares[1]])
    assert int.from_bytes(rebuilt, "big") == (int.from_bytes(secret, "big") + 2 * error) % PRIME
