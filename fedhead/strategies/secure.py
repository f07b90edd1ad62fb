"""The server's side of ``privacy.mode=secure``: every sum it needs comes from a secure sum
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]), so it never holds a site's
statistics or head, only their sums over the surviving sites.

[`run_secure_sum`][fedhead.strategies.secure.run_secure_sum] drives stages 2-4 over the grid after a
phase message (stage 1: the sites reply with their public keys);
[`secure_exchange`][fedhead.strategies.secure.secure_exchange] is the one-time exchange of pooled
moments (or a site-local table's pooled statistics). What needs per-site values (``G_star``, the
gap terms, per-site margins, local gaps, ``delta``) is absent, with
[`ABSENT_REASON`][fedhead.strategies.secure.ABSENT_REASON].
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead import ufm
from fedhead.analysis.diagnosis import pooled_diagnosis
from fedhead.analysis.procedure import reference_name
from fedhead.analysis.regime import OutsideRegimeError
from fedhead.analysis.standardization import pooled_standardization, standardized_moments
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.secure_sum import MIN_SITES, PublicKeys, SecureSumError, SecureSumServer, default_threshold
from fedhead.federation.tracking import Targets
from fedhead.strategies.exchange import ConfigValue, ExchangeSettings, MomentExchange, SecureSummary
from fedhead.strategies.failures import Dropped, TooFewReplies, screen
from fedhead.strategies.replies import FederationError, metrics_of
from fedhead.strategies.statistics import RAW_LIMIT, standardization_record

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Why results.json holds no per-site quantity in secure mode.
ABSENT_REASON = (
    "privacy.mode=secure: the server holds only sums over the sites, so G_star, the gap terms, the per-site "
    "margins, outlier scores, local gaps and delta (which need each site's statistics or head) are not computed"
)
#: Quantities that need per-site values (null in a secure run's results.json).
ABSENT = (
    "g_star",
    "gap terms (trace_m_mu, trace_m_sigma, trace_m_a)",
    "margins",
    "outlier_scores",
    "moments.counts/means/covs",
    "targets.grams/client_grams",
    "rounds[t].delta, objective_gaps, trained_gaps, e_f_star, recursion",
)


#: Round scalars of a secure run (``rounds[t].extra``): the sites in the sum, and those of them that
#: report they reached their local optimum (their own pass or fail).
SITES_SUMMED = "secure_sites"
SITES_AT_OPTIMUM = "secure_sites_at_local_optimum"
#: Round scalars under differential privacy: the releases so far (exchange, rounds, evaluations) and their epsilon.
DP_RELEASES = "dp_releases"
DP_EPSILON = "dp_epsilon"


def enforce_reported_regime(exchange: MomentExchange, allow_outside_regime: bool) -> None:
    """Refuse to train when a site reports a non-positive margin of its own, unless allowed (then one warning)."""
    if exchange.diagnosis.fully_active:
        return
    text = (
        f"outside the fully active regime: {exchange.diagnosis.recommendation} (privacy.mode=secure: the server "
        "sees each site's margin only as pass or fail)"
    )
    if not allow_outside_regime:
        raise OutsideRegimeError(f"{text}; set dataset.allow_outside_regime=true to train anyway")
    log.warning("%s; training anyway (dataset.allow_outside_regime=true)", text)


#: The secure sum of the one-time exchange (a phase's sum is ``<kind>-<round>``).
EXCHANGE_SUM = "exchange"


class SecureSumFailed(FederationError):
    """A secure sum cannot finish: too few sites left for its threshold, or a site broke the protocol."""


@dataclass(frozen=True)
class SiteReply:
    """What a site's first reply of a secure sum carries: its keys and its pass/fail self-checks."""

    node: int
    partition: int | None
    keys: PublicKeys
    metrics: Mapping[str, float]
    site: Mapping[str, object] | None = None  # a site-local table's columns and key


@dataclass(frozen=True)
class SecureSum:
    """A finished secure sum: ``total`` over ``survivors`` (node ids) and the sites it ``dropped``."""

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[Dropped, ...]


def parse_site_reply(msg: Message) -> SiteReply:
    """The keys and metrics of a secure phase reply;
    [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] otherwise."""
    node = protocol.node_of(msg)
    try:
        keys = sr.unpack_keys(sr.payload_of(msg.content.config_records.get(sr.SECURE)))
    except (ValueError, KeyError, TypeError) as exc:
        raise agg.ReplyError(node, f"secure reply without valid public keys ({exc})") from None
    metrics = metrics_of(msg)
    values = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    pid = values.get(protocol.PARTITION_ID)
    site = msg.content.config_records.get(protocol.SITE)
    return SiteReply(node, None if pid is None else int(pid), keys, values, None if site is None else dict(site))


