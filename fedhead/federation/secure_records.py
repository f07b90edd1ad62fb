"""What the secure sums of ``privacy.mode=secure`` carry: the vector each site sums (its layout,
one function per sum) and the records of the five stages
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]).

Both ends import this module (the ClientApp builds the vectors, the strategy reads the sums), so a
layout is written once. Every vector is a site's count-weighted statistic, ``N_m v_m``, so that the sum
over the sites divided by its count entry is the pooled value. Stage payloads travel as JSON in one
``bytes`` entry (node ids are 64-bit), the masked input as a uint64 array of ``k L`` words.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedhead.federation.ring_encoding import RingFixedPoint
from fedhead.federation.secure_sum import KeyShares, PublicKeys, RevealedShares, SecureSumError, Unmasking

if TYPE_CHECKING:
    from flwr.app import ConfigRecord

# record and config names
SECURE = "secure"  # ConfigRecord (payload) and ArrayRecord (masked input) of a stage
PAYLOAD = "payload"
MASKED = "masked"
SUM_ID = "secure-sum"  # config: the sum a message belongs to (its first message starts the site's part)
STAGE_SECURE = "secure-sum"  # config stage of the three later steps (query messages)
STAGE_REGIME = "regime"  # config stage: a site-local table's own margin, once the pooled standardisation is known
STEP = "secure-step"
SHARE_KEYS, MASK, SIGN, REVEAL = "share-keys", "mask", "sign", "reveal"
#: The step that moves a site's input out of a sum it signed with its masked input (a peer dropped) into a
#: fresh sum, whose id is its payload; the reply is the site's keys for that sum.
RESUM = "resum"
#: config of a mask request: sign the full list with the masked input (stages 3 and 4 in one message).
SIGN_NOW = "secure-sign-now"
SIGNED = "secure-signed"  # ConfigRecord (payload) of the signature that comes with a masked input
#: config: the run's next sum, set up within this one's messages (its keys come with a masked input, its key
#: shares with the reveal, or with the survivor-list signature of a sum that has that step), so that its phase
#: message carries its mask request at once.
NEXT_SUM = "secure-next-sum"
NEXT = "secure-next"  # ConfigRecord (payload) of the next sum's keys, key book or key shares
LOCAL_OPTIMUM = "at-local-optimum"  # train reply metric (secure mode): 1 when the site reached its optimum
FULLY_ACTIVE = "fully-active"  # exchange reply metric (secure mode): 1 when the site's own margin is positive
TARGETS, FEATURES = "targets", "features"  # exchange reply metrics (secure mode): C, and F of a site-local table

#: Fractional bits every secure sum keeps (the encoding adds words for the range): each entry of a sum
#: is within ``M 2^-97`` of the exact sum, far below float64's rounding of values above ``2^-44``.
FRAC_BITS = 96
#: The largest count a site may report (2^53: exact in float64) times this bounds every weighted entry.
COUNT_BOUND = 2.0**53
#: The largest raw mean or standard deviation a statistics reply may carry: pooling squares
#: ``N_m (sigma^2 + mu^2)`` of larger values can overflow float64.
RAW_LIMIT = 1e100


def encoding_for(bound: float, sites: int) -> RingFixedPoint:
    """The encoding of a sum over ``sites`` vectors with entries at most ``bound``: as many 64-bit
    words as ``M bound 2^FRAC_BITS`` needs, the most fractional bits that fit (at least ``FRAC_BITS``)."""
    bits = math.log2(max(int(sites), 1) * float(bound)) + FRAC_BITS + 2
    return RingFixedPoint.for_sites(float(bound), int(sites), words=max(1, math.ceil(bits / 64)))


def check_encoding(requested: RingFixedPoint, bound: float, sites: int) -> RingFixedPoint:
    """The encoding a site masks with: [`encoding_for`][fedhead.federation.secure_records.encoding_for] of
    its vector's public ``bound`` and the ``sites`` of the key book it checked, when the server's mask request
    names exactly that one; else ``SecureSumError`` (one line, nothing of the site's values). A server that
    chose the encoding could ask, sum after sum, whether a site's entries exceed a bound of its choice, or
    make each site round to a step of its choice."""
    own = encoding_for(bound, sites)
    if requested != own:
        raise SecureSumError(
            f"secure sum: the mask request's encoding ({_ring(requested)}) is not this sum's encoding for "
            f"{sites} sites ({_ring(own)}); refused"
        )
    return own


def _ring(encoding: RingFixedPoint) -> str:
    return f"{encoding.frac_bits} fractional bits, bound {encoding.bound:g}, {encoding.words} words"


# ------------------------------------------------------------------------------------ bounds
# The public bound of each layout's entries, from run constants alone (never from a site's values): the
# server encodes each sum for it and every site checks that it did
# ([`check_encoding`][fedhead.federation.secure_records.check_encoding]).
def moment_bound(max_abs: float) -> float:
    """Entries of a [`moment_vector`][fedhead.federation.secure_records.moment_vector] whose means and standard
    deviations are at most ``max_abs`` (``trust.max_abs``): ``COUNT_BOUND max(1, max_abs)^2``."""
    return COUNT_BOUND * max(1.0, float(max_abs)) ** 2


def statistics_bound() -> float:
    """Entries of a [`statistics_vector`][fedhead.federation.secure_records.statistics_vector] of raw values at
    most ``RAW_LIMIT``."""
    return moment_bound(RAW_LIMIT)


def head_bound(max_abs: float) -> float:
    """Entries of a [`head_vector`][fedhead.federation.secure_records.head_vector] of a head within ``max_abs``."""
    return COUNT_BOUND * float(max_abs)


#: Entries of an [`mse_vector`][fedhead.federation.secure_records.mse_vector].
MSE_BOUND = COUNT_BOUND


# ------------------------------------------------------------------------------------ layouts
@dataclass(frozen=True)
class PooledMoments:
    """Pooled first and second moments of ``C`` targets from a sum of
    [`moment_vector`][fedhead.federation.secure_records.moment_vector]s.

    Attributes
    ----------
    count : float
        ``N = sum_m N_m``.
    mean : ndarray (C,)
        ``mu = sum_m N_m mu_m / N``.
    within : ndarray (C, C)
        ``Sigma_within = sum_m N_m Sigma_m / N``.
    cov : ndarray (C, C)
        ``Sigma_cen = Sigma_within + sum_m N_m mu_m mu_m^T / N - mu mu^T``.
    """

    count: float
    mean: np.ndarray
    within: np.ndarray
    cov: np.ndarray


def moment_vector(count: float, mean: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """``N_m [1, mu_m, vec Sigma_m, vec mu_m mu_m^T]``, shape ``(1 + C + 2 C^2,)``."""
    mu = np.asarray(mean, dtype=np.float64).ravel()
    sigma = np.asarray(cov, dtype=np.float64)
    return float(count) * np.concatenate([[1.0], mu, sigma.ravel(), np.outer(mu, mu).ravel()])


def moment_length(dim: int) -> int:
    """Entries of a [`moment_vector`][fedhead.federation.secure_records.moment_vector] of ``C = dim`` targets."""
    return 1 + dim + 2 * dim * dim


def read_moments(total: np.ndarray, dim: int) -> PooledMoments:
    """The pooled moments of a summed [`moment_vector`][fedhead.federation.secure_records.moment_vector]
    (``C = dim``)."""
    t = np.asarray(total, dtype=np.float64)
    n = float(t[0])
    mean = t[1 : 1 + dim] / n
    within = t[1 + dim : 1 + dim + dim * dim].reshape(dim, dim) / n
    second = t[1 + dim + dim * dim :].reshape(dim, dim) / n
    within = 0.5 * (within + within.T)
    cov = within + second - np.outer(mean, mean)
    return PooledMoments(n, mean, within, 0.5 * (cov + cov.T))


def nearest_psd(a: np.ndarray) -> np.ndarray:
    """The nearest PSD matrix (Frobenius) of a symmetric ``(C, C)``: its negative eigenvalues set to 0
    (a noised covariance under differential privacy may have some)."""
    w, v = np.linalg.eigh(0.5 * (a + a.T))
    out = (v * np.maximum(w, 0.0)) @ v.T
    return 0.5 * (out + out.T)


def statistics_vector(count: float, mean: np.ndarray, cov: np.ndarray, x_mean: np.ndarray, x_var: np.ndarray):
    """A site-local table's raw statistics: the moment vector of its targets, then
    ``N_m [x_mean, x_var + x_mean^2]`` of its ``F`` inputs; shape ``(1 + C + 2 C^2 + 2 F,)``."""
    xm = np.asarray(x_mean, dtype=np.float64).ravel()
    xv = np.asarray(x_var, dtype=np.float64).ravel()
    return np.concatenate([moment_vector(count, mean, cov), float(count) * xm, float(count) * (xv + xm * xm)])


def read_statistics(total: np.ndarray, dim: int, features: int) -> tuple[PooledMoments, np.ndarray, np.ndarray]:
    """Pooled target moments and the pooled input means and variances ``(F,)`` of a summed
    [`statistics_vector`][fedhead.federation.secure_records.statistics_vector]."""
    t = np.asarray(total, dtype=np.float64)
    k = moment_length(dim)
    pooled = read_moments(t[:k], dim)
    x_mean = t[k : k + features] / pooled.count
    x_var = np.maximum(t[k + features : k + 2 * features] / pooled.count - x_mean * x_mean, 0.0)
    return pooled, x_mean, x_var


def head_vector(count: float, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``N_m [vec W_m, b_m, 1]``, shape ``(C P + C + 1,)``."""
    w = np.asarray(weight, dtype=np.float64).ravel()
    b = np.asarray(bias, dtype=np.float64).ravel()
    return float(count) * np.concatenate([w, b, [1.0]])


def read_head(total: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, float]:
    """``(sum_m N_m W_m / N, sum_m N_m b_m / N, N)`` of a summed
    [`head_vector`][fedhead.federation.secure_records.head_vector]."""
    c, p = shape
    t = np.asarray(total, dtype=np.float64)
    n = float(t[-1])
    return t[: c * p].reshape(c, p) / n, t[c * p : c * p + c] / n, n


def mse_vector(train_mse: float, train_count: int, test_mse: float | None, test_count: int) -> np.ndarray:
    """``[N_m MSE_m, N_m, T_m MSE_test_m, T_m]`` (test entries 0 without test rows)."""
    has_test = test_mse is not None and test_count > 0
    t_n = float(test_count) if has_test else 0.0
    return np.array([train_count * float(train_mse), float(train_count), t_n * float(test_mse or 0.0), t_n])


#: Entries of an [`mse_vector`][fedhead.federation.secure_records.mse_vector].
MSE_LENGTH = 4


def read_mse(total: np.ndarray) -> tuple[float, float | None]:
    """Pooled train MSE and test MSE (None when no site had test rows) of a summed
    [`mse_vector`][fedhead.federation.secure_records.mse_vector]."""
    t = np.asarray(total, dtype=np.float64)
    return float(t[0] / t[1]), (float(t[2] / t[3]) if t[3] > 0.5 else None)


# ------------------------------------------------------------------------------------ payloads
def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("expected base64 text")
    return base64.b64decode(text.encode("ascii"), validate=True)


def _sites(mapping: object) -> dict[int, Any]:
    if not isinstance(mapping, dict):
        raise ValueError("expected a mapping of sites")
    return {int(k): v for k, v in mapping.items()}


def pack(obj: PublicKeys | KeyShares | RevealedShares | Unmasking | Mapping[int, Any] | dict[str, Any]) -> bytes:
    """A stage's payload as JSON bytes (``bytes`` as base64, site ids as decimal keys)."""
    if isinstance(obj, PublicKeys):
        data: Any = _entry(obj)
    elif isinstance(obj, KeyShares):
        data = {"ciphertexts": {str(s): _b64(c) for s, c in obj.ciphertexts.items()}, "digest": _b64(obj.seed_digest)}
    elif isinstance(obj, RevealedShares):
        data = {
            "seed_shares": {str(s): _b64(v) for s, v in obj.seed_shares.items()},
            "key_shares": {str(s): _b64(v) for s, v in obj.key_shares.items()},
        }
    elif isinstance(obj, Unmasking):
        data = {
            "survivors": list(obj.survivors),
            "dropped": list(obj.dropped),
            "signatures": {str(s): _b64(v) for s, v in obj.signatures.items()},
        }
    else:
        data = obj
    return json.dumps(data).encode()


def _entry(keys: PublicKeys) -> dict[str, str]:
    return {
        "encryption": _b64(keys.encryption),
        "mask": _b64(keys.mask),
        "name": keys.name,
        "signature": _b64(keys.signature),
    }


def _keys(d: Any) -> PublicKeys:
    if not isinstance(d, dict) or not isinstance(d.get("name"), str):
        raise ValueError("a key-book entry must be an object with a name")
    return PublicKeys(_unb64(d["encryption"]), _unb64(d["mask"]), d["name"], _unb64(d["signature"]))


def unpack_keys(blob: bytes) -> PublicKeys:
    """A site's signed advertisement; ``ValueError`` when malformed."""
    return _keys(_load(blob))


def pack_signature(signature: bytes) -> bytes:
    """A site's signature of the survivor list (stage 4's reply)."""
    return json.dumps({"signature": _b64(signature)}).encode()


def unpack_signature(blob: bytes) -> bytes:
    """The signature of [`pack_signature`][fedhead.federation.secure_records.pack_signature]."""
    return _unb64(_load(blob)["signature"])


def unpack_shares(blob: bytes) -> KeyShares:
    """A site's encrypted key shares; ``ValueError`` when malformed."""
    d = _load(blob)
    return KeyShares({s: _unb64(c) for s, c in _sites(d["ciphertexts"]).items()}, _unb64(d["digest"]))


def unpack_revealed(blob: bytes) -> RevealedShares:
    """A site's unmasking shares; ``ValueError`` when malformed."""
    d = _load(blob)
    return RevealedShares(
        {s: _unb64(v) for s, v in _sites(d["seed_shares"]).items()},
        {s: _unb64(v) for s, v in _sites(d["key_shares"]).items()},
    )


def unpack_unmasking(blob: bytes) -> Unmasking:
    """The server's survivor list (stage 4, to sign) or unmasking request (stage 5, with the signatures)."""
    d = _load(blob)
    signatures = {s: _unb64(v) for s, v in _sites(d["signatures"]).items()}
    return Unmasking(tuple(int(s) for s in d["survivors"]), tuple(int(s) for s in d["dropped"]), signatures)


def pack_book(book: Mapping[int, PublicKeys], threshold: int) -> bytes:
    """The key book of stage 2 and the threshold."""
    keys = {str(s): _entry(k) for s, k in book.items()}
    return json.dumps({"book": keys, "threshold": int(threshold)}).encode()


def unpack_book(blob: bytes) -> tuple[dict[int, PublicKeys], int]:
    """``(key book, threshold)`` of [`pack_book`][fedhead.federation.secure_records.pack_book]."""
    d = _load(blob)
    book = {s: _keys(k) for s, k in _sites(d["book"]).items()}
    return book, int(d["threshold"])


def pack_mask_request(ciphertexts: Mapping[int, bytes], encoding: RingFixedPoint) -> bytes:
    """Stage 3's request: the ciphertexts addressed to a site and the encoding of the sum."""
    data = {
        "ciphertexts": {str(s): _b64(c) for s, c in ciphertexts.items()},
        "ring": [int(encoding.frac_bits), float(encoding.bound), int(encoding.words)],
    }
    return json.dumps(data).encode()


def unpack_mask_request(blob: bytes) -> tuple[dict[int, bytes], RingFixedPoint]:
    """``(ciphertexts, encoding)`` of [`pack_mask_request`][fedhead.federation.secure_records.pack_mask_request]."""
    d = _load(blob)
    f, bound, words = d["ring"]
    return {s: _unb64(c) for s, c in _sites(d["ciphertexts"]).items()}, RingFixedPoint(int(f), float(bound), int(words))


def _load(blob: object) -> dict[str, Any]:
    if not isinstance(blob, bytes):
        raise ValueError("the payload must be bytes")
    data = json.loads(blob)
    if not isinstance(data, dict):
        raise ValueError("the payload must be a JSON object")
    return data


def payload_of(record: ConfigRecord | None) -> bytes:
    """The ``payload`` bytes of a stage's config record; ``ValueError`` when it has none."""
    value = None if record is None else record.get(PAYLOAD)
    if not isinstance(value, bytes):
        raise ValueError(f"the '{SECURE}' record lacks its '{PAYLOAD}' bytes")
    return value


def flat(values: Sequence[np.ndarray]) -> np.ndarray:
    """Arrays concatenated into one float64 vector."""
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values])
