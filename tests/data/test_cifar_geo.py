"""CIFAR-geo: the shift/zoom construction, its designed groups, and the two image sources
(CIFAR-10 python pickle batches and Fashion-MNIST IDX files, fixtures in the published formats)."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedhead.data.base import DataError, MissingDataError
from fedhead.data.cifar_geo import (
    FASHION_MNIST_DIR,
    GROUPS,
    LOG_ZOOM_RANGE,
    CifarGeoConfig,
    load,
    place_images,
    read_idx_images,
    sample_geometry,
)


def _write_cifar(root: Path, n_per_batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """cifar-10-batches-py with data_batch_1..5 and test_batch: pickled dicts with bytes keys
    b'batch_label', b'labels', b'data' (n, 3072) uint8, b'filenames' (the published layout)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    out = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        batch = {
            b"batch_label": f"{name} fixture".encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n_per_batch)],
            b"data": data,
            b"filenames": [f"img_{i}.png".encode() for i in range(n_per_batch)],
        }
        with open(folder / name, "wb") as fh:
            pickle.dump(batch, fh, protocol=2)
        out.append(data.reshape(-1, 3, 32, 32))
    return np.concatenate(out[:5]), out[5]


def _write_idx(path: Path, images: np.ndarray, magic: int = 0x00000803) -> None:
    header = np.array([magic, *images.shape], dtype=">u4").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as fh:
        fh.write(header + images.astype(np.uint8).tobytes())


def _write_fashion(root: Path, n_train: int, n_test: int, seed: int):
    rng = np.random.default_rng(seed)
    tr = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    te = rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8)
    _write_idx(root / "train-images-idx3-ubyte.gz", tr)
    _write_idx(root / "t10k-images-idx3-ubyte.gz", te)
    _write_idx(root / "train-labels-idx1-ubyte.gz", np.zeros((n_train, 1, 1)), magic=0x00000801)
    return tr, te


def test_place_images_identity_shift_and_zoom():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, size=(3, 3, 32, 32), dtype=np.uint8)
    geom = np.array([[0.0, 0.0, 0.0], [3.0, -2.0, 0.0], [-8.0, 8.0, 0.0]])
    out = place_images(src, geom, 40)
    assert out.shape == (3, 3, 40, 40)
    expect = np.zeros((3, 3, 40, 40), np.uint8)
    expect[0, :, 4:36, 4:36] = src[0]
    expect[1, :, 2:34, 7:39] = src[1]  # dx=+3 right, dy=-2 up
    expect[2, :, 12:40, 0:28] = src[2][:, :28, 4:]  # partly out of the frame
    np.testing.assert_array_equal(out, expect)
    const = np.full((1, 1, 28, 28), 255, np.uint8)  # zoom 0.5 of a 28-px source: 16 px square
    half = place_images(const, np.array([[0.0, 0.0, np.log(0.5)]]), 40)[0, 0]
    ref = np.zeros((40, 40), np.uint8)
    ref[12:28, 12:28] = 255
    np.testing.assert_array_equal(half, ref)


def test_designed_groups_have_distinct_moments():
    rng = np.random.default_rng(0)
    means, covs = [], []
    for grp in GROUPS:
        g = sample_geometry(rng, grp, 20000, 8.0)
        assert np.all(np.abs(g[:, :2]) <= 8.0)
        assert np.all((g[:, 2] >= LOG_ZOOM_RANGE[0]) & (g[:, 2] <= LOG_ZOOM_RANGE[1]))
        se = np.asarray(grp.std) / np.sqrt(g.shape[0])
        assert np.all(np.abs(g.mean(0) - grp.mean) < 5 * se + 0.01 * np.asarray(grp.std))
        np.testing.assert_allclose(
            np.cov(g.T), grp.covariance(), rtol=0.06, atol=0.05 * np.outer(grp.std, grp.std).max()
        )
        means.append(g.mean(0))
        covs.append(np.cov(g.T))
    for i in range(4):
        for j in range(i):
            assert np.linalg.norm(means[i][:2] - means[j][:2]) > 3.0
            assert np.linalg.norm(covs[i] - covs[j]) > 1.0


