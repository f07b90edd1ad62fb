"""Backbones and head: shapes, seeding, rotate_features, BatchNorm state, bad configs."""

import numpy as np
import pytest
import torch
from torch import nn

from fedhead.models import (
    FreeFeatureConfig,
    ModelConfig,
    ModelError,
    ResidualCNNConfig,
    ResMLPConfig,
    ResNetConfig,
    backbone_expects_indices,
    backbone_is_image,
    backbone_output_layer,
    build_backbone,
    build_head,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rotation(p: int, seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((p, p)))
    return q * np.sign(np.diag(r))


IMAGE_CASES = [
    (ResNetConfig(depth=18), (3, 64, 64)),
    (ResNetConfig(depth=18), (1, 36, 60)),
    (ResNetConfig(name="resnet34", depth=34), (1, 36, 60)),
    (ResNetConfig(name="resnet34", depth=34), (3, 40, 40)),
    (ResidualCNNConfig(), (3, 16, 16)),
    (ResidualCNNConfig(), (1, 12, 20)),
]


def test_resmlp_layout_and_forward_backward():
    cfg = ResMLPConfig(width=32, depth=3, feature_dim=512)
    net = build_backbone(cfg, (17,), 100, seed=0)
    assert len(net.blocks) == 3
    assert isinstance(net.proj, nn.Linear) and net.proj.out_features == 512
    assert sum(isinstance(m, nn.PReLU) for m in net.modules()) == 1 + 2 * 3
    x = torch.randn(5, 17)
    h = net(x)
    assert h.shape == (5, 512)
    h.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize(
    "cfg,shape",
    IMAGE_CASES,
    ids=["resnet18-rgb64", "resnet18-gray36x60", "resnet34-gray36x60", "resnet34-rgb40", "rescnn-rgb", "rescnn-gray"],
)
def test_image_backbones_forward_backward(cfg, shape):
    net = build_backbone(cfg, shape, 10, seed=0)
    x = torch.rand(2, *shape)
    h = net(x)
    assert h.shape == (2, 512)
    h.sum().backward()
    assert net.net.fc.weight.grad is not None and torch.isfinite(net.net.fc.weight.grad).all()
    assert net.net.conv1.in_channels == shape[0]


def test_resnet_uses_torchvision_layouts():
    r18 = build_backbone(ResNetConfig(depth=18), (3, 64, 64), 1, seed=0).net
    r34 = build_backbone(ResNetConfig(depth=34), (3, 64, 64), 1, seed=0).net
    assert [len(layer) for layer in (r18.layer1, r18.layer2, r18.layer3, r18.layer4)] == [2, 2, 2, 2]
    assert [len(layer) for layer in (r34.layer1, r34.layer2, r34.layer3, r34.layer4)] == [3, 4, 6, 3]
    assert (r18.fc.in_features, r18.fc.out_features) == (512, 512)
    assert isinstance(r18.bn1, nn.BatchNorm2d) and isinstance(r18.maxpool, nn.MaxPool2d)


def test_residual_cnn_layout():
    net = build_backbone(ResidualCNNConfig(), (3, 40, 40), 1, seed=0).net
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, nn.Identity)
    norms = [m for m in net.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    assert norms and all(isinstance(m, nn.GroupNorm) and m.num_groups == 8 for m in norms)
    assert [len(layer) for layer in (net.layer1, net.layer2, net.layer3, net.layer4)] == [2, 2, 2, 2]


def test_batchnorm_state_persists_across_calls():
    net = build_backbone(ResNetConfig(depth=18), (3, 32, 32), 1, seed=0)
    bn = net.net.bn1
    assert int(bn.num_batches_tracked) == 0
    net.train()
    net(torch.rand(4, 3, 32, 32) + 1.0)
    mean1 = bn.running_mean.clone()
    assert int(bn.num_batches_tracked) == 1 and not torch.allclose(mean1, torch.zeros_like(mean1))
    net(torch.rand(4, 3, 32, 32) + 1.0)
    assert int(bn.num_batches_tracked) == 2 and not torch.equal(bn.running_mean, mean1)
    net.eval()
    x = torch.rand(3, 3, 32, 32)
    assert torch.equal(net(x), net(x))  # eval mode uses the stored statistics
    assert int(bn.num_batches_tracked) == 2


def test_free_features_lookup_and_init():
    net = build_backbone(FreeFeatureConfig(feature_dim=64, init_scale=2.0), (), 300, seed=0)
    idx = torch.tensor([3, 0, 3])
    h = net(idx)
    assert h.shape == (3, 64)
    assert torch.equal(h[0], h[2]) and torch.equal(h[1], net.table[0])
    norms = net.table.norm(dim=1)
    assert abs(norms.mean().item() - 2.0) < 0.1
    h.sum().backward()
    assert torch.equal(net.table.grad[3], 2 * torch.ones(64)) and torch.equal(net.table.grad[1], torch.zeros(64))


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_backbone(ResMLPConfig(width=16), (4,), 1, seed=7)
    b = build_backbone(ResMLPConfig(width=16), (4,), 1, seed=7)
    c = build_backbone(ResMLPConfig(width=16), (4,), 1, seed=8)
    assert torch.equal(torch.random.get_rng_state(), before)
    for pa, pb in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.proj.weight, c.proj.weight)
    h1, h2 = build_head(512, 3, seed=1), build_head(512, 3, seed=1)
    assert torch.equal(h1.weight, h2.weight) and torch.equal(h1.bias, h2.bias)
    assert h1.weight.shape == (3, 512) and h1.bias.shape == (3,)


