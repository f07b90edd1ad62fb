"""RawDataset -> standardised targets -> client partition -> [`FederatedData`][fedhead.data.FederatedData], with a
cache.

The expensive part of a data set (reading the published files, or running a generator) is done
once per configuration and kept as an uncompressed ``.npz`` in ``cfg.cache_path()``, named by the
data-set name and a hash of every field of the configuration that can change the samples. The
file is written atomically (temporary file + ``os.replace``) under an advisory file lock, so
several processes (Flower clients in Ray actors) that ask for the same data set at once build it
once and never read a half-written file. Inside one process a memo keeps the loaded arrays.

Standardisation and partitioning are cheap and are redone on every call (they depend on
``num_clients``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from fedhead.analysis.standardization import StandardizationError, check_offset_scale
from fedhead.data.base import ClientData, DataError, FederatedData, RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.data.partition import Partition, designed_partition, eigen_partition
from fedhead.results.io import atomic_open

if TYPE_CHECKING:  # torch is imported where tensors are made (see fedhead.data.base)
    import torch

__all__ = [
    "CACHE_VERSION",
    "Standardization",
    "standardize_targets",
    "partition_raw",
    "build_federated",
    "cache_key",
    "cache_file",
    "load_raw_cached",
    "save_raw",
    "load_raw_file",
    "clear_memo",
    "memo_get",
]

log = logging.getLogger(__name__)

#: Bump when a loader or generator changes what it produces for the same configuration.
CACHE_VERSION = 1

#: Configuration fields that never change the samples (excluded from the cache key).
_KEY_EXCLUDED = (
    "cache_dir",
    "allow_outside_regime",
    "num_clients",
    "chunk_images",
    "read_chunk",
    "image_size",
)  # no effect on the cached samples (image_size resamples after loading)

_MEMO: dict[str, RawDataset] = {}
_MEMO_LOCK = threading.Lock()


# --------------------------------------------------------------------------- standardisation
@dataclasses.dataclass(frozen=True)
class Standardization:
    """Pooled training-target standardisation ``y_std = (y - offset) / scale``.

    ``offset`` and ``scale`` are ``(C,)``; identity (zeros / ones) when disabled (MuJoCo).
    """

    y: np.ndarray
    y_test: np.ndarray | None
    offset: np.ndarray
    scale: np.ndarray


def standardize_targets(
    y: np.ndarray, y_test: np.ndarray | None = None, *, enabled: bool = True, names: Sequence[str] | None = None
) -> Standardization:
    """Centre and scale targets with pooled training statistics (docs/theory.md §10).

    Parameters
    ----------
    y : ndarray, shape (N, C)
        Training targets of all clients together.
    y_test : ndarray, shape (N_test, C), optional
        Transformed with the *training* offset and scale.
    enabled : bool
        False keeps the stored scale (offset 0, scale 1).
    names : sequence of str, optional
        The target columns' names for the error messages (else their indices).

    Returns
    -------
    Standardization
        ``offset = mean(y, axis=0)``, ``scale = std(y, axis=0)`` (population, ``ddof=0``), so the
        standardised training targets have zero mean and unit variance per coordinate. An offset
        or scale that is not finite (values beyond float64) or a constant column is a `DataError`.
    """
    y = np.asarray(y, dtype=np.float64)
    c = y.shape[1]
    if enabled:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow gives inf or NaN, refused here
            offset = y.mean(axis=0)
            scale = y.std(axis=0)
        try:
            check_offset_scale(offset, scale, names=names, positive=False)
        except StandardizationError as exc:
            raise DataError(str(exc)) from None
        bad = np.flatnonzero(~(scale > 0))
        if bad.size:
            raise DataError(
                f"target column(s) {bad.tolist()} are constant over the training set; "
                "they cannot be standardised (check the data set's files)"
            )
    else:
        offset, scale = np.zeros(c), np.ones(c)
    with np.errstate(over="ignore", invalid="ignore"):  # test rows beyond float64: refused by the caller
        ys = (y - offset) / scale
        yts = None if y_test is None else (np.asarray(y_test, dtype=np.float64) - offset) / scale
    return Standardization(y=ys, y_test=yts, offset=offset, scale=scale)


# --------------------------------------------------------------------------- partition + tensors
def partition_raw(raw: RawDataset, y_std: np.ndarray, y_test_std: np.ndarray | None, num_clients: int) -> Partition:
    """Designed groups when the data set has them, else the leading-eigenvector partition."""
    if raw.groups is not None:
        return designed_partition(raw.groups, num_clients, raw.groups_test)
    return eigen_partition(y_std, num_clients, y_test_std)


def _tensor(a: np.ndarray) -> torch.Tensor:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def build_federated(raw: RawDataset, num_clients: int) -> FederatedData:
    """Standardise (unless ``raw.standardize`` is False), partition and convert to tensors.

    Training inputs keep their dtype (float32 tabular, uint8 images); targets become float32 in
    standardised units. Every client gets its samples in ascending original order.
    """
    st = standardize_targets(raw.y, raw.y_test, enabled=raw.standardize, names=raw.target_names)
    part = partition_raw(raw, st.y, st.y_test, num_clients)
    x = raw.x if raw.is_image else raw.x.astype(np.float32, copy=False)
    xt = None
    if raw.x_test is not None:
        xt = raw.x_test if raw.is_image else raw.x_test.astype(np.float32, copy=False)
    clients = []
    for m in range(num_clients):
        idx = part.indices(m)
        cd = ClientData(
            x_train=_tensor(x[idx]),
            y_train=_tensor(st.y[idx].astype(np.float32)),
        )
        if xt is not None and part.test is not None and st.y_test is not None:
            tidx = part.indices(m, test=True)
            cd.x_test = _tensor(xt[tidx])
            cd.y_test = _tensor(st.y_test[tidx].astype(np.float32))
        clients.append(cd)
    return FederatedData(
        name=raw.name,
        clients=clients,
        input_shape=tuple(int(s) for s in raw.x.shape[1:]),
        target_names=tuple(raw.target_names),
        is_image=raw.is_image,
        target_offset=st.offset,
        target_scale=st.scale,
        source=raw.source,
    )


# --------------------------------------------------------------------------- cache
def _key_fields(cfg: DatasetConfig) -> dict:
    fields = dataclasses.asdict(cfg)
    for k in _KEY_EXCLUDED:
        fields.pop(k, None)
    files = cfg.use_files()
    fields["source"] = "files" if files else "generate"  # "auto" resolved
    if fields.get("root"):
        fields["root"] = str(Path(fields["root"]).expanduser().resolve())
    fields["__class__"] = f"{type(cfg).__module__}.{type(cfg).__qualname__}"
    fields["__cache_version__"] = CACHE_VERSION
    return fields


def cache_key(cfg: DatasetConfig) -> str:
    """SHA-256 (hex) of every sample-changing field of ``cfg``, its class and
    [`CACHE_VERSION`][fedhead.data.pipeline.CACHE_VERSION].

    ``source`` enters as the resolved choice (files / generate), ``root`` as an absolute path; ``cache_dir``,
    ``num_clients`` and ``allow_outside_regime`` are excluded. The key does not see the *contents* of the files under
    ``root``: delete the cache file (``fedhead-data`` prints its path) after replacing them.
    """
    blob = json.dumps(_key_fields(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_file(cfg: DatasetConfig) -> Path:
    """``<cache_path>/<name>-<first 16 hex digits of cache_key>.npz``."""
    name = cfg.name or "dataset"
    return cfg.cache_path() / f"{name}-{cache_key(cfg)[:16]}.npz"


def save_raw(raw: RawDataset, path: str | os.PathLike, config: dict | None = None) -> Path:
    """Write ``raw`` as an uncompressed ``.npz`` atomically (temp file in the folder + replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "name": raw.name,
        "target_names": list(raw.target_names),
        "standardize": bool(raw.standardize),
        "source": raw.source,
        "config": config or {},
        "cache_version": CACHE_VERSION,
    }
    arrays = {"x": raw.x, "y": raw.y, "meta": np.array(json.dumps(meta, default=str))}
    for k in ("x_test", "y_test", "groups", "groups_test"):
        v = getattr(raw, k)
        if v is not None:
            arrays[k] = v
    with atomic_open(path) as fh:
        # numpy's stub types **kwds like its allow_pickle flag (numpy >= 2.1); the keys here never clash
        np.savez(fh, **cast(dict[str, Any], arrays))
    return path


