"""Fixed-point numbers in the ring ``Z_{2^(64k)}``: the encoding and the arithmetic of the secure sum
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]).

An entry ``x`` with ``|x| <= bound`` becomes the integer ``a = round(x 2^f)`` (half to even) in two's
complement modulo ``2^(64k)``, written as ``k`` uint64 words, least significant first; a vector of
``L`` entries is ``k L`` words, word ``j`` of entry ``i`` at index ``j L + i``. The masks, the masked
inputs and their sum are elements of the same ring: [`ring_add`][fedhead.federation.ring_encoding.ring_add]
and [`ring_sub`][fedhead.federation.ring_encoding.ring_sub] carry between the words, so the ``k``
words of an entry are one ``64k``-bit integer. A mask of ``k L`` uniform words is a uniform ring
element, so a masked input is uniform whatever the input; after unmasking the server holds the ring
element ``S = sum_u a_u mod 2^(64k)`` and nothing else: two input sets with the same ``S`` give the
same words bit for bit (no count of negative inputs, no carries per site).

Why this ring and not a prime field: the PRG's output is uniform uint64 words as it comes (a field
``Z_p`` needs rejection sampling or a bias bound to draw uniform elements, and a reduction modulo
``p`` of multi-word numbers that numpy cannot vectorise without Python integers); two's complement
gives signed values for free; an addition is ``k`` vectorised passes over the entries (the carry out
of a word is ``(a + b) mod 2^64 < a``).

Range and error: sums stay exact while ``M round(bound 2^f) < 2^(64k-1)``
([`RingFixedPoint.for_sites`][fedhead.federation.ring_encoding.RingFixedPoint.for_sites] picks the largest
such ``f``); then ``S`` is the integer sum of the rounded inputs, each off by at most ``2^-(f+1)``,
and the decoder returns ``S / 2^f`` rounded once to float64: each entry is within ``M 2^-(f+1)`` of
the exact sum of the inputs, plus half an ulp of the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from fedhead.analysis.constraints import ConfigError

#: Largest ``frac_bits`` accepted (far beyond float64's 53 bits).
MAX_FRAC_BITS = 1000
#: Most uint64 words per entry (1024-bit integers).
MAX_WORDS = 16


def _rows(words: np.ndarray, k: int) -> np.ndarray:
    a = np.asarray(words)
    if a.dtype != np.uint64 or a.ndim != 1 or a.size % k:
        raise TypeError(f"ring: expected a flat uint64 vector of a multiple of {k} words, got {a.dtype} {a.shape}")
    return a.reshape(k, -1)


def _pair(a: np.ndarray, b: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = _rows(a, k), _rows(b, k)
    if x.shape != y.shape:
        raise ValueError(f"ring: vectors of {x.size} and {y.size} words do not add")
    return x, y


def ring_add(a: np.ndarray, b: np.ndarray, words: int) -> np.ndarray:
    """``a + b`` modulo ``2^(64 words)`` entry by entry, the carry of each word going into the next.

    ``a`` and ``b`` are flat uint64 vectors of ``words L`` words (word ``j`` of entry ``i`` at ``j L + i``).
    """
    x, y = _pair(a, b, words)
    out = np.empty_like(x)
    carry = np.zeros(x.shape[1], dtype=np.uint64)
    for j in range(words):
        s = x[j] + y[j]
        out[j] = s + carry
        carry = ((s < x[j]) | (out[j] < s)).astype(np.uint64)  # at most one of the two can happen
    return out.reshape(-1)


def ring_sub(a: np.ndarray, b: np.ndarray, words: int) -> np.ndarray:
    """``a - b`` modulo ``2^(64 words)`` entry by entry, the borrow of each word taken from the next
    (layout of [`ring_add`][fedhead.federation.ring_encoding.ring_add])."""
    x, y = _pair(a, b, words)
    out = np.empty_like(x)
    borrow = np.zeros(x.shape[1], dtype=np.uint64)
    for j in range(words):
        d = x[j] - y[j]
        out[j] = d - borrow
        borrow = ((x[j] < y[j]) | (d < borrow)).astype(np.uint64)  # at most one of the two can happen
    return out.reshape(-1)


@dataclass(frozen=True)
class RingFixedPoint:
    """Values ``|x| <= bound`` as ``round(x 2^frac_bits)`` in ``Z_{2^(64 words)}``, ``words`` uint64 each.

    Parameters
    ----------
    frac_bits : int
        Fractional bits ``f`` in ``[0, 1000]``; the step is ``2^-f``.
    bound : float
        Largest magnitude an input entry may have (finite, positive).
    words : int
        ``k`` in ``[1, 16]`` (default 3: 192-bit integers).
    """

    frac_bits: int
    bound: float
    words: int = 3

    def __post_init__(self) -> None:
        k, f = self.words, self.frac_bits
        if not _is_int(k) or not 1 <= k <= MAX_WORDS:
            raise ConfigError(f"fixed point: words must be an integer in [1, {MAX_WORDS}], got {k!r}")
        if not _is_int(f) or not 0 <= f <= MAX_FRAC_BITS:
            raise ConfigError(f"fixed point: frac_bits must be an integer in [0, {MAX_FRAC_BITS}], got {f!r}")
        if not _finite_positive(self.bound):
            raise ConfigError(f"fixed point: bound must be a finite positive number, got {self.bound!r}")
        if self.max_encoded >= self.limit:
            raise ConfigError(f"fixed point: bound {self.bound:g} at {f} fractional bits fills {64 * k} bits")

    @property
    def limit(self) -> int:
        """``2^(64k - 1)``: every sum must stay below it in magnitude."""
        return 2 ** (64 * int(self.words) - 1)

    @property
    def max_encoded(self) -> int:
        """The largest integer magnitude an input encodes to, ``round(bound 2^f)``."""
        return _encoded_bound(float(self.bound), int(self.frac_bits))

    def capacity(self) -> int:
        """How many encodings can be summed exactly: the largest ``M`` with ``M round(bound 2^f) < 2^(64k-1)``."""
        return (self.limit - 1) // max(self.max_encoded, 1)

    def check_sites(self, sites: int) -> None:
        """Raise [`ConfigError`][fedhead.analysis.constraints.ConfigError] unless sums of ``sites`` inputs
        stay exact."""
        if sites > self.capacity():
            best = _largest_frac_bits(float(self.bound), int(sites), self.limit)
            hint = "more words" if best is None else f"frac_bits <= {best}"
            raise ConfigError(
                f"fixed point: {sites} sites with bound {self.bound:g} at {self.frac_bits} fractional bits can "
                f"overflow {64 * self.words} bits; use {hint}"
            )

    @classmethod
    def for_sites(cls, bound: float, sites: int, words: int = 3) -> RingFixedPoint:
        """The most precise ``words``-word encoding whose sums over ``sites`` inputs of magnitude at most ``bound``
        stay exact: the largest ``f`` with ``sites round(bound 2^f) < 2^(64k-1)``. Each entry of a decoded sum is
        then within ``sites 2^-(f+1)`` of the exact sum, plus half an ulp of the float64 result."""
        if not _is_int(sites) or sites < 1:
            raise ConfigError(f"fixed point: the number of sites must be a positive integer, got {sites!r}")
        if not _finite_positive(bound):
            raise ConfigError(f"fixed point: bound must be a finite positive number, got {bound!r}")
        limit = cls(0, 1.0, words).limit  # checks words
        f = _largest_frac_bits(float(bound), int(sites), limit)
        if f is None:
            raise ConfigError(
                f"fixed point: {sites} sites with bound {float(bound):g} overflow {64 * words} bits even at 0 "
                "fractional bits"
            )
        return cls(f, float(bound), int(words))

    def width(self, length: int) -> int:
        """uint64 words of the encoding of ``length`` values (``k`` each)."""
        return int(self.words) * int(length)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """``round(x 2^f)`` (half to even) in two's complement, uint64 ``(k L,)``; refuses NaN/inf and ``|x| > bound``.

        ``x 2^f``, its rounding and every step below are exact in float64: the magnitude is cut into
        64-bit words by ``fmod`` (exact), each word into two 32-bit halves; negative entries are then
        negated in the ring.
        """
        x = np.asarray(values, dtype=np.float64).ravel()
        if not np.all(np.isfinite(x)):
            raise ValueError("fixed point: the input has non-finite entries (NaN/inf)")
        if x.size and float(np.max(np.abs(x))) > self.bound:
            bad = int(np.count_nonzero(np.abs(x) > self.bound))
            raise ValueError(f"fixed point: {bad} input entries exceed the bound {self.bound:g}")
        y = np.rint(np.ldexp(x, int(self.frac_bits)))
        magnitude = np.abs(y)
        words = np.empty((int(self.words), x.size), dtype=np.uint64)
        for j in range(int(self.words)):
            r = np.fmod(magnitude, 2.0**64)
            low = np.fmod(r, 2.0**32)
            words[j] = (((r - low) * 2.0**-32).astype(np.uint64) << np.uint64(32)) | low.astype(np.uint64)
            magnitude = (magnitude - r) * 2.0**-64
        flat = words.reshape(-1)
        negated = ring_sub(np.zeros_like(flat), flat, int(self.words))
        return np.where(np.tile(y < 0, int(self.words)), negated, flat)

    def integers(self, total: np.ndarray) -> list[int]:
        """The entries of a ring vector (uint64 ``(k L,)``) as signed integers in ``[-2^(64k-1), 2^(64k-1))``."""
        rows = _rows(total, int(self.words))
        raw, n = np.ascontiguousarray(rows.T).astype("<u8").tobytes(), 8 * int(self.words)
        return [int.from_bytes(raw[i : i + n], "little", signed=True) for i in range(0, len(raw), n)]

    def decode(self, total: np.ndarray) -> np.ndarray:
        """A ring vector (uint64 ``(k L,)``, e.g. a sum of encodings) back to float64 ``(L,)``: each signed
        integer ``S`` ([`integers`][fedhead.federation.ring_encoding.RingFixedPoint.integers]) over ``2^f``,
        rounded once (Python's ``int / int`` is correctly rounded)."""
        scale = 1 << int(self.frac_bits)
        return np.array([s / scale for s in self.integers(total)], dtype=np.float64)


def _encoded_bound(bound: float, frac_bits: int) -> int:
    """``round(bound 2^f)`` (half to even) as an exact integer."""
    return round(Fraction(bound) * 2**frac_bits)


def _largest_frac_bits(bound: float, sites: int, limit: int) -> int | None:
    """The largest ``f <= MAX_FRAC_BITS`` with ``sites round(bound 2^f) < limit`` (None: not even ``f = 0``)."""
    fits = lambda f: sites * _encoded_bound(bound, f) < limit  # noqa: E731
    f = min(max(math.floor(math.log2(limit) - math.log2(sites) - math.log2(bound)), 0), MAX_FRAC_BITS)
    while f > 0 and not fits(f):
        f -= 1
    while f < MAX_FRAC_BITS and fits(f + 1):
        f += 1
    return f if fits(f) else None


def _is_int(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | np.integer)


def _finite_positive(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return math.isfinite(float(value)) and float(value) > 0
