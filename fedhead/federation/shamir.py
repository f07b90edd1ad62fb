"""Shamir secret sharing over the prime field ``GF(p)``, ``p = 2^521 - 1``, for the secure sum's key shares.

A secret of ``l`` bytes is cut into ``ceil(l / 64)`` chunks of at most 64 bytes, each read as a
big-endian integer ``m < 2^512 < p``. Each chunk gets its own polynomial ``f(x) = m + a_1 x + ... +
a_{t-1} x^{t-1}`` with uniform coefficients ``a_j`` in ``[0, p)`` (``secrets.randbelow``); share ``i``
(``1 <= i <= n``) holds ``f(i)`` of every chunk. Any ``t`` shares with indices ``x_1..x_t`` give back
each chunk as ``m = f(0) = sum_i lambda_i f(x_i) mod p``, the Lagrange coefficients at zero
``lambda_i = prod_{j != i} x_j / (x_j - x_i) mod p``. They depend on the indices alone, so a
[`Combiner`][fedhead.federation.shamir.Combiner] computes them once per set of indices and every
secret shared among the same sites costs one dot product of length ``t`` per chunk. ``t - 1``
shares say nothing of ``m``: for any other secret ``m'`` exactly one polynomial of degree at most
``t - 1`` through ``(0, m')`` and the ``t - 1`` points exists, so every secret explains the shares
equally well.

A share is bytes: a header of three big-endian uint16 (the index ``i``, the threshold ``t``, the
secret's length ``l``), then one 66-byte big-endian field element per chunk. A 32-byte seed or a
48-byte P-384 private scalar is one chunk: a 72-byte share.

Why not flwr's ``create_shares`` / ``combine_shares``: they share each 16-byte chunk (after
PKCS#7 padding) in ``GF(2^128)`` with pycryptodome's pure-Python ``Shamir``, which recomputes
the interpolation for every chunk and every secret. The secure sum's server combines one secret
per site (a survivor's seed, a dropped site's key) with one set of ``t`` helpers, and each site
splits two secrets into ``M`` shares; with flwr's primitive this dominated the whole sum from
``M = 16`` on. Both are compared, in the same run, by ``benchmarks/bench_secure_sum_scale.py``
(``--shamir both``).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from functools import lru_cache

#: The field's modulus, the Mersenne prime ``2^521 - 1``.
PRIME = 2**521 - 1
#: Bytes of a secret per field element (``2^512 < p``).
CHUNK = 64
#: Bytes of one field element in a share.
ELEMENT = 66
#: Bytes of a share's header (index, threshold, secret length, each a big-endian uint16).
HEADER = 6
#: Largest number of shares, threshold and secret length (the header's uint16).
LIMIT = 2**16 - 1


def share_size(length: int) -> int:
    """Bytes of one share of a ``length``-byte secret: ``6 + 66 ceil(length / 64)``."""
    return HEADER + ELEMENT * -(-length // CHUNK)


def evaluate(coefficients: Sequence[int], x: int) -> int:
    """``f(x) mod p`` for ``f(x) = sum_j coefficients[j] x^j`` (Horner), the evaluation that
    [`split`][fedhead.federation.shamir.split] uses."""
    y = 0
    for a in reversed(coefficients):
        y = (y * x + a) % PRIME
    return y


def split(secret: bytes, threshold: int, n: int) -> list[bytes]:
    """The ``n`` shares of ``secret``, any ``threshold`` of which rebuild it.

    Parameters
    ----------
    secret : bytes
        1 to 65535 bytes.
    threshold : int
        ``t``, ``1 <= t <= n``.
    n : int
        Number of shares, at most 65535.

    Returns
    -------
    list of bytes, length n
        Share ``i`` (index ``i + 1``) is ``share_size(len(secret))`` bytes.
    """
    if not isinstance(secret, bytes) or not 1 <= len(secret) <= LIMIT:
        raise ValueError(f"shamir: the secret must be 1 to {LIMIT} bytes")
    if not 1 <= n <= LIMIT or not 1 <= threshold <= n:
        raise ValueError(f"shamir: need 1 <= threshold <= n <= {LIMIT}, got threshold {threshold}, n {n}")
    chunks = [int.from_bytes(secret[i : i + CHUNK], "big") for i in range(0, len(secret), CHUNK)]
    polynomials = [[m, *(secrets.randbelow(PRIME) for _ in range(threshold - 1))] for m in chunks]
    shares = []
    for x in range(1, n + 1):
        head = b"".join(v.to_bytes(2, "big") for v in (x, threshold, len(secret)))
        shares.append(head + b"".join(evaluate(f, x).to_bytes(ELEMENT, "big") for f in polynomials))
    return shares


def parse(share: object) -> tuple[int, int, int, list[int]]:
    """``(index, threshold, length, values)`` of a share; ``ValueError`` unless it is a well-formed share
    (index and threshold at least 1, the size its length implies, every value below ``p``)."""
    if not isinstance(share, bytes) or len(share) < HEADER:
        raise ValueError("shamir: a share must be bytes with a 6-byte header")
    index, threshold, length = (int.from_bytes(share[i : i + 2], "big") for i in range(0, HEADER, 2))
    if index < 1 or threshold < 1 or length < 1 or len(share) != share_size(length):
        raise ValueError("shamir: a share's header does not match its size (or names index, threshold or length 0)")
    values = [int.from_bytes(share[i : i + ELEMENT], "big") for i in range(HEADER, len(share), ELEMENT)]
    if any(v >= PRIME for v in values):
        raise ValueError("shamir: a share holds a value outside the field")
    return index, threshold, length, values


def is_share(share: object, index: int | None = None) -> bool:
    """Whether ``share`` is a well-formed share ([`parse`][fedhead.federation.shamir.parse]), of ``index`` if given."""
    try:
        found = parse(share)[0]
    except ValueError:
        return False
    return index is None or found == index


@lru_cache(maxsize=64)
def lagrange_at_zero(indices: tuple[int, ...]) -> tuple[int, ...]:
    """``lambda_i = prod_{j != i} x_j / (x_j - x_i) mod p`` for the distinct nonzero ``indices`` ``x_i``
    (cached: one computation per set of helpers)."""
    if not indices or len(set(indices)) != len(indices) or not all(0 < x < PRIME for x in indices):
        raise ValueError(f"shamir: the indices must be distinct and nonzero, got {list(indices)}")
    coefficients = []
    for i, xi in enumerate(indices):
        num = den = 1
        for j, xj in enumerate(indices):
            if j != i:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        coefficients.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(coefficients)


class Combiner:
    """Rebuilds secrets from the shares of one fixed set of indices (the Lagrange coefficients once).

    Parameters
    ----------
    indices : sequence of int
        The distinct share indices ``x_1..x_t`` of every combine, in the order the shares will come.
    """

    def __init__(self, indices: Sequence[int]):
        self.indices = tuple(int(x) for x in indices)
        self.coefficients = lagrange_at_zero(self.indices)

    def combine(self, shares: Sequence[bytes]) -> bytes:
        """The secret of ``shares`` (one per index, in order): each chunk ``sum_i lambda_i y_i mod p``.

        ``ValueError`` when a share is malformed, the shares' indices are not this combiner's, they
        disagree on threshold or length, there are fewer than the threshold, or a rebuilt chunk does not
        fit its bytes. An error ``e`` in share ``i`` moves each chunk by ``lambda_i e``: a random wrong
        value is caught but a small error may not be, so callers that must catch every wrong share check
        the secret against a commitment.
        """
        return self._rebuild([parse(s) for s in shares])

    def _rebuild(self, parsed: Sequence[tuple[int, int, int, list[int]]]) -> bytes:
        if tuple(p[0] for p in parsed) != self.indices:
            raise ValueError(f"shamir: the shares' indices are not the combiner's {list(self.indices)}")
        if len({p[1:3] for p in parsed}) != 1:
            raise ValueError("shamir: the shares disagree on the threshold or the secret's length")
        _, threshold, length, _ = parsed[0]
        if len(parsed) < threshold:
            raise ValueError(f"shamir: {len(parsed)} shares, the threshold is {threshold}")
        columns = zip(*(p[3] for p in parsed), strict=True)
        chunks = [sum(c * y for c, y in zip(self.coefficients, col, strict=True)) % PRIME for col in columns]
        sizes = [min(CHUNK, length - i) for i in range(0, length, CHUNK)]
        try:
            return b"".join(m.to_bytes(size, "big") for m, size in zip(chunks, sizes, strict=True))
        except OverflowError:
            raise ValueError("shamir: the shares do not rebuild a secret of their length (a wrong share)") from None


def combine(shares: Sequence[bytes]) -> bytes:
    """The secret of ``shares`` (at least the threshold, distinct indices, any order), through a
    [`Combiner`][fedhead.federation.shamir.Combiner] on their indices; ``ValueError`` as there."""
    parsed = [parse(s) for s in shares]
    if not parsed:
        raise ValueError("shamir: no shares to combine")
    return Combiner([p[0] for p in parsed])._rebuild(parsed)
