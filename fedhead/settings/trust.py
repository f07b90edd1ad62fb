"""What the server accepts from a site (``trust:`` in conf/config.yaml; docs/deployment.md, "Threat model").

[`TrustPolicy`][fedhead.settings.trust.TrustPolicy] bounds the influence of any one site on the
aggregate and the values a reply may carry. A reply that breaks a bound drops that site (the
failure policy, ``failure.min_clients``, decides whether the run continues); the weight cap and the
update clip bound a site instead of dropping it. The defaults leave every honest run of this
repository numerically unchanged.

No flwr, no torch: the config layer and the strategies both import this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedhead.analysis.constraints import ConfigError, Field, Together, check, integer, names, number, optional

__all__ = ["TrustPolicy"]


def _counts(v: Any) -> bool:
    """None, or a non-empty sequence of integers >= 1."""
    if v is None:
        return True
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v:
        return False
    return all(integer(1)(c) for c in v)


def _count_limit(v: Any) -> bool:
    """None, one integer >= 1, or one per site."""
    return v is None or integer(1)(v) or _counts(v)


_TRUST_RULES = (
    Field("max_weight_share", optional(number(0, 1, low_open=True)), "must be a number in (0, 1] or null (no cap)"),
    Field("expected_counts", _counts, "must be a list of integers >= 1 (one per site, by partition id) or null"),
    Field("max_count", _count_limit, "must be an integer >= 1, a list of them (one per site) or null"),
    Field("max_abs", number(0, low_open=True), "must be a finite number > 0"),
    Field("clip_update", optional(number(0, low_open=True)), "must be a finite number > 0 or null (off)"),
    Field("flag_gram_error", number(0, low_open=True), "must be a finite number > 0"),
    Field("flag_outlier", number(1, low_open=True), "must be a finite number > 1"),
    Field("extra_metrics", names, "must be a list of metric names"),
    Together(
        lambda t: (
            t.expected_counts is None
            or not isinstance(t.max_count, (list, tuple))
            or len(t.max_count) == len(t.expected_counts)
        ),
        "trust.expected_counts and trust.max_count list different numbers of sites",
    ),
)


@dataclass(frozen=True)
class TrustPolicy:
    """Bounds on what one site can do to the federation.

    Attributes
    ----------
    max_weight_share : float or None
        Cap on any site's aggregation weight ``p_m = N_m / N`` (in the exchange's ``Sigma_cen``,
        ``G_cen``, ``G_star`` and in every average); the excess is shared among the other sites in
        proportion to their counts. Applies to federations of three sites or more (with two, each
        site is half of it: declare ``expected_counts``). Protects against a site claiming a huge
        ``N_m`` to set the aggregate. None: no cap.
    expected_counts : list of int or None
        The training rows the operator expects of each site (by partition id): any other count
        drops the site.
    max_count : int, list of int or None
        An upper bound on every site's count (one number), or one per site (by partition id).
    max_abs : float
        Bound on the magnitude of what a site sends, in the units exchanged (standardised targets
        unless the data set turns standardisation off): every entry of a target mean, the square
        root of a covariance's largest eigenvalue (a standard deviation), every entry of a
        returned head and bias. Protects the pooled moments and the average from overflow and
        from gross values (a head of 1e200); it does not catch a moderate lie (see the flags).
    clip_update : float or None
        Before averaging, each site's update ``[W_m - W_t, b_m - b_t]`` is scaled down to this
        Frobenius norm (Flower's DP wrappers clip the same way). It bounds a lying site's effect
        on each round; it also moves honest heads away from their optima when it binds (the round
        record counts the clipped sites). None: off.
    flag_gram_error : float
        A site whose returned head's Gram is farther than this (relative Frobenius error) from the
        optimal Gram of the covariance it sent is flagged in the round record and the log.
    flag_outlier : float
        A site whose covariance lies this many times farther from the others' (BW distance) than the
        sites typically lie from each other is flagged in the diagnosis (three sites or more;
        [`fedhead.analysis.consistency.outlier_scores`][fedhead.analysis.consistency.outlier_scores]).
    extra_metrics : tuple of str
        Metric names the app's clients add to their training replies, accepted (finite numbers
        only) beside fedhead's declared ones
        ([`fedhead.results.rounds.ClientMetric`][fedhead.results.rounds.ClientMetric]); every other
        entry is ignored and counted (``ignored_metrics`` of the round).
    """

    max_weight_share: float | None = 0.5
    expected_counts: tuple[int, ...] | None = None
    max_count: int | tuple[int, ...] | None = None
    max_abs: float = 1e6
    clip_update: float | None = None
    flag_gram_error: float = 0.5
    flag_outlier: float = 5.0
    extra_metrics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check(self, _TRUST_RULES, prefix="trust.", error=ConfigError)
        for name in ("expected_counts", "max_count"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, tuple(int(v) for v in value))
        for name in ("max_weight_share", "clip_update"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else float(value))
        object.__setattr__(self, "extra_metrics", tuple(self.extra_metrics))
        for name in ("max_abs", "flag_gram_error", "flag_outlier"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def check(self, num_clients: int) -> None:
        """Refuse per-site lists whose length is not the number of sites."""
        for name in ("expected_counts", "max_count"):
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) != num_clients:
                raise ConfigError(f"trust.{name} lists {len(value)} sites, but num_clients={num_clients}")

    def count_problem(self, count: int, partition: int | None) -> str | None:
        """Why a site (``partition``; None: not yet numbered) may not claim ``count`` rows, or None."""
        expected = self.expected_counts
        if (
            expected is not None
            and partition is not None
            and partition < len(expected)
            and count != expected[partition]
        ):
            return f"reported {count} rows, but trust.expected_counts says {expected[partition]}"
        limit = self.max_count
        if isinstance(limit, tuple):
            limit = limit[partition] if partition is not None and partition < len(limit) else None
        if limit is not None and count > limit:
            return f"reported {count} rows, above trust.max_count={limit}"
        return None
