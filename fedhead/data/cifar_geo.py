"""CIFAR-geo (docs/theory.md §10): source images shifted and zoomed into a 40x40 frame.

Every sample is one source image placed in a black ``frame_size x frame_size`` canvas after a zoom ``z``
and a shift ``(dx, dy)``; the targets are ``(shift_x, shift_y, log_zoom)`` = ``(dx, dy, log z)`` in pixels
/ natural log. Geometry (continuous, bilinear resampling with zero fill outside the source,
[`place_images`][fedhead.data.cifar_geo.place_images]): the source image is first scaled so that its side
spans ``32 z`` frame pixels (so ``z = 1`` puts a CIFAR-10 image at its native size), then its centre is
put at ``(frame_size / 2 + dx, frame_size / 2 + dy)``; ``dx`` grows to the right and ``dy`` downwards.
Parts that leave the frame are cut off.

Four designed client groups ([`GROUPS`][fedhead.data.cifar_geo.GROUPS]) draw ``(dx, dy, log z)`` from
different Gaussians (different means and covariances), truncated to ``|dx|, |dy| <= max_shift`` and ``log
z`` in ``[log 0.5, log 1.3]`` by redrawing. Training samples are split as equally as possible over the
groups (3,000 each for 12,000), and so are test samples (750 each);
[`RawDataset`][fedhead.data.RawDataset] carries the group of every sample in ``groups`` / ``groups_test``,
sorted by group.

Image sources (``image_source``):

* ``"cifar10"``: the CIFAR-10 python pickle batches ``cifar-10-batches-py/data_batch_1..5`` and
  ``test_batch`` (dicts with ``b'data'`` ``(10000, 3072)`` uint8 and ``b'labels'``) under
  ``dataset.root`` (the folder holding ``cifar-10-batches-py`` or that folder itself);
* ``"fashion_mnist"``: the IDX files ``train-images-idx3-ubyte.gz`` / ``t10k-images-idx3-ubyte.gz``
  (gzip optional) under ``dataset.root`` or, when ``root`` is not set, in
  ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``): the offline
  default.

Training samples use distinct images of the source's training split, test samples distinct
images of its test split, all drawn with ``default_rng(seed)``. Output channels: ``channels=3``
(default) replicates grey sources to RGB, so the model's ``in_channels`` is 3 for every source;
``channels=1`` turns colour sources into ITU-R BT.601 luma and keeps grey sources as they are
(then ``in_channels`` must be 1).
"""

from __future__ import annotations

import gzip
import logging
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from fedhead.data._common import check_split_sizes
from fedhead.data.base import DataError, MissingDataError, RawDataset
from fedhead.data.config import DatasetConfig

__all__ = [
    "CifarGeoConfig",
    "GeoGroup",
    "GROUPS",
    "load",
    "place_images",
    "sample_geometry",
    "read_cifar10",
    "read_idx_images",
    "read_fashion_mnist",
    "TARGET_NAMES",
    "FASHION_MNIST_DIR",
]

log = logging.getLogger(__name__)

TARGET_NAMES = ("shift_x", "shift_y", "log_zoom")
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
CIFAR_PUBLISHED_AT = "CIFAR-10, python version (cs.toronto.edu/~kriz/cifar.html, cifar-10-python.tar.gz)"
FASHION_PUBLISHED_AT = (
    "Fashion-MNIST (github.com/zalandoresearch/fashion-mnist), or Debian/Ubuntu: "
    "apt-get install dataset-fashion-mnist (files in /usr/share/datasets/fashion-mnist)"
)
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch"
_CIFAR_FIRST = "cifar-10-batches-py/data_batch_1"
FASHION_FILES = {"train": "train-images-idx3-ubyte", "test": "t10k-images-idx3-ubyte"}
LOG_ZOOM_RANGE = (float(np.log(0.5)), float(np.log(1.3)))
_REFERENCE_SIDE = 32.0  # frame pixels spanned by a source image at zoom 1


