"""The data cache: keys, the in-process memo, the file cache, concurrent builders, unusable folders."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from fedhead.data import (
    DatasetConfig,
    cache_file,
    cache_key,
)
from fedhead.data.mujoco import MujocoConfig
from fedhead.data.pipeline import load_raw_cached, load_raw_file

from .toy_raw import toy_raw


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
        return toy_raw(seed=cfg.seed)

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
        return toy_raw()

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


def test_unusable_cache_folder_warns_and_still_loads(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")  # cache_dir is a file: nothing can be created under it
    cfg = DatasetConfig(name="toy", cache_dir=str(blocker))
    with pytest.warns(UserWarning, match="lock file|could not write the data cache"):
        raw = load_raw_cached(cfg, lambda c: toy_raw())
    assert raw.y.shape == (400, 3)