@pytest.mark.parametrize("kind", ["resmlp", "rescnn", "free"])
def test_rotate_features_maps_h_to_qt_h(kind):
    p = 16
    if kind == "resmlp":
        net, x = build_backbone(ResMLPConfig(width=8, feature_dim=p), (5,), 1, seed=0), torch.randn(6, 5)
    elif kind == "rescnn":
        net, x = build_backbone(ResidualCNNConfig(feature_dim=p), (1, 8, 8), 1, seed=0), torch.rand(2, 1, 8, 8)
    else:
        net, x = build_backbone(FreeFeatureConfig(feature_dim=p), (), 10, seed=0), torch.tensor([1, 4, 9])
    net.double()
    if kind != "free":
        x = x.double()
    net.eval()
    q = _rotation(p, 3)
    h = net(x).detach().numpy()
    net.rotate_features(q)
    h_rot = net(x).detach().numpy()
    np.testing.assert_allclose(h_rot, h @ q, rtol=1e-12, atol=1e-12)  # rows: (Q^T h)^T = h^T Q


def test_rotate_features_rejects_non_orthogonal():
    net = build_backbone(ResMLPConfig(width=8, feature_dim=4), (3,), 1, seed=0)
    with pytest.raises(ModelError, match="not orthogonal"):
        net.rotate_features(2 * np.eye(4))
    with pytest.raises(ModelError, match=r"\(4, 4\)"):
        net.rotate_features(np.eye(3))


def test_bad_configs_and_shapes():
    with pytest.raises(ModelError, match="depth must be 18 or 34"):
        ResNetConfig(depth=50)
    with pytest.raises(ModelError, match="feature_dim"):
        ResMLPConfig(feature_dim=0)
    with pytest.raises(ModelError, match="groups"):
        ResidualCNNConfig(groups=7)
    with pytest.raises(ModelError, match="tabular"):
        build_backbone(ResMLPConfig(), (3, 8, 8), 1, seed=0)
    with pytest.raises(ModelError, match="image"):
        build_backbone(ResNetConfig(), (17,), 1, seed=0)
    with pytest.raises(ModelError, match="n_samples"):
        build_backbone(FreeFeatureConfig(), (), 0, seed=0)
    with pytest.raises(ModelError, match="seed"):
        build_backbone(ResMLPConfig(), (3,), 1, seed=-1)
    with pytest.raises(NotImplementedError):
        build_backbone(ModelConfig(), (3,), 1, seed=0)
    with pytest.raises(ModelError, match="P >= C"):
        build_head(2, 3, seed=0)


def test_model_yaml_files_instantiate():
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[2] / "fedhead" / "conf" / "model"
    expected = {
        "resmlp": (ResMLPConfig, 1024),
        "resmlp_small": (ResMLPConfig, 256),
        "resnet18": (ResNetConfig, 18),
        "resnet34": (ResNetConfig, 34),
        "rescnn": (ResidualCNNConfig, 8),
        "free": (FreeFeatureConfig, None),
    }
    for name, (cls, key) in expected.items():
        cfg = instantiate(OmegaConf.load(conf / f"{name}.yaml"))
        assert type(cfg) is cls and cfg.name == name and cfg.feature_dim == 512
        if cls is ResMLPConfig:
            assert cfg.width == key and cfg.depth == 3
        elif cls is ResNetConfig:
            assert cfg.depth == key
        elif cls is ResidualCNNConfig:
            assert cfg.groups == key


def test_resmlp_state_dict_keys_unchanged():
    net = build_backbone(ResMLPConfig(width=8, depth=1, feature_dim=4), (3,), 1, seed=0)
    assert list(net.state_dict()) == [
        "stem.0.weight",
        "stem.0.bias",
        "stem.1.weight",
        "blocks.0.fc1.weight",
        "blocks.0.fc1.bias",
        "blocks.0.act1.weight",
        "blocks.0.fc2.weight",
        "blocks.0.fc2.bias",
        "blocks.0.act2.weight",
        "proj.weight",
        "proj.bias",
    ]


def test_capabilities_are_declared_by_the_backbone_and_absent_on_any_other_module():
    mlp = build_backbone(ResMLPConfig(width=8, depth=1, feature_dim=4), (3,), 10, seed=0)
    free = build_backbone(FreeFeatureConfig(feature_dim=4), (), 10, seed=0)
    cnn = build_backbone(ResidualCNNConfig(width=8, groups=4, feature_dim=4), (1, 8, 8), 10, seed=0)
    assert (backbone_expects_indices(mlp), backbone_is_image(mlp)) == (False, False)
    assert backbone_output_layer(mlp) is mlp.output_layer() and isinstance(backbone_output_layer(mlp), nn.Linear)
    assert (backbone_expects_indices(free), backbone_is_image(free), backbone_output_layer(free)) == (True, False, None)
    assert backbone_is_image(cnn) and not backbone_expects_indices(cnn)
    plain = nn.Linear(3, 4)
    plain.expects_indices = True  # an attribute of any module is no declaration
    assert (backbone_expects_indices(plain), backbone_is_image(plain), backbone_output_layer(plain)) == (
        False,
        False,
        None,
    )
