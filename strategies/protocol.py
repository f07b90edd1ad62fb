"""The message protocol between the fedhead ServerApp and ClientApp (record names and codecs).

Every message is a :class:`flwr.app.RecordDict`; this module names its records and converts
them to and from plain numpy so that strategies and clients agree on one layout.

Server -> client
    ``query``  : ``config`` ConfigRecord (``stage="moments"``).
    ``train``  : ``head`` ArrayRecord (``weight (C,P)``, ``bias (C,)``, float64), ``config``
                 ConfigRecord (``server-round``), optional ``sigma_cen`` ArrayRecord
                 (``sigma_cen (C,C)``, corrected procedures), optional ``backbone`` ArrayRecord
                 (full-model averaging; BatchNorm statistics never included).
    ``evaluate``: ``head`` ArrayRecord, ``config`` ConfigRecord.

Client -> server
    ``query``  : ``moments`` ArrayRecord (``mean (C,)``, ``cov (C,C)``), ``metrics``
                 MetricRecord (``num-examples``, ``partition-id``).
    ``train``  : ``head`` ArrayRecord, ``metrics`` MetricRecord (``num-examples``,
                 ``partition-id``, ``objective_gap``, local metrics), optional ``checks``
                 ArrayRecord (``trained_gram (C,C)`` before alignment), optional ``backbone``.
    ``evaluate``: ``metrics`` MetricRecord (``num-examples``, ``partition-id``, ``train_mse``,
                 ``num-test-examples``, ``test_mse`` when the client has test data).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, Message

HEAD = "head"
BACKBONE = "backbone"
SIGMA_CEN = "sigma_cen"
MOMENTS = "moments"
CHECKS = "checks"
CONFIG = "config"
METRICS = "metrics"

NUM_EXAMPLES = "num-examples"
NUM_TEST_EXAMPLES = "num-test-examples"
PARTITION_ID = "partition-id"
SERVER_ROUND = "server-round"


def head_record(weight: np.ndarray, bias: np.ndarray) -> ArrayRecord:
    """``ArrayRecord`` holding a head ``(W (C,P), b (C,))`` in float64."""
    return ArrayRecord(
        {
            "weight": Array(np.ascontiguousarray(weight, dtype=np.float64)),
            "bias": Array(np.ascontiguousarray(bias, dtype=np.float64)),
        }
    )


def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Every array of an ``ArrayRecord`` as numpy (original dtype)."""
    return {k: v.numpy() for k, v in record.items()}


def numpy_to_arrays(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ``ArrayRecord`` from a mapping name -> ndarray (copied, contiguous)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def read_head(record: ArrayRecord) -> tuple[np.ndarray, np.ndarray]:
    """``(W, b)`` from a head record; raises ``KeyError`` naming what is missing."""
    missing = [k for k in ("weight", "bias") if k not in record]
    if missing:
        raise KeyError(f"head record lacks {missing}; it has {list(record.keys())}")
    return record["weight"].numpy(), record["bias"].numpy()


def node_of(message: Message) -> int:
    """Source node id of a reply."""
    return int(message.metadata.src_node_id)