def test_truncation_matches_truncated_normal():
    from scipy import stats

    grp = GROUPS[0]._replace(mean=(6.0, 0.0, 0.0), std=(3.0, 1.0, 0.1))  # independent components
    g = sample_geometry(np.random.default_rng(1), grp, 40000, 8.0)
    ref = stats.truncnorm((-8.0 - 6.0) / 3.0, (8.0 - 6.0) / 3.0, loc=6.0, scale=3.0)
    assert abs(g[:, 0].mean() - ref.mean()) < 4 * ref.std() / np.sqrt(g.shape[0])
    assert abs(g[:, 0].var() / ref.var() - 1) < 0.03
    assert stats.kstest(g[:, 0], ref.cdf).pvalue > 1e-3


def test_cifar_source(tmp_path):
    train, test = _write_cifar(tmp_path, 12, seed=1)
    cfg = CifarGeoConfig(root=str(tmp_path), image_source="cifar10", n_train=22, n_test=9, seed=4)
    raw = load(cfg)
    assert raw.x.shape == (22, 3, 40, 40) and raw.x_test.shape == (9, 3, 40, 40)
    assert raw.target_names == ("shift_x", "shift_y", "log_zoom")
    np.testing.assert_array_equal(np.bincount(raw.groups), [6, 6, 5, 5])
    np.testing.assert_array_equal(np.bincount(raw.groups_test), [3, 2, 2, 2])
    # every sample is one source image placed with its own targets: re-placing the matching
    # source reproduces it, and training samples come from the training batches only
    pick = np.random.default_rng(4).choice(60, 22, replace=False)
    np.testing.assert_array_equal(raw.x, place_images(train[pick], raw.y, 40))
    again = load(cfg)
    np.testing.assert_array_equal(again.x_test, raw.x_test)
    np.testing.assert_array_equal(again.y, raw.y)
    grey = load(
        CifarGeoConfig(
            root=str(tmp_path / "cifar-10-batches-py"), image_source="cifar10", n_train=22, n_test=9, seed=4, channels=1
        )
    )
    assert grey.x.shape == (22, 1, 40, 40)
    luma = np.tensordot([0.299, 0.587, 0.114], raw.x.astype(float), axes=([0], [1]))
    assert np.abs(grey.x[:, 0].astype(float) - luma).max() <= 2.0


def test_fashion_source_from_root_and_channels(tmp_path):
    tr, te = _write_fashion(tmp_path / "fm", 30, 10, seed=2)
    cfg = CifarGeoConfig(root=str(tmp_path / "fm"), n_train=16, n_test=8, seed=1)
    raw = load(cfg)
    assert raw.x.shape == (16, 3, 40, 40) and raw.x_test.shape == (8, 3, 40, 40)
    np.testing.assert_array_equal(raw.x[:, 0], raw.x[:, 2])  # grey replicated
    one = load(CifarGeoConfig(root=str(tmp_path / "fm"), n_train=16, n_test=8, seed=1, channels=1))
    np.testing.assert_array_equal(one.x[:, 0], raw.x[:, 0])
    np.testing.assert_array_equal(read_idx_images(tmp_path / "fm" / "t10k-images-idx3-ubyte.gz"), te)
    assert "fashion_mnist" in raw.source


