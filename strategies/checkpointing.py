"""Checkpoint and resume on the server: the state a strategy hands over after every complete round,
and its restoration (the format and the files are :mod:`fedhead.federation.checkpoint`'s).

:class:`Checkpointing` is a mixin of :class:`fedhead.strategies.head_averaging.HeadAveraging`; it reads
and sets the strategy's ``exchange`` (:class:`fedhead.strategies.exchange.MomentExchange`), ``tracker``
(:class:`fedhead.federation.tracking.RoundTracker`), ``_head``, ``_head_shape``, ``_round_offset``,
``observer`` and ``_on_round_end``, and calls its ``check_regime``. Subclasses with state beyond
the head (full-model averaging: the averaged backbone) override :meth:`Checkpointing._extra_state`
and :meth:`Checkpointing._restore_extra`.
"""

from __future__ import annotations

import numpy as np

from fedhead.federation.checkpoint import ServerState, check_moments
from fedhead.federation.tracking import RoundRecord, RoundTracker


class Checkpointing:
    """The server state after each complete round (:meth:`server_state`) and :meth:`restore`."""

    def _round_complete(self, rec: RoundRecord) -> None:
        """A round is fully measured: report it, then hand the server state to the checkpointer."""
        self.observer.on_round(rec)
        if self._on_round_end is not None:
            self._on_round_end(self.server_state())

    def server_state(self) -> ServerState:
        """Everything needed to continue after the last complete round (see fedhead.federation.checkpoint)."""
        if self.tracker is None or self._head is None or self.exchange is None:
            raise RuntimeError("no round has been recorded yet")
        m = self.exchange.moments
        return ServerState(
            round=self.tracker.records[-1].round,
            weight=self._head[0],
            bias=self._head[1],
            records=[r.to_dict() for r in self.tracker.records],
            recursion=self.tracker.recursion,
            counts=np.asarray(m.counts, dtype=np.float64),
            means=np.asarray(m.means),
            covs=np.asarray(m.covs),
            extra=self._extra_state(),
        )

    def restore(self, state: ServerState) -> None:
        """Continue after checkpointed round ``state.round`` (after the strategy's ``exchange_moments``)."""
        if self.exchange is None:
            raise RuntimeError("exchange_moments must run before a restore")
        m = self.exchange.moments
        check_moments(state, np.asarray(m.counts), np.asarray(m.means), np.asarray(m.covs))
        self.check_regime()
        self.tracker = RoundTracker(self.exchange.targets)
        self.tracker.restore([RoundRecord.from_dict(r) for r in state.records], state.recursion)
        w, b = (np.asarray(a, dtype=np.float64) for a in (state.weight, state.bias))
        self._head_shape = (w.shape[0], w.shape[1])
        self._head = (w, b)
        self._round_offset = int(state.round)
        self._restore_extra(state.extra)

    def _extra_state(self) -> dict[str, np.ndarray]:
        """Hook: strategy state beyond the head to checkpoint (arrays)."""
        return {}

    def _restore_extra(self, extra: dict[str, np.ndarray]) -> None:
        """Hook: restore what :meth:`_extra_state` saved."""
