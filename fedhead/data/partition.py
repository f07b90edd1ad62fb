"""Client partitions of docs/theory.md §10: the leading-eigenvector split and designed groups.

Pure numpy. The pipeline calls [`eigen_partition`][fedhead.data.eigen_partition] on (already standardised) training
targets or [`designed_partition`][fedhead.data.designed_partition] when a data set comes with designed client groups
(CIFAR-geo).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhead.data.base import DataError

__all__ = ["Partition", "leading_direction", "eigen_partition", "designed_partition"]


@dataclass(frozen=True)
class Partition:
    """Client assignment of every training (and test) sample.

    Attributes
    ----------
    train : ndarray, shape (N,), int64
        Client id of every training sample.
    test : ndarray, shape (N_test,), int64, or None
        Client id of every test sample.
    direction : ndarray, shape (C,), or None
        Unit leading eigenvector used for the split (None for designed groups).
    intervals : ndarray, shape (M, 2), or None
        ``[min, max]`` of the training projections of each client (None for designed groups).
    """

    train: np.ndarray
    test: np.ndarray | None
    direction: np.ndarray | None = None
    intervals: np.ndarray | None = None

    @property
    def n_clients(self) -> int:
        return int(self.train.max()) + 1

    def indices(self, client: int, *, test: bool = False) -> np.ndarray:
        """Sample indices (ascending) of one client in the training or the test set."""
        assign = self.test if test else self.train
        if assign is None:
            raise ValueError("this partition has no test assignment")
        return np.flatnonzero(assign == client)


def leading_direction(y: np.ndarray) -> np.ndarray:
    """Top eigenvector of the uncentred second-moment matrix ``S = Yᵀ Y / N`` (docs/theory.md §10).

    Parameters
    ----------
    y : ndarray, shape (N, C)
        Training targets (rows are samples), in the units the partition is made in.

    Returns
    -------
    ndarray, shape (C,)
        Unit eigenvector of the largest eigenvalue of ``S`` (symmetrised, ``eigh``), with the sign
        fixed so that its largest-magnitude component is positive (deterministic output).
    """
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] < 1:
        raise DataError(f"targets must be a non-empty (N, C) array, got shape {y.shape}")
    s = y.T @ y / y.shape[0]
    s = 0.5 * (s + s.T)
    _, vecs = np.linalg.eigh(s)
    v = vecs[:, -1]
    k = int(np.argmax(np.abs(v)))
    return v if v[k] > 0 else -v


def eigen_partition(y_train: np.ndarray, num_clients: int, y_test: np.ndarray | None = None) -> Partition:
    """Leading-eigenvector partition (docs/theory.md §10).

    Every training target is projected on [`leading_direction`][fedhead.data.leading_direction] ``v``;
    samples are sorted by ``z = Y v`` (stable sort, ties by index) and cut into ``num_clients`` contiguous
    groups of equal size (sizes differ by at most one when ``N`` is not divisible): client 0 holds the
    smallest projections. A test sample goes to the client whose training projection interval ``[min z,
    max z]`` is nearest to its projection (distance 0 inside; the lower id on a tie).

    Parameters
    ----------
    y_train : ndarray, shape (N, C)
    num_clients : int
        ``M >= 1``, at most ``N``.
    y_test : ndarray, shape (N_test, C), optional

    Returns
    -------
    Partition
    """
    y_train = np.asarray(y_train, dtype=np.float64)
    if y_train.ndim != 2:
        raise DataError(f"training targets must be an (N, C) array, got shape {y_train.shape}")
    if not np.all(np.isfinite(y_train)):
        raise DataError("training targets contain non-finite values; cannot partition")
    n = y_train.shape[0]
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise DataError(f"num_clients must be a positive integer, got {num_clients!r}")
    if n < num_clients:
        raise DataError(f"cannot split {n} training samples into {num_clients} clients")
    v = leading_direction(y_train)
    z = y_train @ v
    order = np.argsort(z, kind="stable")
    assign = np.empty(n, dtype=np.int64)
    for m, chunk in enumerate(np.array_split(order, num_clients)):
        assign[chunk] = m
    intervals = np.array([[z[assign == m].min(), z[assign == m].max()] for m in range(num_clients)])
    test = None
    if y_test is not None:
        y_test = np.asarray(y_test, dtype=np.float64)
        if y_test.ndim != 2 or y_test.shape[1] != y_train.shape[1]:
            raise DataError(f"test targets must be (N_test, {y_train.shape[1]}), got shape {y_test.shape}")
        if not np.all(np.isfinite(y_test)):
            raise DataError("test targets contain non-finite values; cannot assign them to clients")
        zt = y_test @ v
        lo, hi = intervals[:, 0], intervals[:, 1]
        dist = np.maximum(lo[None, :] - zt[:, None], 0.0) + np.maximum(zt[:, None] - hi[None, :], 0.0)
        test = np.argmin(dist, axis=1).astype(np.int64)
    return Partition(train=assign, test=test, direction=v, intervals=intervals)


def designed_partition(groups: np.ndarray, num_clients: int, groups_test: np.ndarray | None = None) -> Partition:
    """Use a data set's designed client groups (CIFAR-geo) as the partition.

    Parameters
    ----------
    groups : ndarray, shape (N,), integer client ids in ``0..M-1``, every id present
    num_clients : int
        Must equal the number of designed groups ``M``.
    groups_test : ndarray, shape (N_test,), optional
    """
    groups = np.asarray(groups)
    if groups.ndim != 1 or not np.issubdtype(groups.dtype, np.integer):
        raise DataError(f"designed groups must be a 1-d integer array, got {groups.dtype} {groups.shape}")
    present = np.unique(groups)
    if present.size != num_clients or present[0] != 0 or present[-1] != num_clients - 1:
        raise DataError(
            f"the data set's designed groups are {present.tolist()}, but num_clients={num_clients}: "
            f"this data set has {present.size} designed clients; use num_clients={present.size}"
        )
    test = None
    if groups_test is not None:
        groups_test = np.asarray(groups_test)
        if groups_test.ndim != 1 or groups_test.size and (groups_test.min() < 0 or groups_test.max() >= num_clients):
            raise DataError(f"designed test groups must be ids in 0..{num_clients - 1}")
        test = groups_test.astype(np.int64)
    return Partition(train=groups.astype(np.int64), test=test)
