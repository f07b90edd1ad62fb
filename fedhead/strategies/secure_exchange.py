"""The one-time exchange of ``privacy.mode=secure``, in named steps
([`secure_exchange`][fedhead.strategies.secure_exchange.secure_exchange] chains them):

1. screening ([`screen_sites`][fedhead.strategies.secure_exchange.screen_sites]): each site's keys and
   self-checks, the sites that take part numbered, those that disagree on the shape refused;
2. the secure sum of the count-weighted moments
   ([`sum_moments`][fedhead.strategies.secure_exchange.sum_moments]; a site-local table: its raw
   statistics);
3. standardisation ([`standardize`][fedhead.strategies.secure_exchange.standardize]): the pooled
   moments, of the standardised targets for a site-local table;
4. votes ([`collect_votes`][fedhead.strategies.secure_exchange.collect_votes]): a site-local table's
   sites check their own margin in the pooled standardisation;
5. the regime check ([`pooled_exchange`][fedhead.strategies.secure_exchange.pooled_exchange]): the
   exchange of one pooled row, ``G_cen``, ``G_within`` and the sites' regime as their own pass or fail.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead import ufm
from fedhead.analysis.diagnosis import pooled_diagnosis
from fedhead.analysis.procedure import reference_name
from fedhead.analysis.standardization import Standardization, pooled_standardization, standardized_moments
from fedhead.federation import protocol
from fedhead.federation import row_privacy as rp
from fedhead.federation import secure_records as sr
from fedhead.federation.tracking import Targets
from fedhead.strategies.exchange import ExchangeSettings, MomentExchange, SecureSummary, screen_exchange
from fedhead.strategies.failures import Dropped, TooFewReplies
from fedhead.strategies.replies import FederationError
from fedhead.strategies.secure import (
    ABSENT_REASON,
    EXCHANGE_SUM,
    FIRST_ROUND_SUM,
    SecureSum,
    SecureSumFailed,
    SiteReply,
    SumSetup,
    parse_site_reply,
    run_secure_sum,
)
from fedhead.strategies.secure_steps import SumMessages
from fedhead.strategies.statistics import standardization_record

log = logging.getLogger(__name__)

STAGE = "moment exchange"


@dataclass(frozen=True)
class ExchangeSites:
    """The sites that take part in the secure exchange (``rows``, with partition ids; ``assigned``:
    numbered by the server), those dropped so far, and the run's ``dim`` targets and ``features`` inputs."""

    rows: list[SiteReply]
    assigned: bool
    dropped: list[Dropped]
    dim: int
    features: int


@dataclass(frozen=True)
class PooledExchange:
    """What the exchange's secure sum gives before the targets: the pooled ``count``, ``mean``, ``cov`` and
    ``within`` (one row), the surviving ``sites`` (with their own regime vote), every dropped site, and a
    site-local table's pooled ``standardization`` and ``record`` (what a resume must find again)."""

    count: float
    mean: np.ndarray
    cov: np.ndarray
    within: np.ndarray
    sites: list[SiteReply]
    dropped: list[Dropped]
    assigned: bool
    standardization: Standardization | None = None
    record: Mapping[str, Any] | None = None

    def nearest_psd(self) -> PooledExchange:
        """The same with both covariances made PSD ([`nearest_psd`][fedhead.federation.secure_records.nearest_psd]:
        a noised sum's may not be)."""
        cov, within = sr.nearest_psd(np.asarray(self.cov)), sr.nearest_psd(np.asarray(self.within))
        return dataclasses.replace(self, cov=cov, within=within)


def exchange_messages(node_ids: Sequence[int], settings: ExchangeSettings, setup: SumSetup) -> list[Message]:
    """The first message of the secure exchange: the moment (or statistics) query naming the sum and the first
    round's, which the exchange's messages set up."""
    stage = protocol.STAGE_STATISTICS if settings.site_statistics is not None else protocol.STAGE_MOMENTS
    cfg = {
        protocol.STAGE: stage,
        **settings.message_config,
        sr.SUM_ID: setup.sum_id(EXCHANGE_SUM),
        sr.NEXT_SUM: setup.sum_id(FIRST_ROUND_SUM),
    }
    return [
        Message(
            content=RecordDict({protocol.CONFIG: ConfigRecord(cfg)}), dst_node_id=int(n), message_type=MessageType.QUERY
        )
        for n in node_ids
    ]


