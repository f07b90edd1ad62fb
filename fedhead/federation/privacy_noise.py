"""Client-level differential privacy of the secure sums (``privacy.dp_noise > 0``): clipping, weight
cap, each site's share of the Gaussian noise, and the privacy spent.

Pure: numpy for the arithmetic, flwr's RDP accountant (a wrapper of Google's ``dp-accounting``)
for epsilon. No torch, no messages; the ClientApp and the strategy call these functions.

Each release is a secure sum ([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum])
of one vector per site ``m``. Without privacy the vector is ``N_m v_m`` (``v_m`` a per-row
statistic: ``[1, mu_m, S_m]`` in the exchange, ``[W_m.ravel(), b_m]`` in a round, the training
errors in an evaluation). Under DP, with public ``K`` (``privacy.dp_max_rows``), ``Delta``
(``privacy.dp_clip``) and ``z`` (``privacy.dp_noise``), site ``m`` sends instead::

    x_m = w_m clip(v_m) + e_m,    w_m = min(N_m, K),    clip(v) = v min(1, Delta / ||v||_2),
    e_m ~ N(0, s^2 I),           s^2 = (z K Delta)^2 / m_min

with ``m_min`` the fewest sites whose sum is released: fedhead's ClientApp passes
``max(2, failure policy's minimum)`` (every step of a secure sum needs the failure policy's minimum of
valid replies, and a sum is never decoded from fewer than 2). Adding or removing one site changes
``sum_m w_m clip(v_m)`` by at most ``K Delta`` in L2 (the sensitivity), and the noise of any
``m >= m_min`` honest sites sums to ``N(0, (m / m_min) (z K Delta)^2 I)``, at least the
``(z K Delta)^2`` of the Gaussian mechanism with noise multiplier ``z``. Sites that collude with
the server know their own ``e_m`` and can subtract it: the guarantee holds for the noise of the
honest survivors only, i.e. while at least ``m_min`` of them take part.

The releases compose (one exchange, one per round, one per evaluation), every site in every
release (no sampling amplification), under add-or-remove-one neighbouring of sites:
[`privacy_spent`][fedhead.federation.privacy_noise.privacy_spent] accounts them with flwr's
``RdpAccountant`` (Renyi DP of the Gaussian mechanism, converted to ``(epsilon, delta)``), and
[`noise_for_epsilon`][fedhead.federation.privacy_noise.noise_for_epsilon] inverts it.

Clipping rescales a whole per-row vector, leading ``1`` included, so a clipped site's weight in a
ratio of sums (means = ``sum x_m[1:] / sum x_m[0]``) shrinks by its clip scale; the estimate stays
a weighted mean of the sites' own values.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from fedhead.analysis.constraints import ConfigError

__all__ = [
    "Clipped",
    "clip_contribution",
    "dp_contribution",
    "dp_weight",
    "gaussian_accountant",
    "noise_for_epsilon",
    "privacy_spent",
    "sensitivity",
    "site_noise",
]

#: Relative tolerance of [`noise_for_epsilon`][fedhead.federation.privacy_noise.noise_for_epsilon] on ``z``.
NOISE_RTOL = 1e-6
#: No noise multiplier beyond this is searched for (its epsilon is far below any useful target).
_MAX_NOISE = 1e12


class Clipped(NamedTuple):
    """A vector clipped to an L2 bound.

    Attributes
    ----------
    values : numpy.ndarray
        ``(L,)`` float64, ``v * scale``.
    scale : float
        ``min(1, Delta / ||v||_2)`` in ``(0, 1]``; 1: the vector was within the bound (untouched).
    """

    values: np.ndarray
    scale: float


def clip_contribution(values: np.ndarray, clip: float) -> Clipped:
    """Scale a flat vector down to the L2 norm ``clip`` (``Delta``) if it is longer.

    ``clip(v) = v min(1, Delta / ||v||_2)``: a vector within the bound is returned unchanged (a
    float64 copy), a longer one has norm ``Delta`` up to float64 rounding (a few ulps).

    Parameters
    ----------
    values : array_like
        ``(L,)`` finite values (a site's per-row statistic vector ``v_m``).
    clip : float
        ``Delta > 0``, finite.

    Returns
    -------
    Clipped
        The clipped ``(L,)`` float64 vector and the scale applied.
    """
    v = np.array(values, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ConfigError(f"differential privacy: the clipped vector must be flat and non-empty, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ConfigError("differential privacy: the clipped vector has a non-finite entry")
    delta = _positive("clip", clip)
    norm = float(np.linalg.norm(v))
    if norm <= delta:
        return Clipped(v, 1.0)
    scale = delta / norm
    return Clipped(v * scale, scale)


def dp_weight(rows: int, max_rows: int) -> float:
    """A site's weight in every sum, its training rows capped at the public ``K``: ``w_m = min(N_m, K)``.

    Parameters
    ----------
    rows : int
        ``N_m >= 0``.
    max_rows : int
        ``K >= 1`` (``privacy.dp_max_rows``).
    """
    if not _integer(rows, 0):
        raise ConfigError(f"differential privacy: a site's rows must be an integer >= 0, got {rows!r}")
    if not _integer(max_rows, 1):
        raise ConfigError(f"differential privacy: max_rows must be an integer >= 1, got {max_rows!r}")
    return float(min(int(rows), int(max_rows)))


def sensitivity(max_rows: int, clip: float) -> float:
    """The L2 sensitivity of a sum to adding or removing one site: ``K Delta``.

    Each site's term ``w_m clip(v_m)`` has norm at most ``min(N_m, K) Delta <= K Delta``.
    """
    if not _integer(max_rows, 1):
        raise ConfigError(f"differential privacy: max_rows must be an integer >= 1, got {max_rows!r}")
    return float(max_rows) * _positive("clip", clip)


def site_noise(
    rng: np.random.Generator, length: int, noise_multiplier: float, sensitivity: float, min_sites: int
) -> np.ndarray:
    """One site's share of the Gaussian noise of a sum: ``(L,)`` draws of ``N(0, (z S)^2 / m_min)``.

    The noise of any ``m >= m_min`` sites sums to ``N(0, (m / m_min) (z S)^2)`` per entry, at least
    the Gaussian mechanism's ``(z S)^2``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The site's own generator, seeded from the operating system's entropy
        (``np.random.default_rng()``) in a run: a seed the server could know would let it remove
        the noise.
    length : int
        ``L >= 1``, the length of the summed vector.
    noise_multiplier : float
        ``z >= 0`` (0: zeros).
    sensitivity : float
        ``S = K Delta > 0`` ([`sensitivity`][fedhead.federation.privacy_noise.sensitivity]).
    min_sites : int
        ``m_min >= 1``: the fewest sites whose sum is released (see the module docstring).

    Returns
    -------
    numpy.ndarray
        ``(L,)`` float64.
    """
    if not _integer(length, 1):
        raise ConfigError(f"differential privacy: the noise length must be an integer >= 1, got {length!r}")
    if not _integer(min_sites, 1):
        raise ConfigError(f"differential privacy: min_sites must be an integer >= 1, got {min_sites!r}")
    z = _non_negative("noise_multiplier", noise_multiplier)
    std = z * _positive("sensitivity", sensitivity) / math.sqrt(int(min_sites))
    if std == 0.0:
        return np.zeros(int(length))
    return rng.normal(0.0, std, size=int(length))


def dp_contribution(
    vector: np.ndarray,
    rows: int,
    *,
    clip: float,
    max_rows: int,
    noise_multiplier: float,
    min_sites: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """What a site sends into a secure sum under DP: ``min(N_m, K) clip(x / N_m) + e_m``.

    Parameters
    ----------
    vector : ndarray (L,)
        The site's count-weighted vector ``x = N_m v_m`` (its clear-mode input to the sum).
    rows : int
        ``N_m >= 1``.
    clip, max_rows, noise_multiplier, min_sites, rng
        ``Delta``, ``K``, ``z``, ``m_min`` and the site's own generator
        ([`site_noise`][fedhead.federation.privacy_noise.site_noise]).

    Returns
    -------
    numpy.ndarray
        ``(L,)`` float64: ``w_m clip(v_m) + e_m`` with ``e_m ~ N(0, (z K Delta)^2 / m_min)``.
    """
    per_row = np.asarray(vector, dtype=np.float64).ravel() / float(rows)
    clipped = clip_contribution(per_row, clip).values
    noise = site_noise(rng, clipped.size, noise_multiplier, sensitivity(max_rows, clip), min_sites)
    return dp_weight(rows, max_rows) * clipped + noise


def privacy_spent(noise_multiplier: float, releases: int, sites: int, delta: float) -> PrivacySpent:
    """``(epsilon, delta)`` of ``releases`` Gaussian releases with noise multiplier ``z`` over ``sites`` sites.

    Client-level, add-or-remove-one neighbouring, every site in every release (no sampling
    amplification: ``sites`` is recorded, it does not lower epsilon). Accounted by flwr's
    ``RdpAccountant`` with its default Renyi orders.

    Parameters
    ----------
    noise_multiplier : float
        ``z >= 0``; 0 (no noise): ``epsilon = inf``, nothing accounted.
    releases : int
        ``T >= 0``, the composed releases (0: ``epsilon = 0``).
    sites : int
        ``M >= 1``, the population.
    delta : float
        In ``(0, 1)``. A warning says when ``delta >= 1 / M``: such a guarantee allows revealing
        one site whole.

    Returns
    -------
    PrivacySpent
        flwr's record: ``epsilon``, ``delta``, ``num_releases``, ``accounting_method`` (``"rdp"``)
        and ``optimal_order`` (None when nothing was accounted).
    """
    z = _non_negative("noise_multiplier", noise_multiplier)
    _check_releases_sites_delta(releases, sites, delta)
    delta = float(delta)
    if delta >= 1.0 / sites:
        warnings.warn(
            f"differential privacy: delta={delta:g} is at least 1/sites (1/{sites}): a guarantee that allows "
            "revealing one site whole; take delta well below 1/sites",
            stacklevel=2,
        )
    if releases == 0:
        return PrivacySpent(epsilon=0.0, delta=float(delta), num_releases=0, accounting_method="rdp")
    if z == 0.0:
        return PrivacySpent(epsilon=math.inf, delta=float(delta), num_releases=int(releases), accounting_method="rdp")
    return _accountant(z, int(releases), int(sites), float(delta)).get_privacy_spent()


def noise_for_epsilon(epsilon: float, releases: int, sites: int, delta: float) -> float:
    """The smallest noise multiplier ``z`` whose ``releases`` releases spend at most ``epsilon``.

    Bisection on [`privacy_spent`][fedhead.federation.privacy_noise.privacy_spent] (epsilon
    decreases with ``z``) until the bracket is within a relative ``1e-6`` of ``z``; the upper end
    is returned, so ``privacy_spent(z, ...).epsilon <= epsilon`` always.

    Parameters
    ----------
    epsilon : float
        Target ``epsilon > 0``, finite.
    releases : int
        ``T >= 1``.
    sites : int
        ``M >= 1``.
    delta : float
        In ``(0, 1)``.

    Returns
    -------
    float
        ``z > 0``.
    """
    target = _positive("epsilon", epsilon)
    _check_releases_sites_delta(releases, sites, delta)
    if releases < 1:
        raise ConfigError(f"differential privacy: releases must be >= 1 to find a noise level, got {releases!r}")

    def spent(z: float) -> float:
        return _accountant(z, int(releases), int(sites), float(delta)).get_epsilon(float(delta))

    high = 1.0
    while spent(high) > target:
        high *= 2.0
        if high > _MAX_NOISE:
            raise ConfigError(
                f"differential privacy: no noise multiplier up to {_MAX_NOISE:g} reaches epsilon={target}"
            )
    low = high / 2.0
    while spent(low) <= target:
        high, low = low, low / 2.0
    while high - low > NOISE_RTOL * high:
        middle = 0.5 * (low + high)
        if spent(middle) <= target:
            high = middle
        else:
            low = middle
    return high


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def gaussian_accountant(events: Sequence[tuple[float, int]], population: int, delta: float) -> RdpAccountant:
    """flwr's RDP accountant with the Gaussian releases ``events`` composed: ``(noise multiplier, count)``
    pairs, add-or-remove-one neighbours among ``population`` units (sites or rows), no sampling amplification."""
    config = PrivacyConfig(
        target_delta=delta,
        population_size=population,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    )
    accountant = RdpAccountant(config)
    for z, count in events:
        event = GaussianPrivacyEvent(noise_multiplier=z, sample_size=population, population_size=population)
        accountant.compose(event, count)
    return accountant


def _accountant(z: float, releases: int, sites: int, delta: float) -> RdpAccountant:
    """flwr's RDP accountant with ``releases`` Gaussian releases of noise multiplier ``z`` composed."""
    return gaussian_accountant([(z, releases)], sites, delta)


def _check_releases_sites_delta(releases: object, sites: object, delta: object) -> None:
    if not _integer(releases, 0):
        raise ConfigError(f"differential privacy: releases must be an integer >= 0, got {releases!r}")
    if not _integer(sites, 1):
        raise ConfigError(f"differential privacy: sites must be an integer >= 1, got {sites!r}")
    value = _finite(delta)
    if value is None or not 0.0 < value < 1.0:
        raise ConfigError(f"differential privacy: delta must be a number in (0, 1), got {delta!r}")


def _integer(value: object, minimum: int) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and int(value) >= minimum


def _finite(value: object) -> float | None:
    """``value`` as a float when it is a finite real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _positive(name: str, value: object) -> float:
    number = _finite(value)
    if number is None or number <= 0.0:
        raise ConfigError(f"differential privacy: {name} must be a finite number > 0, got {value!r}")
    return number


def _non_negative(name: str, value: object) -> float:
    number = _finite(value)
    if number is None or number < 0.0:
        raise ConfigError(f"differential privacy: {name} must be a finite number >= 0, got {value!r}")
    return number
