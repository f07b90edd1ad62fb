"""3D Shapes (docs/theory.md §10): 64x64 RGB scenes, targets object hue, scale and orientation.

Two sources give the same [`RawDataset`][fedhead.data.RawDataset] (images ``(N, 3, 64, 64)``
uint8, targets ``(N, 3)`` float64 in the data set's own units): the official ``3dshapes.h5``
under ``dataset.root`` (only the drawn rows are read), or
[`render_scenes`][fedhead.data.shapes3d.render_scenes], an offline MuJoCo renderer (offscreen
OpenGL; EGL runs on the CPU through Mesa where there is no GPU) of a floor / two-wall / object
scene over the same factor grid (orientation turns the whole room; not pixel-identical to the
official images). Both draw ``n_train + n_test`` distinct flat indices of the
``10 x 10 x 10 x 8 x 4 x 15`` grid with ``numpy.random.default_rng(seed)``: the first
``n_train`` train, the rest are held out.
"""

from __future__ import annotations

import colorsys
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedhead.data._common import check_split_sizes, draw_grid_indices, resolve_file, split_samples
from fedhead.data.base import DataError, RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.progress import progress

if TYPE_CHECKING:
    import h5py

__all__ = [
    "Shapes3DConfig",
    "load",
    "load_file",
    "generate",
    "render_scenes",
    "factor_values",
    "labels_from_indices",
    "sample_grid_indices",
    "FACTOR_SIZES",
    "TARGET_NAMES",
    "FILE_NAME",
]

log = logging.getLogger(__name__)

FILE_NAME = "3dshapes.h5"
PUBLISHED_AT = (
    "the 3D Shapes repository (github.com/google-deepmind/3d-shapes; file 3dshapes.h5 in the "
    "public Google Cloud bucket 3d-shapes)"
)
FACTOR_NAMES = ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")
FACTOR_SIZES = (10, 10, 10, 8, 4, 15)
N_GRID = int(np.prod(FACTOR_SIZES))  # 480000
IMAGE_SIZE = 64
TARGET_NAMES = ("object_hue", "scale", "orientation")
TARGET_COLUMNS = (2, 3, 5)
SHAPE_NAMES = ("cube", "cylinder", "sphere", "capsule")


@dataclass(frozen=True)
class Shapes3DConfig(DatasetConfig):
    """3D Shapes configuration (``_target_: fedhead.data.shapes3d.Shapes3DConfig``).

    Attributes (defaults; ``source``, ``cache_dir`` and ``allow_outside_regime`` as in
    [`DatasetConfig`][fedhead.data.DatasetConfig])
    ---------------------
    name : str = "shapes3d"
    root : str or None = None
        Folder holding ``3dshapes.h5`` (or the path of the file itself). None: the MuJoCo
        renderer (offline default).
    n_train : int = 12000
    n_test : int = 3000
    num_clients : int = 8
    seed : int = 0
        Seed of the factor-combination draw (same draw for the file and the renderer).
    file_name : str = "3dshapes.h5"
    gl_backend : str = "egl"
        OpenGL context of the renderer: ``"egl"`` (works headless, on CPU via Mesa) or
        ``"osmesa"`` (needs libOSMesa).
    read_chunk : int = 2000
        Rows read from the .h5 per request.
    """

    name: str = "shapes3d"
    n_train: int = 12000
    n_test: int = 3000
    num_clients: int = 8
    file_name: str = FILE_NAME
    gl_backend: str = "egl"
    read_chunk: int = 2000


def factor_values() -> dict[str, np.ndarray]:
    """Values of the six factors as stored in ``labels`` (orientation in degrees)."""
    return {
        "floor_hue": np.linspace(0.0, 1.0, 10, endpoint=False),
        "wall_hue": np.linspace(0.0, 1.0, 10, endpoint=False),
        "object_hue": np.linspace(0.0, 1.0, 10, endpoint=False),
        "scale": np.linspace(0.75, 1.25, 8),
        "shape": np.arange(4.0),
        "orientation": np.linspace(-30.0, 30.0, 15),
    }


def sample_grid_indices(n: int, seed: int, n_grid: int = N_GRID) -> np.ndarray:
    """``n`` distinct flat grid indices drawn with ``default_rng(seed)`` (int64, draw order)."""
    return draw_grid_indices(n, seed, n_grid, "3dshapes")


