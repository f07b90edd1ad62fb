"""``fedhead-data`` (Hydra): composition of conf/data.yaml + conf/dataset/, report, PNG grid."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from fedhead.cli.data import run_from_config, sample_grid_figure
from fedhead.data import RawDataset, build_federated

from .conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _compose(overrides):
    with initialize_config_dir(config_dir=str(REPO / "fedhead" / "conf"), version_base=None):
        return compose(config_name="data", overrides=overrides)


def test_default_dataset_is_hopper():
    cfg = _compose([])
    assert cfg.dataset.name == "hopper" and cfg.dataset.n_train == 4000
    assert cfg.dataset.num_clients == 4 and cfg.lambda_h == 0.01 and cfg.lambda_w == 0.01


def test_cli_prepares_cache_and_reports(tmp_path, capsys):
    cfg = _compose(
        [
            "dataset=swimmer",
            "dataset.n_train=300",
            "dataset.pilot_steps=100",
            f"dataset.cache_dir={tmp_path}",
            "num_clients=3",
        ]
    )
    res = run_from_config(cfg)
    out = capsys.readouterr().out
    assert res.cache.exists() and res.cache.parent == tmp_path
    assert res.figure is None  # tabular: no image grid
    assert [c.n_train for c in res.data.clients] == [100] * 3
    assert "client 2: train x (100, 8) y (100, 2)" in out
    assert "fully active check for swimmer" in out and "Sigma_cen" in out
    assert out.count(" ok") == 3


def test_image_grid_png(tmp_path):
    rng = np.random.default_rng(0)
    raw = RawDataset(
        name="img",
        x=rng.integers(0, 256, size=(40, 3, 8, 8), dtype=np.uint8),
        y=rng.normal(size=(40, 2)),
        target_names=("a", "b"),
    )
    fed = build_federated(raw, 4)
    path = sample_grid_figure(fed, tmp_path / "grid.png", n=6)
    assert path.read_bytes()[:8] == PNG_MAGIC
    grey = build_federated(RawDataset(name="g", x=raw.x[:, :1], y=raw.y, target_names=("a", "b")), 2)
    assert sample_grid_figure(grey, tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="not an image data set"):
        sample_grid_figure(
            build_federated(
                RawDataset(name="t", x=np.zeros((8, 2), np.float32), y=raw.y[:8], target_names=("a", "b")), 2
            ),
            tmp_path / "t.png",
        )


def test_cli_image_dataset_writes_grid(tmp_path, capsys):
    cfg = _compose(
        [
            "dataset=dsprites",
            "dataset.n_train=160",
            "dataset.n_test=40",
            f"dataset.cache_dir={tmp_path}",
            f"figure={tmp_path / 'grid.png'}",
            "figure_samples=8",
        ]
    )
    res = run_from_config(cfg)
    assert res.figure == tmp_path / "grid.png" and res.figure.read_bytes()[:8] == PNG_MAGIC
    assert "sample grid" in capsys.readouterr().out


def test_hydra_config_path_composes():
    """What ``@hydra.main(config_path=HYDRA_CONFIG_PATH)`` of every console script resolves: the
    package ``fedhead.conf``."""
    from hydra import initialize_config_module

    from fedhead.settings.config import CONF_PACKAGE, HYDRA_CONFIG_PATH

    assert f"pkg://{CONF_PACKAGE}" == HYDRA_CONFIG_PATH
    with initialize_config_module(config_module=CONF_PACKAGE, version_base=None):
        cfg = compose(config_name="data", overrides=["dataset=walker2d"])
    assert cfg.dataset._target_ == "fedhead.data.mujoco.MujocoConfig"
    assert cfg.dataset.name == "walker2d" and cfg.figure is None


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_console_entry_point_with_pkg_conf(tmp_path):
    """``python -m fedhead.cli.data`` in a scratch folder (config from ``pkg://fedhead.conf``): the
    cache is written and Hydra leaves nothing in the working directory."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    work.mkdir()
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FEDHEAD_CACHE": str(cache), "PYTHONPATH": path}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedhead.cli.data",
            "dataset=hopper",
            "dataset.n_train=200",
            "dataset.pilot_steps=50",
            "seed=3",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fully active check for hopper" in proc.stdout
    assert "client 3: train x (50, 11) y (50, 3)" in proc.stdout
    assert list(cache.glob("hopper-*.npz"))
    assert list(work.iterdir()) == []  # no outputs/, .hydra/ or log file
