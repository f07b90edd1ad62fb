"""MPIIGaze (docs/theory.md §10): 36x60 grey normalised eye images, targets gaze pitch and yaw.

Reads the "Normalized" release: ``Data/Normalized/pXX/dayYY.mat`` (MATLAB v5, one file per
participant and day) holding a struct ``data`` with fields ``left`` and ``right``, each with
``image`` ``(n, 36, 60)`` uint8, ``gaze`` ``(n, 3)`` unit gaze vectors in the normalised camera
frame and ``pose`` ``(n, 3)`` head rotation vectors. ``dataset.root`` is the MPIIGaze folder
(holding ``Data/Normalized``), the ``Data`` folder or the ``Normalized`` folder itself.

Targets ``(gaze_pitch, gaze_yaw)`` in **radians**, from a unit gaze vector ``g = (x, y, z)``
(pointing from the eye to the target; the camera looks along +z, y points down) by the standard
MPIIGaze convention::

    pitch = arcsin(-y)          (positive: looking up, towards negative camera y)
    yaw   = arctan2(-x, -z)     (positive: looking towards negative camera x)

Right eyes are mirrored horizontally and their yaw negated (``mirror_right=True``, the usual
preprocessing), so both eyes share one geometry; ``eyes`` selects ``"both"``, ``"left"`` or
``"right"``.

Sample selection (deterministic under ``seed``, independent of the order files are found in):
every eye image gets a uniform key from ``default_rng([seed, crc32(relative path), eye])``; the
``n_train + n_test`` smallest keys are kept while streaming the files (memory: the kept images
plus one file), in increasing key order; the first ``n_train`` are the training split, the rest
the held-out split. There is no offline generator: without ``dataset.root`` [`load`][fedhead.data.mpiigaze.load] raises
[`MissingDataError`][fedhead.data.MissingDataError].
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io

from fedhead.data._common import check_split_sizes, split_samples
from fedhead.data.base import DataError, MissingDataError, RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.progress import progress

__all__ = ["MPIIGazeConfig", "load", "gaze_to_pitch_yaw", "read_day_file", "TARGET_NAMES"]

log = logging.getLogger(__name__)

PUBLISHED_AT = (
    "MPIIGaze (perceptualui.org/research/datasets/MPIIGaze, or the MPI Informatics page "
    "mpi-inf.mpg.de 'Appearance-based gaze estimation in the wild'; MPIIGaze.tar.gz, folder "
    "Data/Normalized)"
)
TARGET_NAMES = ("gaze_pitch", "gaze_yaw")
EYE_SHAPE = (36, 60)
_DAY_FILES = "Data/Normalized/pXX/dayYY.mat"
_EYES = {"left": 0, "right": 1}


@dataclass(frozen=True)
class MPIIGazeConfig(DatasetConfig):
    """MPIIGaze configuration (``_target_: fedhead.data.mpiigaze.MPIIGazeConfig``).

    Attributes (defaults; ``source``, ``cache_dir`` and ``allow_outside_regime`` as in
    [`DatasetConfig`][fedhead.data.DatasetConfig])
    ---------------------
    name : str = "mpiigaze"
    root : str or None = None
        MPIIGaze folder (holding ``Data/Normalized``), or ``Data``, or ``Normalized``. Required:
        there is no generator.
    n_train : int = 12000
    n_test : int = 3000
    num_clients : int = 8
    seed : int = 0
    eyes : str = "both"
        ``"both"``, ``"left"`` or ``"right"``.
    mirror_right : bool = True
        Mirror right-eye images horizontally and negate their yaw.
    """

    name: str = "mpiigaze"
    n_train: int = 12000
    n_test: int = 3000
    num_clients: int = 8
    eyes: str = "both"
    mirror_right: bool = True


def gaze_to_pitch_yaw(gaze: np.ndarray) -> np.ndarray:
    """``(n, 3)`` gaze vectors -> ``(n, 2)`` ``(pitch, yaw)`` radians (vectors are normalised)."""
    g = np.asarray(gaze, dtype=np.float64)
    norm = np.linalg.norm(g, axis=1, keepdims=True)
    if np.any(norm == 0) or not np.all(np.isfinite(g)):
        raise DataError("mpiigaze: zero or non-finite gaze vector")
    g = g / norm
    pitch = np.arcsin(np.clip(-g[:, 1], -1.0, 1.0))
    yaw = np.arctan2(-g[:, 0], -g[:, 2])
    return np.stack([pitch, yaw], axis=1)


def _field(obj, name: str, path: Path, where: str):
    try:
        return getattr(obj, name)
    except AttributeError:
        raise DataError(f"{path}: struct {where} has no field {name!r}") from None


def read_day_file(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Read one ``dayYY.mat``: ``{"left"|"right": (images (n, 36, 60) uint8, gaze (n, 3))}``."""
    try:
        mat = scipy.io.loadmat(str(path), struct_as_record=False, squeeze_me=True)
    except NotImplementedError as err:  # MATLAB v7.3 (HDF5)
        raise DataError(f"{path}: MATLAB v7.3 file; expected the MATLAB v5 files of the release ({err})") from err
    except Exception as err:  # scipy raises ValueError/TypeError/OSError on corrupt files
        raise DataError(f"{path}: not a readable MATLAB v5 file ({type(err).__name__}: {err})") from err
    if "data" not in mat:
        raise DataError(f"{path}: no variable 'data'; expected struct data.left/right.image/gaze")
    out = {}
    for eye in _EYES:
        sub = _field(mat["data"], eye, path, "data")
        img = np.asarray(_field(sub, "image", path, f"data.{eye}"))
        gaze = np.asarray(_field(sub, "gaze", path, f"data.{eye}"), dtype=np.float64)
        if img.size == 0 and gaze.size == 0:
            out[eye] = (np.empty((0, *EYE_SHAPE), np.uint8), np.empty((0, 3)))
            continue
        if img.shape[-2:] != EYE_SHAPE or img.dtype != np.uint8:
            raise DataError(f"{path}: data.{eye}.image must be uint8 (n, 36, 60), got {img.dtype} {img.shape}")
        img = img.reshape(-1, *EYE_SHAPE)
        if gaze.shape[-1] != 3:
            raise DataError(f"{path}: data.{eye}.gaze must be (n, 3), got {gaze.shape}")
        gaze = gaze.reshape(-1, 3)
        if gaze.shape[0] != img.shape[0]:
            raise DataError(f"{path}: data.{eye} has {img.shape[0]} images but {gaze.shape[0]} gaze vectors")
        out[eye] = (img, gaze)
    return out