def labels_from_indices(indices: np.ndarray) -> np.ndarray:
    """``(n, 6)`` labels (file layout) of flat indices of the factor grid."""
    classes = np.stack(np.unravel_index(np.asarray(indices), FACTOR_SIZES), axis=1)
    vals = factor_values()
    return np.stack([vals[k][classes[:, j]] for j, k in enumerate(FACTOR_NAMES)], axis=1)


# ----------------------------------------------------------------------------------- renderer

_SCENE_XML = """
<mujoco model="3dshapes">
  <visual>
    <global offwidth="{size}" offheight="{size}" fovy="40"/>
    <headlight ambient="0.35 0.35 0.35" diffuse="0.45 0.45 0.45" specular="0 0 0"/>
    <quality shadowsize="0" offsamples="4"/>
  </visual>
  <worldbody>
    <light directional="true" dir="0.35 0.6 -1" diffuse="0.35 0.35 0.35" specular="0 0 0"
           castshadow="false"/>
    <camera name="view" pos="0 -3.2 1.45" xyaxes="1 0 0 0 0.342 0.940"/>
    <body name="room" mocap="true">
      <geom name="floor" type="box" pos="0 0 -0.05" size="5 5 0.05"/>
      <geom name="wall_a" type="box" pos="1.5 1.5 2" size="0.05 4 2.1" euler="0 0 45"/>
      <geom name="wall_b" type="box" pos="-1.5 1.5 2" size="0.05 4 2.1" euler="0 0 -45"/>
      <geom name="object" type="box" pos="0 0 0.3" size="0.3 0.3 0.3"/>
    </body>
  </worldbody>
</mujoco>
"""
_OBJECT_RADIUS = 0.32  # half extent of a scale-1 object


def _rgba(hue: float) -> np.ndarray:
    """Opaque RGBA of a fully saturated, full-value colour of hue ``hue``."""
    return np.array([*colorsys.hsv_to_rgb(float(hue), 1.0, 1.0), 1.0])


def _gl_context(backend: str, size: int):
    """Create and make current an offscreen OpenGL context for MuJoCo's renderer."""
    backend = backend.lower()
    try:
        if backend == "egl":
            os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
            from mujoco.egl import GLContext
        elif backend == "osmesa":
            os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
            from mujoco.osmesa import GLContext
        else:
            raise DataError(f"3dshapes: dataset.gl_backend must be 'egl' or 'osmesa', got {backend!r}")
        ctx = GLContext(size, size)
        ctx.make_current()
    except DataError:
        raise
    except Exception as err:  # driver errors come as many types (ImportError, OSError, GLError)
        other = "osmesa" if backend == "egl" else "egl"
        raise DataError(
            f"3dshapes renderer: cannot create an offscreen OpenGL context with {backend!r} "
            f"({type(err).__name__}: {err}). EGL needs libEGL (Mesa: libegl1, libgl1-mesa-dri; "
            "software rendering on CPU) and PYOPENGL_PLATFORM unset or 'egl' before OpenGL is "
            "first imported; OSMesa needs libOSMesa (libosmesa6) and PYOPENGL_PLATFORM unset or "
            f"'osmesa'. Try dataset.gl_backend={other}, or point dataset.root at the official "
            "3dshapes.h5."
        ) from err
    return ctx


def render_scenes(labels: np.ndarray, *, size: int = IMAGE_SIZE, gl_backend: str = "egl") -> np.ndarray:
    """Render one scene per row of ``labels`` in a child process.

    The OpenGL libraries that an offscreen EGL context loads cannot share a process with
    torch's compiler stack: importing ``triton`` (which ``torch._dynamo`` and so torchvision do)
    after an EGL context has existed crashes the process with a segmentation fault. Rendering
    therefore runs in a freshly spawned interpreter; only the uint8 images come back.
    Parameters and result are those of [`render_scenes_in_process`][fedhead.data.shapes3d.render_scenes_in_process].
    """
    labels = np.asarray(labels, dtype=np.float64)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as ex:
        return ex.submit(render_scenes_in_process, labels, size=size, gl_backend=gl_backend).result()


