"""The one-time moment exchange before round 1, on the server (no torch, no data layer).

Before any training the server waits for the federation's SuperNodes (:func:`wait_for_nodes`),
asks each for its ``(N_m, mu_m, Sigma_m)`` (:func:`query_messages`), reads the replies
(:func:`parse_moment_reply`) and turns the surviving ones into a :class:`MomentExchange`
(:func:`build_exchange`): the :class:`fedhead.ufm.TargetMoments`, the diagnosis and the
reference Grams every round is measured against; :func:`enforce_regime` then refuses to train
outside the fully active regime unless allowed. Every number comes from
:mod:`fedhead.federation.aggregation`, :mod:`fedhead.analysis.diagnosis` and :mod:`fedhead.federation.tracking`;
:class:`fedhead.strategies.head_averaging.HeadAveraging` drives these steps.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead import ufm
from fedhead.analysis.diagnosis import Diagnosis, diagnose
from fedhead.analysis.regime import OutsideRegimeWarning, ensure_fully_active
from fedhead.analysis.standardization import Standardization
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol as P
from fedhead.federation.deploy_checks import FederationMismatch, check_node_count, check_partitions
from fedhead.federation.tracking import Targets, reference_targets
from fedhead.strategies.failures import Dropped, check_partition_subset, screen
from fedhead.strategies.replies import metrics_of, partition_of

log = logging.getLogger(__name__)

#: One valid moment reply: ``(partition id, node id, N_m, mu_m (C,), Sigma_m (C, C))``.
MomentRow = tuple[int, int, int, np.ndarray, np.ndarray]


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
    #: after a statistics exchange (:mod:`fedhead.strategies.statistics`): the pooled offsets and
    #: scales every message carries, and whether the server numbered the clients
    standardization: Standardization | None = None
    assigned_partitions: bool = False


def wait_for_nodes(grid: Grid, min_nodes: int, timeout: float) -> list[int]:
    """Exactly ``min_nodes`` connected SuperNodes (sorted ids), waiting at most ``timeout`` seconds.

    Polls ``grid.get_node_ids()`` (and ``grid.check_alive()`` where the grid has it: a dead
    simulation engine ends the wait); after ``timeout`` (``timeouts.nodes``), or with too many
    nodes, :class:`fedhead.federation.deploy_checks.FederationMismatch` names the nodes and the remedy.
    """
    t0 = time.monotonic()
    next_log = t0 + 5.0
    while len(nodes := list(grid.get_node_ids())) < min_nodes:
        check = getattr(grid, "check_alive", None)
        if check is not None:
            check()
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


def query_messages(node_ids: Iterable[int], message_config: dict[str, Any]) -> list[Message]:
    """One ``query`` message per node asking for ``(N_m, mu_m, Sigma_m)``."""
    record = RecordDict({P.CONFIG: ConfigRecord({P.STAGE: P.STAGE_MOMENTS, **message_config})})
    return [Message(content=record, dst_node_id=int(n), message_type=MessageType.QUERY) for n in node_ids]


def parse_moment_reply(msg: Message) -> MomentRow:
    """The validated moments of one query reply; :class:`fedhead.federation.aggregation.ReplyError` otherwise
    (a missing record, array or count; non-finite, asymmetric or non-PSD moments)."""
    node = P.node_of(msg)
    if P.MOMENTS not in msg.content.array_records:
        raise agg.ReplyError(node, f"query reply lacks the '{P.MOMENTS}' ArrayRecord")
    arrays = msg.content.array_records[P.MOMENTS]
    metrics = metrics_of(msg)
    if P.NUM_EXAMPLES not in metrics:
        raise agg.ReplyError(node, f"query reply metrics lack '{P.NUM_EXAMPLES}'")
    pid = partition_of(msg)
    for key in (P.MEAN, P.COV):
        if key not in arrays:
            raise agg.ReplyError(node, f"query reply lacks the array '{key}'")
    n, mu, cov = agg.validate_moments(
        metrics[P.NUM_EXAMPLES], arrays[P.MEAN].numpy(), arrays[P.COV].numpy(), node_id=f"{node} (partition {pid})"
    )
    return pid, node, n, mu, cov


def build_exchange(
    rows: Sequence[MomentRow],
    dropped: Sequence[Dropped],
    *,
    num_clients: int,
    lambda_h: float,
    lambda_w: float,
    gamma: float,
    centered: bool,
) -> MomentExchange:
    """Moments, diagnosis and reference Grams of the valid replies ``rows`` (any order).

    The partitions must be distinct and, without ``dropped`` clients, exactly ``0..num_clients-1``
    (:func:`fedhead.federation.deploy_checks.check_partitions`). The targets are those of a procedure with
    correction ``gamma`` and centring ``centered`` (:func:`fedhead.federation.tracking.reference_targets`).
    """
    rows = sorted(rows, key=lambda r: (r[0], r[1]))
    pairs = [(r[0], r[1]) for r in rows]
    if dropped:
        check_partition_subset(pairs, num_clients, "moment exchange")
    else:
        check_partitions(pairs, num_clients)
    moments = agg.aggregate_moments(
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
        node_ids=[f"{r[1]} (partition {r[0]})" for r in rows],
    )
    # the regime is reported by the strategy's check_regime (refusal or OutsideRegimeWarning); a
    # barycenter that does not converge keeps its ConvergenceWarning and is flagged in the diagnosis
    diagnosis, gap = diagnose(moments, lambda_h, lambda_w, warn_outside_regime=False)
    if diagnosis.barycenter_converged is False:
        log.warning(
            "the barycenter G_star did not converge (residual %.3g after %d iterations): G_star, "
            "the gap terms and every error against G_star are approximate",
            diagnosis.barycenter_residual,
            diagnosis.barycenter_iters,
        )
    targets = reference_targets(moments, gap, lambda_h, lambda_w, gamma=gamma, centered=centered)
    return MomentExchange(
        moments=moments,
        diagnosis=diagnosis,
        gap=gap,
        targets=targets,
        node_ids=tuple(r[1] for r in rows),
        partition_ids=tuple(r[0] for r in rows),
        dropped=tuple(dropped),
    )


def collect_moments(
    replies: Iterable[Message],
    *,
    required: int,
    num_clients: int,
    expected_nodes: Sequence[int] | None,
    timeout: float,
    lambda_h: float,
    lambda_w: float,
    gamma: float,
    centered: bool,
) -> MomentExchange:
    """The exchange of the query replies: each reply screened by the failure policy
    (:func:`fedhead.strategies.failures.screen`: error replies, invalid moments and replies
    missing from ``expected_nodes`` within ``timeout`` drop the client while ``required`` remain),
    then :func:`build_exchange` over the survivors."""
    kept, dropped = screen(
        replies,
        parse_moment_reply,
        stage="moment exchange",
        required=required,
        expected_nodes=expected_nodes,
        expected_count=num_clients,
        timeout=timeout if expected_nodes is not None else None,
    )
    return build_exchange(
        [r for _, r in kept],
        dropped,
        num_clients=num_clients,
        lambda_h=lambda_h,
        lambda_w=lambda_w,
        gamma=gamma,
        centered=centered,
    )


def enforce_regime(exchange: MomentExchange, lambda_h: float, lambda_w: float, allow_outside_regime: bool) -> None:
    """Refuse to train outside the fully active regime unless explicitly allowed.

    Raises :class:`fedhead.analysis.regime.OutsideRegimeError` naming the clients and margins; with
    ``allow_outside_regime`` logs the :class:`fedhead.analysis.regime.OutsideRegimeWarning`'s text once, with
    what it means for the results (the console's one line; a deployment's run.log).
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
