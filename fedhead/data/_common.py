"""Helpers shared by the data-set loaders (size checks, train/test split, file lookup, grids).

Private to [`fedhead.data`][fedhead.data]; every loader module keeps its own public names and calls these.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedhead.data.base import DataError, MissingDataError, RawDataset
from fedhead.data.config import DatasetConfig


def check_split_sizes(cfg: DatasetConfig, label: str) -> None:
    """``cfg.n_train > 0`` and ``cfg.n_test >= 0``, else a [`DataError`][fedhead.data.DataError] naming ``label``."""
    if cfg.n_train <= 0 or cfg.n_test < 0:
        raise DataError(f"{label}: n_train must be > 0 and n_test >= 0, got {cfg.n_train}, {cfg.n_test}")


def split_samples(
    cfg: DatasetConfig,
    x: np.ndarray,
    y: np.ndarray,
    target_names: tuple[str, ...],
    source: str,
) -> RawDataset:
    """The first ``cfg.n_train`` samples are the training split, the rest the held-out split.

    Parameters
    ----------
    cfg : DatasetConfig
        Supplies ``name``, ``n_train`` and ``n_test`` (``x`` and ``y`` hold ``n_train + n_test``
        rows).
    x : ndarray, shape (n_train + n_test, ...)
    y : ndarray, shape (n_train + n_test, C)
    target_names : tuple of str
    source : str

    Returns
    -------
    RawDataset
        Targets float64 C-contiguous; ``x_test``/``y_test`` None when ``cfg.n_test == 0``.
    """
    n = cfg.n_train
    if x.shape[0] != n + cfg.n_test or y.shape[0] != n + cfg.n_test:
        raise DataError(
            f"{cfg.name}: expected n_train + n_test = {n + cfg.n_test} samples, got "
            f"{x.shape[0]} inputs and {y.shape[0]} targets"
        )
    has_test = cfg.n_test > 0
    return RawDataset(
        name=cfg.name,
        x=x[:n],
        y=np.ascontiguousarray(y[:n], dtype=np.float64),
        target_names=target_names,
        x_test=x[n:] if has_test else None,
        y_test=np.ascontiguousarray(y[n:], dtype=np.float64) if has_test else None,
        source=source,
    )


def resolve_file(cfg: DatasetConfig, file_name: str, published_at: str) -> Path:
    """``cfg.root`` if it is a file, else ``cfg.root / file_name``; a clear error when missing."""
    if cfg.root is None:
        raise MissingDataError(file_name, "dataset.root (not set)", published_at)
    root = Path(cfg.root).expanduser()
    path = root if root.is_file() else root / file_name
    if not path.is_file():
        raise MissingDataError(file_name, str(root), published_at)
    return path


def draw_grid_indices(n: int, seed: int, n_grid: int, label: str) -> np.ndarray:
    """``n`` distinct flat indices of a factor grid of ``n_grid`` cells drawn with
    ``numpy.random.default_rng(seed)`` (int64, in draw order)."""
    if n > n_grid:
        raise DataError(f"{label}: {n} samples asked for but only {n_grid} exist")
    return np.random.default_rng(seed).choice(n_grid, size=n, replace=False).astype(np.int64)


def standardize_columns(x: np.ndarray) -> np.ndarray:
    """``(x - mean) / std`` per column (population std; constant columns are only centred)."""
    x = np.asarray(x, dtype=np.float64)
    sd = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