def render_scenes_in_process(labels: np.ndarray, *, size: int = IMAGE_SIZE, gl_backend: str = "egl") -> np.ndarray:
    """Render one scene per row of ``labels`` in this process (see
    [`render_scenes`][fedhead.data.shapes3d.render_scenes]).

    Parameters
    ----------
    labels : ndarray (n, 6)
        Factor values in the file's layout: floor hue, wall hue, object hue (in [0, 1)),
        scale (relative size), shape (0 cube, 1 cylinder, 2 sphere, 3 capsule), orientation
        (degrees, rotation of the room about the vertical axis through the object).
    size : int
        Image side in pixels.
    gl_backend : str
        ``"egl"`` or ``"osmesa"``.

    Returns
    -------
    ndarray (n, 3, size, size) uint8
    """
    mujoco = _import_mujoco()
    labels, shapes = _checked_labels(labels)
    n = labels.shape[0]
    out = np.empty((n, 3, size, size), dtype=np.uint8)
    if n == 0:
        return out
    model, data, gid = _scene_model(mujoco, size)
    ctx = _gl_context(gl_backend, size)
    try:
        _render_rows(mujoco, model, data, gid, labels, shapes, out)
    finally:
        ctx.free()
    return out


def _import_mujoco():
    """Import ``mujoco``; a backend that fails to load at import becomes a [`DataError`][fedhead.data.DataError]."""
    try:
        import mujoco
    except Exception as err:  # e.g. MUJOCO_GL names a backend whose libraries are missing
        raise DataError(
            f"3dshapes renderer: importing mujoco failed ({type(err).__name__}: {err}); with "
            f"MUJOCO_GL={os.environ.get('MUJOCO_GL')!r} mujoco loads that OpenGL backend at "
            "import. Unset MUJOCO_GL or set it to 'egl'."
        ) from err
    return mujoco