class GeoGroup(NamedTuple):
    """Gaussian of ``(dx, dy, log z)`` for one designed client group."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    corr: tuple[float, float, float]  # correlations (dx,dy), (dx,logz), (dy,logz)

    def covariance(self) -> np.ndarray:
        s = np.asarray(self.std, dtype=np.float64)
        r01, r02, r12 = self.corr
        r = np.array([[1.0, r01, r02], [r01, 1.0, r12], [r02, r12, 1.0]])
        return r * np.outer(s, s)


#: The four designed client groups: up-left & small, up-right & native size with correlated
#: shifts, down-left & medium with zoom anti-correlated to the vertical shift, down-right &
#: large with anti-correlated shifts. Means and covariances differ between all four.
GROUPS: tuple[GeoGroup, ...] = (
    GeoGroup(mean=(-3.0, -3.0, float(np.log(0.70))), std=(1.5, 1.5, 0.08), corr=(0.0, 0.0, 0.0)),
    GeoGroup(mean=(3.0, -2.0, 0.0), std=(1.6, 1.0, 0.10), corr=(0.6, 0.0, 0.0)),
    GeoGroup(mean=(-2.0, 2.5, float(np.log(0.85))), std=(1.0, 1.8, 0.12), corr=(0.0, 0.3, -0.5)),
    GeoGroup(mean=(2.5, 2.5, float(np.log(1.15))), std=(1.8, 1.8, 0.05), corr=(-0.6, 0.0, 0.0)),
)
# Every bound lies at least 2.4 standard deviations from its group mean, so truncation moves the
# group means by less than 0.01 of a standard deviation.


@dataclass(frozen=True)
class CifarGeoConfig(DatasetConfig):
    """CIFAR-geo configuration (``_target_: fedhead.data.cifar_geo.CifarGeoConfig``).

    Attributes (defaults; ``source``, ``cache_dir`` and ``allow_outside_regime`` as in
    [`DatasetConfig`][fedhead.data.DatasetConfig])
    ---------------------
    name : str = "cifar_geo"
    root : str or None = None
        ``image_source="cifar10"``: folder holding ``cifar-10-batches-py`` (or that folder).
        ``"fashion_mnist"``: folder holding the IDX files; None reads
        ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``).
    source : str = "auto"
        With ``"generate"`` (or ``"auto"`` and no root) the Fashion-MNIST construction runs
        whatever ``image_source`` says.
    n_train : int = 12000
    n_test : int = 3000
    num_clients : int = 4
        The construction always has the 4 designed groups of [`GROUPS`][fedhead.data.cifar_geo.GROUPS].
    seed : int = 0
    image_source : str = "fashion_mnist"
        ``"cifar10"`` or ``"fashion_mnist"``.
    frame_size : int = 40
    channels : int = 3
        3: grey sources replicated to RGB; 1: colour sources converted to luma.
    max_shift : float = 8.0
        Largest ``|dx|``, ``|dy|`` in frame pixels.
    """

    name: str = "cifar_geo"
    n_train: int = 12000
    n_test: int = 3000
    num_clients: int = 4
    image_source: str = "fashion_mnist"
    frame_size: int = 40
    channels: int = 3
    max_shift: float = 8.0

    def effective_image_source(self) -> str:
        """The image source that [`load`][fedhead.data.cifar_geo.load] reads (``fashion_mnist`` when generating)."""
        if self.image_source not in ("cifar10", "fashion_mnist"):
            raise ValueError(f"dataset.image_source must be 'cifar10' or 'fashion_mnist', got {self.image_source!r}")
        return self.image_source if self.use_files() else "fashion_mnist"


# ------------------------------------------------------------------------------------ readers


def _cifar_dir(root: str | None) -> Path:
    if root is None:
        raise MissingDataError(_CIFAR_FIRST, "dataset.root (not set)", CIFAR_PUBLISHED_AT)
    base = Path(root).expanduser()
    for cand in (base / "cifar-10-batches-py", base):
        if (cand / CIFAR_TRAIN_FILES[0]).is_file():
            return cand
    raise MissingDataError(_CIFAR_FIRST, f"{base} and {base / 'cifar-10-batches-py'}", CIFAR_PUBLISHED_AT)


def _read_cifar_batch(path: Path) -> np.ndarray:
    if not path.is_file():
        raise MissingDataError(path.name, str(path.parent), CIFAR_PUBLISHED_AT)
    try:
        with path.open("rb") as fh:
            batch = pickle.load(fh, encoding="bytes")
    except Exception as err:  # unpickling raises many types on corrupt input
        raise DataError(f"{path}: not a CIFAR-10 python pickle batch ({type(err).__name__}: {err})") from err
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{path}: expected a dict with b'data' and b'labels', got {keys}")
    data = np.asarray(batch[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataError(f"{path}: b'data' must be uint8 (n, 3072), got {data.dtype} {data.shape}")
    if len(batch[b"labels"]) != data.shape[0]:
        raise DataError(f"{path}: {len(batch[b'labels'])} labels for {data.shape[0]} images")
    return data.reshape(-1, 3, 32, 32)


def read_cifar10(root: str | None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 training ``(50000, 3, 32, 32)`` and test ``(10000, 3, 32, 32)`` uint8 images."""
    folder = _cifar_dir(root)
    train = np.concatenate([_read_cifar_batch(folder / f) for f in CIFAR_TRAIN_FILES])
    test = _read_cifar_batch(folder / CIFAR_TEST_FILE)
    return train, test


