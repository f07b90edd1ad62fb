"""Reading and writing the records of the messages a client serves (no state, no cache): the
round a message names, the pooled ``Sigma_cen`` it carries, and the shared backbone state of
full-model averaging. [`ClientError`][fedhead.clients.messages.ClientError] is a client's error;
[`site_data_error`][fedhead.clients.messages.site_data_error] the one of a problem with its data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict

from fedhead.data.base import DataError
from fedhead.data.table_files import TableError
from fedhead.federation import protocol

if TYPE_CHECKING:  # torch only where a model is touched: a query or a SecAgg step imports none
    import torch

log = logging.getLogger(__name__)


class ClientError(RuntimeError):
    """A client could not serve a message; the text names the partition and the cause."""


def site_data_error(exc: Exception, where: str) -> ClientError:
    """The error a site sends for a problem with its own data (``exc``), and its local log entry.

    The reply carries the text of a [`TableError`][fedhead.data.table_files.TableError] (the file,
    the column, the kind of problem; any [`DataError`][fedhead.data.DataError] of the data layer
    alike), and of any other exception only its type: neither ever quotes a row. The detail (the
    offending value and row, the counts; another exception's text) goes to this node's own log
    only. Raise it ``from None``: a chained cause would show ``exc``'s text in the traceback flwr
    may send.
    """
    if isinstance(exc, DataError):  # its text names the file, the column, the kind: never a value
        public = str(exc)
        local = exc.local_text() if isinstance(exc, TableError) else public
    else:
        public = f"its data could not be read ({type(exc).__name__}; see the node's log)"
        local = f"{public} [{exc}]"
    log.warning("%s: %s", where, local)
    return ClientError(f"{where}: {public}")


@dataclass(frozen=True)
class TrainingMessage:
    """What a training message brings a client: its round, the broadcast head ``(W_t (C, P),
    b_t (C,))`` and, for a correcting procedure, the pooled ``Sigma_cen (C, C)`` (else None)."""

    round: int
    weight: np.ndarray
    bias: np.ndarray
    sigma_cen: np.ndarray | None

    @classmethod
    def read(cls, content: RecordDict, gamma: float, pid: int) -> TrainingMessage:
        """The training message of ``content`` for a client with correction ``gamma``."""
        round_ = round_of(content)
        weight, bias = broadcast_head(content, pid)
        return cls(round_, weight, bias, sigma_cen_of(content, gamma, pid))


def broadcast_head(content: RecordDict, pid: int) -> tuple[np.ndarray, np.ndarray]:
    """The broadcast head ``(W_t, b_t)`` a training or evaluate message carries."""
    if protocol.HEAD not in content.array_records:
        raise ClientError(f"partition {pid}: the message carries no '{protocol.HEAD}' record")
    return protocol.read_head(content.array_records[protocol.HEAD])


def apply_shared_state(backbone: torch.nn.Module, record: ArrayRecord | None, pid: int) -> None:
    """Load the averaged backbone (full-model averaging), keeping the private BatchNorm stats."""
    import torch

    if record is None:
        return
    own = backbone.state_dict()
    shared = {k: torch.as_tensor(v.numpy()) for k, v in record.items()}
    unknown = sorted(set(shared) - set(own))
    if unknown:
        raise ClientError(f"partition {pid}: broadcast backbone has unknown entries {unknown[:5]}")
    for k, v in shared.items():
        if protocol.is_private_state(k):
            continue
        own[k] = v.to(own[k].dtype).reshape(own[k].shape)
    backbone.load_state_dict(own)


def shared_state(backbone: torch.nn.Module) -> ArrayRecord:
    """The backbone's shareable state (BatchNorm running statistics excluded)."""
    return ArrayRecord(
        {
            k: Array(v.detach().cpu().numpy().copy())
            for k, v in backbone.state_dict().items()
            if not protocol.is_private_state(k)
        }
    )


def sigma_cen_of(content: RecordDict, gamma: float, pid: int) -> np.ndarray | None:
    """The pooled ``Sigma_cen (C, C)`` a correcting procedure (``gamma > 0``) receives in a training
    message's ``content``; None otherwise."""
    if gamma <= 0:
        return None
    if protocol.SIGMA_CEN not in content.array_records:
        raise ClientError(f"partition {pid}: corrected procedure but the message carries no Sigma_cen")
    return content.array_records[protocol.SIGMA_CEN][protocol.SIGMA_CEN_ARRAY].numpy().astype(np.float64)


def round_of(msg: Message | RecordDict) -> int:
    """The server round a message (or its content) names (``config["server-round"]``)."""
    content = msg.content if isinstance(msg, Message) else msg
    cfg = content.config_records.get(protocol.CONFIG)
    if cfg is None or protocol.SERVER_ROUND not in cfg:
        raise ClientError(f"message lacks config[{protocol.SERVER_ROUND!r}]")
    return protocol.record_int(cfg[protocol.SERVER_ROUND])