def _normalized_dir(root: str | None) -> Path:
    if root is None:
        raise MissingDataError(_DAY_FILES, "dataset.root (not set)", PUBLISHED_AT)
    base = Path(root).expanduser()
    for cand in (base / "Data" / "Normalized", base / "Normalized", base):
        if cand.is_dir() and any(cand.glob("p*/day*.mat")):
            return cand
    raise MissingDataError(
        "Data/Normalized/pXX/dayYY.mat",
        f"{base / 'Data' / 'Normalized'}, {base / 'Normalized'} and {base}",
        PUBLISHED_AT,
    )


def load(cfg: MPIIGazeConfig) -> RawDataset:
    """Read the Normalized .mat files and keep ``n_train + n_test`` eye images (see module doc)."""
    check_split_sizes(cfg, "mpiigaze")
    if cfg.eyes not in ("both", "left", "right"):
        raise DataError(f"dataset.eyes must be 'both', 'left' or 'right', got {cfg.eyes!r}")
    if not cfg.use_files():
        raise MissingDataError(
            "Data/Normalized/pXX/dayYY.mat",
            "nowhere: MPIIGaze has no offline generator, set dataset.root (and source=auto|files)",
            PUBLISHED_AT,
        )
    folder = _normalized_dir(cfg.root)
    files = sorted(folder.glob("p*/day*.mat"))
    eyes = ("left", "right") if cfg.eyes == "both" else (cfg.eyes,)
    n_keep = cfg.n_train + cfg.n_test
    keys = np.empty(0)
    imgs = np.empty((0, *EYE_SHAPE), np.uint8)
    ys = np.empty((0, 2))
    n_seen = 0
    for path in progress(files, desc="MPIIGaze files", unit="file"):
        day = read_day_file(path)
        rel = path.relative_to(folder).as_posix()
        file_seed = zlib.crc32(rel.encode())
        for eye in eyes:
            img, gaze = day[eye]
            if img.shape[0] == 0:
                continue
            py = gaze_to_pitch_yaw(gaze)
            if eye == "right" and cfg.mirror_right:
                img = img[:, :, ::-1]
                py = py * np.array([1.0, -1.0])
            k = np.random.default_rng([cfg.seed, file_seed, _EYES[eye]]).random(img.shape[0])
            n_seen += img.shape[0]
            # only keys below the current n_keep-th smallest can still be kept
            cut = keys.max() if keys.size >= n_keep else np.inf
            sel = np.flatnonzero(k < cut)
            if sel.size == 0:
                continue
            keys = np.concatenate([keys, k[sel]])
            imgs = np.concatenate([imgs, img[sel]])
            ys = np.concatenate([ys, py[sel]])
            if keys.size > n_keep:
                top = np.argpartition(keys, n_keep - 1)[:n_keep]
                keys, imgs, ys = keys[top], imgs[top], ys[top]
    if n_seen < n_keep:
        raise DataError(f"{folder}: {n_seen} eye images found, {n_keep} needed (n_train + n_test)")
    order = np.argsort(keys, kind="stable")
    imgs = np.ascontiguousarray(imgs[order])[:, None]
    ys = ys[order]
    log.info("MPIIGaze: kept %d of %d eye images from %d files", n_keep, n_seen, len(files))
    return split_samples(
        cfg, imgs, ys, TARGET_NAMES, f"{folder} ({len(files)} files, eyes={cfg.eyes}, seed {cfg.seed})"
    )
