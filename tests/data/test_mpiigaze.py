"""MPIIGaze: reader of the Normalized per-day MATLAB v5 files (fixtures written with
scipy.io.savemat in the published struct layout) and the gaze-angle convention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.io

from fedhead.data.base import DataError, MissingDataError
from fedhead.data.mpiigaze import MPIIGazeConfig, gaze_to_pitch_yaw, load, read_day_file


def _gaze_vectors(rng, n):
    pitch = rng.uniform(-0.4, 0.3, n)
    yaw = rng.uniform(-0.5, 0.5, n)
    # inverse of pitch = arcsin(-y), yaw = arctan2(-x, -z)
    g = np.stack([-np.cos(pitch) * np.sin(yaw), -np.sin(pitch), -np.cos(pitch) * np.cos(yaw)], 1)
    return g, np.stack([pitch, yaw], 1)


def _write_day(path: Path, n_left: int, n_right: int, rng, image_shape=(36, 60)):
    """One dayYY.mat: struct data with left/right sub-structs of image (n,36,60) uint8,
    gaze (n,3) and pose (n,3) doubles, plus the filenames cell (the published layout)."""
    eyes, truth = {}, {}
    for eye, n in (("left", n_left), ("right", n_right)):
        img = rng.integers(0, 256, size=(n, *image_shape), dtype=np.uint8)
        gaze, py = _gaze_vectors(rng, n)
        eyes[eye] = {"gaze": gaze, "image": img, "pose": rng.normal(0, 0.2, (n, 3))}
        truth[eye] = (img, py)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = max(n_left, n_right)
    names = np.array([f"{path.stem}/{i:04d}.jpg" for i in range(n)], dtype=object)
    scipy.io.savemat(str(path), {"data": eyes, "filenames": names}, format="5")
    return truth


def _write_release(root: Path, seed=0, counts=((7, 6), (5, 5), (1, 1), (9, 8))):
    rng = np.random.default_rng(seed)
    folder = root / "Data" / "Normalized"
    pairs = []
    names = ["p00/day01.mat", "p00/day02.mat", "p01/day01.mat", "p03/day07.mat"]
    for name, (nl, nr) in zip(names, counts):
        truth = _write_day(folder / name, nl, nr, rng)
        for eye in ("left", "right"):
            img, py = truth[eye]
            for i in range(img.shape[0]):
                pairs.append((eye, img[i], py[i]))
    return pairs


def _lookup(pairs, image, mirror=True):
    for eye, img, py in pairs:
        if eye == "right" and mirror:
            img, py = img[:, ::-1], py * [1, -1]
        if np.array_equal(img, image):
            return eye, py
    raise AssertionError("sample not found among the fixture's images")


def test_gaze_convention_known_angles():
    a, b = 0.3, -0.2
    g = np.array([[0.0, 0.0, -1.0], [0.0, -np.sin(a), -np.cos(a)], [-np.sin(b), 0.0, -np.cos(b)], [0.0, 0.0, -2.0]])
    np.testing.assert_allclose(gaze_to_pitch_yaw(g), [[0, 0], [a, 0], [0, b], [0, 0]], atol=1e-15)
    with pytest.raises(DataError):
        gaze_to_pitch_yaw(np.zeros((1, 3)))


def test_read_day_file_including_single_sample(tmp_path):
    rng = np.random.default_rng(3)
    truth = _write_day(tmp_path / "p00" / "day01.mat", 1, 4, rng)
    day = read_day_file(tmp_path / "p00" / "day01.mat")
    assert day["left"][0].shape == (1, 36, 60) and day["right"][0].shape == (4, 36, 60)
    np.testing.assert_array_equal(day["left"][0], truth["left"][0])
    np.testing.assert_allclose(gaze_to_pitch_yaw(day["right"][1]), truth["right"][1], atol=1e-12)


def test_load_selects_true_pairs_deterministically(tmp_path):
    pairs = _write_release(tmp_path)
    cfg = MPIIGazeConfig(root=str(tmp_path), n_train=20, n_test=8, seed=2)
    raw = load(cfg)
    assert raw.x.shape == (20, 1, 36, 60) and raw.x.dtype == np.uint8
    assert raw.x_test.shape == (8, 1, 36, 60) and raw.y_test.shape == (8, 2)
    assert raw.target_names == ("gaze_pitch", "gaze_yaw")
    seen = set()
    eyes = set()
    for x, y in zip(np.concatenate([raw.x, raw.x_test]), np.concatenate([raw.y, raw.y_test])):
        eye, py = _lookup(pairs, x[0])
        np.testing.assert_allclose(y, py, atol=1e-12)
        seen.add(x.tobytes())
        eyes.add(eye)
    assert len(seen) == 28 and eyes == {"left", "right"}
    again = load(MPIIGazeConfig(root=str(tmp_path / "Data"), n_train=20, n_test=8, seed=2))
    np.testing.assert_array_equal(again.x, raw.x)
    np.testing.assert_array_equal(again.y_test, raw.y_test)
    other = load(MPIIGazeConfig(root=str(tmp_path), n_train=20, n_test=8, seed=3))
    assert not np.array_equal(other.x, raw.x)
    # a smaller draw with the same seed keeps the smallest keys: a prefix of the larger one
    small = load(MPIIGazeConfig(root=str(tmp_path), n_train=10, n_test=0, seed=2))
    np.testing.assert_array_equal(small.x, raw.x[:10])
    assert small.x_test is None


def test_eye_selection_and_mirroring(tmp_path):
    pairs = _write_release(tmp_path, seed=1)
    left = load(MPIIGazeConfig(root=str(tmp_path), eyes="left", n_train=15, n_test=0))
    assert {_lookup(pairs, x[0])[0] for x in left.x} == {"left"}
    right = load(MPIIGazeConfig(root=str(tmp_path), eyes="right", mirror_right=False, n_train=15, n_test=0))
    for x, y in zip(right.x, right.y):
        eye, py = _lookup(pairs, x[0], mirror=False)
        assert eye == "right"
        np.testing.assert_allclose(y, py, atol=1e-12)


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(MissingDataError, match="dataset.root") as err:
        load(MPIIGazeConfig(n_train=4, n_test=0))
    assert "MPIIGaze" in str(err.value)
    with pytest.raises(MissingDataError) as err:
        load(MPIIGazeConfig(root=str(tmp_path), n_train=4, n_test=0))
    assert "Data/Normalized/pXX/dayYY.mat" in str(err.value) and str(tmp_path) in str(err.value)
    _write_release(tmp_path / "few")
    with pytest.raises(DataError, match="eye images found"):
        load(MPIIGazeConfig(root=str(tmp_path / "few"), n_train=40, n_test=10))
    bad = tmp_path / "bad" / "Data" / "Normalized" / "p00" / "day01.mat"
    _write_day(bad, 3, 3, np.random.default_rng(0), image_shape=(36, 59))
    with pytest.raises(DataError, match=r"day01.mat.*\(n, 36, 60\)"):
        load(MPIIGazeConfig(root=str(tmp_path / "bad"), n_train=2, n_test=0))
    bad.write_bytes(b"MATLAB 5.0 MAT-file, corrupt" + b"\x00" * 20)
    with pytest.raises(DataError, match="day01.mat"):
        load(MPIIGazeConfig(root=str(tmp_path / "bad"), n_train=2, n_test=0))
    scipy.io.savemat(str(bad), {"other": np.zeros(3)})
    with pytest.raises(DataError, match="'data'"):
        load(MPIIGazeConfig(root=str(tmp_path / "bad"), n_train=2, n_test=0))
    with pytest.raises(ValueError, match="eyes"):
        load(MPIIGazeConfig(root=str(tmp_path), eyes="both_eyes", n_train=2, n_test=0))
