"""The one-time moment exchange before round 1, on the server (no torch, no data layer).

The server waits for the SuperNodes ([`wait_for_nodes`][fedhead.strategies.exchange.wait_for_nodes]),
asks each for ``(N_m, mu_m, Sigma_m)`` ([`query_moments`][fedhead.strategies.exchange.query_moments])
and turns the valid replies into a [`MomentExchange`][fedhead.strategies.MomentExchange]
([`build_exchange`][fedhead.strategies.exchange.build_exchange]): the moments, the diagnosis and the
reference Grams every round is measured against. What it reads of its strategy is an
[`ExchangeSettings`][fedhead.strategies.exchange.ExchangeSettings]. In secure mode the exchange is
[`secure_exchange`][fedhead.strategies.secure_exchange.secure_exchange] instead.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead import ufm
from fedhead.analysis.consistency import outlier_scores
from fedhead.analysis.diagnosis import Diagnosis, diagnose
from fedhead.analysis.regime import OutsideRegimeWarning, ensure_fully_active
from fedhead.analysis.standardization import Standardization
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation.deploy_checks import FederationMismatch, check_node_count
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.federation.tracking import Targets, reference_targets
from fedhead.settings.limits import Timeouts
from fedhead.settings.trust import TrustPolicy
from fedhead.strategies.failures import Dropped, TooFewReplies, screen
from fedhead.strategies.replies import metrics_of, partition_of

log = logging.getLogger(__name__)

#: One valid moment reply: ``(partition id, node id, N_m, mu_m (C,), Sigma_m (C, C))``.
MomentRow = tuple[int, int, int, np.ndarray, np.ndarray]
#: A value of a message's ``config`` record.
ConfigValue = int | float | str | bool
T = TypeVar("T")


@dataclass(frozen=True)
class ExchangeSettings:
    """What the exchange, the node wait and the failure policy of every phase read; built once
    by the strategy ([`fedhead.strategies.head_averaging.HeadAveraging`][fedhead.strategies.HeadAveraging]).

    Attributes
    ----------
    lambda_h, lambda_w : float
        Penalties of the local objective (theory.md §2): the diagnosis and the reference Grams.
    gamma : float
        The clients' moment-correction strength (theory.md §8).
    centered : bool
        Whether the clients centre their targets (the reference Gram becomes ``G_within``).
    num_clients : int
        SuperNodes expected; all take part in every phase.
    required : int
        Valid replies a phase needs (``failure.min_clients``; fewer stop the run).
    timeouts : Timeouts
        Deadlines of the node wait, the exchange and each phase.
    message_config : Mapping
        Entries added to every message's ``config`` record (read-only).
    site_statistics : (str, str) or None
        ``(standardize_targets, standardize_inputs)`` of a site-local table run, whose statistics exchange
        ([`fedhead.strategies.statistics`][fedhead.strategies.statistics]) replaces the moment query.
    trust : TrustPolicy
        What a reply may claim ([`fedhead.settings.trust.TrustPolicy`][fedhead.settings.trust.TrustPolicy]).
    row_level : bool
        ``privacy.dp_unit=row``: the secure exchange sums the sites' row-level releases
        ([`fedhead.federation.row_privacy`][fedhead.federation.row_privacy]) instead of their moments.
    """

    lambda_h: float
    lambda_w: float
    gamma: float
    centered: bool
    num_clients: int
    required: int
    timeouts: Timeouts
    message_config: Mapping[str, ConfigValue]
    site_statistics: tuple[str, str] | None = None
    trust: TrustPolicy = TrustPolicy()
    row_level: bool = False


@dataclass(frozen=True)
class SecureSummary:
    """What a secure exchange ([`secure_exchange`][fedhead.strategies.secure_exchange.secure_exchange]) knows
    beyond its one pooled row of moments: ``Sigma_within`` ``(C, C)`` and the pooled count ``N``."""

    within: np.ndarray
    count: int


@dataclass(frozen=True)
class MomentExchange:
    """Outcome of the one-time moment exchange before round 1."""

    moments: ufm.TargetMoments
    diagnosis: Diagnosis
    gap: ufm.GapDecomposition | None  # None outside the fully active regime
    targets: Targets  # g_star None outside the fully active regime
    node_ids: tuple[int, ...]  # ordered by partition id (the clients that take part)
    partition_ids: tuple[int, ...]
    dropped: tuple[Dropped, ...] = ()  # clients left out by the failure policy
    #: after a statistics exchange ([`fedhead.strategies.statistics`][fedhead.strategies.statistics]):
    #: the pooled offsets and scales every message carries, and whether the server numbered the clients
    standardization: Standardization | None = None
    assigned_partitions: bool = False
    #: after a statistics exchange: what a resume must find again (site keys by partition, the
    #: pooled target standardisation, each site's input means and variances; JSON-ready)
    site_record: Mapping[str, Any] | None = None
    #: in secure mode (``privacy.mode=secure``): the moments are one pooled row and no per-site value is known
    secure: SecureSummary | None = None

    def sample_counts(self) -> dict[int, int]:
        """Partition id -> ``N_m``, as the clients reported them in the exchange."""
        counts = self.moments.counts
        if counts is None:  # build_exchange always records them
            raise RuntimeError("the moment exchange holds no sample counts")
        return {pid: int(n) for pid, n in zip(self.partition_ids, counts)}


def wait_for_nodes(grid: Grid, min_nodes: int, timeout: float) -> list[int]:
    """Exactly ``min_nodes`` connected SuperNodes (sorted ids), waiting at most ``timeout`` seconds.

    Polls ``grid.get_node_ids()`` (and, on a
    [`ProgressGrid`][fedhead.federation.progress_grid.ProgressGrid], its ``check_alive()``: a dead
    simulation engine ends the wait); after ``timeout`` (``timeouts.nodes``), or with too many
    nodes, [`fedhead.federation.deploy_checks.FederationMismatch`][fedhead.federation.deploy_checks.FederationMismatch]
    names the nodes and the remedy.
    """
    t0 = time.monotonic()
    next_log = t0 + 5.0
    while len(nodes := list(grid.get_node_ids())) < min_nodes:
        if isinstance(grid, ProgressGrid):
            grid.check_alive()
        now = time.monotonic()
        if now - t0 > timeout:
            try:
                check_node_count(nodes, min_nodes)
            except FederationMismatch as exc:
                raise FederationMismatch(f"after waiting {timeout:g} s (timeouts.nodes): {exc}") from None
        if now >= next_log:
            log.info("waiting for SuperNodes: %d connected of %d (timeouts.nodes=%g s)", len(nodes), min_nodes, timeout)
            next_log = now + 5.0
        time.sleep(0.2)
    return check_node_count(grid.get_node_ids(), min_nodes)


def query_messages(node_ids: Iterable[int], message_config: Mapping[str, ConfigValue]) -> list[Message]:
    """One ``query`` message per node asking for ``(N_m, mu_m, Sigma_m)``."""
    record = RecordDict({protocol.CONFIG: ConfigRecord({protocol.STAGE: protocol.STAGE_MOMENTS, **message_config})})
    return [Message(content=record, dst_node_id=int(n), message_type=MessageType.QUERY) for n in node_ids]


def parse_moment_reply(msg: Message) -> MomentRow:
    """The validated moments of one query reply;
    [`fedhead.federation.aggregation.ReplyError`][fedhead.federation.aggregation.ReplyError] otherwise
    (a missing record, array or count; non-finite, asymmetric or non-PSD moments)."""
    node = protocol.node_of(msg)
    if protocol.MOMENTS not in msg.content.array_records:
        raise agg.ReplyError(node, f"query reply lacks the '{protocol.MOMENTS}' ArrayRecord")
    arrays = msg.content.array_records[protocol.MOMENTS]
    metrics = metrics_of(msg)
    if protocol.NUM_EXAMPLES not in metrics:
        raise agg.ReplyError(node, f"query reply metrics lack '{protocol.NUM_EXAMPLES}'")
    pid = partition_of(msg)
    for key in (protocol.MEAN, protocol.COV):
        if key not in arrays:
            raise agg.ReplyError(node, f"query reply lacks the array '{key}'")
    n, mu, cov = agg.validate_moments(
        metrics[protocol.NUM_EXAMPLES],
        arrays[protocol.MEAN].numpy(),
        arrays[protocol.COV].numpy(),
        node_id=f"{node} (partition {pid})",
    )
    return pid, node, n, mu, cov


def screen_rows(
    rows: Sequence[MomentRow], settings: ExchangeSettings, stage: str = "moment exchange"
) -> tuple[list[MomentRow], list[Dropped]]:
    """The rows the trust policy accepts, ordered by partition, and one
    [`Dropped`][fedhead.strategies.failures.Dropped] per refused site: a partition id outside
    ``0..num_clients-1`` or claimed by several nodes (all of them are refused: the server cannot
    tell which one is honest), a node answering twice, a count beyond ``trust.expected_counts`` or
    ``trust.max_count``, moments beyond ``trust.max_abs``."""
    trust, m = settings.trust, settings.num_clients
    claims: dict[int, list[int]] = {}
    answers: dict[int, int] = {}
    for pid, node, *_ in rows:
        claims.setdefault(int(pid), []).append(int(node))
        answers[int(node)] = answers.get(int(node), 0) + 1
    kept: list[MomentRow] = []
    dropped: list[Dropped] = []
    for row in sorted(rows, key=lambda r: (r[0], r[1])):
        pid, node, n, mu, cov = row
        reason = None
        if answers[node] > 1:
            reason = "answered more than once"
        elif not 0 <= pid < m:
            reason = f"reports partition {pid} outside 0..{m - 1}"
        elif len(claims[pid]) > 1:
            others = [k for k in claims[pid] if k != node]
            reason = (
                f"partition {pid} is also claimed by node(s) {others}: none of them is used (check each "
                f"SuperNode's --node-config partition-id=K num-partitions={m})"
            )
        else:
            reason = trust.count_problem(n, pid)
        if reason is None:
            try:
                agg.validate_moments(n, mu, cov, node_id=node, dim=mu.shape[0], max_abs=trust.max_abs)
            except agg.ReplyError as exc:
                reason = str(exc).split(": ", 1)[1]
        if reason is None:
            kept.append(row)
        else:
            dropped.append(Dropped(stage, node, "invalid", reason, pid if 0 <= pid < m else None))
    return kept, dropped


def build_exchange(rows: Sequence[MomentRow], dropped: Sequence[Dropped], settings: ExchangeSettings) -> MomentExchange:
    """Moments, diagnosis and reference Grams of the valid replies ``rows`` (any order).

    The trust policy screens the rows first ([`screen_rows`][fedhead.strategies.exchange.screen_rows]);
    each refused site is dropped (one console line) while ``settings.required`` remain, else
    [`TooFewReplies`][fedhead.strategies.failures.TooFewReplies] names them all. The weights are
    capped at ``trust.max_weight_share``; the diagnosis flags covariance outliers
    (``trust.flag_outlier``). The targets are those of the settings' correction and centring
    ([`fedhead.federation.tracking.reference_targets`][fedhead.federation.tracking.reference_targets]).
    """
    rows, refused = screen_rows(rows, settings)
    dropped = [*dropped, *refused]
    expected = settings.num_clients
    if len(rows) < settings.required:
        raise TooFewReplies.of("moment exchange", len(rows), expected, settings.required, dropped)
    for d in refused:
        log.warning("moment exchange: dropping %s; continuing with %d of %d clients", d.describe(), len(rows), expected)
    trust = settings.trust
    moments = agg.aggregate_moments(
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
        node_ids=[f"{r[1]} (partition {r[0]})" for r in rows],
        max_share=trust.max_weight_share,
    )
    plain = agg.aggregation_weights(np.asarray(moments.counts))
    capped = tuple(
        f"node {rows[i][1]} (partition {rows[i][0]}): reported {100 * plain[i]:.3g}% of the rows; its weight is "
        f"capped at {moments.weights[i]:.3g} (trust.max_weight_share={trust.max_weight_share})"
        for i in np.flatnonzero(agg.capped_sites(moments))
    )
    for line in capped:
        log.warning("moment exchange: %s", line)
    # the regime is reported by the strategy's check_regime (refusal or OutsideRegimeWarning); a
    # barycenter that does not converge keeps its ConvergenceWarning and is flagged in the diagnosis
    lambda_h, lambda_w = settings.lambda_h, settings.lambda_w
    diagnosis, gap = diagnose(moments, lambda_h, lambda_w, warn_outside_regime=False)
    diagnosis = flag_outliers(diagnosis, moments, rows, trust.flag_outlier)
    diagnosis = dataclasses.replace(diagnosis, flags=capped + diagnosis.flags)
    if diagnosis.barycenter_converged is False:
        log.warning(
            "the barycenter G_star did not converge (residual %.3g after %d iterations): G_star, "
            "the gap terms and every error against G_star are approximate",
            diagnosis.barycenter_residual,
            diagnosis.barycenter_iters,
        )
    targets = reference_targets(moments, gap, lambda_h, lambda_w, gamma=settings.gamma, centered=settings.centered)
    return MomentExchange(
        moments=moments,
        diagnosis=diagnosis,
        gap=gap,
        targets=targets,
        node_ids=tuple(r[1] for r in rows),
        partition_ids=tuple(r[0] for r in rows),
        dropped=tuple(dropped),
    )


def flag_outliers(
    diagnosis: Diagnosis, moments: ufm.TargetMoments, rows: Sequence[MomentRow], limit: float
) -> Diagnosis:
    """The diagnosis with each site's covariance outlier score
    ([`fedhead.analysis.consistency.outlier_scores`][fedhead.analysis.consistency.outlier_scores]) and a flag
    (one log line) for every score above ``limit``."""
    scores = outlier_scores(np.asarray(moments.covs))
    if scores is None:
        return diagnosis
    flags = tuple(
        f"node {rows[i][1]} (partition {rows[i][0]}): its covariance lies {scores[i]:.3g} times as far from the "
        f"others' (BW distance) as the sites typically lie from each other (trust.flag_outlier={limit:g})"
        for i in np.flatnonzero(scores > limit).tolist()
    )
    for flag in flags:
        log.warning("moment exchange: flagged %s", flag)
    return dataclasses.replace(diagnosis, outlier_scores=scores, flags=flags)


def screen_exchange(
    replies: Iterable[Message],
    parse: Callable[[Message], T],
    settings: ExchangeSettings,
    *,
    stage: str,
    expected_nodes: Sequence[int] | None,
) -> tuple[list[tuple[Message, T]], list[Dropped]]:
    """The exchange's replies screened by the failure policy
    ([`fedhead.strategies.failures.screen`][fedhead.strategies.failures.screen]: error replies, invalid
    ones and replies missing from ``expected_nodes`` within the exchange's deadline drop the client
    while ``settings.required`` remain)."""
    return screen(
        replies,
        parse,
        stage=stage,
        required=settings.required,
        expected_nodes=expected_nodes,
        expected_count=settings.num_clients,
        timeout=settings.timeouts.exchange if expected_nodes is not None else None,
    )


def collect_moments(
    replies: Iterable[Message], settings: ExchangeSettings, *, expected_nodes: Sequence[int] | None
) -> MomentExchange:
    """The exchange of the query replies: each reply screened
    ([`screen_exchange`][fedhead.strategies.exchange.screen_exchange]), then
    [`build_exchange`][fedhead.strategies.exchange.build_exchange] over the survivors."""
    kept, dropped = screen_exchange(
        replies, parse_moment_reply, settings, stage="moment exchange", expected_nodes=expected_nodes
    )
    return build_exchange([r for _, r in kept], dropped, settings)


def query_moments(settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> MomentExchange:
    """The moment exchange over ``grid``: one query per node, then
    [`collect_moments`][fedhead.strategies.exchange.collect_moments]."""
    queries = query_messages(node_ids, settings.message_config)
    replies = grid.send_and_receive(queries, timeout=settings.timeouts.exchange)
    return collect_moments(replies, settings, expected_nodes=node_ids)


def enforce_regime(exchange: MomentExchange, lambda_h: float, lambda_w: float, allow_outside_regime: bool) -> None:
    """Refuse to train outside the fully active regime unless explicitly allowed.

    Raises [`fedhead.analysis.regime.OutsideRegimeError`][fedhead.analysis.regime.OutsideRegimeError]
    naming the clients and margins; with ``allow_outside_regime`` logs the
    [`fedhead.analysis.regime.OutsideRegimeWarning`][fedhead.analysis.regime.OutsideRegimeWarning]'s
    text once, with what it means for the results (the console's one line; a deployment's run.log).
    """
    if exchange.diagnosis.fully_active:
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OutsideRegimeWarning)
        ensure_fully_active(exchange.moments, lambda_h, lambda_w, allow_outside_regime=allow_outside_regime)
    for w in caught:
        log.warning(
            "%s G_star, the exact recursion, predicted_gram, trajectory_error and delta are recorded as null.",
            w.message,
        )