def _checked_labels(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` as float64 ``(n, 6)`` and its shape column as int64; DataError if invalid."""
    labels = np.asarray(labels, dtype=np.float64)
    if labels.ndim != 2 or labels.shape[1] != 6:
        raise DataError(f"3dshapes renderer: labels must be (n, 6), got {labels.shape}")
    shapes = labels[:, 4].astype(np.int64)
    if not np.all(np.isin(shapes, np.arange(4))) or np.any(labels[:, 3] <= 0):
        raise DataError("3dshapes renderer: shape must be 0..3 and scale > 0")
    return labels, shapes


def _scene_model(mujoco, size: int):
    """The scene's ``MjModel``, ``MjData`` and geom ids (object bounding radius widened to 10)."""
    model = mujoco.MjModel.from_xml_string(_SCENE_XML.format(size=size))
    data = mujoco.MjData(model)
    gid = {k: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, k) for k in ("floor", "wall_a", "wall_b", "object")}
    model.geom_rbound[gid["object"]] = 10.0
    return model, data, gid


def _render_rows(mujoco, model, data, gid, labels: np.ndarray, shapes: np.ndarray, out: np.ndarray) -> None:
    """Render row ``i`` of ``labels`` into ``out[i]`` offscreen (needs a current GL context)."""
    size = out.shape[-1]
    n = labels.shape[0]
    con = None
    try:
        con = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, con)
        scene = mujoco.MjvScene(model, maxgeom=32)
        opt = mujoco.MjvOption()
        pert = mujoco.MjvPerturb()
        cam = mujoco.MjvCamera()
        cam.type = mujoco.mjtCamera.mjCAMERA_FIXED
        cam.fixedcamid = 0
        rect = mujoco.MjrRect(0, 0, size, size)
        rgb = np.empty((size, size, 3), dtype=np.uint8)
        for i in progress(range(n), desc="3dshapes render", unit="img", disable=n < 200):
            _pose_scene(mujoco, model, data, gid, labels[i], int(shapes[i]))
            mujoco.mjv_updateScene(model, data, opt, pert, cam, mujoco.mjtCatBit.mjCAT_ALL, scene)
            mujoco.mjr_render(rect, scene, con)
            mujoco.mjr_readPixels(rgb, None, rect, con)
            out[i] = rgb[::-1].transpose(2, 0, 1)
    finally:
        if con is not None:
            con.free()


def _pose_scene(mujoco, model, data, gid, row: np.ndarray, shape: int) -> None:
    """Set colours, object geometry and room orientation of one label row, then the kinematics."""
    geom_types = (
        mujoco.mjtGeom.mjGEOM_BOX,
        mujoco.mjtGeom.mjGEOM_CYLINDER,
        mujoco.mjtGeom.mjGEOM_SPHERE,
        mujoco.mjtGeom.mjGEOM_CAPSULE,
    )
    obj = gid["object"]
    floor_h, wall_h, obj_h, scale, _, orient = row
    r = _OBJECT_RADIUS * scale
    model.geom_rgba[gid["floor"]] = _rgba(floor_h)
    model.geom_rgba[gid["wall_a"]] = _rgba(wall_h)
    model.geom_rgba[gid["wall_b"]] = _rgba(wall_h)
    model.geom_rgba[obj] = _rgba(obj_h)
    model.geom_type[obj] = geom_types[shape]
    if shape == 3:  # capsule: radius 0.6 r, half length 0.7 r (height 2.6 r)
        model.geom_size[obj] = (0.6 * r, 0.7 * r, 0.0)
        model.geom_pos[obj] = (0.0, 0.0, 1.3 * r)
    else:
        model.geom_size[obj] = (r, r, r)
        model.geom_pos[obj] = (0.0, 0.0, r)
    half = np.deg2rad(orient) / 2.0
    data.mocap_quat[0] = (np.cos(half), 0.0, 0.0, np.sin(half))
    mujoco.mj_kinematics(model, data)
    mujoco.mj_camlight(model, data)  # fixed camera pose


def generate(cfg: Shapes3DConfig) -> RawDataset:
    """Render the ``n_train + n_test`` factor combinations drawn with ``cfg.seed``."""
    _check_sizes(cfg)
    idx = sample_grid_indices(cfg.n_train + cfg.n_test, cfg.seed)
    labels = labels_from_indices(idx)
    imgs = render_scenes(labels, gl_backend=cfg.gl_backend)
    return _split(
        cfg,
        imgs,
        labels[:, TARGET_COLUMNS],
        source=f"MuJoCo 3D Shapes renderer ({cfg.gl_backend}, seed {cfg.seed})",
    )


# -------------------------------------------------------------------------------------- file


def load_file(cfg: Shapes3DConfig) -> RawDataset:
    """Read the drawn rows of the official ``3dshapes.h5``."""
    # optional dependency: only this data set needs it
    import h5py

    _check_sizes(cfg)
    path = resolve_file(cfg, cfg.file_name, PUBLISHED_AT)
    try:
        fh = h5py.File(path, "r")
    except OSError as err:
        raise DataError(f"{path}: not a readable HDF5 file ({err})") from err
    with fh:
        images, labels = _h5_dataset(fh, "images", path), _h5_dataset(fh, "labels", path)
        n_file = images.shape[0]
        if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, 3) or images.dtype != np.uint8:
            raise DataError(f"{path}: images must be uint8 (N, 64, 64, 3), got {images.dtype} {images.shape}")
        if labels.shape != (n_file, 6):
            raise DataError(f"{path}: labels must be ({n_file}, 6), got {labels.shape}")
        if n_file != N_GRID:
            log.warning("%s holds %d samples, the official file %d", path, n_file, N_GRID)
        idx = sample_grid_indices(cfg.n_train + cfg.n_test, cfg.seed, n_grid=n_file)
        order = np.argsort(idx)
        srt = idx[order]
        lab = np.asarray(labels[...], dtype=np.float64)[idx]
        imgs = np.empty((idx.size, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
        step = cfg.read_chunk
        try:
            for lo in progress(range(0, srt.size, step), desc="3dshapes images", unit="chunk"):
                rows = srt[lo : lo + step]
                imgs[order[lo : lo + step]] = images[rows].transpose(0, 3, 1, 2)
        except (OSError, ValueError) as err:
            raise DataError(f"{path}: cannot read images ({err})") from err
    return _split(cfg, imgs, lab[:, TARGET_COLUMNS], source=str(path))


def _h5_dataset(fh: h5py.File, key: str, path: Path) -> h5py.Dataset:
    import h5py  # optional dependency: only this file format needs it

    node = fh.get(key)
    if not isinstance(node, h5py.Dataset):
        raise DataError(f"{path}: no dataset {key!r}; expected 'images' and 'labels'")
    return node


def load(cfg: Shapes3DConfig) -> RawDataset:
    """The official file when ``cfg.use_files()``, else the MuJoCo renderer."""
    return load_file(cfg) if cfg.use_files() else generate(cfg)


def _check_sizes(cfg: Shapes3DConfig) -> None:
    """Split sizes ([`check_split_sizes`][fedhead.data._common.check_split_sizes]) and ``read_chunk > 0``."""
    check_split_sizes(cfg, "3dshapes")
    if cfg.read_chunk <= 0:
        raise DataError(f"3dshapes: read_chunk must be positive, got {cfg.read_chunk}")


def _split(cfg: Shapes3DConfig, imgs: np.ndarray, y: np.ndarray, source: str) -> RawDataset:
    """Training and held-out [`RawDataset`][fedhead.data.RawDataset] of the 3D Shapes targets."""
    return split_samples(cfg, imgs, y, TARGET_NAMES, source)
