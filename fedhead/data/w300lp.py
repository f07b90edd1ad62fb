"""300W-LP (docs/theory.md §10): 64x64 RGB faces, targets head pitch, yaw and roll in degrees.

Reads the 300W-LP release: folders (``AFW``, ``AFW_Flip``, ``HELEN``, ``HELEN_Flip``, ``IBUG``,
``IBUG_Flip``, ``LFPW``, ``LFPW_Flip``) of ``.jpg`` face images (450x450), each with a
same-named ``.mat`` file (MATLAB v5) whose ``Pose_Para`` ``(1, 7)`` holds pitch, yaw, roll (in
radians) followed by the 3-d translation and the scale. ``dataset.root`` is the ``300W_LP``
folder; every ``.jpg`` under it (recursively) is a candidate, and a ``.jpg`` without its ``.mat``
is an error.

Targets ``(head_pitch, head_yaw, head_roll)`` in **degrees** (``Pose_Para[:3] * 180 / pi``).
Samples with any ``|angle| > max_abs_angle_deg`` (default 99, the usual filter of the
HopeNet-style protocols) are skipped; ``None`` keeps all. Images: the whole image, converted to
RGB and resized to ``image_size`` x ``image_size`` (Pillow, antialiased bilinear), stored as
``(N, 3, 64, 64)`` uint8.

Selection (deterministic under ``seed``): the sorted list of candidate images is permuted with
``default_rng(seed)`` and visited in that order until ``n_train + n_test`` samples pass the angle
filter (only those .mat and .jpg files are read); the first ``n_train`` are the training split,
the rest the held-out split. The flipped (``*_Flip``) and multi-pose copies of one face are
different samples of the release, so one face can appear in both splits, as in the random
splits of the release. There is no offline generator: without ``dataset.root`` [`load`][fedhead.data.w300lp.load]
raises [`MissingDataError`][fedhead.data.MissingDataError].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.io

from fedhead.data._common import check_split_sizes, split_samples
from fedhead.data.base import DataError, MissingDataError, RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.progress import progress

__all__ = ["W300LPConfig", "load", "read_pose", "read_image", "TARGET_NAMES"]

log = logging.getLogger(__name__)

PUBLISHED_AT = (
    "300W-LP (Zhu et al., 'Face Alignment Across Large Poses: A 3D Solution', project page "
    "cbsr.ia.ac.cn/users/xiangyuzhu/projects/3DDFA/main.htm; archive 300W-LP.zip)"
)
TARGET_NAMES = ("head_pitch", "head_yaw", "head_roll")
_POSE_LAYOUT = "pitch, yaw, roll, tx, ty, tz, scale"


@dataclass(frozen=True)
class W300LPConfig(DatasetConfig):
    """300W-LP configuration (``_target_: fedhead.data.w300lp.W300LPConfig``).

    Attributes (defaults; ``source``, ``cache_dir`` and ``allow_outside_regime`` as in
    [`DatasetConfig`][fedhead.data.DatasetConfig])
    ---------------------
    name : str = "300w_lp"
    root : str or None = None
        The ``300W_LP`` folder. Required: there is no generator.
    n_train : int = 12000
    n_test : int = 3000
    num_clients : int = 8
    seed : int = 0
    image_size : int = 64
    max_abs_angle_deg : float or None = 99.0
        Skip samples with a larger absolute pitch, yaw or roll (degrees); None keeps all.
    """

    name: str = "300w_lp"
    n_train: int = 12000
    n_test: int = 3000
    num_clients: int = 8
    image_size: int = 64
    max_abs_angle_deg: float | None = 99.0


def read_pose(path: Path) -> np.ndarray:
    """``(pitch, yaw, roll)`` in degrees from ``Pose_Para`` of a 300W-LP .mat file."""
    try:
        mat = scipy.io.loadmat(str(path), variable_names=["Pose_Para"])
    except Exception as err:  # scipy raises ValueError/TypeError/OSError on corrupt files
        raise DataError(f"{path}: not a readable MATLAB v5 file ({type(err).__name__}: {err})") from err
    if "Pose_Para" not in mat:
        raise DataError(f"{path}: no variable 'Pose_Para' (expected 1x7: {_POSE_LAYOUT})")
    pose = np.asarray(mat["Pose_Para"], dtype=np.float64)
    if pose.size != 7:
        raise DataError(f"{path}: Pose_Para must be 1x7 ({_POSE_LAYOUT}), got {pose.shape}")
    angles = np.rad2deg(pose.ravel()[:3])
    if not np.all(np.isfinite(angles)):
        raise DataError(f"{path}: non-finite pose angles {angles}")
    return angles


def read_image(path: Path, size: int) -> np.ndarray:
    """``(3, size, size)`` uint8 RGB image, resized with antialiased bilinear filtering."""
    # optional dependency: only this data set needs it
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.draft("RGB", (2 * size, 2 * size))  # JPEG: decode at a reduced scale
            rgb = im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
            arr = np.asarray(rgb, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable image ({err})") from err
    return arr.transpose(2, 0, 1)


def load(cfg: W300LPConfig) -> RawDataset:
    """Read ``n_train + n_test`` (image, pose) pairs chosen with ``cfg.seed`` (see module doc)."""
    check_split_sizes(cfg, "300w_lp")
    if cfg.image_size <= 0:
        raise DataError(f"300w_lp: image_size must be positive, got {cfg.image_size}")
    if not cfg.use_files() or cfg.root is None:
        raise MissingDataError(
            "300W_LP/<subset>/*.jpg + .mat",
            "nowhere: 300W-LP has no offline generator, set dataset.root (and source=auto|files)",
            PUBLISHED_AT,
        )
    root = Path(cfg.root).expanduser()
    if not root.is_dir():
        raise MissingDataError("300W_LP folder", str(root), PUBLISHED_AT)
    jpgs = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg") and p.is_file())
    if not jpgs:
        raise MissingDataError("300W_LP/<subset>/*.jpg + .mat", str(root), PUBLISHED_AT)
    n_keep = cfg.n_train + cfg.n_test
    order = np.random.default_rng(cfg.seed).permutation(len(jpgs))
    s = cfg.image_size
    x = np.empty((n_keep, 3, s, s), dtype=np.uint8)
    y = np.empty((n_keep, 3))
    kept = skipped = 0
    bar = progress(total=n_keep, desc="300W-LP", unit="img")
    for i in order:
        if kept == n_keep:
            break
        jpg = jpgs[i]
        mat = jpg.with_suffix(".mat")
        if not mat.is_file():
            raise DataError(f"{jpg}: no pose file {mat.name} next to it (every 300W-LP .jpg has a .mat)")
        angles = read_pose(mat)
        if cfg.max_abs_angle_deg is not None and np.any(np.abs(angles) > cfg.max_abs_angle_deg):
            skipped += 1
            continue
        x[kept] = read_image(jpg, s)
        y[kept] = angles
        kept += 1
        bar.update(1)
    bar.close()
    if kept < n_keep:
        raise DataError(
            f"{root}: only {kept} usable samples ({len(jpgs)} images, {skipped} outside "
            f"|angle| <= {cfg.max_abs_angle_deg} deg), {n_keep} needed (n_train + n_test)"
        )
    log.info("300W-LP: kept %d samples, skipped %d by the angle filter", kept, skipped)
    return split_samples(cfg, x, y, TARGET_NAMES, f"{root} ({len(jpgs)} images, seed {cfg.seed})")
