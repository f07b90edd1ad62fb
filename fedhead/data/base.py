"""Data-set containers shared by every loader, generator and partitioner.

A loader or generator returns a [`RawDataset`][fedhead.data.RawDataset] (numpy, original target units). The pipeline
([`fedhead.data.pipeline`][fedhead.data.pipeline]) standardises targets, partitions into clients and turns the result
into a [`FederatedData`][fedhead.data.FederatedData] of torch tensors that the trainer and the Flower client consume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fedhead.ufm import TargetMoments

if TYPE_CHECKING:  # torch is imported where tensors are made: a client's statistics and SecAgg steps need none
    import torch


class DataError(ValueError):
    """Bad or missing data: the message names the file, what was expected and where to get it."""


class MissingDataError(DataError, FileNotFoundError):
    """A data file or folder is missing."""

    def __init__(self, what: str, looked_in: str, where_to_get: str):
        self.what = what
        self.looked_in = looked_in
        self.where_to_get = where_to_get
        super().__init__(
            f"missing data file: {what} (looked for it in {looked_in}). "
            f"Get it from {where_to_get} and point dataset.root at the folder that holds it."
        )


@dataclass(frozen=True)
class RawDataset:
    """One data set as loaded from its files or produced by a generator.

    Attributes
    ----------
    name : str
        Data-set name as typed by users (``hopper``, ``dsprites``, ...).
    x : ndarray
        Training inputs, ``(N, F)`` float32 for tabular data or ``(N, ch, H, W)`` uint8 images.
    y : ndarray
        Training targets ``(N, C)`` float64 in original units.
    target_names : tuple of str
        ``C`` names.
    x_test, y_test : ndarray or None
        Held-out samples in the same layouts (image data sets), else None.
    groups, groups_test : ndarray or None
        Designed client id per sample (CIFAR-geo); None means the leading-eigenvector partition.
    standardize : bool
        Whether targets are centred and scaled with pooled training statistics (False: MuJoCo).
    source : str
        The files or generator the samples came from.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    target_names: tuple[str, ...]
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    groups: np.ndarray | None = None
    groups_test: np.ndarray | None = None
    standardize: bool = True
    source: str = ""

    @property
    def is_image(self) -> bool:
        return self.x.ndim == 4

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise DataError(f"{self.name}: {self.x.shape[0]} inputs but {self.y.shape[0]} targets ({self.source})")
        if self.y.ndim != 2 or self.y.shape[1] != len(self.target_names):
            raise DataError(f"{self.name}: targets must be (N, {len(self.target_names)}), got {self.y.shape}")
        if not np.all(np.isfinite(self.y)):
            raise DataError(f"{self.name}: non-finite targets ({self.source})")
        if (self.x_test is None) != (self.y_test is None):
            raise DataError(f"{self.name}: x_test and y_test must both be given or both be None")
        if self.x_test is not None and self.y_test is not None:  # both or neither, checked above
            c = len(self.target_names)
            if self.y_test.ndim != 2 or self.y_test.shape[1] != c:
                raise DataError(f"{self.name}: test targets must be (N_test, {c}), got {self.y_test.shape}")
            if self.x_test.shape[0] != self.y_test.shape[0]:
                raise DataError(
                    f"{self.name}: {self.x_test.shape[0]} test inputs but {self.y_test.shape[0]} test "
                    f"targets ({self.source})"
                )
            if self.x_test.shape[1:] != self.x.shape[1:]:
                raise DataError(
                    f"{self.name}: test inputs have sample shape {self.x_test.shape[1:]}, training "
                    f"inputs {self.x.shape[1:]}"
                )
            if not np.all(np.isfinite(self.y_test)):
                raise DataError(f"{self.name}: non-finite test targets ({self.source})")
        for k, ref in (("groups", self.y), ("groups_test", self.y_test)):
            g = getattr(self, k)
            if g is None:
                continue
            if ref is None or g.ndim != 1 or g.shape[0] != ref.shape[0]:
                n_ref = None if ref is None else ref.shape[0]
                raise DataError(f"{self.name}: {k} must be one client id per sample ({n_ref}), got shape {g.shape}")


@dataclass
class ClientData:
    """One client's tensors (CPU; the trainer moves them to its device once).

    ``x_train`` is float32 ``(N_m, F)`` or uint8 ``(N_m, ch, H, W)``; ``y_train`` float32
    ``(N_m, C)`` in the standardised units the theory is evaluated in.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor | None = None
    y_test: torch.Tensor | None = None

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])


@dataclass
class FederatedData:
    """A partitioned data set: one [`ClientData`][fedhead.data.ClientData] per client plus its standardisation."""

    name: str
    clients: list[ClientData]
    input_shape: tuple[int, ...]
    target_names: tuple[str, ...]
    is_image: bool
    target_offset: np.ndarray = field(default_factory=lambda: np.zeros(0))
    target_scale: np.ndarray = field(default_factory=lambda: np.ones(0))
    source: str = ""

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def n_targets(self) -> int:
        return len(self.target_names)

    def moments(self):
        """Training-target moments with weights N_m / N ([`fedhead.ufm.TargetMoments`][fedhead.ufm.TargetMoments])."""
        return TargetMoments.from_targets([c.y_train.detach().cpu().numpy().astype(np.float64) for c in self.clients])


def batch_to_float(xb: torch.Tensor) -> torch.Tensor:
    """Convert an input batch to float32: uint8 images become values in [0, 1]."""
    import torch

    if xb.dtype == torch.uint8:
        return xb.to(torch.float32).div_(255.0)
    if xb.dtype in (torch.int64, torch.int32):  # free-feature indices pass through
        return xb
    return xb.to(torch.float32)
