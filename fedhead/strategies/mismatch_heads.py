"""Head averaging that measures the cost of mismatched coordinates in round 1 (docs/theory.md §13):
[`MismatchHeadAveraging`][fedhead.strategies.mismatch_heads.MismatchHeadAveraging] sends one extra
``query`` after round 1's aggregation and records the cost in that round's record; the broadcast
for round 2 is the procedure's normal aggregate.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhead.analysis.mismatch_cost import MismatchWarning, mismatch_averages, mismatch_cost
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation.tracking import RoundRecord
from fedhead.strategies.aggregator import HeadSum
from fedhead.strategies.head_averaging import HeadAveraging
from fedhead.strategies.phases import screen_phase
from fedhead.strategies.replies import metrics_of, partition_of
from fedhead.strategies.statistics import node_messages

log = logging.getLogger(__name__)


class MismatchHeadAveraging(HeadAveraging):
    """Head averaging + the round-``measure_round`` mismatch measurement (round 1 by default)."""

    def __init__(self, *, measure_round: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.measure_round = int(measure_round)
        self._in_round: int | None = None
        self._trained: tuple[list[int], list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._pending: RoundRecord | None = None  # the record the measurement goes into
        self._deferred = False  # its completion waits for the measurement (no evaluate phase)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        self._in_round = self.rounds.round(server_round)
        try:
            out = super().aggregate_train(server_round, replies)
        finally:
            self._in_round = None
        if self._trained is not None:
            assert self.rounds.tracker is not None
            self._pending = self.rounds.tracker.records[-1]
        return out

    def _add_aggregate(self, arrays: ArrayRecord, summed: HeadSum) -> None:
        """Keep the measured round's replies (heads seen in the clear) for the measurement."""
        super()._add_aggregate(arrays, summed)
        if self._in_round == self.measure_round and self._broadcast is not None:
            kept = summed.kept
            self._trained = (
                [protocol.node_of(m) for m in kept.messages],
                [partition_of(m) for m in kept.messages],
                kept.heads,
                kept.biases,
                kept.counts,
                np.asarray(self._broadcast[0], dtype=np.float64),
            )

    def _round_complete(self, rec: RoundRecord) -> None:
        if self._trained is not None and self._pending is None:  # aggregate_train without evaluation
            self._deferred = True
            return
        super()._round_complete(rec)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        if self._trained is not None:
            rec = self._pending
            try:
                self.measure(grid, self.rounds.round(server_round))
            finally:
                self._trained, self._pending = None, None
            if self._deferred and rec is not None:
                self._deferred = False
                super()._round_complete(rec)
        return super().configure_evaluate(server_round, arrays, config, grid)

    # ---------------------------------------------------------------- the measurement
    def mismatch_messages(self, server_round: int) -> list[Message]:
        """One ``query`` (``stage="mismatch"``) per client of the kept round: its own trained
        head, both averages and its rotation."""
        assert self._trained is not None
        nodes, _, heads, biases, counts, broadcast = self._trained
        avg = mismatch_averages(heads, biases, counts, broadcast)
        config = ConfigRecord(
            {
                protocol.STAGE: protocol.STAGE_MISMATCH,
                protocol.SERVER_ROUND: int(server_round),
                **self.settings.message_config,
            }
        )
        out = []
        for i, node in enumerate(nodes):
            record = protocol.numpy_to_arrays(
                {
                    protocol.OWN_WEIGHT: heads[i],
                    protocol.OWN_BIAS: biases[i],
                    protocol.TRAINED_WEIGHT: avg.trained_weight,
                    protocol.ALIGNED_WEIGHT: avg.aligned_weight,
                    protocol.AVERAGE_BIAS: avg.bias,
                    protocol.ROTATION: avg.rotations[i],
                }
            )
            content = RecordDict({protocol.MISMATCH: record, protocol.CONFIG: config})
            out += node_messages(content, [int(node)], MessageType.QUERY, self.exchange)
        return out

    def parse_mismatch_replies(self, replies: Iterable[Message]) -> tuple[np.ndarray, np.ndarray]:
        """Validated ``(objectives (M', 3): local, trained, aligned; counts (M',))`` of the clients
        that answered validly (the failure policy drops the others)."""
        assert self._trained is not None
        nodes, pids, _, _, counts, _ = self._trained
        expected_n = dict(zip(pids, (int(c) for c in counts)))

        def parse(msg: Message):
            node = protocol.node_of(msg)
            m = metrics_of(msg)
            pid = partition_of(msg)
            if pid not in expected_n:
                raise agg.ReplyError(node, f"mismatch reply from partition {pid}, not among {sorted(expected_n)}")
            row = []
            for key in (protocol.MISMATCH_LOCAL, protocol.MISMATCH_TRAINED, protocol.MISMATCH_ALIGNED):
                if key not in m:
                    raise agg.ReplyError(node, f"mismatch reply lacks '{key}'")
                row.append(float(agg.validate_array(m[key], (), node_id=node, name=key)))
            n = agg.validate_count(m.get(protocol.NUM_EXAMPLES), node_id=node)
            if n != expected_n[pid]:
                raise agg.ReplyError(node, f"mismatch reply reports {n} samples, {expected_n[pid]} in training")
            return pid, row, n

        kept, _ = screen_phase(  # checked, by partition
            replies,
            parse,
            stage="mismatch measurement",
            exchange=self._exchanged("the mismatch measurement"),
            required=self.settings.required,
            sent=list(nodes),
            timeout=self.settings.timeouts.round,
        )
        rows = [r for _, r in kept]
        return np.asarray([r[1] for r in rows], dtype=np.float64), np.asarray([r[2] for r in rows])

    def measure(self, grid: Grid, server_round: int) -> None:
        """Send the mismatch query, validate the replies and record the cost in the round's record."""
        assert self._pending is not None
        replies = grid.send_and_receive(self.mismatch_messages(server_round), timeout=self.settings.timeouts.round)
        objectives, counts = self.parse_mismatch_replies(replies)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", MismatchWarning)
            cost = mismatch_cost(objectives[:, 0], objectives[:, 1], objectives[:, 2], counts)
        for w in caught:
            log.warning("%s", w.message)
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self._pending.extra.update(cost.to_extra())
        log.info("%s", cost.line())
