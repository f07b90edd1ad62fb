"""dSprites (docs/theory.md §10): 64x64 binary sprites, targets x position, y position and scale.

Two sources, both returning a [`RawDataset`][fedhead.data.RawDataset] with images
``(N, 1, 64, 64)`` uint8 in {0, 255} and targets ``(N, 3)`` float64 ``(pos_x, pos_y, scale)`` in
the data set's own units (positions in [0, 1], scale in [0.5, 1]):

* the official file ``dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz`` (keys ``imgs``
  ``(737280, 64, 64)`` uint8 in {0, 1}, ``latents_values`` ``(737280, 6)``, ``latents_classes``),
  read from ``dataset.root``; the images are streamed out of the archive, so the 3 GB image array
  is never held in memory;
* [`render_sprites`][fedhead.data.dsprites.render_sprites], a vectorised numpy rasteriser of the same factor grid (3
  shapes square/ellipse/heart, 6 scales 0.5..1, 40 orientations 0..2pi, 32x32 positions), the offline default. Its
  sprites follow the published factor grid; they are not pixel-identical to the official images (the original generator
  was not released).

Both sources draw the same factor combinations: ``n_train + n_test`` distinct flat indices of the
``1 x 3 x 6 x 40 x 32 x 32`` grid, drawn with ``numpy.random.default_rng(seed)``; the first
``n_train`` are the training split, the rest the held-out split.
"""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhead.data._common import check_split_sizes, draw_grid_indices, resolve_file, split_samples
from fedhead.data.base import DataError, RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.progress import progress

__all__ = [
    "DSpritesConfig",
    "load",
    "load_file",
    "generate",
    "render_sprites",
    "sample_grid_indices",
    "factor_values",
    "LATENT_SIZES",
    "TARGET_NAMES",
    "FILE_NAME",
]

log = logging.getLogger(__name__)

FILE_NAME = "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
PUBLISHED_AT = "the dSprites repository (github.com/google-deepmind/dsprites-dataset, file " + FILE_NAME + ")"
#: Grid sizes of the latent factors, in the file's order: color, shape, scale, orientation, x, y.
LATENT_SIZES = (1, 3, 6, 40, 32, 32)
N_GRID = int(np.prod(LATENT_SIZES))  # 737280
IMAGE_SIZE = 64
TARGET_NAMES = ("pos_x", "pos_y", "scale")
#: Columns of ``latents_values`` that are the targets (x position, y position, scale).
TARGET_COLUMNS = (4, 5, 2)

# Geometry of the renderer (pixel units; pixel centres at 0.5, 1.5, ..., 63.5).
_POS_LO, _POS_HI = 12.0, 52.0  # sprite centre for pos = 0 and pos = 1
_HALF_SIZE = 10.0  # half extent of a scale-1 sprite


@dataclass(frozen=True)
class DSpritesConfig(DatasetConfig):
    """dSprites configuration (``_target_: fedhead.data.dsprites.DSpritesConfig``).

    Attributes (defaults; ``source``, ``cache_dir`` and ``allow_outside_regime`` as in
    [`DatasetConfig`][fedhead.data.DatasetConfig])
    ---------------------
    name : str = "dsprites"
    root : str or None = None
        Folder holding ``dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz`` (or the path of the
        file itself). None: the procedural renderer (offline default).
    n_train : int = 12000
    n_test : int = 3000
    num_clients : int = 8
    seed : int = 0
        Seed of the factor-combination draw (same draw for the file and the renderer).
    file_name : str = "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
    chunk_images : int = 16384
        Images decompressed at a time while streaming the official file.
    """

    name: str = "dsprites"
    n_train: int = 12000
    n_test: int = 3000
    num_clients: int = 8
    file_name: str = FILE_NAME
    chunk_images: int = 16384


def factor_values() -> dict[str, np.ndarray]:
    """Values of every latent factor of the official grid (as in ``latents_values``)."""
    return {
        "color": np.ones(1),
        "shape": np.arange(1.0, 4.0),  # 1 square, 2 ellipse, 3 heart
        "scale": np.linspace(0.5, 1.0, 6),
        "orientation": np.linspace(0.0, 2.0 * np.pi, 40),
        "pos_x": np.linspace(0.0, 1.0, 32),
        "pos_y": np.linspace(0.0, 1.0, 32),
    }


