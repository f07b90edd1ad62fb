"""3D Shapes: the official .h5 reader (fixtures written with h5py in the published layout) and the
MuJoCo scene renderer (a handful of images; EGL software rendering on CPU)."""

from __future__ import annotations

import colorsys

import h5py
import numpy as np
import pytest

from fedhead.data.base import DataError, MissingDataError
from fedhead.data.shapes3d import (
    FACTOR_SIZES,
    FILE_NAME,
    Shapes3DConfig,
    factor_values,
    labels_from_indices,
    load,
    render_scenes,
    sample_grid_indices,
)


def _write_h5(folder, n, seed, images_shape=None, with_labels=True):
    rng = np.random.default_rng(seed)
    idx = rng.choice(int(np.prod(FACTOR_SIZES)), n, replace=False)
    labels = labels_from_indices(idx)
    images = rng.integers(0, 256, size=images_shape or (n, 64, 64, 3), dtype=np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    with h5py.File(path, "w") as f:
        chunks = (8, 64, 64, 3) if images_shape is None else None
        f.create_dataset("images", data=images, chunks=chunks)
        if with_labels:
            f.create_dataset("labels", data=labels)
    return path, images, labels


def _dominant_hue(rgb):
    return colorsys.rgb_to_hsv(*(np.asarray(rgb, float) / 255.0))[0]


def _hue_close(h, target, tol=0.04):
    d = abs(h - target) % 1.0
    return min(d, 1 - d) < tol


def test_grid_values():
    vals = factor_values()
    assert [len(v) for v in vals.values()] == list(FACTOR_SIZES)
    np.testing.assert_allclose(vals["object_hue"], np.arange(10) / 10)
    np.testing.assert_allclose(vals["scale"][[0, -1]], [0.75, 1.25])
    np.testing.assert_allclose(vals["orientation"][[0, 7, -1]], [-30, 0, 30])
    lab = labels_from_indices(np.array([0, 479999, 15 * 4 * 8 * 10 + 1]))
    np.testing.assert_allclose(lab[0], [0, 0, 0, 0.75, 0, -30])
    np.testing.assert_allclose(lab[1], [0.9, 0.9, 0.9, 1.25, 3, 30])
    np.testing.assert_allclose(lab[2], [0, 0.1, 0, 0.75, 0, -30 + 60 / 14])


def test_renderer_colours_scale_and_orientation():
    labels = np.array(
        [
            [0.0, 0.3, 0.6, 1.0, 0, 0.0],  # red floor, green wall, blue cube
            [0.6, 0.0, 0.3, 1.0, 2, 0.0],  # blue floor, red wall, green sphere
            [0.0, 0.3, 0.6, 0.75, 0, 0.0],  # small cube
            [0.0, 0.3, 0.6, 1.25, 0, 0.0],  # large cube
            [0.0, 0.3, 0.6, 1.0, 0, 30.0],  # turned room
        ]
    )
    img = render_scenes(labels)
    assert img.shape == (5, 3, 64, 64) and img.dtype == np.uint8
    for k in (0, 1):
        floor_h, wall_h, obj_h = labels[k, :3]
        assert _hue_close(_dominant_hue(img[k, :, 62, 32]), floor_h)  # bottom centre: floor
        assert _hue_close(_dominant_hue(img[k, :, 2, 10]), wall_h)  # top left: wall
        assert _hue_close(_dominant_hue(img[k, :, 32, 32]), obj_h)  # centre: object

    def object_pixels(im, hue):
        hsv = np.array([colorsys.rgb_to_hsv(*(p / 255.0)) for p in im.reshape(3, -1).T])
        d = np.abs(hsv[:, 0] - hue)
        return int(np.sum((np.minimum(d, 1 - d) < 0.04) & (hsv[:, 1] > 0.5)))

    sizes = [object_pixels(img[k], 0.6) for k in (2, 0, 3)]
    assert sizes[0] < sizes[1] < sizes[2]
    assert np.abs(img[4].astype(int) - img[0].astype(int)).mean() > 5
    again = render_scenes(labels[:2])
    np.testing.assert_array_equal(again, img[:2])


def test_generator_dataset_shapes_ranges_determinism():
    cfg = Shapes3DConfig(n_train=4, n_test=2, seed=5)
    raw = load(cfg)
    assert raw.x.shape == (4, 3, 64, 64) and raw.x_test.shape == (2, 3, 64, 64)
    assert raw.target_names == ("object_hue", "scale", "orientation")
    idx = sample_grid_indices(6, 5)
    np.testing.assert_allclose(np.concatenate([raw.y, raw.y_test]), labels_from_indices(idx)[:, [2, 3, 5]])
    vals = factor_values()
    assert np.all(np.isin(raw.y[:, 0], vals["object_hue"]))
    assert np.all(np.isin(raw.y[:, 1], vals["scale"]))
    assert np.all(np.isin(raw.y[:, 2], vals["orientation"]))
    again = load(cfg)
    np.testing.assert_array_equal(again.x, raw.x)
    np.testing.assert_array_equal(again.x_test, raw.x_test)


def test_file_loader_reads_the_drawn_rows(tmp_path):
    path, images, labels = _write_h5(tmp_path / "3d", 200, seed=2)
    cfg = Shapes3DConfig(root=str(tmp_path / "3d"), n_train=30, n_test=10, seed=9, read_chunk=7)
    raw = load(cfg)
    idx = sample_grid_indices(40, 9, n_grid=200)
    np.testing.assert_array_equal(raw.x, images[idx[:30]].transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(raw.x_test, images[idx[30:]].transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(raw.y, labels[idx[:30]][:, [2, 3, 5]])
    np.testing.assert_array_equal(raw.y_test, labels[idx[30:]][:, [2, 3, 5]])
    raw2 = load(Shapes3DConfig(root=str(path), n_train=30, n_test=10, seed=9))
    np.testing.assert_array_equal(raw2.x, raw.x)


def test_missing_and_bad_files(tmp_path):
    with pytest.raises(MissingDataError) as err:
        load(Shapes3DConfig(root=str(tmp_path), n_train=2, n_test=0))
    assert FILE_NAME in str(err.value) and str(tmp_path) in str(err.value)
    assert "3d-shapes" in str(err.value)
    with pytest.raises(MissingDataError, match="dataset.root"):
        load(Shapes3DConfig(source="files", n_train=2, n_test=0))
    _write_h5(tmp_path / "shape", 20, seed=0, images_shape=(20, 32, 32, 3))
    with pytest.raises(DataError, match=r"\(N, 64, 64, 3\)"):
        load(Shapes3DConfig(root=str(tmp_path / "shape"), n_train=2, n_test=0))
    _write_h5(tmp_path / "nolab", 20, seed=0, with_labels=False)
    with pytest.raises(DataError, match="labels"):
        load(Shapes3DConfig(root=str(tmp_path / "nolab"), n_train=2, n_test=0))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / FILE_NAME).write_bytes(b"\x00" * 64)
    with pytest.raises(DataError, match="HDF5"):
        load(Shapes3DConfig(root=str(tmp_path / "junk"), n_train=2, n_test=0))
    with pytest.raises(DataError, match="gl_backend"):
        render_scenes(np.zeros((1, 6)) + [0, 0, 0, 1, 0, 0], gl_backend="vulkan")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_generator_moderate_size():
    raw = load(Shapes3DConfig(n_train=400, n_test=100, seed=0))
    assert raw.x.shape == (400, 3, 64, 64)
    # images differ whenever the factors differ
    flat = raw.x.reshape(400, -1)
    assert np.unique(flat, axis=0).shape[0] == 400


def test_rendering_leaves_process_safe_for_torch_compiler_stack():
    """An EGL context in the calling process followed by ``import triton`` (what torchvision's
    import does through torch._dynamo) segfaults; render_scenes must keep GL out of the caller."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from fedhead.data.shapes3d import render_scenes\n"
        "img = render_scenes(np.array([[0.1, 0.5, 0.9, 1.0, 2, 0.0]]), size=16)\n"
        "assert img.shape == (1, 3, 16, 16) and img.dtype == np.uint8 and img.max() > 0\n"
        "import torch._dynamo  # loads triton\n"
        "print('survived')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "survived" in proc.stdout
