"""The discrete Gaussian ``N_Z(0, s^2)`` on the integers, sampled exactly (Canonne, Kamath and Steinke
2020, "The Discrete Gaussian for Differential Privacy", Algorithms 1-3), and the bound on a sum of them.

``P[X = x] proportional to exp(-x^2 / (2 s^2))`` for integer ``x``. The sampler uses only integer and
rational arithmetic (Python's ``int`` and ``fractions.Fraction``) and uniform integers, so the draws
follow the distribution exactly, with no floating-point bias:

1. ``Bernoulli(exp(-g))`` for rational ``g >= 0``: for ``g <= 1`` draw ``A_k ~ Bernoulli(g / k)`` for
   ``k = 1, 2, ...`` until one is 0; the result is 1 iff that ``k`` is odd; a larger ``g`` is
   ``floor(g)`` draws of ``Bernoulli(exp(-1))`` and one of ``Bernoulli(exp(-(g - floor g)))``.
2. the discrete Laplace of scale ``t`` (an integer): ``U`` uniform in ``0..t-1`` accepted with
   probability ``exp(-U / t)``, ``V`` geometric (``Bernoulli(exp(-1))`` until 0), ``X = U + t V``,
   a random sign, ``-0`` rejected;
3. the discrete Gaussian: ``t = floor(s) + 1``, ``Y`` discrete Laplace of scale ``t``, accepted with
   probability ``exp(-(|Y| - s^2 / t)^2 / (2 s^2))``.

The sum of ``n`` independent ``N_Z(0, s^2)`` is not exactly ``N_Z(0, n s^2)``. Kairouz, Liu and
Steinke 2021 ("The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
Aggregation", Proposition 14, Eq. 17; the same formula in their ``distributed_dp`` accounting
code) bound the gap for ``s >= 1/2``, ``s^2`` each summand's variance in grid steps: with

    tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k / (k + 1)),

the sum ``Z`` of ``n`` such vectors of ``L`` entries and a shift ``D`` on the grid (an integer vector,
L2 norm ``D_2``) satisfy, at every Renyi order ``alpha >= 1``,

    D_alpha(Z + D || Z) <= min( alpha D_2^2 / (2 n s^2) + tau L,  alpha / 2 (D_2 / sqrt(n s^2) + tau sqrt(L))^2 ).

The first term is the continuous Gaussian mechanism's Renyi divergence at noise variance ``n s^2``
plus ``tau L``: a mechanism whose noise is such a sum is accounted as that Gaussian mechanism, its
epsilon raised by at most ``tau L`` (an RDP bound raised by a constant raises the converted epsilon
by that constant). [`sum_gap`][fedhead.federation.discrete_gaussian.sum_gap] computes ``tau``;
[`fedhead.federation.row_privacy`][fedhead.federation.row_privacy] refuses a setting where ``tau L``
exceeds ``MAX_SUM_GAP`` (with its grid, ``s`` is thousands of steps at least and ``tau`` underflows to 0).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

from fedhead.analysis.constraints import ConfigError

__all__ = ["MAX_SUM_GAP", "bernoulli_exp", "discrete_gaussian", "discrete_gaussians", "discrete_laplace", "sum_gap"]

#: The largest ``tau L`` ([`sum_gap`][fedhead.federation.discrete_gaussian.sum_gap] times the entries) a release
#: may carry: the most its epsilon may exceed the accounted Gaussian mechanism's.
MAX_SUM_GAP = 1e-12


def _bernoulli(rng: random.Random, p: Fraction) -> bool:
    """``Bernoulli(p)`` for rational ``p`` in ``[0, 1]``: one uniform integer below the denominator."""
    return rng.randrange(p.denominator) < p.numerator


def bernoulli_exp(rng: random.Random, gamma: Fraction) -> bool:
    """``Bernoulli(exp(-gamma))`` for rational ``gamma >= 0``, exactly (CKS 2020, Algorithm 1)."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp: gamma must be >= 0, got {gamma}")
    if gamma > 1:
        whole = math.floor(gamma)
        for _ in range(whole):
            if not bernoulli_exp(rng, Fraction(1)):
                return False
        return bernoulli_exp(rng, gamma - whole)
    k = 1
    while _bernoulli(rng, gamma / k):
        k += 1
    return k % 2 == 1


def discrete_laplace(rng: random.Random, scale: int) -> int:
    """One draw of ``P[X = x] ~ exp(-|x| / t)`` on the integers, ``t = scale >= 1`` (CKS 2020, Algorithm 2)."""
    t = int(scale)
    if t < 1:
        raise ValueError(f"discrete_laplace: the scale must be an integer >= 1, got {scale}")
    while True:
        u = rng.randrange(t)
        if not bernoulli_exp(rng, Fraction(u, t)):
            continue
        v = 0
        while bernoulli_exp(rng, Fraction(1)):
            v += 1
        x = u + t * v
        negative = rng.randrange(2) == 1
        if negative and x == 0:
            continue
        return -x if negative else x


def discrete_gaussian(rng: random.Random, variance: Fraction) -> int:
    """One draw of ``N_Z(0, s^2)``, ``s^2 = variance`` rational and ``> 0`` (CKS 2020, Algorithm 3)."""
    s2 = Fraction(variance)
    if s2 <= 0:
        raise ValueError(f"discrete_gaussian: the variance must be > 0, got {variance}")
    t = math.isqrt(math.floor(s2)) + 1  # floor(s) + 1 (floor(sqrt(floor(s2))) = floor(sqrt(s2)))
    centre = s2 / t
    while True:
        y = discrete_laplace(rng, t)
        if bernoulli_exp(rng, (abs(y) - centre) ** 2 / (2 * s2)):
            return y


def discrete_gaussians(rng: random.Random, variance: Fraction, count: int) -> list[int]:
    """``count`` independent draws of ``N_Z(0, variance)`` (0: zeros)."""
    if count < 0:
        raise ValueError(f"discrete_gaussians: count must be >= 0, got {count}")
    if variance == 0:
        return [0] * count
    return [discrete_gaussian(rng, Fraction(variance)) for _ in range(count)]


def sum_gap(variance: float, terms: int) -> float:
    """Kairouz-Liu-Steinke's ``tau`` of a sum of ``terms`` independent ``N_Z(0, variance)``: ``tau L`` bounds how
    much its Renyi divergence (and epsilon) may exceed the Gaussian mechanism's of variance ``terms variance``
    on ``L`` entries (see the module docstring); 0 for one term.

    Raises
    ------
    ConfigError
        When ``variance < 1/4`` (``s < 1/2``: the bound does not apply).
    """
    if variance < 0.25:
        raise ConfigError(f"differential privacy: a discrete Gaussian share needs a variance >= 1/4, got {variance}")
    return 10.0 * sum(math.exp(-2.0 * math.pi**2 * variance * k / (k + 1)) for k in range(1, int(terms)))