def _columns(row: SiteReply) -> tuple[str, ...]:
    """A site-local table's column names, as its reply lists them (empty when it sent none)."""
    names = (row.site or {}).get(protocol.COLUMNS)
    return tuple(str(c) for c in names) if isinstance(names, list) else ()


def _number(
    rows: Sequence[SiteReply], settings: ExchangeSettings, dropped: list[Dropped]
) -> tuple[list[SiteReply], bool]:
    """The sites that take part, with partition ids: reported ones (duplicates and ids outside
    ``0..M-1`` refused), else ``0..M-1`` by (site key, node) as the clear statistics exchange numbers them."""
    m = settings.num_clients
    if all(r.partition is not None for r in rows):
        claims: dict[int, int] = {}
        for r in rows:
            claims[int(r.partition or 0)] = claims.get(int(r.partition or 0), 0) + 1
        kept = []
        for r in rows:
            pid = int(r.partition or 0)
            if not 0 <= pid < m:
                dropped.append(Dropped(STAGE, r.node, "invalid", f"reports partition {pid} outside 0..{m - 1}"))
            elif claims[pid] > 1:
                dropped.append(Dropped(STAGE, r.node, "invalid", f"partition {pid} is claimed by several nodes", pid))
            else:
                kept.append(r)
        return sorted(kept, key=lambda r: int(r.partition or 0)), False
    ordered = sorted(rows, key=lambda r: (str((r.site or {}).get(protocol.SITE_KEY, "")), r.node))
    return [dataclasses.replace(r, partition=i) for i, r in enumerate(ordered)], True


def _refuse_odd(rows: list[SiteReply], values: Sequence[Hashable], reason: str, dropped: list[Dropped]) -> Any:
    """The value most ``rows`` report (``values``, one per row; None without rows); a row that reports
    another is refused: removed from ``rows``, one ``Dropped`` whose reason is ``reason`` formatted with
    its ``value`` and the ``run``'s."""
    ref = max(set(values), key=list(values).count) if values else None
    for r, v in zip(list(rows), values, strict=True):
        if v != ref:
            dropped.append(Dropped(STAGE, r.node, "invalid", reason.format(value=v, run=ref), r.partition))
            rows.remove(r)
    return ref


def screen_sites(settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int], setup: SumSetup) -> ExchangeSites:
    """Step 1: the exchange's first message and each site's keys and self-checks, screened by the failure
    policy; the sites numbered (their own partition ids, else by site key and node) and those that report
    another shape (targets, inputs) or, in a site-local table run, other columns refused."""
    replies = grid.send_and_receive(exchange_messages(node_ids, settings, setup), timeout=settings.timeouts.exchange)
    kept, dropped = screen_exchange(replies, parse_site_reply, settings, stage=STAGE, expected_nodes=node_ids)
    rows, assigned = _number([r for _, r in kept], settings, dropped)
    dims = [(int(r.metrics.get(sr.TARGETS, -1)), int(r.metrics.get(sr.FEATURES, 0))) for r in rows]
    shape = _refuse_odd(rows, dims, "reports {value[0]} targets and {value[1]} inputs, the run has {run}", dropped)
    if settings.site_statistics is not None:
        _refuse_odd(rows, [_columns(r) for r in rows], "its columns differ from the run's", dropped)
    if len(rows) < settings.required:
        raise TooFewReplies.of(STAGE, len(rows), settings.num_clients, settings.required, dropped)
    for d in dropped:
        log.warning("%s: dropping %s", STAGE, d.describe())
    dim, features = shape or (-1, 0)
    if dim < 1:
        raise FederationError(f"{STAGE}: the sites report no target count")
    return ExchangeSites(rows, assigned, dropped, dim, features)


def sum_moments(grid: Grid, sites: ExchangeSites, settings: ExchangeSettings, setup: SumSetup) -> SecureSum:
    """Step 2: the secure sum of the sites' count-weighted moments
    ([`moment_vector`][fedhead.federation.secure_records.moment_vector]; a site-local table: its raw
    statistics, [`statistics_vector`][fedhead.federation.secure_records.statistics_vector])."""
    raw = settings.site_statistics is not None
    sums = SumMessages(
        grid,
        setup.sum_id(EXCHANGE_SUM),
        "the exchange",
        settings.timeouts.exchange,
        settings.required,
        settings.message_config,
        {r.node: int(r.partition or 0) for r in sites.rows},
    )
    return run_secure_sum(
        sums,
        {r.node: r.keys for r in sites.rows if r.keys is not None},
        length=rp.release_length(sites.dim)
        if settings.row_level
        else sr.moment_length(sites.dim) + (2 * sites.features if raw else 0),
        bound=sr.statistics_bound() if raw and not settings.row_level else sr.moment_bound(settings.trust.max_abs),
        setup=setup,
        next_keys={r.node: r.next_keys for r in sites.rows if r.next_keys is not None},
        next_sum=setup.sum_id(FIRST_ROUND_SUM),
    )


