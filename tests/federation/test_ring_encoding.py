"""The ring Z_{2^(64k)} of the secure sum (fedhead.federation.ring_encoding): its carry arithmetic
against Python integers, the fixed-point encoding's rounding, error bound and range refusals."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from secure_helpers import Federation

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.ring_encoding import RingFixedPoint, ring_add, ring_sub


def _words(values: list[int], k: int) -> np.ndarray:
    """Python integers as ring vectors, word j of entry i at j L + i (an oracle independent of the module)."""
    mod = 2 ** (64 * k)
    return np.array([[(v % mod) >> (64 * j) & (2**64 - 1) for v in values] for j in range(k)], dtype=np.uint64).ravel()


def _unsigned(words: np.ndarray, k: int) -> list[int]:
    rows = words.reshape(k, -1)
    return [sum(int(rows[j, i]) << (64 * j) for j in range(k)) for i in range(rows.shape[1])]


def _edges(k: int) -> list[int]:
    """0, +-1, the extremes of the signed range and a carry or borrow across every word boundary."""
    top = 2 ** (64 * k - 1)
    out = [0, 1, -1, top - 1, -top, -top + 1, top - 2]
    for j in range(1, k):
        out += [2 ** (64 * j) - 1, 2 ** (64 * j), -(2 ** (64 * j)), 2 ** (64 * j) + 2**63]
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16])
def test_ring_add_and_sub_equal_python_integers_modulo_2_to_the_64k(k):
    rng = np.random.default_rng(k)
    mod = 2 ** (64 * k)
    randoms = [int.from_bytes(rng.bytes(8 * k), "little") for _ in range(200)]
    edges = _edges(k)
    xs = edges * len(edges) + randoms  # every pair of edge values, then random pairs
    ys = [e for e in edges for _ in edges] + randoms[::-1]
    a, b = _words(xs, k), _words(ys, k)
    assert _unsigned(ring_add(a, b, k), k) == [(x + y) % mod for x, y in zip(xs, ys, strict=True)]
    assert _unsigned(ring_sub(a, b, k), k) == [(x - y) % mod for x, y in zip(xs, ys, strict=True)]
    carry_all = _words([-1] * 3, k)  # 2^(64k) - 1 plus 1: a carry through every word, to 0
    assert _unsigned(ring_add(carry_all, _words([1, 2, 0], k), k), k) == [0, 1, mod - 1]
    assert _unsigned(ring_sub(_words([0], k), _words([1], k), k), k) == [mod - 1]  # a borrow through every word
    enc = RingFixedPoint(0, 1.0, k)
    assert enc.integers(a) == [(x + mod // 2) % mod - mod // 2 for x in xs]  # the signed representative


def test_ring_arithmetic_refuses_a_wrong_shape_or_type():
    with pytest.raises(TypeError, match="multiple of 3 words"):
        ring_add(np.zeros(4, dtype=np.uint64), np.zeros(4, dtype=np.uint64), 3)
    with pytest.raises(TypeError, match="flat uint64"):
        ring_sub(np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.uint64), 2)
    with pytest.raises(ValueError, match="vectors of 4 and 2 words do not add"):
        ring_add(np.zeros(4, dtype=np.uint64), np.zeros(2, dtype=np.uint64), 2)  # no broadcasting
    with pytest.raises(TypeError, match="flat uint64"):
        RingFixedPoint(10, 1.0, 2).decode(np.zeros((2, 2), dtype=np.uint64))


@pytest.mark.parametrize("k, f, bound", [(1, 20, 8.0), (2, 80, 4.0), (3, 100, 1e6), (16, 1000, 1e6)])
def test_encode_is_the_exact_rounded_integer_in_twos_complement(k, f, bound):
    enc = RingFixedPoint(f, bound, k)
    rng = np.random.default_rng(f)
    tiny = 2.0 ** -(f + 1)  # half a step: ties round to even
    x = np.concatenate(
        [rng.uniform(-bound, bound, 50), [bound, -bound, 0.0, -0.0, tiny, 3 * tiny, -tiny, -3 * tiny, 2.0**-f]]
    )
    want = [round(Fraction(float(v)) * 2**f) for v in x]
    got = enc.encode(x)
    assert got.dtype == np.uint64 and got.shape == (k * x.size,)
    assert _unsigned(got, k) == [w % 2 ** (64 * k) for w in want]
    assert want[-5:] == [0, 2, 0, -2, 1]
    np.testing.assert_array_equal(enc.encode(-x), ring_sub(np.zeros_like(got), got, k))
    np.testing.assert_array_equal(enc.decode(got), [float(Fraction(w, 2**f)) for w in want])
    assert np.max(np.abs(enc.decode(got) - x)) <= 2.0 ** -(f + 1)


def test_decode_rounds_the_exact_quotient_once_at_the_extremes():
    enc = RingFixedPoint(70, 1.0, 2)
    top = 2**127
    ints = [top - 1, -top, 3 * 2**60 + 1, -1, 2**53 + 1, (2**53 + 1) * 2**70 + 2**69]
    got = enc.decode(_words(ints, 2))
    np.testing.assert_array_equal(got, [float(Fraction(s, 2**70)) for s in ints])
    assert got[-1] == float(2**53 + 2)  # a tie at the float64 rounding: to even, without a double rounding


def _exact_error(ints: list[int], xs: list[np.ndarray], frac_bits: int) -> Fraction:
    """max over entries of |S / 2^f - sum_m x_m|, in exact rational arithmetic."""
    exact = [sum((Fraction(float(x[j])) for x in xs), Fraction(0)) for j in range(len(ints))]
    return max(abs(Fraction(s, 2**frac_bits) - e) for s, e in zip(ints, exact, strict=True))


def _ring_sum(enc: RingFixedPoint, xs: list[np.ndarray]) -> np.ndarray:
    total = np.zeros(enc.width(xs[0].size), dtype=np.uint64)
    for x in xs:
        total = ring_add(total, enc.encode(x), enc.words)
    return total


def test_sum_of_encodings_meets_the_stated_error_bound_at_the_documented_example():
    m, bound = 100, 2.0**20
    enc = RingFixedPoint.for_sites(bound, m, words=2)
    assert enc.frac_bits == 100 and f"{m * 2.0 ** -(enc.frac_bits + 1):.1e}" == "3.9e-29"  # the module docstring's
    rng = np.random.default_rng(2)
    xs = [rng.uniform(-bound, bound, 30) for _ in range(m)]
    xs = [np.where(np.arange(30) < 5, bound, np.where(np.arange(30) < 10, -bound, x)) for x in xs]  # +-M bound
    total = _ring_sum(enc, xs)
    assert _exact_error(enc.integers(total), xs, enc.frac_bits) <= Fraction(m, 2 ** (enc.frac_bits + 1))
    decoded = enc.decode(total)
    np.testing.assert_array_equal(decoded[:10], [m * bound] * 5 + [-m * bound] * 5)
    exact = np.array([math.fsum(float(x[j]) for x in xs) for j in range(30)])
    assert np.all(np.abs(decoded - exact) <= m * 2.0 ** -(enc.frac_bits + 1) + np.spacing(np.abs(exact)))


def test_a_wide_sum_is_exact_and_rounds_once():
    rng = np.random.default_rng(0)
    m, length = 7, 40
    rows = [rng.normal(size=length) * 10.0 ** rng.uniform(-20, 12, size=length) for _ in range(m)]
    enc = RingFixedPoint.for_sites(1e13, m, words=3)
    assert enc.frac_bits >= 96
    got = enc.decode(_ring_sum(enc, rows))
    step = Fraction(1, 2**enc.frac_bits)
    for g, r in zip(got, np.stack(rows, 1), strict=True):
        # the integer sum is the sum of the rounded inputs, rounded once to float64
        assert g == float(sum((Fraction(round(Fraction(float(v)) / step)) * step for v in r), Fraction(0)))


def test_for_sites_picks_the_most_precise_exact_encoding():
    for bound, m, k in [(1e3, 3, 1), (2.0**20, 100, 2), (1e-6, 8, 1), (0.75, 50, 3), (3e15, 1000, 1), (1e300, 4, 16)]:
        enc = RingFixedPoint.for_sites(bound, m, k)
        enc.check_sites(m)
        assert m * enc.max_encoded < 2 ** (64 * k - 1) == enc.limit
        assert enc.capacity() >= m
        if enc.frac_bits < 1000:
            with pytest.raises(ConfigError, match=f"use frac_bits <= {enc.frac_bits}$"):
                RingFixedPoint(enc.frac_bits + 1, bound, k).check_sites(m)
    assert RingFixedPoint.for_sites(1e3, np.int64(5)) == RingFixedPoint.for_sites(1e3, 5)
    for sites in (0, 2.0, True):
        with pytest.raises(ConfigError, match="number of sites must be a positive integer"):
            RingFixedPoint.for_sites(1.0, sites)
    with pytest.raises(ConfigError, match="bound must be a finite positive"):
        RingFixedPoint.for_sites(-1.0, 3)


@pytest.mark.parametrize(
    "frac_bits, bound, words, msg",
    [
        (-1, 1.0, 1, "frac_bits must be an integer"),
        (1.5, 1.0, 1, "frac_bits must be an integer"),
        (True, 1.0, 1, "frac_bits must be an integer"),
        (1001, 1.0, 16, "frac_bits must be an integer"),
        (10, 0.0, 1, "bound must be a finite positive"),
        (10, float("inf"), 1, "bound must be a finite positive"),
        (10, float("nan"), 1, "bound must be a finite positive"),
        (10, "1", 1, "bound must be a finite positive"),
        (10, 1.0, 0, "words must be an integer in"),
        (10, 1.0, 17, "words must be an integer in"),
        (10, 1.0, 2.0, "words must be an integer in"),
        (60, 8.0, 1, "bound 8 at 60 fractional bits fills 64 bits"),
        (1000, 1e300, 16, "fills 1024 bits"),
    ],
)
def test_bad_encodings_are_refused_in_one_line(frac_bits, bound, words, msg):
    with pytest.raises(ConfigError, match=msg) as err:
        RingFixedPoint(frac_bits, bound, words)
    assert "\n" not in str(err.value)


def test_range_condition_is_refused_at_setup_with_the_best_frac_bits():
    with pytest.raises(
        ConfigError,
        match=r"^fixed point: 100 sites with bound 1.04858e\+06 at 101 fractional bits can overflow 128 bits; "
        r"use frac_bits <= 100$",
    ):
        RingFixedPoint(101, 2.0**20, 2).check_sites(100)
    with pytest.raises(ConfigError, match="use frac_bits <= 100"):
        Federation(range(100)).server(10, RingFixedPoint(101, 2.0**20, 2))
    with pytest.raises(ConfigError, match="use more words"):
        RingFixedPoint(0, 2.0**61, 1).check_sites(4)
    with pytest.raises(ConfigError, match=r"overflow 64 bits even at 0 fractional bits"):
        RingFixedPoint.for_sites(2.0**62, 4, words=1)


def test_encode_refuses_values_beyond_the_bound_without_quoting_them():
    enc = RingFixedPoint(10, 5.0, 2)
    with pytest.raises(ValueError, match="2 input entries exceed the bound 5") as err:
        enc.encode(np.array([1.0, 5.5, -123.25, 5.0]))
    assert "123" not in str(err.value) and "5.5" not in str(err.value)
    with pytest.raises(ValueError, match="non-finite"):
        enc.encode(np.array([np.nan]))
    with pytest.raises(TypeError, match="uint64"):
        enc.decode(np.zeros(4, dtype=np.int64))
