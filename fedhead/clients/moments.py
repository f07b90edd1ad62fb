"""The moment query's reply ([`moment_reply`][fedhead.clients.moments.moment_reply]), without torch: a
deployed moment query starts a fresh process that touches no model (re-exported by
[`fedhead.clients.step`][fedhead.clients.step], the library's steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedhead.federation import protocol
from fedhead.train.client_math import target_moments

if TYPE_CHECKING:
    import torch

__all__ = ["Moments", "moment_reply", "target_moments_of"]

#: ``(mu_m (C,), Sigma_m (C, C))`` of a client's training targets
# ([`fedhead.train.target_moments`][fedhead.train.target_moments]).
Moments = tuple[np.ndarray, np.ndarray]


def target_moments_of(y: torch.Tensor | np.ndarray, moments: Moments | None = None) -> Moments:
    """``moments`` when given, else ``(mu_m, Sigma_m)`` of targets ``y`` (a tensor or an array) in float64."""
    if moments is not None:
        return moments
    if isinstance(y, np.ndarray) or not hasattr(y, "detach"):  # torch is not imported here
        y64 = np.asarray(y)
    else:
        y64 = y.detach().cpu().numpy()
    return target_moments(y64.astype(np.float64))


def moment_reply(y: torch.Tensor | np.ndarray, partition_id: int, *, moments: Moments | None = None) -> RecordDict:
    """The reply content of the moment query: ``(N_m, mu_m, Sigma_m)`` of the training targets.

    Parameters
    ----------
    y : Tensor or ndarray (N_m, C)
        The client's training targets (only these O(C^2) numbers leave it).
    partition_id : int
        The client's number ``0..M-1`` (distinct per client, the same in every reply).
    moments : (ndarray (C,), ndarray (C, C)), optional
        ``(mu_m, Sigma_m)`` already computed from ``y``
        ([`fedhead.train.target_moments`][fedhead.train.target_moments]).

    Returns
    -------
    RecordDict
        ``moments`` ArrayRecord (``mean``, ``cov``) and ``metrics`` (``num-examples``, ``partition-id``).
    """
    mu, sigma = target_moments_of(y, moments)
    return RecordDict(
        {
            protocol.MOMENTS: ArrayRecord(
                {protocol.MEAN: Array(np.asarray(mu)), protocol.COV: Array(np.asarray(sigma))}
            ),
            protocol.METRICS: MetricRecord(
                {protocol.NUM_EXAMPLES: int(y.shape[0]), protocol.PARTITION_ID: int(partition_id)}
            ),
        }
    )
