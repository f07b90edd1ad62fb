"""The two HeadAveraging variants and [`make_strategy`][fedhead.strategies.make_strategy].

* [`AlignedHeadAveraging`][fedhead.strategies.AlignedHeadAveraging]: additionally verifies that
  every aligned head kept the Gram of the head the client trained (alignment is a rotation,
  theory.md §5).
* [`FullModelAveraging`][fedhead.strategies.FullModelAveraging]: additionally averages the backbone
  (BatchNorm statistics stay on the clients) and broadcasts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict

from fedhead.analysis.constraints import ConfigError
from fedhead.analysis.metrics import relative_error
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.strategies.aggregator import HeadSum
from fedhead.strategies.head_averaging import HeadAveraging
from fedhead.strategies.mismatch_heads import MismatchHeadAveraging


class AlignedHeadAveraging(HeadAveraging):
    """Head averaging for aligned clients; verifies that alignment kept each client's Gram.

    Each aligned client reports ``trained_gram = W^ W^^T`` of the head it trained (before
    alignment) in its ``checks`` record; the server checks that the uploaded head has the same
    Gram to relative tolerance ``rtol`` and fails naming the client otherwise.
    """

    def __init__(self, *, rtol: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rtol = float(rtol)

    @staticmethod
    def alignment_error(msg: Message, w: np.ndarray) -> float:
        """Relative change of the client's Gram through alignment (its reported ``trained_gram``
        against the uploaded head ``w``)."""
        node = protocol.node_of(msg)
        checks = msg.content.array_records.get(protocol.CHECKS)
        if checks is None or protocol.TRAINED_GRAM not in checks:
            raise agg.ReplyError(node, f"aligned reply lacks the '{protocol.CHECKS}' ArrayRecord")
        g_trained = agg.validate_array(
            checks[protocol.TRAINED_GRAM].numpy(), (w.shape[0], w.shape[0]), node_id=node, name=protocol.TRAINED_GRAM
        )
        return float(relative_error(w @ w.T, g_trained))

    def check_reply(self, msg: Message, weight: np.ndarray) -> None:
        err = self.alignment_error(msg, weight)
        if err > self.rtol:
            raise agg.ReplyError(
                protocol.node_of(msg),
                f"aligned head changed the trained Gram (relative error {err:.3g} > {self.rtol:g})",
            )

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]:
        errors = [self.alignment_error(msg, w) for msg, w in zip(msgs, heads, strict=True)]
        return {"alignment_gram_error": max(errors, default=0.0)}


class FullModelAveraging(HeadAveraging):
    """Full-model averaging: heads and backbones averaged with weights ``N_m / N``.

    The aggregated backbone (BatchNorm running statistics excluded, they never leave the
    client) travels in the ``backbone`` record of every training and evaluation message.
    ``initial_backbone`` is the common random backbone all clients start from.
    """

    def __init__(self, *, initial_backbone: dict[str, np.ndarray] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._backbone = (
            None
            if initial_backbone is None
            else {k: np.asarray(v) for k, v in initial_backbone.items() if not protocol.is_private_state(k)}
        )

    def _extend_train_content(self, content: RecordDict, arrays: ArrayRecord) -> None:
        if self._backbone is not None:
            content[protocol.BACKBONE] = protocol.numpy_to_arrays(self._backbone)

    def _extra_state(self) -> dict[str, np.ndarray]:
        return {f"backbone/{k}": v for k, v in (self._backbone or {}).items()}

    def _restore_extra(self, extra: dict[str, np.ndarray]) -> None:
        state = {k[len("backbone/") :]: np.asarray(v) for k, v in extra.items() if k.startswith("backbone/")}
        if state:
            self._backbone = state

    def check_reply(self, msg: Message, weight: np.ndarray) -> None:
        """The backbone must be there, with the broadcast backbone's names and shapes (once there is
        one), finite and within ``trust.max_abs``."""
        node = protocol.node_of(msg)
        if protocol.BACKBONE not in msg.content.array_records:
            raise agg.ReplyError(node, f"full-model reply lacks '{protocol.BACKBONE}'")
        try:
            state = protocol.arrays_to_numpy(msg.content.array_records[protocol.BACKBONE])
        except (TypeError, ValueError) as exc:
            raise agg.ReplyError(node, f"unreadable backbone record ({exc})") from None
        shared = {k: v for k, v in state.items() if not protocol.is_private_state(k)}
        if self._backbone is not None and sorted(shared) != sorted(self._backbone):
            raise agg.ReplyError(node, "its backbone's parameter names differ from the broadcast backbone's")
        for name, value in shared.items():
            shape = None if self._backbone is None else np.shape(self._backbone[name])
            arr = agg.validate_array(value, shape, node_id=node, name=f"model state {name!r}")
            agg.check_magnitude(arr, self.settings.trust.max_abs, node_id=node, name=f"model state {name!r}")

    def _add_aggregate(self, arrays: ArrayRecord, summed: HeadSum) -> None:
        msgs = summed.kept.messages
        states = [protocol.arrays_to_numpy(msg.content.array_records[protocol.BACKBONE]) for msg in msgs]
        dtypes = {k: v.dtype for k, v in states[0].items()}
        avg = agg.average_states(states, summed.shares, node_ids=[protocol.node_of(m) for m in msgs])
        self._backbone = {
            k: v.astype(dtypes[k]) if np.issubdtype(dtypes[k], np.floating) else v for k, v in avg.items()
        }


def make_strategy(kind: str, *, measure_mismatch: bool = False, **kwargs: Any) -> HeadAveraging:
    """Build the strategy a procedure needs: ``"head"``, ``"aligned"`` or ``"full_model"``.

    ``measure_mismatch`` (``"head"`` only):
    [`fedhead.strategies.mismatch_heads.MismatchHeadAveraging`][fedhead.strategies.MismatchHeadAveraging],
    which measures the cost of mismatched coordinates in round 1 (docs/theory.md §13).
    """
    classes: dict[str, Callable[..., HeadAveraging]] = {
        "head": HeadAveraging,
        "aligned": AlignedHeadAveraging,
        "full_model": FullModelAveraging,
    }
    if kind not in classes:
        raise ValueError(f"unknown strategy kind {kind!r}; expected one of {sorted(classes)}")
    privacy = kwargs.get("privacy")
    if privacy is not None and privacy.secure and (measure_mismatch or kind == "full_model"):
        what = "the mismatch measurement (per-site objectives)" if measure_mismatch else "full-model averaging"
        raise ConfigError(f"privacy.mode=secure sums only the heads; {what} would send per-site values in the clear")
    if measure_mismatch:
        if kind != "head":
            raise ValueError(f"the mismatch measurement needs head averaging without alignment, not {kind!r}")
        return MismatchHeadAveraging(**kwargs)
    return classes[kind](**kwargs)
