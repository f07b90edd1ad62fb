"""Row-level differential privacy of the one-time moment exchange: the unit is one row of one site.

Pure: numpy, Python integers and flwr's RDP accountant (a wrapper of Google's ``dp-accounting``). No
torch, no messages.

**Clip.** Each site clips every row of its targets, in public standardised units (a centre and a scale
per target declared before any row is seen), to the L2 norm ``C``, a public constant:
``clip(y) = y min(1, C / ||y||)`` ([`clip_rows`][fedhead.federation.row_privacy.clip_rows]).

**Release.** Site ``m`` releases its sufficient statistics
([`row_statistics`][fedhead.federation.row_privacy.row_statistics]), summed over the sites by the
secure sum (``S_m = sum_i clip(y_i)``)::

    s_m = [ N_m,  S_m,  svec(sum_i clip(y_i) clip(y_i)^T),  svec(S_m S_m^T / N_m) ]    (1 + d + d (d + 1) entries)

``svec`` is the upper triangle with the off-diagonal entries times ``sqrt(2)``, so ``||svec(A)||_2 =
||A||_F``. Adding or removing one row ``y`` changes the first three blocks by at most ``1``, ``C`` and
``||y y^T||_F = ||y||^2 <= C^2`` in L2 (Dwork, Talwar, Thakurta and Zhang 2014, "Analyze Gauss": the
second moments of rows of bounded norm released with Gaussian noise). The fourth, the site's between-
means term (what the pooled within-site covariance ``Sigma_within`` needs), changes by
``y y^T - N_m / (N_m + 1) (y - mu_m)(y - mu_m)^T``: a difference of two PSD matrices of Frobenius norms
``<= C^2`` and ``<= 4 C^2`` (``||mu_m|| <= C``), so by at most ``sqrt(17) C^2`` (``||A - B||_F^2 <=
||A||_F^2 + ||B||_F^2`` for PSD ``A, B``).

**One Gaussian mechanism.** Block ``k`` (sensitivity ``D_k``) is scaled by ``w_k / D_k`` with
``sum_k w_k^2 = 1`` (``w_k^2``: ``BLOCK_SHARES``), so the scaled concatenation has L2 sensitivity 1,
and Gaussian noise of standard deviation ``z`` on it is the Gaussian mechanism of noise multiplier
``z`` (zero-concentrated DP ``rho = 1 / (2 z^2)``, of which block ``k`` spends ``w_k^2 rho``). In the
statistics' own units block ``k``'s entries carry noise of standard deviation ``z D_k / w_k``
([`noise_scales`][fedhead.federation.row_privacy.noise_scales]). The count and the sums take 5 % of
``rho`` each: with the pooled mean near 0 in standardised units, the covariance's error comes from the
second moments, which take 88 %; the between-means term (only ``Sigma_within`` reads it) the last 4 %.

**Noise in shares on the secure sum's grid.** Each site rounds its statistics to the grid ``2^-g``
(``g = GRID_BITS``, at most the ring's fractional bits, so a grid value is encoded exactly by
[`fedhead.federation.ring_encoding`][fedhead.federation.ring_encoding]) and adds, per entry, ``2^-g``
times a discrete Gaussian of variance ``(z D_k / w_k)^2 2^(2g) / m_min``
([`site_share`][fedhead.federation.row_privacy.site_share],
[`fedhead.federation.discrete_gaussian`][fedhead.federation.discrete_gaussian]). Any ``m >= m_min``
honest sites' noise then sums to at least the full variance; a single site's share hides nothing on
its own. The discrete Gaussian is as private as the continuous one of the same variance for the same
L2 sensitivity (Canonne, Kamath and Steinke 2020), and the Renyi divergence of the sum of the shares
exceeds that one's by at most ``tau L`` at every order (Kairouz, Liu and Steinke 2021,
[`fedhead.federation.discrete_gaussian`][fedhead.federation.discrete_gaussian]; ``L`` entries), so the
epsilon of the accountant's Gaussian mechanism grows by at most ``tau L``, which
[`site_share`][fedhead.federation.row_privacy.site_share] refuses above ``MAX_SUM_GAP``. Rounding moves
each entry by at most ``2^-(g+1)``, so the sensitivity of the rounded statistics grows by at most
``||2^-g / scale||_2`` over the entries: the sites draw noise of multiplier ``z (1 + that)``
([`drawn_noise`][fedhead.federation.row_privacy.drawn_noise]), so the release is accounted at exactly ``z``
(``privacy.dp_noise``), whatever the targets' number.

**Standardisation.** The clip's units are public: the targets' units as the site holds them (a built-in
data set's standardisation is part of the data set's definition; none is derived from this release, and
a site-local table, whose standardisation the server derives from the pooled private statistics, is
refused with the row unit). The pooled mean, covariance, ``Sigma_within`` and ``G_cen`` follow from the
released statistics alone (post-processing: no further epsilon):
[`pooled_moments`][fedhead.federation.row_privacy.pooled_moments].

**Accounting.** [`exchange_event`][fedhead.federation.row_privacy.exchange_event] is what the exchange
is for an accountant: one Gaussian release of noise multiplier ``z`` on L2 sensitivity 1 in the scaled
units, under add-or-remove-one neighbouring of rows.
[`row_privacy_spent`][fedhead.federation.row_privacy.row_privacy_spent] composes, with
flwr's ``RdpAccountant``, the exchange (noise multiplier ``z``) and every later client-level release
(noise multiplier ``z_c`` on sensitivity ``K Delta`` per site,
[`fedhead.federation.privacy_noise`][fedhead.federation.privacy_noise]): one row moves a site's
clipped, capped term by at most ``2 K Delta``, so in the row unit such a release is a Gaussian
mechanism of noise multiplier ``z_c / 2``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.discrete_gaussian import MAX_SUM_GAP, discrete_gaussians, sum_gap
from fedhead.federation.privacy_noise import noise_for_epsilon
from fedhead.federation.run_privacy import client_release_in_rows, run_epsilon

__all__ = [
    "BLOCK_SHARES",
    "GRID_BITS",
    "PooledRows",
    "clip_rows",
    "drawn_noise",
    "exchange_event",
    "noise_for_row_epsilon",
    "noise_scales",
    "pooled_moments",
    "release_length",
    "row_privacy_spent",
    "row_statistics",
    "sensitivities",
    "site_release",
    "site_share",
    "svec",
    "unsvec",
]

#: ``w_k^2``, the share of the release's ``rho`` of the count, the sums, the second moments and the between-means term.
BLOCK_SHARES = (0.04, 0.04, 0.88, 0.04)
#: The L2 sensitivity of the between-means block per ``C^2`` (see the module docstring).
BETWEEN_SENSITIVITY = math.sqrt(17.0)
#: ``g``: the noise grid is ``2^-g``; a share's entries must stay below ``2^(52 - g)`` in magnitude.
GRID_BITS = 16
_EXACT = 2.0**52  # below it, every multiple of 2^-g with g <= GRID_BITS is a float64 exactly


class PooledRows(NamedTuple):
    """The pooled count, mean ``(d,)``, covariance ``(d, d)`` and within-site covariance ``(d, d)``
    (population, symmetric) of a summed release."""

    count: float
    mean: np.ndarray
    cov: np.ndarray
    within: np.ndarray


def svec(a: np.ndarray) -> np.ndarray:
    """The upper triangle of a symmetric ``(d, d)``, row by row, off-diagonal entries times ``sqrt(2)``."""
    m = np.asarray(a, dtype=np.float64)
    i, j = np.triu_indices(m.shape[0])
    return m[i, j] * np.where(i == j, 1.0, math.sqrt(2.0))


def unsvec(v: np.ndarray, dim: int) -> np.ndarray:
    """The symmetric ``(d, d)`` of an [`svec`][fedhead.federation.row_privacy.svec]."""
    i, j = np.triu_indices(dim)
    vals = np.asarray(v, dtype=np.float64) / np.where(i == j, 1.0, math.sqrt(2.0))
    out = np.zeros((dim, dim))
    out[i, j] = vals
    out[j, i] = vals
    return out


def release_length(dim: int) -> int:
    """Entries of a release of ``d = dim`` targets: ``1 + d + d (d + 1)``."""
    return 1 + dim + dim * (dim + 1)


def clip_rows(y: np.ndarray, clip: float) -> np.ndarray:
    """Every row of ``y (N, d)`` scaled to the L2 norm ``C = clip`` if it is longer (float64 copy)."""
    rows = np.array(y, dtype=np.float64)
    if rows.ndim != 2 or not np.all(np.isfinite(rows)):
        raise ConfigError(f"row-level privacy: the targets must be a finite (N, d) array, got shape {rows.shape}")
    c = _positive("clip", clip)
    norms = np.linalg.norm(rows, axis=1)
    scale = np.minimum(1.0, c / np.maximum(norms, np.finfo(np.float64).tiny))
    return rows * scale[:, None]


def row_statistics(y: np.ndarray, clip: float) -> np.ndarray:
    """A site's release before noise: ``[N_m, S_m, svec(sum clip(y) clip(y)^T), svec(S_m S_m^T / N_m)]`` of its
    rows ``y (N, d)`` (``S_m = sum clip(y)``; the last block 0 without rows)."""
    rows = clip_rows(y, clip)
    total = rows.sum(axis=0)
    between = np.outer(total, total) / max(rows.shape[0], 1)
    return np.concatenate([[float(rows.shape[0])], total, svec(rows.T @ rows), svec(between)])


def sensitivities(clip: float) -> tuple[float, float, float, float]:
    """``(1, C, C^2, sqrt(17) C^2)``: the L2 change of each block of a release by one row added or removed."""
    c = _positive("clip", clip)
    return 1.0, c, c * c, BETWEEN_SENSITIVITY * c * c


def noise_scales(dim: int, clip: float) -> np.ndarray:
    """``(L,)`` ``D_k / w_k`` of each entry's block: its noise is ``z`` times this in the statistics' units."""
    sizes = (1, dim, dim * (dim + 1) // 2, dim * (dim + 1) // 2)
    return np.concatenate(
        [np.full(n, d / math.sqrt(w)) for n, d, w in zip(sizes, sensitivities(clip), BLOCK_SHARES, strict=True)]
    )


def drawn_noise(noise_multiplier: float, dim: int, clip: float, grid_bits: int = GRID_BITS) -> float:
    """The noise multiplier the sites draw for an accounted ``z``: ``z (1 + ||2^-g / scale||_2)`` (the grid's
    rounding raises the scaled sensitivity from 1 to at most ``1 + ||2^-g / scale||_2``)."""
    rounding = float(np.linalg.norm(2.0**-grid_bits / noise_scales(dim, clip)))
    return _non_negative("noise_multiplier", noise_multiplier) * (1.0 + rounding)


def exchange_event(noise_multiplier: float) -> tuple[float, int]:
    """The row-level exchange for an accountant: ``(z, 1)``, one Gaussian mechanism of noise multiplier ``z``
    (``privacy.dp_noise``) on L2 sensitivity 1 under add-or-remove-one rows (an event of
    [`gaussian_accountant`][fedhead.federation.privacy_noise.gaussian_accountant]; the sites' draw covers the
    grid's rounding, [`drawn_noise`][fedhead.federation.row_privacy.drawn_noise])."""
    return _positive("noise_multiplier", noise_multiplier), 1


def noise_for_row_epsilon(epsilon: float, rows: int, delta: float) -> float:
    """The accounted noise multiplier ``z`` of an exchange that alone spends at most ``epsilon`` per row:
    [`noise_for_epsilon`][fedhead.federation.privacy_noise.noise_for_epsilon] of one release over ``rows``."""
    return noise_for_epsilon(epsilon, 1, rows, delta)


def site_release(
    y: np.ndarray, *, clip: float, noise_multiplier: float, min_sites: int, sites: int, rng: random.Random
) -> np.ndarray:
    """What a site's rows ``y (N, d)`` send into the exchange's secure sum under ``privacy.dp_unit=row``:
    [`site_share`][fedhead.federation.row_privacy.site_share] of their
    [`row_statistics`][fedhead.federation.row_privacy.row_statistics], accounted at ``z = noise_multiplier``."""
    rows = np.asarray(y, dtype=np.float64)
    dim = int(rows.shape[1]) if rows.ndim == 2 else 0
    z = drawn_noise(noise_multiplier, max(dim, 1), clip)
    stats = row_statistics(rows, clip)
    return site_share(stats, dim, clip=clip, noise_multiplier=z, min_sites=min_sites, rng=rng, sites=sites)


def site_share(
    statistics: np.ndarray,
    dim: int,
    *,
    clip: float,
    noise_multiplier: float,
    min_sites: int,
    rng: random.Random,
    sites: int | None = None,
    grid_bits: int = GRID_BITS,
) -> np.ndarray:
    """What a site sends into the secure sum: its statistics on the grid ``2^-g`` plus its noise share.

    Parameters
    ----------
    statistics : ndarray (L,)
        [`row_statistics`][fedhead.federation.row_privacy.row_statistics] of the site's rows.
    dim : int
        ``d``, the targets.
    clip, noise_multiplier, min_sites
        ``C``, ``z`` (the multiplier drawn: [`drawn_noise`][fedhead.federation.row_privacy.drawn_noise] of the
        accounted one) and ``m_min`` (the fewest honest sites whose sum is released).
    rng : random.Random
        The site's generator: ``random.SystemRandom()`` in a run (no seed the server could know).
    sites : int, optional
        The most shares that may be summed (the run's sites; default ``m_min``): the sum's ``tau``
        ([`sum_gap`][fedhead.federation.discrete_gaussian.sum_gap]) grows with it.
    grid_bits : int
        ``g`` (``GRID_BITS``).

    Raises
    ------
    ConfigError
        When ``tau L`` exceeds ``MAX_SUM_GAP`` (shares too narrow for the grid) or a value leaves the grid's range.

    Returns
    -------
    numpy.ndarray
        ``(L,)`` float64 multiples of ``2^-g`` (exact): ``round(s 2^g) 2^-g + 2^-g X``, ``X`` a discrete
        Gaussian of variance ``(z scale)^2 2^(2g) / m_min`` per entry.
    """
    values = np.asarray(statistics, dtype=np.float64).ravel()
    if values.size != release_length(dim) or not np.all(np.isfinite(values)):
        raise ConfigError(f"row-level privacy: expected {release_length(dim)} finite statistics, got {values.size}")
    if not isinstance(min_sites, int) or min_sites < 1:
        raise ConfigError(f"row-level privacy: min_sites must be an integer >= 1, got {min_sites!r}")
    z = _non_negative("noise_multiplier", noise_multiplier)
    summed = max(min_sites, int(sites or min_sites))
    step = 2.0**grid_bits
    grid = np.round(values * step)
    shares = []
    for scale in noise_scales(dim, clip):
        variance = Fraction(z * float(scale) * step) ** 2 / min_sites
        if variance and sum_gap(float(variance), summed) * values.size > MAX_SUM_GAP:
            raise ConfigError(f"row-level privacy: the noise share (variance {float(variance):.3g} steps) is too small")
        shares.extend(discrete_gaussians(rng, variance, 1))
    total = grid + np.array(shares, dtype=np.float64)
    if np.any(np.abs(total) >= _EXACT):
        raise ConfigError(f"row-level privacy: a statistic is beyond 2^{52 - grid_bits}, too large for the noise grid")
    return total / step


def pooled_moments(total: np.ndarray, dim: int) -> PooledRows:
    """The pooled count, mean, covariance and within-site covariance of a summed release (post-processing: no
    further epsilon): ``cov = sum clip(y) clip(y)^T / N - mean mean^T``, ``within = (sum clip(y) clip(y)^T -
    sum_m S_m S_m^T / N_m) / N``.

    Raises
    ------
    ConfigError
        When the noised count is not positive.
    """
    t = np.asarray(total, dtype=np.float64).ravel()
    count = float(t[0])
    if not count > 0:
        raise ConfigError("row-level privacy: the noised count of the rows is not positive")
    mean = t[1 : 1 + dim] / count
    half = dim * (dim + 1) // 2
    second = unsvec(t[1 + dim : 1 + dim + half], dim) / count
    cov = second - np.outer(mean, mean)
    within = second - unsvec(t[1 + dim + half :], dim) / count
    return PooledRows(count, mean, 0.5 * (cov + cov.T), within)


def row_privacy_spent(exchange_noise: float, later_noise: Sequence[float], rows: int, delta: float) -> float:
    """``epsilon`` at ``delta``, for one row, of the row-level exchange and the later client-level releases.

    Parameters
    ----------
    exchange_noise : float
        The exchange's accounted noise multiplier (``privacy.dp_noise``; 0: no exchange accounted).
    later_noise : sequence of float
        ``z_c > 0`` of each later client-level release: accounted as Gaussian mechanisms of ``z_c / 2``.
    rows : int
        ``N >= 1``, the population (recorded; no sampling amplification).
    delta : float
        In ``(0, 1)``.
    """
    if not isinstance(rows, int) or rows < 1:
        raise ConfigError(f"row-level privacy: rows must be an integer >= 1, got {rows!r}")
    if not 0.0 < float(delta) < 1.0:
        raise ConfigError(f"row-level privacy: delta must be in (0, 1), got {delta!r}")
    exchange = [float(exchange_noise)] if exchange_noise else []
    later = [client_release_in_rows(_positive("noise", z)) for z in later_noise]
    return run_epsilon(exchange, later, None, 0, float(delta))


def _positive(name: str, value: object) -> float:
    number = float(value) if isinstance(value, int | float | np.floating) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"row-level privacy: {name} must be a finite number > 0, got {value!r}")
    return number


def _non_negative(name: str, value: object) -> float:
    if value == 0:
        return 0.0
    return _positive(name, value)