def stage_messages(
    payloads: Mapping[int, bytes], sum_name: str, step: str, message_config: Mapping[str, ConfigValue]
) -> list[Message]:
    """One ``query`` per site carrying ``step``'s payload of the sum ``sum_name``."""
    out = []
    for node, payload in payloads.items():
        cfg = ConfigRecord({**message_config, protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: sum_name, sr.STEP: step})
        content = RecordDict({protocol.CONFIG: cfg, sr.SECURE: ConfigRecord({sr.PAYLOAD: payload})})
        out.append(Message(content=content, dst_node_id=int(node), message_type=MessageType.QUERY))
    return out


def run_secure_sum(
    grid: Grid,
    sites: Mapping[int, PublicKeys],
    *,
    sum_id: str,
    name: str,
    length: int,
    bound: float,
    required: int,
    timeout: float,
    threshold: int | None = None,
    message_config: Mapping[str, ConfigValue] | None = None,
    partitions: Mapping[int, int] | None = None,
) -> SecureSum:
    """Stages 2-4 of the secure sum ``sum_id`` (``name`` in messages to people) of the ``sites`` that advertised
    their keys (stage 1).

    ``length`` entries per site, each at most ``bound`` in magnitude
    ([`encoding_for`][fedhead.federation.secure_records.encoding_for]); ``threshold`` of the Shamir shares
    (None: a majority); ``required``: the failure policy's minimum of sites in the sum. A site whose
    reply fails or is invalid before it sent its masked input leaves the sum (a ``Dropped``); a site
    that fails to help unmask is only missing. Fewer than the threshold (or ``required``) left end the
    run with one line ([`SecureSumFailed`][fedhead.strategies.secure.SecureSumFailed] or
    [`TooFewReplies`][fedhead.strategies.failures.TooFewReplies]).
    """
    config = dict(message_config or {})
    if len(sites) < MIN_SITES:
        raise SecureSumFailed(
            f"secure sum of {name}: {len(sites)} sites left, secure mode needs at least {MIN_SITES} (with two, "
            "each learns the other's input from the sum and its own)"
        )
    encoding = sr.encoding_for(bound, len(sites))
    t = threshold if threshold is not None else default_threshold(len(sites))
    try:
        server = SecureSumServer(sorted(sites), length, encoding, threshold=min(max(t, 2), len(sites)))
    except Exception as exc:  # noqa: BLE001 - a threshold or encoding refused for this many sites
        raise SecureSumFailed(f"secure sum of {name}: {exc}") from None
    dropped: list[Dropped] = []

    def ask(
        step: str, payloads: Mapping[int, bytes], parse: Callable[[Message], T], needed: int
    ) -> tuple[dict[int, T], list[Dropped]]:
        replies = grid.send_and_receive(stage_messages(payloads, sum_id, step, config), timeout=timeout)
        kept, lost = screen(
            replies,
            parse,
            stage=f"secure sum of {name} ({step})",
            required=needed,
            expected_nodes=list(payloads),
            timeout=timeout,
            partitions=partitions,
        )
        return {protocol.node_of(m): v for m, v in kept}, lost

    try:
        book = server.collect_keys(dict(sites))
        blob = sr.pack_book(book, server.threshold)
        shares, lost = ask(sr.SHARE_KEYS, dict.fromkeys(book, blob), _parser(sr.unpack_shares), required)
        dropped += lost
        routed = server.route_shares(shares)
        requests = {node: sr.pack_mask_request(routed[node], encoding) for node in routed}
        masked, lost = ask(sr.MASK, requests, _masked, required)
        dropped += lost
        unmasking = server.collect_masked(masked)
        request = sr.pack(unmasking)
        revealed, lost = ask(sr.REVEAL, dict.fromkeys(unmasking.survivors, request), _parser(sr.unpack_revealed), 0)
        for d in lost:  # its input is in the sum; only its shares are missing
            log.info("secure sum of %s: %s did not help unmask (%s)", name, f"node {d.node}", d.reason)
        result = server.unmask(revealed)
    except TooFewReplies:
        raise
    except (SecureSumError, agg.ReplyError) as exc:
        raise SecureSumFailed(f"secure sum of {name}: {exc} (privacy.threshold={server.threshold})") from None
    return SecureSum(result.total, result.survivors, tuple(dropped))


