"""Seed rules of the clients' initial backbones (numpy only; shared by clients, recorder and tests).

``init=common`` builds every client's backbone from the run seed, ``init=independent`` from
[`backbone_seed`][fedhead.analysis.seeds.backbone_seed]; what each means: docs/theory.md §13.
"""

from __future__ import annotations

import numpy as np

__all__ = ["INIT_MODES", "backbone_seed"]

#: Values of the top-level ``init=`` option.
INIT_MODES = ("common", "independent")

#: Separates the independent backbone seeds from every other stream derived from the run seed.
_INDEPENDENT_TAG = 0x1D1E


def backbone_seed(seed: int, partition_id: int, init: str = "common") -> int:
    """Seed of client ``partition_id``'s initial backbone.

    ``common``: the run seed itself (every client the same backbone). ``independent``: a seed of
    ``(seed, partition_id)`` from `numpy.random.SeedSequence` (distinct per client, distinct
    from the run seed, reproducible from it), a non-negative integer below ``2**32``.
    """
    if init not in INIT_MODES:
        raise ValueError(f"init must be one of {INIT_MODES}, got {init!r}")
    if int(seed) < 0 or int(partition_id) < 0:
        raise ValueError(f"seed and partition_id must be non-negative, got {seed!r}, {partition_id!r}")
    if init == "common":
        return int(seed)
    state = np.random.SeedSequence((int(seed), _INDEPENDENT_TAG, int(partition_id))).generate_state(1, np.uint32)
    return int(state[0])
