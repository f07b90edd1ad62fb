"""The round state a strategy owns between rounds: the aggregated head, the measurements and the
resume offset ([`RoundState`][fedhead.strategies.rounds.RoundState]), which is what a checkpoint
carries ([`ServerState`][fedhead.federation.checkpoint.ServerState]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedhead.federation.checkpoint import ServerState, check_moments
from fedhead.federation.tracking import RoundRecord, RoundTracker, Targets
from fedhead.ufm import TargetMoments

if TYPE_CHECKING:
    from fedhead.strategies.aggregator import HeadSum


@dataclass
class RoundState:
    """The strategy's state between rounds.

    Attributes
    ----------
    tracker : RoundTracker or None
        The per-round measurements (None before [`start`][fedhead.strategies.rounds.RoundState.start] /
        [`restore`][fedhead.strategies.rounds.RoundState.restore]).
    head : tuple of ndarray or None
        ``(W (C, P), b (C,))``: the initial head, then the aggregate of the last round.
    offset : int
        Rounds done before this run's first round (a resumed run); flwr counts from 1 again.
    """

    tracker: RoundTracker | None = None
    head: tuple[np.ndarray, np.ndarray] | None = None
    offset: int = 0

    @property
    def head_shape(self) -> tuple[int, int]:
        """``(C, P)`` of the shared head; a `RuntimeError` before
        [`start`][fedhead.strategies.rounds.RoundState.start]."""
        if self.head is None:
            raise RuntimeError("begin() must record the initial head before training")
        return (self.head[0].shape[0], self.head[0].shape[1])

    def round(self, server_round: int) -> int:
        """The run's round number of flwr's ``server_round`` (counted from 1 after a resume)."""
        return server_round + self.offset

    def start(self, targets: Targets, weight: np.ndarray, bias: np.ndarray, *, dim: int) -> RoundRecord:
        """Round 0: measure the initial head ``(W (C, P), b (C,))`` against ``targets`` (``C = dim``)."""
        w, b = (np.asarray(a, dtype=np.float64) for a in (weight, bias))
        if w.ndim != 2 or w.shape[0] != dim or b.shape != (dim,):
            raise ValueError(f"initial head {w.shape}/{b.shape} does not match C = {dim} targets")
        self.tracker = RoundTracker(targets)
        self.head = (w, b)
        return self.tracker.start(w, b)

    def set_head(self, weight: np.ndarray, bias: np.ndarray) -> None:
        """The aggregate of the round just measured."""
        self.head = (weight, bias)

    def restore(self, state: ServerState, moments: TargetMoments, targets: Targets) -> None:
        """Continue after the checkpointed round ``state.round``: its records, head and round.

        ``moments`` (the resumed run's exchange) must be the checkpoint's
        ([`fedhead.federation.checkpoint.check_moments`][fedhead.federation.checkpoint.check_moments])."""
        check_moments(state, np.asarray(moments.counts), np.asarray(moments.means), np.asarray(moments.covs))
        self.tracker = RoundTracker(targets)
        self.tracker.restore([RoundRecord.from_dict(r) for r in state.records], state.recursion)
        w, b = (np.asarray(a, dtype=np.float64) for a in (state.weight, state.bias))
        self.head = (w, b)
        self.offset = int(state.round)

    def server_state(self, moments: TargetMoments, extra: dict[str, np.ndarray]) -> ServerState:
        """Everything needed to continue after the last complete round (with the exchange's
        ``moments``, which a resumed run's exchange must repeat, and the strategy's ``extra`` arrays)."""
        if self.tracker is None or self.head is None:
            raise RuntimeError("no round has been recorded yet")
        return ServerState(
            round=self.tracker.records[-1].round,
            weight=self.head[0],
            bias=self.head[1],
            records=[r.to_dict() for r in self.tracker.records],
            recursion=self.tracker.recursion,
            counts=np.asarray(moments.counts, dtype=np.float64),
            means=np.asarray(moments.means),
            covs=np.asarray(moments.covs),
            extra=extra,
        )

    def record_train(
        self, server_round: int, summed: HeadSum, broadcast: np.ndarray, extra: dict[str, float]
    ) -> RoundRecord:
        """Round ``server_round``'s aggregate ``summed`` (the head broadcast before it, ``broadcast``): the head
        to broadcast next and the round's record (``extra``: further scalars, e.g. the privacy spent)."""
        assert self.tracker is not None
        self.set_head(summed.weight, summed.bias)
        rec = self.tracker.record(
            server_round,
            summed.weight,
            summed.bias,
            broadcast=broadcast,
            client_heads=summed.kept.heads,
            fit=summed.fit,
            client_metrics=summed.client_metrics,
            extra={**summed.extra, **extra},
            present=summed.present,
            dropped=[d.to_dict() for d in summed.dropped],
        )
        rec.ignored_metrics, rec.clipped_updates = summed.ignored_metrics, summed.clipped_updates
        rec.gram_errors, rec.flags = summed.gram_errors, summed.flags
        return rec
