"""fedhead/models/export.py: a backbone + shared head + offsets and scales as model.pt2 + model.json,
loaded back with torch alone, gives the in-memory model's outputs (ResMLP, ResNet-18 with
BatchNorm in eval mode, the residual CNN, a user module; batch sizes 1 and N). Slow: about
12 s each on 2 busy cores (torch.export traces every layer; its first call imports dynamo). The
default suite exports one ResMLP (tests/cli/test_predict.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedhead.models import ResidualCNNConfig, ResMLPConfig, ResNetConfig, build_backbone
from fedhead.models.export import META_FILE, PROGRAM_FILE, ModelFileError, PredictionModule, export_model, load_model
from fedhead.models.user import TorchModelConfig

C = 2
META = {"inputs": {"kind": "table", "features": [], "shape": [], "dtype": "float64"}, "targets": {"names": ["a", "b"]}}

CASES = {
    "resmlp": (ResMLPConfig(width=16, depth=2, feature_dim=8), (3,)),
    "resnet18": (ResNetConfig(width=4, feature_dim=6), (3, 16, 16)),
    "rescnn": (ResidualCNNConfig(width=4, groups=2, feature_dim=6), (1, 8, 8)),
    "user": (TorchModelConfig(module="user_backbones:TinyNet", kwargs={"width": 8}, feature_dim=5), (4,)),
}


def _reference(backbone, x, w, b, t_off, t_scale, i_off=None, i_scale=None):
    """y = t_off + t_scale (W h(x') + b), written out in numpy (float32 features, as in training)."""
    if x.dtype == np.uint8:
        xf = x.astype(np.float32) / 255.0
    else:
        xf = ((x - i_off) / i_scale).astype(np.float32) if i_off is not None else x.astype(np.float32)
    with torch.no_grad():
        h = backbone(torch.as_tensor(xf)).double().numpy()
    return t_off + t_scale * (h @ w.T + b)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_saved_model_gives_the_in_memory_outputs(tmp_path, name):
    cfg, shape = CASES[name]
    rng = np.random.default_rng(3)
    backbone = build_backbone(cfg, shape, 10, seed=1)
    image = len(shape) == 3
    x = rng.integers(0, 256, size=(7, *shape), dtype=np.uint8) if image else rng.normal(size=(7, *shape)) * 5 + 2
    if image:  # BatchNorm running statistics away from their initial values, then eval
        backbone.train()
        with torch.no_grad():
            backbone(torch.as_tensor(x.astype(np.float32) / 255.0))
    backbone.eval()
    p = int(backbone(torch.zeros((2, *shape))).shape[1])
    w, b = rng.normal(size=(C, p)), rng.normal(size=C)
    t_off, t_scale = np.array([10.0, -3.0]), np.array([2.5, 0.1])
    i_off, i_scale = (None, None) if image else (rng.normal(size=shape), rng.uniform(0.5, 3.0, size=shape))
    backbone.train()  # the caller's module keeps its mode and parameters
    before = {k: v.clone() for k, v in backbone.state_dict().items()}
    module = PredictionModule(backbone, w, b, t_off, t_scale, i_off, i_scale, image=image)
    assert backbone.training and all(torch.equal(v, before[k]) for k, v in backbone.state_dict().items())
    backbone.eval()
    dtype = torch.uint8 if image else torch.float64
    export_model(tmp_path, module, torch.zeros((2, *shape), dtype=dtype), {**META, "partition": 3})
    meta = json.loads((tmp_path / META_FILE).read_text())
    assert (meta["format"], meta["format_version"], meta["program"], meta["partition"]) == (
        "fedhead-model",
        1,
        PROGRAM_FILE,
        3,
    )
    loaded = torch.export.load(str(tmp_path / PROGRAM_FILE)).module()  # plain torch
    want = _reference(backbone, x, w, b, t_off, t_scale, i_off, i_scale)
    for rows in (slice(0, 1), slice(0, 7)):
        with torch.no_grad():
            got = loaded(torch.as_tensor(x[rows])).numpy()
        assert got.dtype == np.float64 and got.shape == (rows.stop, C)
        np.testing.assert_allclose(got, want[rows], rtol=1e-6, atol=1e-6)


def test_a_folder_without_model_json_or_with_another_format_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="no such model folder"):
        load_model(tmp_path / "absent")
    with pytest.raises(ModelFileError, match=r"model\.json: no such file"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text("{not json")
    with pytest.raises(ModelFileError, match="cannot read it as JSON"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps({"format": "fedhead-model", "format_version": 99}))
    with pytest.raises(ModelFileError, match="format_version 99, this fedhead reads version 1"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps({"format": "fedhead-model", "format_version": 1, **META}))
    with pytest.raises(ModelFileError, match=r"model\.pt2: no such file"):
        load_model(tmp_path)
    (tmp_path / PROGRAM_FILE).write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match="cannot load it with torch.export.load"):
        load_model(tmp_path)