def read_idx_images(path: Path) -> np.ndarray:
    """Images ``(n, rows, cols)`` uint8 of an IDX3 ubyte file (gzip-compressed when ``.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as err:
        raise DataError(f"{path}: cannot read ({err})") from err
    if len(raw) < 16:
        raise DataError(f"{path}: {len(raw)} bytes, too short for an IDX3 header")
    magic, n, rows, cols = np.frombuffer(raw[:16], dtype=">u4")
    if magic != 0x00000803:
        raise DataError(f"{path}: IDX magic {magic:#010x}, expected 0x00000803 (ubyte, 3 dims)")
    if len(raw) != 16 + int(n) * int(rows) * int(cols):
        raise DataError(f"{path}: header says {n}x{rows}x{cols} images, file holds {len(raw) - 16} data bytes")
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(int(n), int(rows), int(cols))


def read_fashion_mnist(root: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST training ``(60000, 1, 28, 28)`` and test ``(10000, 1, 28, 28)`` images."""
    base = Path(root).expanduser() if root is not None else Path(FASHION_MNIST_DIR)
    out = []
    for split in ("train", "test"):
        stem = FASHION_FILES[split]
        for cand in (base / f"{stem}.gz", base / stem):
            if cand.is_file():
                out.append(read_idx_images(cand)[:, None])
                break
        else:
            raise MissingDataError(f"{stem}.gz", str(base), FASHION_PUBLISHED_AT)
    return out[0], out[1]


# ---------------------------------------------------------------------------- construction


def sample_geometry(rng: np.random.Generator, group: GeoGroup, n: int, max_shift: float) -> np.ndarray:
    """``(n, 3)`` draws of ``(dx, dy, log z)`` from ``group``, truncated by redrawing."""
    out = np.empty((n, 3))
    filled = 0
    lo = np.array([-max_shift, -max_shift, LOG_ZOOM_RANGE[0]])
    hi = np.array([max_shift, max_shift, LOG_ZOOM_RANGE[1]])
    cov = group.covariance()
    for _ in range(1000):
        if filled == n:
            break
        size = 2 * (n - filled) + 8
        draw = rng.multivariate_normal(group.mean, cov, size=size, method="cholesky")
        ok = draw[np.all((draw >= lo) & (draw <= hi), axis=1)][: n - filled]
        out[filled : filled + ok.shape[0]] = ok
        filled += ok.shape[0]
    if filled < n:
        raise DataError(f"cifar_geo: group {group} puts almost no mass inside the allowed range")
    return out


