"""How close each client's local training came to its optimum in a round (docs/theory.md §11): the
training replies' gap metrics, read and checked by [`local_fit`][fedhead.federation.local_fit.local_fit],
and the gap [`LOCAL_GAP_THRESHOLD`][fedhead.federation.local_fit.LOCAL_GAP_THRESHOLD] above which the
theory's references are not yet meaningful. Numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedhead.federation.protocol import LOCAL_EPOCHS, OBJECTIVE_GAP, TRAINED_GAP
from fedhead.federation.reply_checks import ReplyError, validate_array

#: Relative local objective gap above which the theory's references (which assume every client
#: at its local optimum) are not yet meaningful for a round.
LOCAL_GAP_THRESHOLD = 1e-2


@dataclass(frozen=True)
class LocalFit:
    """How close each client's local training came to its optimum in one round (docs/theory.md §11).

    Attributes
    ----------
    objective_gaps : list of float
        ``(L_m - L*_m) / L*_m`` per client (partition order), the original objective.
    trained_gaps : list of float
        The same for the objective each client minimised (``L_m + gamma C_m``; equal to
        ``objective_gaps`` without correction). For corrected clients this is the one that says
        whether local training converged: ``L_m`` is not minimised there.
    local_epochs : list of int
        Epochs each client ran (fewer than ``E`` when it stopped at ``local_tol``).
    """

    objective_gaps: list[float]
    trained_gaps: list[float]
    local_epochs: list[int]

    @property
    def max_trained_gap(self) -> float:
        return max(self.trained_gaps)


def local_fit(metrics: Sequence[Mapping[str, Any]], node_ids: Sequence[int | str]) -> LocalFit:
    """Read and validate the local-fit metrics of the training replies (one per client, in order).

    Each reply must carry finite ``objective_gap`` and ``trained_gap`` (>= -1e-6: a model cannot
    beat its closed-form optimum by more than rounding) and an integer ``local_epochs`` >= 0.
    """
    gaps, trained, epochs = [], [], []
    for m, node in zip(metrics, node_ids, strict=True):
        for key in (OBJECTIVE_GAP, TRAINED_GAP, LOCAL_EPOCHS):
            if key not in m:
                raise ReplyError(node, f"training reply lacks the metric '{key}'")
        for key, out in ((OBJECTIVE_GAP, gaps), (TRAINED_GAP, trained)):
            v = float(validate_array(m[key], (), node_id=node, name=key))
            if v < -1e-6:
                raise ReplyError(node, f"{key} = {v:.3g} is below zero: the model beats its closed-form optimum")
            out.append(v)
        e = m[LOCAL_EPOCHS]
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0:
            raise ReplyError(node, f"{LOCAL_EPOCHS} must be an integer >= 0, got {e!r}")
        epochs.append(int(e))
    return LocalFit(objective_gaps=gaps, trained_gaps=trained, local_epochs=epochs)
