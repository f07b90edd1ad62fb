"""The message protocol between the fedhead ServerApp and ClientApp (record names and codecs).

Every message is a `flwr.app.RecordDict`; this module names its records, their keys and
the private-state rule, and converts records to and from plain numpy, so that the server
(``strategies/``) and the clients (``clients/``) agree on one layout. Both sides import this
neutral module; neither imports the other.

Server -> client
    ``query``  : ``config`` ConfigRecord (``stage="moments"``; for a site-local ``dataset=table``
                 run ``stage="statistics"`` instead: the raw statistics below); with ``measure_mismatch=true``, once
                 after round 1, ``stage="mismatch"`` (+ ``server-round``) and a ``mismatch``
                 ArrayRecord (the client's own trained head ``own_weight``/``own_bias``, the
                 trained average ``trained_weight``, the aligned average ``aligned_weight``, their
                 bias ``average_bias`` and the client's rotation ``rotation (P,P)``).
    ``train``  : ``head`` ArrayRecord (``weight (C,P)``, ``bias (C,)``, float64), ``config``
                 ConfigRecord (``server-round``), optional ``sigma_cen`` ArrayRecord
                 (``sigma_cen (C,C)``, corrected procedures), optional ``backbone`` ArrayRecord
                 (full-model averaging; BatchNorm statistics never included).
    ``evaluate``: ``head`` ArrayRecord, ``config`` ConfigRecord; in the run's last round the
                 config also has ``final-round=true``: the head is the run's final shared head, and each
                 client saves its final model ([`fedhead.clients.export`][fedhead.clients.export],
                 ``output.export_model``).
    After a statistics exchange every message also carries a ``standardization`` ArrayRecord
    (``target_offset``, ``target_scale`` ``(C,)``, ``input_offset``, ``input_scale`` ``(F,)`` or
    empty) and, when the server numbered the SuperNodes, ``config["partition-id"]``.

Client -> server
    ``query``  : ``moments`` ArrayRecord (``mean (C,)``, ``cov (C,C)``), ``metrics``
                 MetricRecord (``num-examples``, ``partition-id``); the mismatch query's reply:
                 ``metrics`` with ``mismatch_local``, ``mismatch_trained``, ``mismatch_aligned``
                 (the client's objectives, [`fedhead.analysis.mismatch_cost`][fedhead.analysis.mismatch_cost]);
                 ``stage="statistics"``: ``site_stats`` ArrayRecord (raw ``y_mean (C,)``,
                 ``y_cov (C,C)``, ``x_mean``, ``x_var`` ``(F,)``), ``site`` ConfigRecord
                 (``columns``: the file's column signature, ``site-key``: hash of its bytes),
                 ``metrics`` (``num-examples``, ``partition-id`` when the node config has one).
    ``train``  : ``head`` ArrayRecord, ``metrics`` MetricRecord (``num-examples``,
                 ``partition-id``, ``objective_gap``, local metrics), optional ``checks``
                 ArrayRecord (``trained_gram (C,C)`` before alignment), optional ``backbone``.
    ``evaluate``: ``metrics`` MetricRecord (``num-examples``, ``partition-id``, ``train_mse``,
                 ``num-test-examples``, ``test_mse`` when the client has test data).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from fedhead.results.rounds import ClientMetric

if TYPE_CHECKING:  # the constants and the private-state rule need no flwr (the numpy layer uses them)
    from flwr.app import ArrayRecord, Message

# record names
HEAD = "head"
BACKBONE = "backbone"
SIGMA_CEN = "sigma_cen"
MOMENTS = "moments"
ROW_RELEASE = "row_release"  # privacy.dp_unit=row: the moment step's noised row-level release (never sent as is)
CHECKS = "checks"
CONFIG = "config"
METRICS = "metrics"
MISMATCH = "mismatch"  # the mismatch query's heads and rotation (measure_mismatch=true, round 1)
SITE_STATS = "site_stats"  # a site's raw statistics (stage="statistics")
SITE = "site"  # its column signature and key (stage="statistics")
STANDARDIZATION = "standardization"  # the federation's pooled offsets and scales (after the statistics)

# array keys
WEIGHT = "weight"  # in HEAD: W (C, P)
BIAS = "bias"  # in HEAD: b (C,)
MEAN = "mean"  # in MOMENTS: mu_m (C,)
COV = "cov"  # in MOMENTS: Sigma_m (C, C)
RELEASE = "release"  # in ROW_RELEASE: the site's share of the secure sum (1 + C + C (C + 1),)
SIGMA_CEN_ARRAY = "sigma_cen"  # in SIGMA_CEN: Sigma_cen (C, C)
TRAINED_GRAM = "trained_gram"  # in CHECKS: W^ W^^T before alignment (C, C)
OWN_WEIGHT = "own_weight"  # in MISMATCH: the client's trained head W~_m (C, P)
OWN_BIAS = "own_bias"  # in MISMATCH: its bias b~_m (C,)
TRAINED_WEIGHT = "trained_weight"  # in MISMATCH: sum_m p_m W~_m (C, P)
ALIGNED_WEIGHT = "aligned_weight"  # in MISMATCH: sum_m p_m W~_m Q_m (C, P)
AVERAGE_BIAS = "average_bias"  # in MISMATCH: sum_m p_m b~_m (C,)
ROTATION = "rotation"  # in MISMATCH: the client's Q_m (P, P); its aligned features are Q_m^T h
Y_MEAN, Y_COV, X_MEAN, X_VAR = "y_mean", "y_cov", "x_mean", "x_var"  # in SITE_STATS (raw units)
TARGET_OFFSET, TARGET_SCALE = "target_offset", "target_scale"  # in STANDARDIZATION: (C,)
INPUT_OFFSET, INPUT_SCALE = "input_offset", "input_scale"  # in STANDARDIZATION: (F,), empty unless pooled
COLUMNS, SITE_KEY = "columns", "site-key"  # in SITE (config)

# config keys
STAGE = "stage"
STAGE_MOMENTS = "moments"
STAGE_MISMATCH = "mismatch"
STAGE_STATISTICS = "statistics"
SERVER_ROUND = ClientMetric.SERVER_ROUND.name  # also echoed in the train reply's metrics
FINAL_ROUND = "final-round"  # true in the evaluate config of the run's last round (the client saves its model)
JOB = "job"  # index of the job when one simulation serves several procedures

# metric keys: a train reply's metrics are results.json's per-client metrics, declared (with
# their meaning) in the results layer; the names below are kept for importers
NUM_EXAMPLES = ClientMetric.NUM_EXAMPLES.name
NUM_TEST_EXAMPLES = "num-test-examples"
PARTITION_ID = ClientMetric.PARTITION_ID.name
OBJECTIVE_GAP = ClientMetric.OBJECTIVE_GAP.name
TRAINED_GAP = ClientMetric.TRAINED_GAP.name
LOCAL_EPOCHS = ClientMetric.LOCAL_EPOCHS.name
OBJECTIVE = ClientMetric.OBJECTIVE.name
OPTIMAL_OBJECTIVE = ClientMetric.OPTIMAL_OBJECTIVE.name
LOCAL_TRAIN_MSE = ClientMetric.LOCAL_TRAIN_MSE.name
TRAIN_SECONDS = ClientMetric.TRAIN_SECONDS.name
LOCAL_SECONDS = ClientMetric.LOCAL_SECONDS.name
N_STEPS = ClientMetric.N_STEPS.name
ALIGN_DISTANCE_BEFORE = ClientMetric.ALIGN_DISTANCE_BEFORE.name
ALIGN_DISTANCE_AFTER = ClientMetric.ALIGN_DISTANCE_AFTER.name
DISTANCE_TO_BROADCAST = ClientMetric.DISTANCE_TO_BROADCAST.name
DISTANCE_TO_SELECTION = ClientMetric.DISTANCE_TO_SELECTION.name
RELATIVE_DISTANCE_TO_SELECTION = ClientMetric.RELATIVE_DISTANCE_TO_SELECTION.name
TRAIN_MSE = "train_mse"
TEST_MSE = "test_mse"
SHARED_OBJECTIVE = "shared_objective"
MISMATCH_LOCAL = "mismatch_local"  # L_m of the client's own trained local model
MISMATCH_TRAINED = "mismatch_trained"  # L_m of the trained average with its trained backbone
MISMATCH_ALIGNED = "mismatch_aligned"  # L_m of the aligned average with its aligned backbone

#: Suffixes of BatchNorm buffers: client-private, never averaged nor sent (theory.md §1, full-model variant).
PRIVATE_STATE_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def is_private_state(name: str) -> bool:
    """True for BatchNorm running statistics, which never leave the client."""
    return name.endswith(PRIVATE_STATE_SUFFIXES)


def head_record(weight: np.ndarray, bias: np.ndarray) -> ArrayRecord:
    """``ArrayRecord`` holding a head ``(W (C,P), b (C,))`` in float64."""
    # flwr: the names and the private-state rule stay importable without it
    from flwr.app import Array, ArrayRecord

    return ArrayRecord(
        {
            WEIGHT: Array(np.ascontiguousarray(weight, dtype=np.float64)),
            BIAS: Array(np.ascontiguousarray(bias, dtype=np.float64)),
        }
    )


def arrays_to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """Every array of an ``ArrayRecord`` as numpy (original dtype)."""
    return {k: v.numpy() for k, v in record.items()}


def numpy_to_arrays(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An ``ArrayRecord`` from a mapping name -> ndarray (copied, contiguous)."""
    # flwr: the names and the private-state rule stay importable without it
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


def read_head(record: ArrayRecord) -> tuple[np.ndarray, np.ndarray]:
    """``(W, b)`` from a head record; raises ``KeyError`` naming what is missing."""
    missing = [k for k in (WEIGHT, BIAS) if k not in record]
    if missing:
        raise KeyError(f"head record lacks {missing}; it has {list(record.keys())}")
    return record[WEIGHT].numpy(), record[BIAS].numpy()


def record_int(value: object) -> int:
    """``int(value)`` for a scalar record value (a number, or a string of one, as a node config
    may carry); ``TypeError`` for a list or bytes, which records can also hold."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


def node_of(message: Message) -> int:
    """Source node id of a reply."""
    return int(message.metadata.src_node_id)