def load_raw_file(path: str | os.PathLike) -> RawDataset:
    """Read a file written by [`save_raw`][fedhead.data.pipeline.save_raw] (no pickle). Raises DataError if
    unreadable."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {k: z[k] for k in z.files if k != "meta"}
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise DataError(f"cached data set {path} is unreadable ({exc}); delete it to rebuild") from exc
    if meta.get("cache_version") != CACHE_VERSION:
        raise DataError(
            f"cached data set {path} has cache version {meta.get('cache_version')}, expected {CACHE_VERSION}"
        )
    return RawDataset(
        name=meta["name"],
        x=arrays["x"],
        y=arrays["y"],
        target_names=tuple(meta["target_names"]),
        x_test=arrays.get("x_test"),
        y_test=arrays.get("y_test"),
        groups=arrays.get("groups"),
        groups_test=arrays.get("groups_test"),
        standardize=bool(meta["standardize"]),
        source=meta["source"],
    )


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive advisory lock on ``path`` (POSIX ``flock``; no-op where unavailable)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+b")  # noqa: SIM115 - held by the `with fh:` below, after the error branch
    except OSError as exc:  # read-only cache folder: build without the lock (and the cache)
        warnings.warn(f"cannot create the lock file {path} ({exc})", stacklevel=3)
        yield
        return
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _freeze(raw: RawDataset) -> RawDataset:
    for k in ("x", "y", "x_test", "y_test", "groups", "groups_test"):
        v = getattr(raw, k)
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return raw


def memo_get(cfg: DatasetConfig) -> RawDataset | None:
    """The data set of ``cfg`` if this process has already loaded it (reads no file), else None."""
    key = cache_key(cfg)
    with _MEMO_LOCK:
        return _MEMO.get(key)


def clear_memo() -> None:
    """Forget the in-process memo (the files in the cache folder stay)."""
    with _MEMO_LOCK:
        _MEMO.clear()


def load_raw_cached(
    cfg: DatasetConfig, loader: Callable[[DatasetConfig], RawDataset], *, use_cache: bool = True
) -> RawDataset:
    """Return ``loader(cfg)``, reusing the in-process memo and the cache file when possible.

    Order: memo -> cache file -> (under the file lock: cache file again -> ``loader`` -> write the
    cache atomically). ``use_cache=False`` always calls the loader and touches no file. Arrays of
    the returned data set are read-only (shared by every caller in the process).
    """
    if not use_cache:
        return loader(cfg)
    key = cache_key(cfg)
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
    if hit is not None:
        return hit
    path = cache_file(cfg)
    raw = _try_read(path)
    if raw is None:
        with _file_lock(path.with_name(path.name + ".lock")):
            raw = _try_read(path)  # another process may have finished it meanwhile
            if raw is None:
                log.info("preparing data set %s (cache %s)", cfg.name, path)
                raw = loader(cfg)
                try:
                    save_raw(raw, path, config=_key_fields(cfg))
                    log.info("cached %s at %s", cfg.name, path)
                except OSError as exc:
                    warnings.warn(f"could not write the data cache {path}: {exc}", stacklevel=2)
    raw = _freeze(raw)
    with _MEMO_LOCK:
        _MEMO[key] = raw
    return raw


def _try_read(path: Path) -> RawDataset | None:
    if not path.exists():
        return None
    try:
        return load_raw_file(path)
    except DataError as exc:
        warnings.warn(f"{exc}; rebuilding it", stacklevel=3)
        return None


def resize_images(raw: RawDataset, size: int | None) -> RawDataset:
    """``raw`` with every image resampled to ``size x size`` by area averaging (uint8 kept).

    Tabular data sets and ``size=None`` (or the native size) pass through unchanged. Used for
    ``dataset.image_size`` (CPU smoke runs); targets, groups and the split are untouched.
    """
    if size is None or not raw.is_image or raw.x.shape[-2:] == (size, size):
        return raw
    if raw.x.shape[-1] < size or raw.x.shape[-2] < size:
        raise DataError(f"{raw.name}: dataset.image_size={size} exceeds the native {raw.x.shape[-2:]} images")

    def resample(x: np.ndarray | None) -> np.ndarray | None:
        if x is None:
            return None
        import torch

        t = torch.from_numpy(np.array(x, dtype=np.float32))
        out = torch.nn.functional.interpolate(t, size=(size, size), mode="area")
        return out.round().clamp(0, 255).to(torch.uint8).numpy() if x.dtype == np.uint8 else out.numpy().astype(x.dtype)

    return dataclasses.replace(
        raw, x=resample(raw.x), x_test=resample(raw.x_test), source=f"{raw.source} (resampled to {size}x{size})"
    )