def _parser(unpack: Callable[[bytes], T]) -> Callable[[Message], T]:
    def parse(msg: Message) -> T:
        try:
            return unpack(sr.payload_of(msg.content.config_records.get(sr.SECURE)))
        except (ValueError, KeyError, TypeError) as exc:
            raise agg.ReplyError(protocol.node_of(msg), f"secure step reply does not parse ({exc})") from None

    return parse


def _masked(msg: Message) -> np.ndarray:
    record = msg.content.array_records.get(sr.SECURE)
    if record is None or sr.MASKED not in record:
        raise agg.ReplyError(protocol.node_of(msg), "secure step reply lacks its masked input")
    return record[sr.MASKED].numpy()


# ------------------------------------------------------------------------------------ the exchange
def exchange_messages(node_ids: Sequence[int], settings: ExchangeSettings) -> list[Message]:
    """The first message of the secure exchange: the moment (or statistics) query naming the sum."""
    stage = protocol.STAGE_STATISTICS if settings.site_statistics is not None else protocol.STAGE_MOMENTS
    cfg = {protocol.STAGE: stage, **settings.message_config, sr.SUM_ID: EXCHANGE_SUM}
    return [
        Message(
            content=RecordDict({protocol.CONFIG: ConfigRecord(cfg)}), dst_node_id=int(n), message_type=MessageType.QUERY
        )
        for n in node_ids
    ]


