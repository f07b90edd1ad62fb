"""Data-set names -> config classes and loaders; [`load_federated`][fedhead.data.load_federated], the layer's entry
point.

Every data set is a module exposing a [`DatasetConfig`][fedhead.data.DatasetConfig] subclass and
``load(cfg) -> RawDataset``. Modules are imported lazily (``fedhead.data`` does not import
gymnasium or h5py until a data set needs them).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhead.data.base import DataError, FederatedData, RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.data.pipeline import build_federated, load_raw_cached, resize_images
from fedhead.data.table_files import file_key

__all__ = [
    "DatasetEntry",
    "REGISTRY",
    "dataset_names",
    "config_class",
    "make_config",
    "coerce_config",
    "get_loader",
    "load_raw",
    "load_federated",
    "data_record",
]


@dataclass(frozen=True)
class DatasetEntry:
    """Where a data set lives: ``module`` with config class ``config`` and ``load(cfg)``;
    ``builtin`` False for the user's own files (``table``)."""

    name: str
    module: str
    config: str
    builtin: bool = True


REGISTRY: dict[str, DatasetEntry] = {
    e.name: e
    for e in (
        DatasetEntry("beijing", "fedhead.data.beijing", "BeijingConfig"),
        DatasetEntry("swimmer", "fedhead.data.mujoco", "MujocoConfig"),
        DatasetEntry("hopper", "fedhead.data.mujoco", "MujocoConfig"),
        DatasetEntry("halfcheetah", "fedhead.data.mujoco", "MujocoConfig"),
        DatasetEntry("walker2d", "fedhead.data.mujoco", "MujocoConfig"),
        DatasetEntry("mpiigaze", "fedhead.data.mpiigaze", "MPIIGazeConfig"),
        DatasetEntry("300w_lp", "fedhead.data.w300lp", "W300LPConfig"),
        DatasetEntry("dsprites", "fedhead.data.dsprites", "DSpritesConfig"),
        DatasetEntry("shapes3d", "fedhead.data.shapes3d", "Shapes3DConfig"),
        DatasetEntry("cifar_geo", "fedhead.data.cifar_geo", "CifarGeoConfig"),
        DatasetEntry("table", "fedhead.data.table", "TableConfig", builtin=False),
    )
}


def dataset_names() -> tuple[str, ...]:
    """The ten built-in names accepted by ``dataset=`` (docs/theory.md §10 order); ``table`` (the
    user's own files) is in [`REGISTRY`][fedhead.data.REGISTRY] too."""
    return tuple(n for n, e in REGISTRY.items() if e.builtin)


def _entry(name: str) -> DatasetEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise DataError(f"unknown data set {name!r}; expected one of {', '.join(REGISTRY)}") from None


def _module(entry: DatasetEntry):
    try:
        return importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        if exc.name == entry.module:
            raise DataError(f"data set {entry.name!r}: its module {entry.module} is not installed") from exc
        raise


def config_class(name: str) -> type[DatasetConfig]:
    """The [`DatasetConfig`][fedhead.data.DatasetConfig] subclass of data set ``name``."""
    entry = _entry(name)
    return getattr(_module(entry), entry.config)


def get_loader(name: str) -> Callable[[DatasetConfig], RawDataset]:
    """``load(cfg) -> RawDataset`` of data set ``name``."""
    return _module(_entry(name)).load


def make_config(name: str, **overrides) -> DatasetConfig:
    """A config of data set ``name`` with its docs/theory.md §10 defaults and the given field overrides."""
    cls = config_class(name)
    return cls(**{**overrides, "name": name})


def coerce_config(cfg: DatasetConfig) -> DatasetConfig:
    """Return ``cfg`` as its data set's config class (a plain [`DatasetConfig`][fedhead.data.DatasetConfig] or another
    class is rebuilt from the fields both share; unknown extra fields are an error)."""
    if not isinstance(cfg, DatasetConfig):
        raise DataError(f"expected a DatasetConfig, got {type(cfg).__name__}")
    cls = config_class(cfg.name)
    if isinstance(cfg, cls):
        return cfg
    own = {f.name for f in dataclasses.fields(cls)}
    given = dataclasses.asdict(cfg)
    extra = sorted(set(given) - own)
    if extra:
        raise DataError(f"data set {cfg.name!r} ({cls.__name__}) has no option(s) {extra}")
    return cls(**given)


def load_raw(cfg: DatasetConfig, *, use_cache: bool = True) -> RawDataset:
    """Load (or generate) the un-partitioned data set through the cache of
    [`fedhead.data.pipeline.load_raw_cached`][fedhead.data.pipeline.load_raw_cached]."""
    cfg = coerce_config(cfg)
    raw = load_raw_cached(cfg, get_loader(cfg.name), use_cache=use_cache)
    raw = resize_images(raw, cfg.image_size)
    if cfg.n_train is not None and raw.y.shape[0] != cfg.n_train:  # None: every row (dataset=table)
        raise DataError(
            f"data set {cfg.name}: the loader returned {raw.y.shape[0]} training samples but the config asks "
            f"for exactly dataset.n_train={cfg.n_train} (source {raw.source or '?'}): set dataset.n_train to at "
            f"most the samples available, or check the files"
        )
    return raw


def load_federated(
    cfg: DatasetConfig,
    *,
    num_clients: int | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> FederatedData:
    """Load, standardise and partition a data set (docs/theory.md §10).

    Parameters
    ----------
    cfg : DatasetConfig
        The typed ``dataset`` config (its ``name`` selects the data set).
    num_clients : int, optional
        Number of clients ``M``; default ``cfg.num_clients``.
    seed : int, optional
        Overrides ``cfg.seed`` (generator seed and deterministic subsampling).
    use_cache : bool
        Reuse / write the cache file and in-process memo (default True).

    Returns
    -------
    FederatedData
        Fresh tensors on every call (safe to modify); the prepared arrays are cached.
    """
    cfg = coerce_config(cfg).preflight()
    if seed is not None and seed != cfg.seed:
        cfg = dataclasses.replace(cfg, seed=int(seed))
    m = cfg.num_clients if num_clients is None else num_clients
    if not isinstance(m, int) or m < 1:
        raise DataError(f"num_clients must be a positive integer, got {m!r}")
    raw = load_raw(cfg, use_cache=use_cache)
    return build_federated(raw, m)


def data_record(cfg: DatasetConfig, data: FederatedData) -> dict[str, Any]:
    """What a resumed run must find again (no rows; JSON-ready): the site keys of the files
    (``dataset.files``; [`file_key`][fedhead.data.table_files.file_key]), the target
    standardisation (offsets and scales) and each client's per-column mean and variance of its
    tabular training inputs as trained on (none for images).

    Parameters
    ----------
    cfg : DatasetConfig
        The config ``data`` was loaded with.
    data : FederatedData
        [`load_federated`][fedhead.data.load_federated]'s result.
    """
    files = tuple(getattr(cfg, "files", ()) or ())
    means, variances = [], []
    for c in data.clients:
        x = c.x_train.detach().cpu().numpy()
        if x.ndim == 2 and x.dtype.kind == "f":
            x = x.astype(np.float64)
            means.append(x.mean(axis=0).tolist())
            variances.append(x.var(axis=0).tolist())
    return {
        "site_keys": [[Path(f).name, file_key(f)] for f in files],
        "target_names": list(data.target_names),
        "target_offset": np.asarray(data.target_offset, dtype=np.float64).tolist(),
        "target_scale": np.asarray(data.target_scale, dtype=np.float64).tolist(),
        "input_mean": means,
        "input_var": variances,
    }