def sample_grid_indices(n: int, seed: int, n_grid: int = N_GRID) -> np.ndarray:
    """``n`` distinct flat grid indices drawn with ``default_rng(seed)`` (int64, draw order)."""
    return draw_grid_indices(n, seed, n_grid, "dsprites")


def latents_from_indices(indices: np.ndarray) -> np.ndarray:
    """``(n, 6)`` latent values (file layout) of flat indices of the full grid."""
    classes = np.stack(np.unravel_index(indices, LATENT_SIZES), axis=1)
    vals = factor_values()
    cols = [vals[k][classes[:, j]] for j, k in enumerate(vals)]
    return np.stack(cols, axis=1)


def render_sprites(
    shape: np.ndarray,
    scale: np.ndarray,
    orientation: np.ndarray,
    pos_x: np.ndarray,
    pos_y: np.ndarray,
    *,
    chunk: int = 2048,
) -> np.ndarray:
    """Rasterise sprites on 64x64 binary images.

    Parameters
    ----------
    shape : ndarray (n,)
        1 square, 2 ellipse, 3 heart (dSprites' ``shape`` values).
    scale : ndarray (n,)
        Relative size in [0.5, 1].
    orientation : ndarray (n,)
        Rotation in radians (counter-clockwise on screen).
    pos_x, pos_y : ndarray (n,)
        Position in [0, 1]; x grows to the right, y grows downwards (image rows). The sprite
        centre sits at pixel ``12 + 40 * pos``; a scale-1 square has side 16 px.

    Returns
    -------
    ndarray (n, 1, 64, 64) uint8
        0 background, 255 sprite; a pixel is on when its centre lies inside the shape.
    """
    shape = np.asarray(shape).astype(np.int64).ravel()
    n = shape.shape[0]
    out = np.empty((n, 1, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    if not np.all(np.isin(shape, (1, 2, 3))):
        raise DataError(f"dsprites: shape values must be 1, 2 or 3, got {np.unique(shape)}")
    grid = np.arange(IMAGE_SIZE, dtype=np.float32) + 0.5
    cols = grid[None, None, :]
    rows = grid[None, :, None]
    for lo in range(0, n, chunk):
        sl = slice(lo, min(n, lo + chunk))
        cx = (_POS_LO + (_POS_HI - _POS_LO) * np.asarray(pos_x, np.float32)[sl])[:, None, None]
        cy = (_POS_LO + (_POS_HI - _POS_LO) * np.asarray(pos_y, np.float32)[sl])[:, None, None]
        r = (_HALF_SIZE * np.asarray(scale, np.float32)[sl])[:, None, None]
        th = np.asarray(orientation, np.float32)[sl][:, None, None]
        c, s = np.cos(th), np.sin(th)
        dx = cols - cx
        dy = cy - rows  # screen "up" is positive
        u = (c * dx + s * dy) / r  # rotate by -theta into sprite coordinates
        v = (-s * dx + c * dy) / r
        sh = shape[sl]
        mask = np.empty(u.shape, dtype=bool)
        k = sh == 1  # square
        mask[k] = np.maximum(np.abs(u[k]), np.abs(v[k])) <= 0.8
        k = sh == 2  # ellipse, axes 1 and 0.5
        mask[k] = u[k] ** 2 + (2.0 * v[k]) ** 2 <= 1.0
        k = sh == 3  # heart curve (x^2 + y^2 - 1)^3 - x^2 y^3 <= 0
        hx, hy = 1.1 * u[k], 1.1 * v[k] - 0.1
        hx2 = hx * hx
        mask[k] = (hx2 + hy * hy - 1.0) ** 3 - hx2 * hy**3 <= 0.0
        out[sl, 0] = mask.view(np.uint8) * np.uint8(255)
    return out


def generate(cfg: DSpritesConfig) -> RawDataset:
    """Render the ``n_train + n_test`` factor combinations drawn with ``cfg.seed``."""
    _check_sizes(cfg)
    idx = sample_grid_indices(cfg.n_train + cfg.n_test, cfg.seed)
    lat = latents_from_indices(idx)
    imgs = render_sprites(lat[:, 1], lat[:, 2], lat[:, 3], lat[:, 4], lat[:, 5])
    y = lat[:, TARGET_COLUMNS]
    return _split(cfg, imgs, y, source=f"procedural dSprites renderer (seed {cfg.seed})")


def _stream_rows(path: Path, key: str, wanted_sorted: np.ndarray, chunk: int) -> np.ndarray:
    """Rows ``wanted_sorted`` (ascending) of array ``key`` of an .npz, streamed chunk by chunk."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"{path}: not a readable .npz archive ({err})") from err
    with zf:
        member = key + ".npy"
        if member not in zf.namelist():
            raise DataError(f"{path}: no array {key!r}; expected keys imgs, latents_values")
        with zf.open(member) as fh:
            try:
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                else:
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            except ValueError as err:
                raise DataError(f"{path}: array {key!r} has no valid .npy header ({err})") from err
            if dtype != np.uint8 or len(shape) != 3 or shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
                raise DataError(f"{path}: {key} must be uint8 (N, 64, 64), got {dtype} {shape}")
            if fortran:
                raise DataError(f"{path}: {key} is stored in Fortran order; expected C order")
            n = shape[0]
            if wanted_sorted.size and wanted_sorted[-1] >= n:
                raise DataError(f"{path}: {key} has {n} rows, row {wanted_sorted[-1]} needed")
            out = np.empty((wanted_sorted.size, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
            row_bytes = IMAGE_SIZE * IMAGE_SIZE
            done = 0
            last = int(wanted_sorted[-1]) + 1 if wanted_sorted.size else 0
            steps = range(0, last, chunk)
            for lo in progress(steps, desc="dsprites images", unit="chunk"):
                hi = min(last, lo + chunk)
                buf = fh.read((hi - lo) * row_bytes)
                if len(buf) != (hi - lo) * row_bytes:
                    raise DataError(f"{path}: {key} is truncated (ends before row {hi})")
                block = np.frombuffer(buf, dtype=np.uint8).reshape(hi - lo, IMAGE_SIZE, IMAGE_SIZE)
                stop = np.searchsorted(wanted_sorted, hi)
                sel = wanted_sorted[done:stop]
                out[done:stop] = block[sel - lo]
                done = stop
            return out


def load_file(cfg: DSpritesConfig) -> RawDataset:
    """Read the official .npz and keep the ``n_train + n_test`` rows drawn with ``cfg.seed``."""
    _check_sizes(cfg)
    path = resolve_file(cfg, cfg.file_name, PUBLISHED_AT)
    try:
        with np.load(path, allow_pickle=False) as z:
            if "latents_values" not in z.files or "imgs" not in z.files:
                raise DataError(f"{path}: expected arrays imgs and latents_values, found {sorted(z.files)}")
            lat = np.asarray(z["latents_values"], dtype=np.float64)
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"{path}: not a readable .npz archive ({err})") from err
    if lat.ndim != 2 or lat.shape[1] != 6:
        raise DataError(f"{path}: latents_values must be (N, 6), got {lat.shape}")
    n_file = lat.shape[0]
    if n_file != N_GRID:
        log.warning("%s holds %d samples, the official file %d", path, n_file, N_GRID)
    idx = sample_grid_indices(cfg.n_train + cfg.n_test, cfg.seed, n_grid=n_file)
    order = np.argsort(idx)
    imgs_sorted = _stream_rows(path, "imgs", idx[order], cfg.chunk_images)
    if imgs_sorted.size and imgs_sorted.max() > 1:
        raise DataError(f"{path}: imgs must be binary 0/1, found value {imgs_sorted.max()}")
    imgs = np.empty((idx.size, 1, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    imgs[order, 0] = imgs_sorted * np.uint8(255)
    y = lat[idx][:, TARGET_COLUMNS]
    return _split(cfg, imgs, y, source=str(path))


def load(cfg: DSpritesConfig) -> RawDataset:
    """The official file when ``cfg.use_files()``, else the procedural renderer."""
    return load_file(cfg) if cfg.use_files() else generate(cfg)


def _check_sizes(cfg: DSpritesConfig) -> None:
    check_split_sizes(cfg, "dsprites")
    if cfg.chunk_images <= 0:
        raise DataError(f"dsprites: chunk_images must be positive, got {cfg.chunk_images}")


def _split(cfg: DSpritesConfig, imgs: np.ndarray, y: np.ndarray, source: str) -> RawDataset:
    return split_samples(cfg, imgs, y, TARGET_NAMES, source)
