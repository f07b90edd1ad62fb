"""300W-LP: reader of the .jpg images and their .mat pose files (fixtures written with Pillow
and scipy.io.savemat in the published layout)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from fedhead.data.base import DataError, MissingDataError
from fedhead.data.w300lp import W300LPConfig, load, read_image, read_pose


def _colour(k: int) -> tuple[int, int, int]:
    return (20 + 37 * k % 200, 40 + 53 * k % 180, 60 + 71 * k % 160)


def _write_sample(folder: Path, stem: str, angles_rad, colour, size=120, with_mat=True):
    """``stem.jpg`` (solid colour) and ``stem.mat`` with Pose_Para 1x7 float32 (pitch, yaw,
    roll, tx, ty, tz, scale) plus Shape_Para / Exp_Para / pt2d as in the release."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), colour).save(folder / f"{stem}.jpg", quality=95)
    if with_mat:
        pose = np.array([[*angles_rad, 220.0, 230.0, -40.0, 0.0015]], dtype=np.float32)
        scipy.io.savemat(
            str(folder / f"{stem}.mat"),
            {
                "Pose_Para": pose,
                "Shape_Para": np.zeros((199, 1), np.float32),
                "Exp_Para": np.zeros((29, 1), np.float32),
                "pt2d": np.zeros((2, 68)),
            },
        )


def _write_release(root: Path, n_per_subset=8, seed=0, extreme=()):
    """AFW / HELEN_Flip subsets; returns {colour: angles in degrees}."""
    rng = np.random.default_rng(seed)
    truth = {}
    k = 0
    for subset in ("AFW", "HELEN_Flip"):
        for i in range(n_per_subset):
            ang = rng.uniform(-1.2, 1.2, 3)
            if k in extreme:
                ang[1] = np.deg2rad(120.0)
            col = _colour(k)
            _write_sample(root / subset, f"{subset}_{1000 + i}_1_{i % 3}", ang, col)
            truth[col] = np.rad2deg(ang.astype(np.float32).astype(np.float64))
            k += 1
    (root / "landmarks" / "AFW").mkdir(parents=True)  # the release's landmark folder (no .jpg)
    return truth


def _match(truth, img):
    col = img.reshape(3, -1).mean(axis=1)
    best = min(truth, key=lambda c: np.abs(np.array(c) - col).sum())
    assert np.abs(np.array(best) - col).max() < 4, (best, col)
    return truth[best]


def test_read_pose_and_image(tmp_path):
    _write_sample(tmp_path, "x", [0.1, -0.5, 0.25], (200, 10, 30), size=450)
    expect = np.rad2deg(np.float32([0.1, -0.5, 0.25]).astype(np.float64))
    np.testing.assert_allclose(read_pose(tmp_path / "x.mat"), expect, rtol=1e-14)
    img = read_image(tmp_path / "x.jpg", 64)
    assert img.shape == (3, 64, 64) and img.dtype == np.uint8
    assert np.abs(img.reshape(3, -1).mean(1) - [200, 10, 30]).max() < 4


def test_load_pairs_images_with_their_poses(tmp_path):
    truth = _write_release(tmp_path, extreme=(3, 11))
    cfg = W300LPConfig(root=str(tmp_path), n_train=9, n_test=4, seed=1)
    raw = load(cfg)
    assert raw.x.shape == (9, 3, 64, 64) and raw.x_test.shape == (4, 3, 64, 64)
    assert raw.target_names == ("head_pitch", "head_yaw", "head_roll")
    ys = np.concatenate([raw.y, raw.y_test])
    for x, y in zip(np.concatenate([raw.x, raw.x_test]), ys):
        np.testing.assert_allclose(y, _match(truth, x), rtol=1e-12)
    assert np.all(np.abs(ys) <= 99.0)  # the two 120-degree samples are filtered out
    assert np.unique(ys, axis=0).shape[0] == 13
    again = load(cfg)
    np.testing.assert_array_equal(again.x, raw.x)
    np.testing.assert_array_equal(again.y_test, raw.y_test)
    other = load(W300LPConfig(root=str(tmp_path), n_train=9, n_test=4, seed=2))
    assert not np.array_equal(other.y, raw.y)
    everything = load(W300LPConfig(root=str(tmp_path), n_train=16, n_test=0, max_abs_angle_deg=None, image_size=32))
    assert everything.x.shape == (16, 3, 32, 32) and np.abs(everything.y).max() > 119


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(MissingDataError, match="dataset.root") as err:
        load(W300LPConfig(n_train=2, n_test=0))
    assert "300W-LP" in str(err.value)
    with pytest.raises(MissingDataError, match=str(tmp_path / "nowhere")):
        load(W300LPConfig(root=str(tmp_path / "nowhere"), n_train=2, n_test=0))
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingDataError, match="jpg"):
        load(W300LPConfig(root=str(tmp_path / "empty"), n_train=2, n_test=0))
    _write_release(tmp_path / "few", n_per_subset=2)
    with pytest.raises(DataError, match="only 4 usable"):
        load(W300LPConfig(root=str(tmp_path / "few"), n_train=4, n_test=1))
    nomat = tmp_path / "nomat" / "AFW"
    _write_sample(nomat, "AFW_1_1_0", [0, 0, 0], (1, 2, 3), with_mat=False)
    with pytest.raises(DataError, match=r"AFW_1_1_0.jpg.*AFW_1_1_0.mat"):
        load(W300LPConfig(root=str(tmp_path / "nomat"), n_train=1, n_test=0))
    bad = tmp_path / "bad" / "AFW"
    _write_sample(bad, "AFW_2_1_0", [0, 0, 0], (1, 2, 3))
    scipy.io.savemat(str(bad / "AFW_2_1_0.mat"), {"Pose_Para": np.zeros((1, 5))})
    with pytest.raises(DataError, match="1x7"):
        load(W300LPConfig(root=str(tmp_path / "bad"), n_train=1, n_test=0))
    (bad / "AFW_2_1_0.mat").write_bytes(b"\x01\x02corrupt")
    with pytest.raises(DataError, match="AFW_2_1_0.mat"):
        load(W300LPConfig(root=str(tmp_path / "bad"), n_train=1, n_test=0))
    _write_sample(bad, "AFW_2_1_0", [0, 0, 0], (1, 2, 3))
    (bad / "AFW_2_1_0.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match="AFW_2_1_0.jpg"):
        load(W300LPConfig(root=str(tmp_path / "bad"), n_train=1, n_test=0))