def standardize(summed: SecureSum, sites: ExchangeSites, settings: ExchangeSettings) -> PooledExchange:
    """Step 3: the pooled moments of the sum's survivors (``privacy.dp_unit=row``: of their row-level releases,
    [`pooled_moments`][fedhead.federation.row_privacy.pooled_moments]); for a site-local table, of its targets in the
    pooled standardisation ([`pooled_standardization`][fedhead.analysis.standardization.pooled_standardization])."""
    survivors = [r for r in sites.rows if r.node in summed.survivors]
    dropped = [*sites.dropped, *summed.dropped]
    if settings.row_level:  # the row-level releases' sum (post-processing of the noised statistics)
        if not summed.total[0] > 0:
            raise SecureSumFailed(f"{STAGE}: the noised count of the rows is not positive (too few rows for the noise)")
        rows = rp.pooled_moments(summed.total, sites.dim)
        if settings.site_statistics is None:
            return PooledExchange(rows.count, rows.mean, rows.cov, rows.within, survivors, dropped, sites.assigned)
        # a site-local table in its files' units (PrivacyPolicy.check_units): nothing standardised, no input released
        target_mode, input_mode = settings.site_statistics
        st = pooled_standardization([1], [rows.mean], [rows.cov], target_mode=target_mode, input_mode=input_mode)
        record = _standardization_record(survivors, st, [], [])
        return PooledExchange(
            rows.count, rows.mean, rows.cov, rows.within, survivors, dropped, sites.assigned, st, record
        )
    if settings.site_statistics is None:
        pooled = sr.read_moments(summed.total, sites.dim)
        mean, cov, within = pooled.mean, pooled.cov, pooled.within
        return PooledExchange(float(pooled.count), mean, cov, within, survivors, dropped, sites.assigned)
    pooled, x_mean, x_var = sr.read_statistics(summed.total, sites.dim, sites.features)
    target_mode, input_mode = settings.site_statistics
    st = pooled_standardization(
        [round(pooled.count)],
        [pooled.mean],
        [pooled.cov],
        [x_mean],
        [x_var],
        target_mode=target_mode,
        input_mode=input_mode,
    )
    off, sc = st.target_offset, st.target_scale
    (mean,), (cov,) = standardized_moments([pooled.mean], [pooled.cov], off, sc)
    _, (within,) = standardized_moments([pooled.mean], [pooled.within], off, sc)
    record = _standardization_record(survivors, st, [np.asarray(x_mean).tolist()], [np.asarray(x_var).tolist()])
    count = float(pooled.count)
    return PooledExchange(count, mean, cov, within, survivors, dropped, sites.assigned, st, record)


def _standardization_record(survivors: Sequence[SiteReply], st: Standardization, input_mean: list, input_var: list):
    """The run's record of a site-local table's standardisation (what a resume must find again)."""
    return {
        "site_keys": [[f"partition {r.partition}", str((r.site or {}).get(protocol.SITE_KEY, ""))] for r in survivors],
        "target_names": [],
        "target_offset": np.asarray(st.target_offset, dtype=np.float64).tolist(),
        "target_scale": np.asarray(st.target_scale, dtype=np.float64).tolist(),
        "input_mean": input_mean,
        "input_var": input_var,
    }


