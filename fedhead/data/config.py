"""Typed data-set configuration (built once from Hydra's ``dataset`` group via ``_target_``).

Every file of ``conf/dataset/`` names one of these classes (or a subclass defined next to its
loader) as ``_target_``. Nothing below the entry points reads raw config keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def default_cache_dir() -> Path:
    """``$FEDHEAD_CACHE`` or ``~/.cache/fedhead``: where prepared/generated data sets are kept."""
    return Path(os.environ.get("FEDHEAD_CACHE", Path.home() / ".cache" / "fedhead"))


@dataclass
class DatasetConfig:
    """Options shared by every data set.

    Attributes
    ----------
    name : str
        The name users type (``dataset=hopper``).
    root : str or None
        Folder holding the published files. None selects the offline generator where one exists.
    source : str
        ``"auto"`` (files when ``root`` is set, else the generator), ``"files"`` or ``"generate"``.
    n_train, n_test : int
        Training / test samples in total over all clients (docs/theory.md §10 table).
    num_clients : int
        Default client count of the data set (docs/theory.md §10 table); ``num_clients=`` overrides it.
    cache_dir : str or None
        Where prepared or generated tensors are cached (default :func:`default_cache_dir`).
    seed : int
        Seed of the generator and of every deterministic subsample.
    allow_outside_regime : bool
        Let a run start even though a client violates the fully active condition.
    image_size : int or None
        Image data sets only: resample every image to ``image_size x image_size`` (area
        averaging) after loading; None keeps the native size (docs/theory.md §10). Meant for
        CPU smoke runs (``fedhead-sweep scale=smoke``); targets are unchanged.
    """

    name: str = ""
    root: str | None = None
    source: str = "auto"
    n_train: int = 4000
    n_test: int = 0
    num_clients: int = 4
    cache_dir: str | None = None
    seed: int = 0
    allow_outside_regime: bool = False
    image_size: int | None = None

    def __post_init__(self) -> None:
        if self.image_size is not None and (
            isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or self.image_size < 4
        ):
            raise ValueError(f"dataset.image_size must be null or an integer >= 4, got {self.image_size!r}")

    def use_files(self) -> bool:
        """True when the published files are to be read, False when the generator runs."""
        if self.source not in ("auto", "files", "generate"):
            raise ValueError(f"dataset.source must be 'auto', 'files' or 'generate', got {self.source!r}")
        if self.source == "auto":
            return self.root is not None
        return self.source == "files"

    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()
