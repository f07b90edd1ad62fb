"""The statistics exchange of a site-local ``dataset=table`` run, on the server (no torch, no data).

Each client reads only its own file and reports the raw statistics of its training rows (no row
leaves it); the server pools them into the run's standardisation and the exchange of the
standardised targets ([`collect_statistics`][fedhead.strategies.statistics.collect_statistics]),
and every later message carries the offsets and scales ([`node_messages`][fedhead.strategies.statistics.node_messages]).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead.analysis.standardization import Standardization, pooled_standardization, standardized_moments
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation.secure_records import RAW_LIMIT
from fedhead.strategies.exchange import (
    ConfigValue,
    ExchangeSettings,
    MomentExchange,
    MomentRow,
    build_exchange,
    screen_exchange,
)
from fedhead.strategies.failures import Dropped, TooFewReplies
from fedhead.strategies.replies import metrics_of, partition_of

log = logging.getLogger(__name__)

STAGE = "statistics exchange"


@dataclasses.dataclass(frozen=True)
class StatsRow:
    """One valid statistics reply (raw units)."""

    partition: int | None
    node: int
    key: str
    columns: tuple[str, ...]
    n: int
    mu: np.ndarray
    cov: np.ndarray
    x_mean: np.ndarray
    x_var: np.ndarray


def statistics_messages(node_ids: Iterable[int], message_config: Mapping[str, ConfigValue]) -> list[Message]:
    """One ``query`` per node asking for its raw site statistics."""
    record = RecordDict({protocol.CONFIG: ConfigRecord({protocol.STAGE: protocol.STAGE_STATISTICS, **message_config})})
    return [Message(content=record, dst_node_id=int(n), message_type=MessageType.QUERY) for n in node_ids]


def parse_statistics_reply(msg: Message) -> StatsRow:
    """The validated statistics of one reply;
    [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] otherwise."""
    node = protocol.node_of(msg)
    content = msg.content
    if protocol.SITE_STATS not in content.array_records or protocol.SITE not in content.config_records:
        raise agg.ReplyError(node, f"statistics reply lacks the '{protocol.SITE_STATS}' or '{protocol.SITE}' record")
    arrays, site, metrics = (
        content.array_records[protocol.SITE_STATS],
        content.config_records[protocol.SITE],
        metrics_of(msg),
    )
    missing = [k for k in (protocol.Y_MEAN, protocol.Y_COV, protocol.X_MEAN, protocol.X_VAR) if k not in arrays]
    if missing or protocol.COLUMNS not in site or protocol.SITE_KEY not in site or protocol.NUM_EXAMPLES not in metrics:
        raise agg.ReplyError(
            node, f"statistics reply lacks {missing or [protocol.COLUMNS, protocol.SITE_KEY, protocol.NUM_EXAMPLES]}"
        )
    n, mu, cov = agg.validate_moments(
        metrics[protocol.NUM_EXAMPLES], arrays[protocol.Y_MEAN].numpy(), arrays[protocol.Y_COV].numpy(), node_id=node
    )
    x_mean = agg.validate_array(arrays[protocol.X_MEAN].numpy(), None, node_id=node, name="input means")
    x_var = agg.validate_array(arrays[protocol.X_VAR].numpy(), x_mean.shape, node_id=node, name="input variances")
    if x_mean.ndim != 1 or np.any(x_var < 0):
        raise agg.ReplyError(node, "input means and variances must be vectors, variances >= 0")
    for name, values in (
        ("target means", mu),
        ("target standard deviations", np.sqrt(np.abs(np.diag(cov)))),
        ("input means", x_mean),
        ("input standard deviations", np.sqrt(x_var)),
    ):
        agg.check_magnitude(values, RAW_LIMIT, node_id=node, name=name, rule="beyond what float64 can pool")
    pid = None if protocol.PARTITION_ID not in metrics else partition_of(msg)
    names = site[protocol.COLUMNS]
    if not isinstance(names, list):
        raise agg.ReplyError(node, f"statistics reply: '{protocol.COLUMNS}' must be a list of column names")
    columns = tuple(str(c) for c in names)
    return StatsRow(pid, node, str(site[protocol.SITE_KEY]), columns, n, mu, cov, x_mean, x_var)


def refuse_other_columns(
    rows: Sequence[StatsRow], dropped: list[Dropped], *, required: int, expected: int
) -> list[StatsRow]:
    """The rows whose column signature is the run's (the one most nodes share; ties: the
    smallest site key); the others are refused, one line naming the node, under the failure policy."""
    count = Counter(r.columns for r in rows)
    ref = min(count, key=lambda cols: (-count[cols], min(r.key for r in rows if r.columns == cols)), default=())
    kept = []
    for r in rows:
        if r.columns == ref:
            kept.append(r)
            continue
        missing, extra = sorted(set(ref) - set(r.columns)), sorted(set(r.columns) - set(ref))
        reason = f"its columns differ from the run's (missing {missing}, extra {extra})"
        dropped.append(Dropped(STAGE, r.node, "invalid", reason, r.partition))
    if len(kept) < required:
        raise TooFewReplies.of(STAGE, len(kept), expected, required, dropped)
    for d in dropped:
        if "columns differ" in d.reason:
            log.warning("%s: refusing %s; continuing with %d of %d clients", STAGE, d.describe(), len(kept), expected)
    return kept


def refuse_duplicate_sites(rows: Sequence[StatsRow], dropped: list[Dropped]) -> list[StatsRow]:
    """The rows whose site key (the sha256 of the site's file) no other node reported; nodes that
    share a key are all refused (the same rows must not count twice, and the server cannot tell
    which node holds the file), one line each."""
    nodes: dict[str, list[int]] = {}
    for r in rows:
        nodes.setdefault(r.key, []).append(r.node)
    kept = []
    for r in rows:
        if len(nodes[r.key]) == 1:
            kept.append(r)
            continue
        others = [n for n in nodes[r.key] if n != r.node]
        reason = f"its file is byte-identical to that of node(s) {others} (site key {r.key}): none of them is used"
        dropped.append(Dropped(STAGE, r.node, "invalid", reason, r.partition))
        log.warning("%s: refusing node %s: %s", STAGE, r.node, reason)
    return kept


def number_clients(rows: Sequence[StatsRow]) -> tuple[list[StatsRow], bool]:
    """Rows with partition ids: the reported ones when every node has one, else ``0..M-1`` by
    (site key, node id) and True (the server's numbering, sent with every message)."""
    if all(r.partition is not None for r in rows):
        return list(rows), False
    ordered = sorted(rows, key=lambda r: (r.key, r.node))
    return [dataclasses.replace(r, partition=i) for i, r in enumerate(ordered)], True


def exchange_from_statistics(
    rows: Sequence[StatsRow], dropped: Sequence[Dropped], settings: ExchangeSettings
) -> MomentExchange:
    """The exchange of the standardised targets from the raw statistics: the pooled
    standardisation ([`pooled_standardization`][fedhead.analysis.standardization.pooled_standardization]),
    the exact moments of the standardised targets
    ([`standardized_moments`][fedhead.analysis.standardization.standardized_moments]), then
    [`build_exchange`][fedhead.strategies.exchange.build_exchange]."""
    if settings.site_statistics is None:
        raise ValueError("the statistics exchange needs settings.site_statistics (the standardisation modes)")
    target_mode, input_mode = settings.site_statistics
    counts = [r.n for r in rows]
    st = pooled_standardization(
        counts,
        [r.mu for r in rows],
        [r.cov for r in rows],
        [r.x_mean for r in rows],
        [r.x_var for r in rows],
        target_mode=target_mode,
        input_mode=input_mode,
    )
    mus, covs = standardized_moments([r.mu for r in rows], [r.cov for r in rows], st.target_offset, st.target_scale)
    moment_rows: list[MomentRow] = []
    for i, r in enumerate(rows):
        if r.partition is None:
            raise ValueError(f"node {r.node} has no partition id: number the clients first (number_clients)")
        moment_rows.append((r.partition, r.node, r.n, mus[i], covs[i]))
    exchange = build_exchange(moment_rows, dropped, settings)
    used = sorted((r for r in rows if r.partition in exchange.partition_ids), key=lambda r: r.partition or 0)
    record = {
        "site_keys": [[f"partition {r.partition}", r.key] for r in used],
        "target_names": [],
        "target_offset": np.asarray(st.target_offset, dtype=np.float64).tolist(),
        "target_scale": np.asarray(st.target_scale, dtype=np.float64).tolist(),
        "input_mean": [r.x_mean.tolist() for r in used],
        "input_var": [r.x_var.tolist() for r in used],
    }
    return dataclasses.replace(exchange, standardization=st, site_record=record)


def collect_statistics(
    replies: Iterable[Message], settings: ExchangeSettings, *, expected_nodes: Sequence[int] | None
) -> MomentExchange:
    """The exchange of the statistics replies: ``(N_m, mu_m, Sigma_m)`` of the targets, per-feature
    input ``(mean, variance)``, the file's column signature and key.

    1. screens the replies with the failure policy
       ([`screen_exchange`][fedhead.strategies.exchange.screen_exchange]; a SuperNode without
       ``data-path`` answers with an error naming itself);
    2. refuses nodes that report the same site file
       ([`refuse_duplicate_sites`][fedhead.strategies.statistics.refuse_duplicate_sites]) and the nodes
       whose columns differ from the run's
       ([`refuse_other_columns`][fedhead.strategies.statistics.refuse_other_columns]);
    3. numbers the clients when the SuperNodes have no ``partition-id`` (by site key, then node
       id: stable across restarts); the number then travels in every message's config;
    4. pools the statistics and turns the raw target moments into those of the standardised
       targets exactly ([`exchange_from_statistics`][fedhead.strategies.statistics.exchange_from_statistics]).
    """
    kept, dropped = screen_exchange(
        replies, parse_statistics_reply, settings, stage=STAGE, expected_nodes=expected_nodes
    )
    unique = refuse_duplicate_sites([r for _, r in kept], dropped)
    rows = refuse_other_columns(unique, dropped, required=settings.required, expected=settings.num_clients)
    rows, assigned = number_clients(rows)
    exchange = exchange_from_statistics(rows, dropped, settings)
    return dataclasses.replace(exchange, assigned_partitions=assigned)


def exchange_statistics(settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> MomentExchange:
    """The statistics exchange over ``grid`` (replaces the moment query of a site-local table run)."""
    messages = statistics_messages(node_ids, settings.message_config)
    replies = grid.send_and_receive(messages, timeout=settings.timeouts.exchange)
    return collect_statistics(replies, settings, expected_nodes=node_ids)


def standardization_record(st: Standardization) -> ArrayRecord:
    """The federation's offsets and scales as the record every message of the run carries."""
    return ArrayRecord(
        {
            protocol.TARGET_OFFSET: Array(np.asarray(st.target_offset, dtype=np.float64)),
            protocol.TARGET_SCALE: Array(np.asarray(st.target_scale, dtype=np.float64)),
            protocol.INPUT_OFFSET: Array(np.asarray(st.input_offset, dtype=np.float64)),
            protocol.INPUT_SCALE: Array(np.asarray(st.input_scale, dtype=np.float64)),
        }
    )


def node_messages(
    content: RecordDict, node_ids: Sequence[int], message_type: str, exchange: MomentExchange | None
) -> list[Message]:
    """One message per node: ``content`` as it is, or, after a statistics exchange, with the
    standardisation record and (server numbering) the node's partition id in its config."""
    if exchange is None or exchange.standardization is None:
        return [Message(content=content, dst_node_id=int(n), message_type=message_type) for n in node_ids]
    st = exchange.standardization
    part = dict(zip(exchange.node_ids, exchange.partition_ids))
    record = standardization_record(st)
    out = []
    for n in node_ids:
        own = RecordDict({k: v for k, v in content.items()})
        own[protocol.STANDARDIZATION] = record
        if exchange.assigned_partitions:
            cfg = ConfigRecord(dict(content.config_records.get(protocol.CONFIG, ConfigRecord())))
            cfg[protocol.PARTITION_ID] = int(part[int(n)])
            own[protocol.CONFIG] = cfg
        out.append(Message(content=own, dst_node_id=int(n), message_type=message_type))
    return out
