"""What a site's clear reply puts into a secure sum: the vector of its layout
([`fedhead.federation.secure_records`][fedhead.federation.secure_records]), the layout's public bound, and the
pass/fail self-checks and sizes that may travel with the masked input
([`sum_input`][fedhead.clients.sum_inputs.sum_input]). No flwr message is sent here and nothing is logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedhead.clients.messages import ClientError
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.local_fit import LOCAL_GAP_THRESHOLD
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.ufm import fully_active_margins

__all__ = ["SumInput", "exchange_vector", "fully_active", "sum_input"]


@dataclass(frozen=True)
class SumInput:
    """A site's input to one secure sum: ``vector`` within ``bound`` per entry; ``heads``: a round's head (its
    own clip); ``private``: already differentially private for one row (a row-level release, a private head),
    so no client-level noise is added; ``safe``: what may be sent with it; ``site``: a site-local table's column
    names and file key."""

    vector: np.ndarray
    bound: float
    rows: int
    heads: bool = False
    private: bool = False
    safe: dict[str, int | float] = field(default_factory=dict)
    site: ConfigRecord | None = None


def metric(metrics: Mapping[str, object], key: str) -> float:
    """A numeric metric of the clear reply, which the sum's layout needs."""
    value = metrics.get(key)
    if not isinstance(value, int | float):
        raise ClientError(f"secure sum: the reply lacks its metric '{key}'")
    return float(value)


def sum_input(
    msg: Message,
    content: RecordDict,
    *,
    lambdas: tuple[float, float],
    privacy: PrivacyPolicy,
    max_abs: float,
    private_heads: bool = False,
) -> SumInput:
    """The [`SumInput`][fedhead.clients.sum_inputs.SumInput] of the clear reply ``content`` to ``msg``: the moment
    exchange (``N_m [1, mu_m, Sigma_m, mu_m mu_m^T]``, or the row-level release), a site-local table's raw
    statistics (or, row unit, its targets' row-level release), a round's head ``N_m [vec W_m, b_m, 1]`` (a private
    head weighted by the public ``K = privacy.dp_max_rows``: one row moves no count), or an evaluation's errors."""
    metrics = content.metric_records.get(protocol.METRICS, MetricRecord())
    safe: dict[str, int | float] = {}
    if protocol.PARTITION_ID in metrics:
        safe[protocol.PARTITION_ID] = int(metric(metrics, protocol.PARTITION_ID))
    rows = max(1, int(metric(metrics, protocol.NUM_EXAMPLES)))
    arrays = content.array_records
    row_release = privacy.row_level and protocol.ROW_RELEASE in arrays
    if protocol.MOMENTS in arrays:  # the moment exchange
        mean, cov = arrays[protocol.MOMENTS][protocol.MEAN].numpy(), arrays[protocol.MOMENTS][protocol.COV].numpy()
        vector = exchange_vector(arrays, metric(metrics, protocol.NUM_EXAMPLES), privacy)
        safe[sr.FULLY_ACTIVE] = int(fully_active(cov, lambdas))
        safe[sr.TARGETS] = int(np.asarray(mean).size)
        return SumInput(vector, sr.moment_bound(max_abs), rows, private=row_release, safe=safe)
    if protocol.SITE_STATS in arrays:  # a site-local table's statistics
        return _statistics_input(content, arrays[protocol.SITE_STATS], privacy, max_abs, rows, safe)
    if protocol.HEAD in arrays:  # a round's trained head
        weight, bias = protocol.read_head(arrays[protocol.HEAD])
        count = float(rows)
        if private_heads:
            assert privacy.dp_max_rows is not None  # the policy refuses dp_noise without it
            count = float(privacy.dp_max_rows)
        cfg = msg.content.config_records.get(protocol.CONFIG)
        rnd = None if cfg is None else cfg.get(protocol.SERVER_ROUND)
        if isinstance(rnd, int):
            safe[protocol.SERVER_ROUND] = rnd
        gap = metrics.get(protocol.TRAINED_GAP)
        if isinstance(gap, int | float):
            safe[sr.LOCAL_OPTIMUM] = int(float(gap) <= LOCAL_GAP_THRESHOLD)
        vector = sr.head_vector(count, weight, bias)
        return SumInput(vector, sr.head_bound(max_abs), rows, heads=True, private=private_heads, safe=safe)
    test = metrics.get(protocol.TEST_MSE)  # an evaluation
    vector = sr.mse_vector(
        metric(metrics, protocol.TRAIN_MSE),
        int(metric(metrics, protocol.NUM_EXAMPLES)),
        None if not isinstance(test, int | float) else float(test),
        int(metric(metrics, protocol.NUM_TEST_EXAMPLES)) if protocol.NUM_TEST_EXAMPLES in metrics else 0,
    )
    return SumInput(vector, sr.MSE_BOUND, rows, safe=safe)


def _statistics_input(
    content: RecordDict, st: ArrayRecord, privacy: PrivacyPolicy, max_abs: float, rows: int, safe: dict
) -> SumInput:
    """A site-local table's exchange: its raw statistics, or, row unit (its files' units), the raw targets'
    row-level release (nothing of the inputs); with its column names and file key."""
    cov = st[protocol.Y_COV].numpy()
    safe[sr.TARGETS] = int(cov.shape[0])
    safe[sr.FEATURES] = int(st[protocol.X_MEAN].numpy().size)
    site = content.config_records[protocol.SITE]
    if privacy.row_level:
        vector = exchange_vector(content.array_records, 0.0, privacy)
        return SumInput(vector, sr.moment_bound(max_abs), rows, private=True, safe=safe, site=site)
    x_mean, x_var = st[protocol.X_MEAN].numpy(), st[protocol.X_VAR].numpy()
    vector = sr.statistics_vector(float(rows), st[protocol.Y_MEAN].numpy(), cov, x_mean, x_var)
    return SumInput(vector, sr.statistics_bound(), rows, safe=safe, site=site)


def exchange_vector(arrays: Mapping[str, ArrayRecord], count: float, privacy: PrivacyPolicy) -> np.ndarray:
    """A site's input to the exchange's sum: ``N_m [1, mu_m, Sigma_m, mu_m mu_m^T]`` of its moment reply, or, with
    ``privacy.dp_unit=row``, the moment step's noised row-level release
    ([`fedhead.federation.row_privacy`][fedhead.federation.row_privacy]), which no further noise is added to."""
    if not privacy.row_level:
        moments = arrays[protocol.MOMENTS]
        return sr.moment_vector(count, moments[protocol.MEAN].numpy(), moments[protocol.COV].numpy())
    if protocol.ROW_RELEASE not in arrays:
        raise ClientError("privacy.dp_unit=row: the moment reply carries no row-level release")
    return arrays[protocol.ROW_RELEASE][protocol.RELEASE].numpy()


def fully_active(cov: np.ndarray, lambdas: tuple[float, float]) -> bool:
    """This site's own margin as pass or fail (theory.md §3)."""
    return bool(fully_active_margins(np.asarray(cov, dtype=np.float64)[None], *lambdas).margins[0] > 0)