def _require_debian_files() -> None:
    """Skip without the Debian files, except where CI installed them (.ci/run sets
    FEDHEAD_REQUIRE_DEFAULT_SOURCES=1 after ``apt-get install dataset-fashion-mnist``): fail there."""
    if Path(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz").is_file():
        return
    if os.environ.get("FEDHEAD_REQUIRE_DEFAULT_SOURCES"):
        pytest.fail(
            f"the default source {FASHION_MNIST_DIR} is missing although CI installed "
            f"dataset-fashion-mnist (FEDHEAD_REQUIRE_DEFAULT_SOURCES=1)"
        )
    pytest.skip("Debian package dataset-fashion-mnist not installed")


def test_offline_default_source_path(tmp_path, monkeypatch):
    """The default source (no root: the Debian Fashion-MNIST folder) with files in the published
    IDX format at that path: runs everywhere, whether or not the package is installed."""
    from fedhead.data import cifar_geo

    _write_fashion(tmp_path / "fm", 30, 10, seed=2)
    monkeypatch.setattr(cifar_geo, "FASHION_MNIST_DIR", str(tmp_path / "fm"))
    raw = load(CifarGeoConfig(n_train=16, n_test=8, seed=0))
    assert raw.x.shape == (16, 3, 40, 40) and str(tmp_path / "fm") in raw.source
    gen = load(CifarGeoConfig(n_train=16, n_test=8, seed=0, image_source="cifar10", source="generate"))
    np.testing.assert_array_equal(gen.x, raw.x)


def test_offline_default_reads_the_debian_files():
    _require_debian_files()
    raw = load(CifarGeoConfig(n_train=40, n_test=8, seed=0))
    assert raw.x.shape == (40, 3, 40, 40) and raw.x.max() > 0
    assert FASHION_MNIST_DIR in raw.source
    # source="generate" uses the Debian files even when cifar10 is asked for
    gen = load(CifarGeoConfig(n_train=40, n_test=8, seed=0, image_source="cifar10", source="generate"))
    np.testing.assert_array_equal(gen.x, raw.x)


def test_missing_and_bad_inputs(tmp_path):
    with pytest.raises(MissingDataError) as err:
        load(CifarGeoConfig(root=str(tmp_path), image_source="cifar10", n_train=4, n_test=0))
    assert "data_batch_1" in str(err.value) and str(tmp_path) in str(err.value)
    assert "cifar.html" in str(err.value)
    with pytest.raises(MissingDataError, match="dataset.root"):
        load(CifarGeoConfig(source="files", image_source="cifar10", n_train=4, n_test=0))
    with pytest.raises(MissingDataError, match="train-images-idx3-ubyte"):
        load(CifarGeoConfig(root=str(tmp_path), n_train=4, n_test=0))
    with pytest.raises(ValueError, match="image_source"):
        load(CifarGeoConfig(root=str(tmp_path), image_source="mnist", n_train=4, n_test=0))
    # corrupt pickle, wrongly shaped data
    _write_cifar(tmp_path / "c", 4, seed=0)
    batch = tmp_path / "c" / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(b"garbage")
    with pytest.raises(DataError, match="data_batch_3"):
        load(CifarGeoConfig(root=str(tmp_path / "c"), image_source="cifar10", n_train=4, n_test=0))
    with open(batch, "wb") as fh:
        pickle.dump({b"data": np.zeros((4, 1024), np.uint8), b"labels": [0] * 4}, fh)
    with pytest.raises(DataError, match=r"\(n, 3072\)"):
        load(CifarGeoConfig(root=str(tmp_path / "c"), image_source="cifar10", n_train=4, n_test=0))
    # IDX: wrong magic, truncated payload
    bad = tmp_path / "idx" / "x.gz"
    _write_idx(bad, np.zeros((3, 28, 28)), magic=0x00000801)
    with pytest.raises(DataError, match="magic"):
        read_idx_images(bad)
    with gzip.open(bad, "wb") as fh:
        fh.write(np.array([0x803, 5, 28, 28], ">u4").tobytes() + b"\x00" * 100)
    with pytest.raises(DataError, match="5x28x28"):
        read_idx_images(bad)
    _write_fashion(tmp_path / "few", 10, 4, seed=0)
    with pytest.raises(DataError, match="training samples asked for"):
        load(CifarGeoConfig(root=str(tmp_path / "few"), n_train=11, n_test=0))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_full_size_offline_default():
    _require_debian_files()
    raw = load(CifarGeoConfig())
    assert raw.x.shape == (12000, 3, 40, 40) and raw.x_test.shape == (3000, 3, 40, 40)
    np.testing.assert_array_equal(np.bincount(raw.groups), [3000] * 4)
    np.testing.assert_array_equal(np.bincount(raw.groups_test), [750] * 4)
    for g, grp in enumerate(GROUPS):
        np.testing.assert_allclose(raw.y[raw.groups == g].mean(0), grp.mean, atol=0.15)
