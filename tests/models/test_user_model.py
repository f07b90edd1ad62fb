"""``model=torch`` (fedhead/models/user.py): a user's own nn.Module as the private backbone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhead.analysis.constraints import ConfigError
from fedhead.driver.errors import EXIT_USAGE, exit_code
from fedhead.models import build_backbone
from fedhead.models.user import TorchModelConfig, UserBackbone, UserModelError, check_user_model
from fedhead.settings.config import compose_config, load_config

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:  # user_backbones.py, the "user's package"
    sys.path.insert(0, str(TESTS))


def test_wraps_the_module_and_rotates_its_final_linear():
    cfg = TorchModelConfig(module="user_backbones:TinyNet", kwargs={"width": 8}, feature_dim=6)
    bb = build_backbone(cfg, (3,), 10, seed=1)
    assert isinstance(bb, UserBackbone) and bb.output_layer() is bb.net.out and bb.net.out.in_features == 8
    x = torch.randn(5, 3)
    h = bb(x).detach().double()
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    bb.rotate_features(q)
    torch.testing.assert_close(bb(x).detach().double(), h @ q, atol=1e-5, rtol=1e-5)
    same = build_backbone(cfg, (3,), 10, seed=1)
    torch.testing.assert_close(same(x), build_backbone(cfg, (3,), 10, seed=1)(x))  # seeded
    img = build_backbone(TorchModelConfig(module="user_backbones:TinyConv", feature_dim=4), (2, 8, 8), 10, seed=0)
    assert img.is_image and img(torch.rand(3, 2, 8, 8)).shape == (3, 4)


def test_hydra_kwargs_syntax():
    base = ["model=torch", "model.module=user_backbones:TinyNet", "model.feature_dim=8"]
    cfg = load_config(compose_config([*base, "+model.kwargs.width=64"]))
    assert isinstance(cfg.model, TorchModelConfig) and cfg.model.kwargs == {"width": 64}
    cfg = load_config(compose_config([*base, "++model.kwargs={width:32}"]))
    assert cfg.model.kwargs == {"width": 32}
    assert build_backbone(cfg.model, (3,), 4, 0).net.out.in_features == 32


@pytest.mark.parametrize(
    ("module", "kwargs", "text"),
    [
        ("no_such_package.mod:Net", {}, "cannot import no_such_package.mod (ModuleNotFoundError"),
        ("user_backbones:Missing", {}, "user_backbones has no attribute 'Missing'"),
        ("user_backbones:NOT_A_MODULE", {}, "NOT_A_MODULE is not a torch.nn.Module subclass"),
        ("user_backbones", {}, "model.module must be 'package.module:Class'"),
    ],
)
def test_import_errors_at_config_time(module, kwargs, text):
    with pytest.raises(ConfigError, match=r"^model\.module") as info:  # the key as users type it, once
        load_config(compose_config(["model=torch", f"model.module={module}"]))
    assert text in str(info.value) and exit_code(info.value) == EXIT_USAGE


@pytest.mark.parametrize(
    ("name", "kwargs", "text"),
    [
        (
            "EndsWithActivation",
            {},
            "the module must end with an nn.Linear producing the features (its last registered layer; found ReLU)",
        ),
        ("ActivationAfterLinear", {}, "the features are not the outputs of its final nn.Linear"),
        ("WrongShape", {}, "returned (2, 16), expected features (2, 8) = (batch, model.feature_dim)"),
        ("NeedsWidth", {}, "NeedsWidth(**{'in_features': 3, 'feature_dim': 8}) failed (TypeError"),
        ("TinyNet", {"feature_dim": 5}, "its final nn.Linear has 5 outputs but model.feature_dim=8"),
    ],
)
def test_shape_errors_on_a_tiny_batch(name, kwargs, text):
    cfg = TorchModelConfig(module=f"user_backbones:{name}", kwargs=kwargs, feature_dim=8)
    with pytest.raises(UserModelError) as info:
        check_user_model(cfg, (3,))
    assert text in str(info.value), str(info.value)
    assert f"model.module=user_backbones:{name}" in str(info.value) and exit_code(info.value) == EXIT_USAGE


def _write_sites(folder: Path) -> list[Path]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate((24, 28, 32)):
        x = rng.normal(size=(n, 3))
        y = x @ rng.normal(size=(3, 2)) + 0.5 * rng.normal(size=(n, 2)) + i
        lines = ["f1,f2,f3,t1,t2"] + [",".join(repr(float(v)) for v in (*x[j], *y[j])) for j in range(n)]
        path = folder / f"site_{'abc'[i]}.csv"
        path.write_text("\n".join(lines) + "\n")
        out.append(path)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_simulation_on_three_csv_sites_with_a_user_backbone(tmp_path, monkeypatch):
    """fedhead-run's path (compose -> load_config -> run_federations) on 3 CSV sites and a user
    backbone: the diagnosis's G_cen is the one of the pooled standardised rows, clients optimal."""
    import os

    from fedhead import ufm
    from fedhead.driver.simulation import run_federations

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    files = _write_sites(tmp_path)
    cfg = load_config(
        compose_config(
            [
                "dataset=table",
                f"dataset.files=[{','.join(map(str, files))}]",
                "dataset.targets=[t1,t2]",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "model=torch",
                "model.module=user_backbones:TinyNet",
                "+model.kwargs.width=64",
                "model.feature_dim=8",
                "procedure=proximal",
                "rounds=1",
                # the 64-wide one-layer tanh net memorises the sites' noise slowly: at 3000 epochs
                # the cosine schedule had decayed the lr while client 2 was still 2.9e-2 from its
                # optimum; it reaches 1e-4 after about 6000 (local_tol stops each client there)
                "local_epochs=10000",
                "local_tol=1e-4",
                "train.lr=1e-2",
                "output.figures=false",
                "output.tensorboard=false",
                "resources.client_cpus=1",
            ]
        )
    )
    (res,) = run_federations(cfg.jobs(tmp_path / "out"), show_progress=False)
    assert res["status"] == "completed"
    y = np.concatenate([np.loadtxt(f, delimiter=",", skiprows=1)[:, 3:] for f in files])
    ys = (y - y.mean(0)) / y.std(0)
    g_cen = ufm.optimal_gram(np.cov(ys.T, bias=True), cfg.settings.lambda_h, cfg.settings.lambda_w)
    np.testing.assert_allclose(np.array(res["targets"]["g_cen"]), g_cen, rtol=0, atol=1e-8)
    assert res["local_optimality"]["reached"] is True, res["local_optimality"]
    assert res["diagnosis"]["fully_active"]
    for k in range(3):  # each client saved its final model (clients/export.py), through the Ray workers
        meta = json.loads((tmp_path / "out" / "proximal" / "models" / f"partition_{k}" / "model.json").read_text())
        assert (meta["model"], meta["partition"], meta["round"]) == ("torch", k, 1)
