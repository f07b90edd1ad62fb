"""fedhead/models/export.py: a backbone + shared head + offsets and scales as model.pt2 + model.json,
loaded back with torch alone, gives the in-memory model's outputs (ResMLP, ResNet-18 with
BatchNorm in eval mode, the residual CNN, a user module; batch sizes 1 and N). Slow: about
12 s each on 2 busy cores (torch.export traces every layer; its first call imports dynamo). The
default suite exports one ResMLP (tests/cli/test_predict.py).

Fast: model.json is checked before torch reads any program (format, ``program`` a file name in
the folder, ``program_sha256``, the inputs' standardisation), the program's bytes against that
hash; the standardisation the module cannot take in float32."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from fedhead.models import ResidualCNNConfig, ResMLPConfig, ResNetConfig, build_backbone
from fedhead.models.export import (
    META_FILE,
    PROGRAM_FILE,
    ModelFileError,
    PredictionModule,
    export_model,
    input_overflow,
    load_model,
    read_meta,
    read_program,
)
from fedhead.models.user import TorchModelConfig

C = 2
META = {"inputs": {"kind": "table", "features": [], "shape": [], "dtype": "float64"}, "targets": {"names": ["a", "b"]}}
NO_STD = {"mode": "none", "offset": [], "scale": []}

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
        2,
        PROGRAM_FILE,
        3,
    )
    assert meta["program_sha256"] == hashlib.sha256((tmp_path / PROGRAM_FILE).read_bytes()).hexdigest()
    want_std = NO_STD if image else {"mode": "none", "offset": i_off.tolist(), "scale": i_scale.tolist()}
    assert meta["inputs"]["standardization"] == want_std
    loaded = torch.export.load(str(tmp_path / PROGRAM_FILE)).module()  # plain torch
    for rows in (slice(0, 1), slice(0, 7)):  # the reference on the same batch (float32 kernels differ by size)
        want = _reference(backbone, x[rows], w, b, t_off, t_scale, i_off, i_scale)
        with torch.no_grad():
            got = loaded(torch.as_tensor(x[rows])).numpy()
        assert got.dtype == np.float64 and got.shape == (rows.stop, C)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _meta(**changes) -> dict:
    """A valid format-2 model.json for a table model of 2 features (keys changed; None: removed)."""
    inputs = {"kind": "table", "features": ["u", "v"], "shape": [2], "dtype": "float64", "standardization": NO_STD}
    meta = {"format": "fedhead-model", "format_version": 2, "program": PROGRAM_FILE, "program_sha256": "0" * 64}
    meta |= {"inputs": inputs, "targets": {"names": ["a"]}} | changes
    return {k: v for k, v in meta.items() if v is not None}


def test_a_folder_without_model_json_or_with_another_format_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="no such model folder"):
        load_model(tmp_path / "absent")
    with pytest.raises(ModelFileError, match=r"model\.json: no such file"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text("{not json")
    with pytest.raises(ModelFileError, match="cannot read it as JSON"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps({"format": "fedhead-model", "format_version": 99}))
    with pytest.raises(ModelFileError, match="format_version 99, this fedhead reads version 2"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps(_meta(format_version=1, program_sha256=None)))
    with pytest.raises(ModelFileError, match=r"format_version 1 records no program_sha256.*; re-export the model"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps(_meta()))
    with pytest.raises(ModelFileError, match=r"model\.pt2: no such file"):
        load_model(tmp_path)
    (tmp_path / PROGRAM_FILE).write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match=r"model\.pt2: its sha256 is [0-9a-f]{64}, not model\.json's"):
        load_model(tmp_path)
    (tmp_path / META_FILE).write_text(json.dumps(_meta(program_sha256=hashlib.sha256(b"not a zip").hexdigest())))
    with pytest.raises(ModelFileError, match="cannot load it with torch.export.load"):
        load_model(tmp_path)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"program": "/abs/model.pt2"}, "'program' must be a file name inside the model folder, got '/abs/model.pt2'"),
        ({"program": "../model.pt2"}, "'program' must be a file name inside the model folder, got '../model.pt2'"),
        ({"program": ".."}, "'program' must be a file name inside the model folder, got '..'"),
        ({"program": "a\\b.pt2"}, "'program' must be a file name inside the model folder, got 'a\\\\b.pt2'"),
        ({"program": None}, "'program' must be a file name inside the model folder, got None"),
        ({"program": 3}, "'program' must be a file name inside the model folder, got 3"),
        ({"program_sha256": None}, "lacks program_sha256, so its program cannot be checked before torch loads it"),
        ({"program_sha256": "ABC"}, "program_sha256 must be 64 lowercase hex digits, got 'ABC'"),
        ({"inputs": {"kind": "table", "shape": [2], "dtype": "float64"}}, "lacks inputs.standardization"),
        ({"inputs": _meta()["inputs"] | {"dtype": "load"}}, "inputs.dtype must be one of float64, float32, uint8"),
        ({"inputs": _meta()["inputs"] | {"shape": [-2]}}, "inputs.shape must be a list of positive integers"),
        ({"inputs": _meta()["inputs"] | {"kind": "text"}}, "inputs.kind must be 'table' or 'image', got 'text'"),
        ({"inputs": _meta()["inputs"] | {"features": ["u"]}}, "inputs.features must name the [2] inputs' columns"),
        (
            {"inputs": _meta()["inputs"] | {"standardization": {"offset": [0.0], "scale": [1.0]}}},
            "offset and scale must be empty or 2 finite numbers each (scale nonzero), got 1 and 1",
        ),
        (
            {"inputs": _meta()["inputs"] | {"standardization": {"offset": [0.0, 1.0], "scale": [1.0, 0.0]}}},
            "offset and scale must be empty or 2 finite numbers each (scale nonzero), got 2 and 2",
        ),
    ],
)
def test_model_json_is_checked_before_any_program_is_read(tmp_path, changes, expected):
    (tmp_path / META_FILE).write_text(json.dumps(_meta(**changes)))
    with pytest.raises(ModelFileError) as info:
        read_meta(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / META_FILE}: ") and expected in message and "\n" not in message, message


def test_the_program_is_read_once_inside_the_folder_and_checked_against_its_hash(tmp_path):
    folder, outside = tmp_path / "m", tmp_path / "outside.pt2"
    folder.mkdir()
    outside.write_bytes(b"program bytes")
    digest = hashlib.sha256(b"program bytes").hexdigest()
    (folder / PROGRAM_FILE).symlink_to(outside)
    meta = _meta(program_sha256=digest)
    with pytest.raises(ModelFileError, match="links to .*outside.pt2, outside the model folder; not loaded"):
        read_program(folder, meta)
    (folder / PROGRAM_FILE).unlink()
    (folder / PROGRAM_FILE).write_bytes(b"program bytes")
    assert read_program(folder, meta) == b"program bytes"
    (folder / PROGRAM_FILE).write_bytes(b"program bytez")
    with pytest.raises(ModelFileError, match=r"\(the file changed after the export\); not loaded"):
        read_program(folder, meta)


def test_inputs_the_float32_backbone_cannot_take_after_standardisation():
    meta = _meta()
    x = np.array([[1.0, -3e38], [4e38, 0.0], [1e308, 2.0]])
    assert input_overflow(x, meta).tolist() == [[False, False], [True, False], [True, False]]
    std = {"mode": "pooled", "offset": [0.0, -1e308], "scale": [1e-300, 1.0]}
    meta["inputs"]["standardization"] = std
    # column 0: 1 / 1e-300 overflows; column 1: -3e38 + 1e308 = 1e308 beyond float32
    assert input_overflow(x, meta).tolist() == [[True, True], [True, True], [True, True]]
    x = np.array([[1e-300, 2.0 - 1e308], [-1e-262, -1e308]])
    assert input_overflow(x, meta).tolist() == [[False, False], [False, False]]
