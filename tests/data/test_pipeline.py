"""Standardisation, partition-to-tensors, saved raw files, margins and split checks (docs/theory.md §10)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedhead.analysis.regime import OutsideRegimeError, OutsideRegimeWarning
from fedhead.data import (
    DataError,
    DatasetConfig,
    RawDataset,
    build_federated,
    client_margins,
    eigen_partition,
    ensure_fully_active,
    standardize_targets,
)
from fedhead.data.pipeline import load_raw_file, save_raw

from .toy_raw import toy_raw


def test_standardize_targets_pooled_training_statistics():
    raw = toy_raw(n_test=50)
    st = standardize_targets(raw.y, raw.y_test)
    np.testing.assert_allclose(st.y.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(st.y.std(0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(st.y * st.scale + st.offset, raw.y, rtol=1e-13)
    np.testing.assert_allclose(st.y_test, (raw.y_test - raw.y.mean(0)) / raw.y.std(0), rtol=1e-13)
    off = standardize_targets(raw.y, enabled=False)
    assert np.array_equal(off.y, raw.y) and np.all(off.offset == 0) and np.all(off.scale == 1)
    y = raw.y.copy()
    y[:, 1] = 2.0
    with pytest.raises(DataError, match=r"column\(s\) \[1\] are constant"):
        standardize_targets(y)


def test_build_federated_tabular_keeps_rows_together():
    raw = toy_raw(n=400)
    fed = build_federated(raw, 4)
    assert fed.n_clients == 4 and fed.input_shape == (2,) and not fed.is_image
    assert [c.n_train for c in fed.clients] == [100] * 4
    st = standardize_targets(raw.y)
    part = eigen_partition(st.y, 4)
    for m, c in enumerate(fed.clients):
        assert c.x_train.dtype == torch.float32 and c.y_train.dtype == torch.float32
        idx = c.x_train[:, 0].numpy().astype(int)  # column 0 is the original row index
        assert np.array_equal(idx, part.indices(m))
        np.testing.assert_allclose(c.y_train.numpy(), st.y[idx], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            c.y_train.numpy() * fed.target_scale + fed.target_offset, raw.y[idx], rtol=1e-5, atol=1e-5
        )
        assert c.x_test is None and c.y_test is None
    mom = fed.moments()
    np.testing.assert_allclose(mom.weights, 0.25)
    np.testing.assert_allclose(mom.mean_global, 0.0, atol=1e-6)
    np.testing.assert_allclose(mom.sigma_cen, np.cov(st.y.T, bias=True), atol=1e-5)


def test_build_federated_images_stay_uint8_and_tests_follow_partition():
    raw = toy_raw(n=400, image=True, n_test=80)
    fed = build_federated(raw, 4)
    assert fed.is_image and fed.input_shape == (1, 4, 4)
    st = standardize_targets(raw.y, raw.y_test)
    part = eigen_partition(st.y, 4, st.y_test)
    assert sum(int(c.y_test.shape[0]) for c in fed.clients) == 80
    for m, c in enumerate(fed.clients):
        assert c.x_train.dtype == torch.uint8 and c.x_test.dtype == torch.uint8
        assert np.array_equal(c.x_train.numpy(), raw.x[part.indices(m)])
        assert np.array_equal(c.x_test.numpy(), raw.x_test[part.indices(m, test=True)])
        np.testing.assert_allclose(c.y_test.numpy(), st.y_test[part.test == m], atol=1e-6)


def test_designed_groups_and_stored_scale():
    raw = toy_raw(n=400, n_test=40, groups=True, standardize=False)
    fed = build_federated(raw, 4)
    for m, c in enumerate(fed.clients):
        idx = c.x_train[:, 0].numpy().astype(int)
        assert np.all(idx % 4 == m)
        np.testing.assert_array_equal(c.y_train.numpy(), raw.y[idx].astype(np.float32))
        assert c.y_test.shape[0] == 10
    assert np.all(fed.target_offset == 0) and np.all(fed.target_scale == 1)
    with pytest.raises(DataError, match="designed"):
        build_federated(raw, 3)


def test_save_and_load_roundtrip(tmp_path):
    for raw in (toy_raw(), toy_raw(image=True, n_test=20, groups=True, standardize=False)):
        path = save_raw(raw, tmp_path / "x.npz", config={"a": 1})
        back = load_raw_file(path)
        for k in ("x", "y", "x_test", "y_test", "groups", "groups_test"):
            a, b = getattr(raw, k), getattr(back, k)
            assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype)
        assert back.target_names == raw.target_names and back.standardize == raw.standardize
        assert back.source == raw.source
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="bad.npz"):
        load_raw_file(tmp_path / "bad.npz")


def test_margins_against_independent_eigenvalues():
    raw = toy_raw(n=400)
    fed = build_federated(raw, 4)
    rep = client_margins(fed, 0.1, 0.2)
    covs = [np.cov(c.y_train.numpy().astype(np.float64).T, bias=True) for c in fed.clients]
    expect = np.array([np.linalg.eigvalsh(s)[0] for s in covs])
    np.testing.assert_allclose(rep.min_eigs, expect, rtol=1e-10, atol=1e-12)
    assert rep.threshold == pytest.approx(0.02, rel=1e-15)
    np.testing.assert_allclose(rep.margins, expect - 0.02, rtol=1e-10, atol=1e-12)
    assert rep.ok and rep.counts.tolist() == [100] * 4 and "client" in rep.table()
    assert np.array_equal(ensure_fully_active(fed, 0.1, 0.2).min_eigs, rep.min_eigs)
    big = float(expect.max()) * 2  # lambda_H lambda_W above every client's lambda_min
    with pytest.raises(OutsideRegimeError, match="allow_outside_regime=true") as err:
        ensure_fully_active(fed, big, 1.0)
    assert "outside the theory's fully active regime" in str(err.value)
    assert isinstance(err.value, ValueError)
    with pytest.warns(OutsideRegimeWarning, match="Continuing"):
        rep2 = ensure_fully_active(fed, big, 1.0, allow_outside_regime=True)
    assert not rep2.ok and rep2.violating == [0, 1, 2, 3]
    assert "OUTSIDE REGIME" in rep2.table()


def test_partition_is_made_in_standardised_units():
    """docs/theory.md §10: the leading eigenvector is taken after standardisation (pooled training stats);
    in original units a large-scale column would dominate and give a different split."""
    rng = np.random.default_rng(5)
    n = 800
    a = rng.normal(size=n)
    b = rng.normal(size=n)
    # column 0: huge scale, weakly tied to b; column 1: unit scale, strongly tied to b
    y = np.column_stack([1000.0 * (0.2 * b + a), b + 0.05 * rng.normal(size=n)]) + [50.0, -3.0]
    x = np.arange(n, dtype=np.float32)[:, None]
    raw = RawDataset(name="toy", x=x, y=y, target_names=("t0", "t1"), source="test")
    fed = build_federated(raw, 4)
    st = standardize_targets(y)
    v = eigen_partition(st.y, 4).direction
    np.testing.assert_allclose(abs(v), [np.sqrt(0.5)] * 2, atol=1e-12)  # 2-d standardised: +-45 deg
    z = st.y @ v
    order = np.argsort(z, kind="stable")
    for m, c in enumerate(fed.clients):
        idx = c.x_train[:, 0].numpy().astype(int)
        np.testing.assert_array_equal(np.sort(idx), np.sort(order[200 * m : 200 * (m + 1)]))
    # the raw-unit split (dominated by column 0) is a different partition
    raw_part = eigen_partition(y, 4)
    assert abs(raw_part.direction[0]) > 0.99
    assert not np.array_equal(raw_part.train, eigen_partition(st.y, 4).train)
    # stored scale (MuJoCo): the uncentred raw targets are split as they are
    fed_raw = build_federated(dataclasses.replace(raw, standardize=False), 4)
    for m, c in enumerate(fed_raw.clients):
        idx = c.x_train[:, 0].numpy().astype(int)
        np.testing.assert_array_equal(idx, raw_part.indices(m))


def test_raw_dataset_rejects_inconsistent_splits():
    x, y = np.zeros((10, 2), np.float32), np.zeros((10, 3))
    names = ("a", "b", "c")
    with pytest.raises(DataError, match="9 test inputs but 8 test targets"):
        RawDataset("toy", x, y, names, x_test=np.zeros((9, 2)), y_test=np.zeros((8, 3)))
    with pytest.raises(DataError, match=r"test targets must be \(N_test, 3\)"):
        RawDataset("toy", x, y, names, x_test=np.zeros((8, 2)), y_test=np.zeros((8, 2)))
    with pytest.raises(DataError, match="non-finite test targets"):
        RawDataset("toy", x, y, names, x_test=np.zeros((2, 2)), y_test=np.array([[0, np.nan, 0]] * 2))
    with pytest.raises(DataError, match="test inputs have sample shape"):
        RawDataset("toy", x, y, names, x_test=np.zeros((2, 3)), y_test=np.zeros((2, 3)))
    with pytest.raises(DataError, match="groups must be one client id per sample"):
        RawDataset("toy", x, y, names, groups=np.zeros(9, np.int64))
    with pytest.raises(DataError, match="groups_test must be one client id per sample"):
        RawDataset("toy", x, y, names, groups=np.zeros(10, np.int64), groups_test=np.zeros(3, np.int64))


def test_shared_split_helpers():
    from fedhead.data._common import check_split_sizes, split_samples

    cfg = DatasetConfig(name="toy", n_train=3, n_test=2)
    x, y = np.arange(5)[:, None].astype(np.float32), np.arange(10.0).reshape(5, 2)
    raw = split_samples(cfg, x, y, ("a", "b"), "src")
    np.testing.assert_array_equal(raw.x[:, 0], [0, 1, 2])
    np.testing.assert_array_equal(raw.y_test, y[3:])
    assert raw.y.flags.c_contiguous and raw.y.dtype == np.float64
    no_test = split_samples(dataclasses.replace(cfg, n_train=5, n_test=0), x, y, ("a", "b"), "src")
    assert no_test.x_test is None and no_test.y_test is None
    with pytest.raises(DataError, match="expected n_train \\+ n_test = 5 samples, got 4 inputs"):
        split_samples(cfg, x[:4], y, ("a", "b"), "src")
    for n_train, n_test in ((0, 1), (5, -1)):
        with pytest.raises(DataError, match="toy: n_train must be > 0 and n_test >= 0"):
            check_split_sizes(dataclasses.replace(cfg, n_train=n_train, n_test=n_test), "toy")
