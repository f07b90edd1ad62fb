"""Typed data-set configuration (built once from Hydra's ``dataset`` group via ``_target_``).

Every file of ``conf/dataset/`` names one of these classes (or a subclass defined next to its
loader) as ``_target_``. Frozen and checked by a constraint table
([`fedhead.analysis.constraints`][fedhead.analysis.constraints]) without touching a file; what
needs the files is [`DatasetConfig.preflight`][fedhead.data.config.DatasetConfig.preflight].
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fedhead.analysis.constraints import Field, check, integer, one_of, optional

SOURCES = ("auto", "files", "generate")
_RULES = (
    Field("image_size", optional(integer(4)), "must be null or an integer >= 4"),
    Field("source", one_of(SOURCES), "must be 'auto', 'files' or 'generate'"),
)


def default_cache_dir() -> Path:
    """``$FEDHEAD_CACHE`` or ``~/.cache/fedhead``: where prepared/generated data sets are kept."""
    return Path(os.environ.get("FEDHEAD_CACHE", Path.home() / ".cache" / "fedhead"))


@dataclass(frozen=True)
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
        Where prepared or generated tensors are cached (default [`default_cache_dir`][fedhead.data.default_cache_dir]).
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
        check(self, _RULES, prefix="dataset.", error=ValueError)

    def preflight(self) -> DatasetConfig:
        """The config checked against its files before anything starts (the data layer's one
        place for file access of a config); built-in data sets have nothing to check."""
        return self

    def use_files(self) -> bool:
        """True when the published files are to be read, False when the generator runs."""
        if self.source == "auto":
            return self.root is not None
        return self.source == "files"

    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()

    def site_local(self) -> bool:
        """Whether each client reads only its own file (a site-local table,
        [`fedhead.data.site`][fedhead.data.site])."""
        return False

    @property
    def files(self) -> tuple[str, ...]:
        """The data set's files, one per client, where it names them (``dataset=table``); else ``()``."""
        return ()