def reported_regime(
    grid: Grid, rows: Sequence[SiteReply], st: Standardization, assigned: bool, settings: ExchangeSettings
) -> dict[int, float]:
    """Each site's own margin as pass (1) or fail (0), for its targets in the pooled standardisation ``st``
    (a ``stage="regime"`` query); a site that does not answer counts as failing."""
    record = standardization_record(st)
    messages = []
    for r in rows:
        cfg = ConfigRecord({protocol.STAGE: sr.STAGE_REGIME, **settings.message_config})
        if assigned:
            cfg[protocol.PARTITION_ID] = int(r.partition or 0)
        content = RecordDict({protocol.CONFIG: cfg, protocol.STANDARDIZATION: record})
        messages.append(Message(content=content, dst_node_id=int(r.node), message_type=MessageType.QUERY))
    out: dict[int, float] = {}
    for msg in grid.send_and_receive(messages, timeout=settings.timeouts.exchange):
        if not msg.has_error():
            value = msg.content.metric_records.get(protocol.METRICS, {}).get(sr.FULLY_ACTIVE)
            out[protocol.node_of(msg)] = 1.0 if value == 1 else 0.0
    return out


def collect_votes(grid: Grid, pooled: PooledExchange, settings: ExchangeSettings) -> PooledExchange:
    """Step 4: a site-local table's sites vote on their own margin in the pooled standardisation, known
    only now ([`reported_regime`][fedhead.strategies.secure_exchange.reported_regime]); the other sites
    voted in their first reply."""
    if pooled.standardization is None:
        return pooled
    passed = reported_regime(grid, pooled.sites, pooled.standardization, pooled.assigned, settings)
    sites = [
        dataclasses.replace(r, metrics={**r.metrics, sr.FULLY_ACTIVE: passed.get(r.node, 0)}) for r in pooled.sites
    ]
    return dataclasses.replace(pooled, sites=sites)


def pooled_exchange(pooled: PooledExchange, settings: ExchangeSettings) -> MomentExchange:
    """Step 5: the exchange of one pooled row (``Sigma_cen``), ``G_cen`` and ``G_within``, and the regime as
    the sites report it (fully active when every one passes); no per-site quantity."""
    count, cov, within = pooled.count, np.asarray(pooled.cov), np.asarray(pooled.within)
    if not (count >= 1 and np.all(np.isfinite(cov))):
        raise SecureSumFailed(f"{STAGE}: the secure sum holds no valid pooled moments (count {count:.3g})")
    survivors = pooled.sites
    active = all(r.metrics.get(sr.FULLY_ACTIVE, 0) == 1 for r in survivors)
    moments = ufm.TargetMoments(
        weights=np.ones(1), means=np.asarray(pooled.mean)[None], covs=cov[None], counts=np.array([round(count)])
    )  # one pooled row: sigma_cen is its covariance
    lh, lw = settings.lambda_h, settings.lambda_w
    c = int(cov.shape[0])
    targets = Targets(
        g_star=None,
        g_cen=np.asarray(ufm.optimal_gram(cov, lh, lw), dtype=np.float64),
        g_within=np.asarray(ufm.optimal_gram(within, lh, lw), dtype=np.float64),
        grams=np.zeros((0, c, c)),
        client_grams=np.zeros((0, c, c)),
        weights=np.zeros(0),
        reference=reference_name(settings.gamma, settings.centered),
        fully_active=active,
    )
    failing = [r.partition for r in survivors if r.metrics.get(sr.FULLY_ACTIVE, 0) != 1]
    diagnosis = pooled_diagnosis(lh * lw, active, len(survivors) - len(failing), len(survivors), ABSENT_REASON)
    log.info("%s: secure sum over %d sites (pooled count %d)", STAGE, len(survivors), round(count))
    return MomentExchange(
        moments=moments,
        diagnosis=diagnosis,
        gap=None,
        targets=targets,
        node_ids=tuple(r.node for r in survivors),
        partition_ids=tuple(int(r.partition or 0) for r in survivors),
        dropped=tuple(pooled.dropped),
        standardization=pooled.standardization,
        assigned_partitions=pooled.assigned,
        site_record=pooled.record,
        secure=SecureSummary(within=np.asarray(within, dtype=np.float64), count=round(count)),
    )


def pool_sites(settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int], setup: SumSetup) -> PooledExchange:
    """Steps 1 to 4: the sites screened, their secure sum, its pooled moments and the sites' votes."""
    sites = screen_sites(settings, grid, node_ids, setup)
    summed = sum_moments(grid, sites, settings, setup)
    return collect_votes(grid, standardize(summed, sites, settings), settings)


def secure_exchange(settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int], setup: SumSetup) -> MomentExchange:
    """The one-time exchange in secure mode: steps 1 to 5 (``setup``: the run's roster and threshold)."""
    return pooled_exchange(pool_sites(settings, grid, node_ids, setup), settings)