def reported_regime(
    grid: Grid, rows: Sequence[SiteReply], st, assigned: bool, settings: ExchangeSettings
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
                dropped.append(
                    Dropped("moment exchange", r.node, "invalid", f"reports partition {pid} outside 0..{m - 1}")
                )
            elif claims[pid] > 1:
                dropped.append(
                    Dropped("moment exchange", r.node, "invalid", f"partition {pid} is claimed by several nodes", pid)
                )
            else:
                kept.append(r)
        return sorted(kept, key=lambda r: int(r.partition or 0)), False
    ordered = sorted(rows, key=lambda r: (str((r.site or {}).get(protocol.SITE_KEY, "")), r.node))
    return [dataclasses.replace(r, partition=i) for i, r in enumerate(ordered)], True


def secure_exchange(
    settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int], threshold: int | None, *, noised: bool = False
) -> MomentExchange:
    """The one-time exchange in secure mode: each site's keys and self-checks, then one secure sum of
    the count-weighted moments ([`moment_vector`][fedhead.federation.secure_records.moment_vector]; a
    site-local table: its raw statistics, [`statistics_vector`][fedhead.federation.secure_records.statistics_vector]).
    The exchange holds the pooled moments as one row (``Sigma_cen``), ``G_cen`` and ``G_within``, the
    sites' regime as their own pass/fail, and no per-site quantity."""
    stage = "moment exchange"
    replies = grid.send_and_receive(exchange_messages(node_ids, settings), timeout=settings.timeouts.exchange)
    kept, dropped = screen(
        replies,
        parse_site_reply,
        stage=stage,
        required=settings.required,
        expected_nodes=node_ids,
        expected_count=settings.num_clients,
        timeout=settings.timeouts.exchange,
    )
    rows, assigned = _number([r for _, r in kept], settings, dropped)
    site_local = settings.site_statistics is not None
    dims = [(int(r.metrics.get(sr.TARGETS, -1)), int(r.metrics.get(sr.FEATURES, 0))) for r in rows]
    shape = max(set(dims), key=dims.count) if dims else (-1, 0)
    for r, d in zip(list(rows), dims, strict=True):
        if d != shape:
            dropped.append(
                Dropped(
                    stage,
                    r.node,
                    "invalid",
                    f"reports {d[0]} targets and {d[1]} inputs, the run has {shape}",
                    r.partition,
                )
            )
            rows.remove(r)
    if site_local:
        columns = [_columns(r) for r in rows]
        ref = max(set(columns), key=columns.count) if columns else ()
        for r, cols in zip(list(rows), columns, strict=True):
            if cols != ref:
                dropped.append(Dropped(stage, r.node, "invalid", "its columns differ from the run's", r.partition))
                rows.remove(r)
    if len(rows) < settings.required:
        raise TooFewReplies.of(stage, len(rows), settings.num_clients, settings.required, dropped)
    for d in dropped:
        log.warning("%s: dropping %s", stage, d.describe())
    dim, features = shape
    if dim < 1:
        raise FederationError(f"{stage}: the sites report no target count")
    part = {r.node: int(r.partition or 0) for r in rows}
    raw = site_local
    length = sr.moment_length(dim) + (2 * features if raw else 0)
    scale = RAW_LIMIT if raw else settings.trust.max_abs
    summed = run_secure_sum(
        grid,
        {r.node: r.keys for r in rows},
        sum_id=EXCHANGE_SUM,
        name="the exchange",
        length=length,
        bound=sr.COUNT_BOUND * max(1.0, scale) ** 2,
        required=settings.required,
        timeout=settings.timeouts.exchange,
        threshold=threshold,
        message_config=settings.message_config,
        partitions=part,
    )
    dropped += summed.dropped
    survivors = [r for r in rows if r.node in summed.survivors]
    standardization = record = None
    if raw:
        pooled, x_mean, x_var = sr.read_statistics(summed.total, dim, features)
        assert settings.site_statistics is not None
        target_mode, input_mode = settings.site_statistics
        standardization = pooled_standardization(
            [round(pooled.count)],
            [pooled.mean],
            [pooled.cov],
            [x_mean],
            [x_var],
            target_mode=target_mode,
            input_mode=input_mode,
        )
        off, sc = standardization.target_offset, standardization.target_scale
        (mean,), (cov,) = standardized_moments([pooled.mean], [pooled.cov], off, sc)
        _, (within,) = standardized_moments([pooled.mean], [pooled.within], off, sc)
        record = {
            "site_keys": [
                [f"partition {r.partition}", str((r.site or {}).get(protocol.SITE_KEY, ""))] for r in survivors
            ],
            "target_names": [],
            "target_offset": np.asarray(off, dtype=np.float64).tolist(),
            "target_scale": np.asarray(sc, dtype=np.float64).tolist(),
            "input_mean": [np.asarray(x_mean).tolist()],
            "input_var": [np.asarray(x_var).tolist()],
        }
    else:
        pooled = sr.read_moments(summed.total, dim)
        mean, cov, within = pooled.mean, pooled.cov, pooled.within
    if raw:  # the sites check their own margin in the pooled standardisation, known only now
        assert standardization is not None
        passed = reported_regime(grid, survivors, standardization, assigned, settings)
        survivors = [
            dataclasses.replace(r, metrics={**r.metrics, sr.FULLY_ACTIVE: passed.get(r.node, 0)}) for r in survivors
        ]
    count = float(pooled.count)
    if noised:  # differential privacy: a noised covariance may not be PSD
        cov, within = sr.nearest_psd(np.asarray(cov)), sr.nearest_psd(np.asarray(within))
    if not (count >= 1 and np.all(np.isfinite(cov))):
        raise SecureSumFailed(f"{stage}: the secure sum holds no valid pooled moments (count {count:.3g})")
    active = all(r.metrics.get(sr.FULLY_ACTIVE, 0) == 1 for r in survivors)
    moments = ufm.TargetMoments(
        weights=np.ones(1), means=np.asarray(mean)[None], covs=np.asarray(cov)[None], counts=np.array([round(count)])
    )  # one pooled row: sigma_cen is its covariance
    lh, lw = settings.lambda_h, settings.lambda_w
    g_cen = ufm.optimal_gram(np.asarray(cov), lh, lw)
    g_within = ufm.optimal_gram(np.asarray(within), lh, lw)
    c = int(dim)
    targets = Targets(
        g_star=None,
        g_cen=np.asarray(g_cen, dtype=np.float64),
        g_within=np.asarray(g_within, dtype=np.float64),
        grams=np.zeros((0, c, c)),
        client_grams=np.zeros((0, c, c)),
        weights=np.zeros(0),
        reference=reference_name(settings.gamma, settings.centered),
        fully_active=active,
    )
    failing = [r.partition for r in survivors if r.metrics.get(sr.FULLY_ACTIVE, 0) != 1]
    diagnosis = pooled_diagnosis(lh * lw, active, len(survivors) - len(failing), len(survivors), ABSENT_REASON)
    log.info("%s: secure sum over %d sites (pooled count %d)", stage, len(survivors), round(count))
    return MomentExchange(
        moments=moments,
        diagnosis=diagnosis,
        gap=None,
        targets=targets,
        node_ids=tuple(r.node for r in survivors),
        partition_ids=tuple(int(r.partition or 0) for r in survivors),
        dropped=tuple(dropped),
        standardization=standardization,
        assigned_partitions=assigned,
        site_record=record,
        secure=SecureSummary(within=np.asarray(within, dtype=np.float64), count=round(count)),
    )