def place_images(images: np.ndarray, geometry: np.ndarray, frame_size: int = 40, *, chunk: int = 1024) -> np.ndarray:
    """Shift and zoom source images into a black frame (bilinear, zero fill).

    Parameters
    ----------
    images : ndarray (n, ch, h, w) uint8
        Square sources (``h == w``).
    geometry : ndarray (n, 3)
        ``(dx, dy, log z)``: the source spans ``32 z`` frame pixels and its centre lies at
        ``frame_size / 2 + (dx, dy)``.
    frame_size : int

    Returns
    -------
    ndarray (n, ch, frame_size, frame_size) uint8
    """
    n, ch, h, w = images.shape
    if h != w or geometry.shape != (n, 3):
        raise DataError(f"cifar_geo: need square images and (n, 3) geometry, got {images.shape}, {geometry.shape}")
    out = np.empty((n, ch, frame_size, frame_size), dtype=np.uint8)
    pix = torch.arange(frame_size, dtype=torch.float64) + 0.5 - frame_size / 2.0
    for lo in range(0, n, chunk):
        g = torch.from_numpy(np.asarray(geometry[lo : lo + chunk], dtype=np.float64))
        half = (_REFERENCE_SIDE / 2.0) * torch.exp(g[:, 2])  # frame pixels per half source side
        gx = (pix[None, None, :] - g[:, 0, None, None]) / half[:, None, None]
        gy = (pix[None, :, None] - g[:, 1, None, None]) / half[:, None, None]
        grid = torch.stack(torch.broadcast_tensors(gx, gy), dim=-1).to(torch.float32)
        src = torch.from_numpy(images[lo : lo + chunk]).to(torch.float32)
        res = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        out[lo : lo + chunk] = res.round_().clamp_(0, 255).to(torch.uint8).numpy()
    return out


def _to_channels(images: np.ndarray, channels: int) -> np.ndarray:
    if channels not in (1, 3):
        raise ValueError(f"dataset.channels must be 1 or 3, got {channels}")
    ch = images.shape[1]
    if ch == channels:
        return images
    if ch == 1:
        return np.repeat(images, 3, axis=1)
    out = np.empty((images.shape[0], 1, *images.shape[2:]), dtype=np.uint8)
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R BT.601 luma
    for lo in range(0, images.shape[0], 2048):  # chunks: no float copy of the whole set
        block = images[lo : lo + 2048].astype(np.float32)
        luma = np.tensordot(weights, block, axes=([0], [1]))
        out[lo : lo + 2048, 0] = np.clip(np.rint(luma), 0, 255).astype(np.uint8)
    return out


def _group_sizes(n: int, n_groups: int) -> list[int]:
    base, rem = divmod(n, n_groups)
    return [base + (g < rem) for g in range(n_groups)]


def _build(
    rng: np.random.Generator, source: np.ndarray, n: int, cfg: CifarGeoConfig, split: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if n > source.shape[0]:
        raise DataError(f"cifar_geo: {n} {split} samples asked for, the source has {source.shape[0]}")
    pick = rng.choice(source.shape[0], size=n, replace=False)
    sizes = _group_sizes(n, len(GROUPS))
    geom = np.concatenate([sample_geometry(rng, grp, k, cfg.max_shift) for grp, k in zip(GROUPS, sizes)])
    groups = np.repeat(np.arange(len(GROUPS), dtype=np.int64), sizes)
    imgs = place_images(_to_channels(source[pick], cfg.channels), geom, cfg.frame_size)
    return imgs, geom, groups


def load(cfg: CifarGeoConfig) -> RawDataset:
    """Build CIFAR-geo from the configured image source (see the module docstring)."""
    check_split_sizes(cfg, "cifar_geo")
    if cfg.frame_size <= 0 or cfg.max_shift < 0:
        raise DataError(f"cifar_geo: frame_size must be > 0 and max_shift >= 0, got {cfg.frame_size}, {cfg.max_shift}")
    src = cfg.effective_image_source()
    if src == "cifar10":
        train_src, test_src = read_cifar10(cfg.root)
        where = str(_cifar_dir(cfg.root))
    else:
        root = cfg.root if cfg.use_files() else None
        train_src, test_src = read_fashion_mnist(root)
        where = str(Path(root).expanduser()) if root is not None else FASHION_MNIST_DIR
    rng = np.random.default_rng(cfg.seed)
    x, y, groups = _build(rng, train_src, cfg.n_train, cfg, "training")
    x_test = y_test = groups_test = None
    if cfg.n_test > 0:
        x_test, y_test, groups_test = _build(rng, test_src, cfg.n_test, cfg, "test")
    return RawDataset(
        name=cfg.name,
        x=x,
        y=y,
        target_names=TARGET_NAMES,
        x_test=x_test,
        y_test=y_test,
        groups=groups,
        groups_test=groups_test,
        source=f"{src} images from {where}, shift/zoom construction (seed {cfg.seed})",
    )
