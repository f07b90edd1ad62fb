"""Standardisation, partition-to-tensors, cache and registry (docs/theory.md §10)."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch

from fedhead.analysis.regime import OutsideRegimeError, OutsideRegimeWarning
from fedhead.data import (
    DataError,
    DatasetConfig,
    RawDataset,
    build_federated,
    cache_file,
    cache_key,
    client_margins,
    coerce_config,
    config_class,
    dataset_names,
    eigen_partition,
    ensure_fully_active,
    load_federated,
    make_config,
    standardize_targets,
)
from fedhead.data.mujoco import MujocoConfig
from fedhead.data.pipeline import load_raw_cached, load_raw_file, save_raw

from .conftest import REPO


def _raw(n=400, c=3, seed=0, image=False, n_test=0, groups=False, standardize=True):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(n, c)) @ rng.normal(size=(c, c)) * 5.0 + 3.0
    if image:
        x = rng.integers(0, 256, size=(n, 1, 4, 4), dtype=np.uint8)
        x[:, 0, 0, 0] = np.arange(n) % 256
    else:
        x = np.column_stack([np.arange(n), rng.normal(size=n)]).astype(np.float32)
    kw = {}
    if n_test:
        kw["y_test"] = rng.normal(size=(n_test, c)) @ np.eye(c) * 5.0 + 3.0
        kw["x_test"] = (
            rng.integers(0, 256, size=(n_test, 1, 4, 4), dtype=np.uint8)
            if image
            else np.arange(n_test, dtype=np.float32)[:, None].repeat(2, 1)
        )
    if groups:
        kw["groups"] = np.arange(n) % 4
        if n_test:
            kw["groups_test"] = np.arange(n_test) % 4
    return RawDataset(
        name="toy",
        x=x,
        y=y,
        target_names=tuple(f"t{i}" for i in range(c)),
        standardize=standardize,
        source="test",
        **kw,
    )


def test_standardize_targets_pooled_training_statistics():
    raw = _raw(n_test=50)
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
    raw = _raw(n=400)
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
    raw = _raw(n=400, image=True, n_test=80)
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
    raw = _raw(n=400, n_test=40, groups=True, standardize=False)
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
    for raw in (_raw(), _raw(image=True, n_test=20, groups=True, standardize=False)):
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


def test_cache_key_fields():
    a = MujocoConfig(name="hopper", n_train=100)
    assert cache_key(a) == cache_key(dataclasses.replace(a, cache_dir="/elsewhere"))
    assert cache_key(a) == cache_key(dataclasses.replace(a, num_clients=7))
    assert cache_key(a) == cache_key(dataclasses.replace(a, allow_outside_regime=True))
    assert cache_key(a) != cache_key(dataclasses.replace(a, seed=1))
    assert cache_key(a) != cache_key(dataclasses.replace(a, n_train=101))
    assert cache_key(a) != cache_key(dataclasses.replace(a, name="swimmer"))
    assert cache_key(a) != cache_key(dataclasses.replace(a, noise_std=0.2))
    # "auto" without root is the generator
    assert cache_key(a) == cache_key(dataclasses.replace(a, source="generate"))
    f = dataclasses.replace(a, root="/data/jat")
    assert cache_key(f) != cache_key(a)
    assert cache_key(f) == cache_key(dataclasses.replace(f, source="files"))
    assert cache_key(f) != cache_key(dataclasses.replace(f, root="/data/other"))
    assert cache_file(a).name.startswith("hopper-") and cache_file(a).suffix == ".npz"


def test_cache_memo_and_file(isolated_cache):
    calls = []

    def loader(cfg):
        calls.append(cfg.seed)
        return _raw(seed=cfg.seed)

    cfg = DatasetConfig(name="toy", seed=3)
    r1 = load_raw_cached(cfg, loader)
    r2 = load_raw_cached(cfg, loader)
    assert calls == [3] and r1 is r2  # memo
    assert not r1.y.flags.writeable  # shared arrays are read-only
    path = cache_file(cfg)
    assert path.parent == isolated_cache and path.exists()
    from fedhead.data import clear_memo

    clear_memo()
    r3 = load_raw_cached(cfg, loader)
    assert calls == [3] and np.array_equal(r3.y, r1.y)  # from the file
    load_raw_cached(dataclasses.replace(cfg, seed=4), loader)
    assert calls == [3, 4]
    # a corrupt cache file is rebuilt with a warning
    clear_memo()
    path.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="rebuilding"):
        load_raw_cached(cfg, loader)
    assert calls == [3, 4, 3] and load_raw_file(path).y.shape == (400, 3)
    load_raw_cached(cfg, loader, use_cache=False)
    assert calls == [3, 4, 3, 3]


def test_concurrent_builders_build_once():
    calls = []
    lock = threading.Lock()

    def slow_loader(cfg):
        with lock:
            calls.append(1)
        time.sleep(0.3)
        return _raw()

    cfg = DatasetConfig(name="toy-concurrent")
    results = [None] * 4

    def work(i):
        results[i] = load_raw_cached(cfg, slow_loader)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # the file lock let one thread build, the others read its file
    for r in results:
        assert np.array_equal(r.y, results[0].y)


def test_registry_names_and_configs():
    assert dataset_names() == (
        "beijing",
        "swimmer",
        "hopper",
        "halfcheetah",
        "walker2d",
        "mpiigaze",
        "300w_lp",
        "dsprites",
        "shapes3d",
        "cifar_geo",
    )
    for name in ("swimmer", "hopper", "halfcheetah", "walker2d"):
        cfg = make_config(name)
        assert isinstance(cfg, MujocoConfig) and cfg.name == name
        assert (cfg.num_clients, cfg.n_train, cfg.n_test) == (4, 4000, 0)
    assert make_config("beijing").n_train == 9000
    c = coerce_config(DatasetConfig(name="hopper", n_train=123, seed=2))
    assert isinstance(c, MujocoConfig) and (c.n_train, c.seed, c.noise_std) == (123, 2, 0.3)
    with pytest.raises(DataError, match="unknown data set 'nope'"):
        config_class("nope")

    @dataclasses.dataclass
    class Odd(DatasetConfig):
        weird: int = 1

    with pytest.raises(DataError, match=r"no option\(s\) \['weird'\]"):
        coerce_config(Odd(name="hopper"))


SIZES_10 = {  # name: (clients, train, test)
    "beijing": (4, 9000, 0),
    "swimmer": (4, 4000, 0),
    "hopper": (4, 4000, 0),
    "halfcheetah": (4, 4000, 0),
    "walker2d": (4, 4000, 0),
    "mpiigaze": (8, 12000, 3000),
    "300w_lp": (8, 12000, 3000),
    "dsprites": (8, 12000, 3000),
    "shapes3d": (8, 12000, 3000),
    "cifar_geo": (4, 12000, 3000),
}


@pytest.mark.parametrize("name", list(SIZES_10))
def test_dataset_yaml_files(name):
    from omegaconf import OmegaConf

    y = OmegaConf.load(REPO / "conf" / "dataset" / f"{name}.yaml")
    assert y.name == name
    assert (y.num_clients, y.n_train, y.n_test) == SIZES_10[name]
    module, cls = y._target_.rsplit(".", 1)
    from fedhead.data.registry import REGISTRY

    assert (module, cls) == (REGISTRY[name].module, REGISTRY[name].config)
    from hydra.utils import instantiate

    cfg = instantiate(y)
    assert isinstance(cfg, config_class(name))
    assert (cfg.name, cfg.num_clients, cfg.n_train, cfg.n_test) == (name, *SIZES_10[name])


def test_load_federated_mujoco_small_overrides():
    cfg = MujocoConfig(name="swimmer", n_train=240, pilot_steps=100, episode_steps=60)
    fed = load_federated(cfg)
    assert [c.n_train for c in fed.clients] == [60] * 4 and fed.input_shape == (8,)
    fed3 = load_federated(cfg, num_clients=3)
    assert [c.n_train for c in fed3.clients] == [80] * 3
    again = load_federated(cfg)
    assert again is not fed and torch.equal(again.clients[0].y_train, fed.clients[0].y_train)
    other = load_federated(cfg, seed=5)
    assert not torch.equal(other.clients[0].x_train, fed.clients[0].x_train)
    with pytest.raises(DataError, match="num_clients"):
        load_federated(cfg, num_clients=0)


def test_margins_against_independent_eigenvalues():
    raw = _raw(n=400)
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


def test_unusable_cache_folder_warns_and_still_loads(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")  # cache_dir is a file: nothing can be created under it
    cfg = DatasetConfig(name="toy", cache_dir=str(blocker))
    with pytest.warns(UserWarning, match="lock file|could not write the data cache"):
        raw = load_raw_cached(cfg, lambda c: _raw())
    assert raw.y.shape == (400, 3)


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


def test_a_loader_returning_fewer_samples_than_asked_raises(monkeypatch):
    from fedhead.data import registry

    cfg = make_config("hopper", n_train=500)
    monkeypatch.setattr(registry, "get_loader", lambda name: lambda c: _raw(n=300))
    with pytest.raises(DataError, match=r"hopper: the loader returned 300 training samples .*n_train=500"):
        registry.load_raw(cfg, use_cache=False)
