"""dSprites: the official .npz reader (fixtures in the published layout) and the renderer."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.data.base import DataError, MissingDataError
from fedhead.data.dsprites import (
    FILE_NAME,
    LATENT_SIZES,
    DSpritesConfig,
    factor_values,
    latents_from_indices,
    load,
    render_sprites,
    sample_grid_indices,
)


def _write_npz(folder, n, seed, compressed=True, imgs=None):
    """A small file with the official keys: imgs (n,64,64) uint8 0/1, latents_values (n,6),
    latents_classes (n,6), rows = random grid combinations."""
    idx = np.random.default_rng(seed).choice(int(np.prod(LATENT_SIZES)), n, replace=False)
    lat = latents_from_indices(idx)
    cls = np.stack(np.unravel_index(idx, LATENT_SIZES), axis=1).astype(np.int64)
    if imgs is None:
        imgs = render_sprites(lat[:, 1], lat[:, 2], lat[:, 3], lat[:, 4], lat[:, 5])[:, 0] // 255
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    save = np.savez_compressed if compressed else np.savez
    save(
        path,
        imgs=imgs.astype(np.uint8),
        latents_values=lat,
        latents_classes=cls,
        metadata=np.array(["dsprites fixture"]),
    )
    return path, imgs, lat


def test_grid_values_and_index_decoding():
    vals = factor_values()
    assert [len(v) for v in vals.values()] == list(LATENT_SIZES)
    lat = latents_from_indices(np.array([0, int(np.prod(LATENT_SIZES)) - 1, 32 * 32 * 40 + 33]))
    np.testing.assert_allclose(lat[0], [1, 1, 0.5, 0, 0, 0])
    np.testing.assert_allclose(lat[1], [1, 3, 1.0, 2 * np.pi, 1, 1])
    # index 32*32*40 + 33: scale class 1, orientation 0, x class 1, y class 1
    np.testing.assert_allclose(lat[2], [1, 1, 0.6, 0, 1 / 31, 1 / 31])


def test_square_known_pixels_and_symmetries():
    one = np.ones(1)
    sq = render_sprites(one, one, 0 * one, 0.5 * one, 0.5 * one)[0, 0]
    # centre at 32, half side 8: pixel centres 24.5 .. 39.5 -> rows/cols 24..39
    expect = np.zeros((64, 64), np.uint8)
    expect[24:40, 24:40] = 255
    np.testing.assert_array_equal(sq, expect)
    sq90 = render_sprites(one, one, np.pi / 2 * one, 0.5 * one, 0.5 * one)[0, 0]
    np.testing.assert_array_equal(sq90, sq)
    ell = render_sprites(2 * one, one, 0 * one, 0.5 * one, 0.5 * one)[0, 0] > 0
    assert abs(ell.sum() - np.pi * 10 * 5) < 12  # area of the 10 x 5 px ellipse
    assert ell.any(axis=0).sum() > ell.any(axis=1).sum()  # wide, not tall, at orientation 0
    ell90 = render_sprites(2 * one, one, np.pi / 2 * one, 0.5 * one, 0.5 * one)[0, 0] > 0
    np.testing.assert_array_equal(ell90, ell.T)
    heart = render_sprites(3 * one, one, 0 * one, 0.5 * one, 0.5 * one)[0, 0]
    np.testing.assert_array_equal(heart, heart[:, ::-1])  # mirror symmetric about the centre
    assert not np.array_equal(heart, heart[::-1])  # but not upside-down symmetric


@pytest.mark.parametrize("pos", [0.0, 0.25, 1.0])
def test_centroid_follows_position_and_scale_sets_area(pos):
    n = 3
    img = (
        render_sprites(np.ones(n), np.array([0.5, 0.75, 1.0]), np.zeros(n), np.full(n, pos), np.full(n, 1 - pos))[:, 0]
        > 0
    )
    rows, cols = np.mgrid[0:64, 0:64] + 0.5
    for k in range(n):
        m = img[k]
        assert abs(cols[m].mean() - (12 + 40 * pos)) < 1e-9
        assert abs(rows[m].mean() - (12 + 40 * (1 - pos))) < 1e-9
    areas = img.sum(axis=(1, 2))
    assert np.all(np.diff(areas) > 0)


def test_generator_shapes_ranges_determinism():
    cfg = DSpritesConfig(n_train=40, n_test=12, seed=3)
    raw = load(cfg)
    assert raw.x.shape == (40, 1, 64, 64) and raw.x.dtype == np.uint8
    assert raw.x_test.shape == (12, 1, 64, 64)
    assert raw.y.shape == (40, 3) and raw.y_test.shape == (12, 3)
    assert raw.target_names == ("pos_x", "pos_y", "scale")
    assert set(np.unique(raw.x)) <= {0, 255} and raw.x.reshape(40, -1).max(axis=1).min() == 255
    vals = factor_values()
    both = np.concatenate([raw.y, raw.y_test])
    assert np.all(np.isin(both[:, 0], vals["pos_x"])) and np.all(np.isin(both[:, 1], vals["pos_y"]))
    assert np.all(np.isin(both[:, 2], vals["scale"]))
    again = load(DSpritesConfig(n_train=40, n_test=12, seed=3))
    np.testing.assert_array_equal(again.x, raw.x)
    np.testing.assert_array_equal(again.y_test, raw.y_test)
    other = load(DSpritesConfig(n_train=40, n_test=12, seed=4))
    assert not np.array_equal(other.y, raw.y)
    # train and test are distinct grid combinations
    idx = sample_grid_indices(52, 3)
    assert np.unique(idx).size == 52
    np.testing.assert_allclose(latents_from_indices(idx[:40])[:, [4, 5, 2]], raw.y)


@pytest.mark.parametrize("compressed", [True, False])
def test_file_loader_reads_the_drawn_rows(tmp_path, compressed):
    path, imgs, lat = _write_npz(tmp_path / "dsprites", 300, seed=1, compressed=compressed)
    cfg = DSpritesConfig(root=str(tmp_path / "dsprites"), n_train=50, n_test=20, seed=7, chunk_images=7)
    raw = load(cfg)
    idx = sample_grid_indices(70, 7, n_grid=300)
    np.testing.assert_array_equal(raw.y, lat[idx[:50]][:, [4, 5, 2]])
    np.testing.assert_array_equal(raw.y_test, lat[idx[50:]][:, [4, 5, 2]])
    np.testing.assert_array_equal(raw.x[:, 0], imgs[idx[:50]] * 255)
    np.testing.assert_array_equal(raw.x_test[:, 0], imgs[idx[50:]] * 255)
    assert raw.source == str(path)
    # dataset.root may also be the path of the file itself
    raw2 = load(DSpritesConfig(root=str(path), n_train=50, n_test=20, seed=7, source="files"))
    np.testing.assert_array_equal(raw2.x, raw.x)


def test_missing_file_and_missing_root(tmp_path):
    with pytest.raises(MissingDataError) as err:
        load(DSpritesConfig(root=str(tmp_path), n_train=5, n_test=0))
    msg = str(err.value)
    assert FILE_NAME in msg and str(tmp_path) in msg and "dsprites-dataset" in msg
    with pytest.raises(MissingDataError, match="dataset.root"):
        load(DSpritesConfig(source="files", n_train=5, n_test=0))


def test_bad_files_raise_data_error(tmp_path):
    bad = tmp_path / "shape"
    _write_npz(bad, 30, seed=0, imgs=np.zeros((30, 32, 32), np.uint8))
    with pytest.raises(DataError, match=r"\(N, 64, 64\)"):
        load(DSpritesConfig(root=str(bad), n_train=5, n_test=2))
    nokey = tmp_path / "nokey"
    nokey.mkdir()
    np.savez(nokey / FILE_NAME, imgs=np.zeros((4, 64, 64), np.uint8))
    with pytest.raises(DataError, match="latents_values"):
        load(DSpritesConfig(root=str(nokey), n_train=2, n_test=0))
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / FILE_NAME).write_bytes(b"not a zip archive" * 10)
    with pytest.raises(DataError, match=FILE_NAME):
        load(DSpritesConfig(root=str(junk), n_train=2, n_test=0))
    toomany = tmp_path / "small"
    _write_npz(toomany, 10, seed=0)
    with pytest.raises(DataError, match="only 10"):
        load(DSpritesConfig(root=str(toomany), n_train=8, n_test=5))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_full_size_generation():
    raw = load(DSpritesConfig())
    assert raw.x.shape == (12000, 1, 64, 64) and raw.x_test.shape == (3000, 1, 64, 64)
    cov = np.cov(raw.y.T)
    # x, y, scale drawn independently from the uniform grid: variances of the grids
    np.testing.assert_allclose(
        np.diag(cov), [factor_values()["pos_x"].var()] * 2 + [factor_values()["scale"].var()], rtol=0.05
    )
    assert np.all(raw.x.reshape(12000, -1).max(axis=1) == 255)
