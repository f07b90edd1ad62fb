"""The data-set registry: names, configs, the Hydra YAML of each data set, loading by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedhead.data import (
    DataError,
    DatasetConfig,
    coerce_config,
    config_class,
    dataset_names,
    load_federated,
    make_config,
)
from fedhead.data.mujoco import MujocoConfig

from .conftest import REPO
from .toy_raw import toy_raw

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

    @dataclasses.dataclass(frozen=True)  # the data set configs are frozen
    class Odd(DatasetConfig):
        weird: int = 1

    with pytest.raises(DataError, match=r"no option\(s\) \['weird'\]"):
        coerce_config(Odd(name="hopper"))


@pytest.mark.parametrize("name", list(SIZES_10))
def test_dataset_yaml_files(name):
    from omegaconf import OmegaConf

    y = OmegaConf.load(REPO / "fedhead" / "conf" / "dataset" / f"{name}.yaml")
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


def test_a_loader_returning_fewer_samples_than_asked_raises(monkeypatch):
    from fedhead.data import registry

    cfg = make_config("hopper", n_train=500)
    monkeypatch.setattr(registry, "get_loader", lambda name: lambda c: toy_raw(n=300))
    with pytest.raises(DataError, match=r"hopper: the loader returned 300 training samples .*n_train=500"):
        registry.load_raw(cfg, use_cache=False)
