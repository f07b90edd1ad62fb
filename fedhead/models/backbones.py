"""Backbones (private per client) and the shared linear head (docs/theory.md §1, §10).

Every backbone maps a batch to features ``(B, P)`` and can rotate or affinely map them in place
(alignment, docs/theory.md §5; the trainer's finishing step, §14); what else it can do it
declares on [`Backbone`][fedhead.models.Backbone], read through ``backbone_*`` helpers. Models
are built on the CPU inside [`seeded`][fedhead.models.seeded], which leaves the caller's RNG alone.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedhead.models.errors import ModelError

if TYPE_CHECKING:
    from torchvision.models.resnet import ResNet


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the body with the CPU RNG seeded by ``seed``, restoring the caller's RNG state after."""
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ModelError(f"model seed must be a non-negative integer, got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def _as_rotation(q: np.ndarray | torch.Tensor, dim: int, where: str) -> torch.Tensor:
    """Validate an orthogonal ``(dim, dim)`` matrix and return it as a float64 CPU tensor."""
    qt = torch.as_tensor(np.asarray(q.detach().cpu() if isinstance(q, torch.Tensor) else q), dtype=torch.float64)
    if qt.shape != (dim, dim):
        raise ModelError(f"{where}: rotation must be ({dim}, {dim}), got {tuple(qt.shape)}")
    if not torch.isfinite(qt).all():
        raise ModelError(f"{where}: rotation has non-finite entries")
    err = torch.linalg.matrix_norm(qt.T @ qt - torch.eye(dim, dtype=torch.float64)).item()
    if err > 1e-6 * math.sqrt(dim):
        raise ModelError(f"{where}: rotation is not orthogonal (||Q^T Q - I||_F = {err:.3g})")
    return qt


@torch.no_grad()
def rotate_linear_output(layer: nn.Linear, q: np.ndarray | torch.Tensor) -> None:
    """Replace the outputs ``z`` of ``layer`` by ``Q^T z``: ``weight <- Q^T weight``, ``bias <- Q^T bias``.

    The product is formed in float64 and cast back to the parameters' dtype.
    """
    qt = _as_rotation(q, layer.out_features, "rotate_features")
    qt = qt.to(layer.weight.device)
    layer.weight.copy_((qt.T @ layer.weight.double()).to(layer.weight.dtype))
    if layer.bias is not None:
        layer.bias.copy_((qt.T @ layer.bias.double()).to(layer.bias.dtype))


class Backbone(nn.Module):
    """Base class: a private feature extractor ``x -> h(x)`` with ``h`` in ``R^P``.

    Attributes
    ----------
    feature_dim : int
        ``P``.
    input_shape : tuple of int or None
        Shape of one input sample (``(F,)`` or ``(ch, H, W)``); None for the free-feature
        backbone, whose inputs are sample indices.
    expects_indices : bool
        True when the inputs are ``(B,)`` int64 sample indices (free features).
    is_image : bool
        True for image backbones (channels-last eligible).
    """

    feature_dim: int
    input_shape: tuple[int, ...] | None
    expects_indices: bool = False
    is_image: bool = False

    def rotate_features(self, q: np.ndarray | torch.Tensor) -> None:  # pragma: no cover - abstract
        """Replace the features ``h`` by ``Q^T h`` (``Q`` orthogonal ``(P, P)``) in place."""
        raise NotImplementedError

    def map_features(self, m: torch.Tensor, delta: torch.Tensor) -> None:  # pragma: no cover - abstract
        """Replace the features ``h`` by ``M (h + delta)`` (``M`` ``(P, P)``, ``delta`` ``(P,)``) in place."""
        raise NotImplementedError

    def output_layer(self) -> nn.Linear | None:
        """The last layer, a ``Linear(width, P)`` whose outputs are the features (None for free
        features, whose table is the features themselves)."""
        return None


def backbone_expects_indices(module: nn.Module) -> bool:
    """Whether ``module`` takes ``(B,)`` sample indices: a [`Backbone`][fedhead.models.Backbone] that says so.

    Any ``nn.Module`` can be trained as a backbone; one that is not a ``Backbone`` declares
    nothing, so it takes ordinary inputs, is not an image backbone and has no output layer.
    """
    return isinstance(module, Backbone) and bool(module.expects_indices)


def backbone_is_image(module: nn.Module) -> bool:
    """Whether ``module`` is a [`Backbone`][fedhead.models.Backbone] of image inputs (channels-last eligible)."""
    return isinstance(module, Backbone) and bool(module.is_image)


def backbone_output_layer(module: nn.Module) -> nn.Linear | None:
    """The ``Linear`` whose outputs are the features of ``module``, or None (free features, or not a ``Backbone``)."""
    return module.output_layer() if isinstance(module, Backbone) else None


def feature_table(module: nn.Module) -> nn.Parameter | None:
    """The ``(N, P)`` feature table of a [`FreeFeatureBackbone`][fedhead.models.FreeFeatureBackbone], else None."""
    return module.table if isinstance(module, FreeFeatureBackbone) else None


def require_backbone(module: nn.Module, need: str) -> Backbone:
    """``module`` as a [`Backbone`][fedhead.models.Backbone]; a clear error naming ``need``, what requires one."""
    if not isinstance(module, Backbone):
        raise ModelError(f"{need} needs a fedhead Backbone (rotate_features/map_features), got {type(module).__name__}")
    return module


@torch.no_grad()
def map_linear_output(layer: nn.Linear, m: torch.Tensor, delta: torch.Tensor) -> None:
    """``weight <- M weight``, ``bias <- M (bias + delta)``: every output ``h`` of ``layer`` becomes
    ``M (h + delta)`` (``M`` ``(P, P)``, ``delta`` ``(P,)``; products in float64)."""
    if layer.bias is None:
        raise ModelError("map_features needs a last Linear layer with a bias")
    m = m.to(device=layer.weight.device, dtype=torch.float64)
    delta = delta.to(device=layer.weight.device, dtype=torch.float64)
    layer.weight.copy_((m @ layer.weight.double()).to(layer.weight.dtype))
    layer.bias.copy_((m @ (layer.bias.double() + delta)).to(layer.bias.dtype))


class ResidualBlock(nn.Module):
    """``x -> PReLU(x + Linear(PReLU(Linear(x))))``, width preserved."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.act1 = nn.PReLU()
        self.fc2 = nn.Linear(width, width)
        self.act2 = nn.PReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act2(x + self.fc2(self.act1(self.fc1(x))))


class ResMLP(Backbone):
    """Tabular backbone (docs/theory.md §10): input projection + PReLU, ``depth`` residual blocks of width
    ``width`` with PReLU, then ``Linear(width, P)`` with no activation.

    Parameters
    ----------
    in_features : int
        ``F``, the input dimension.
    width, depth, feature_dim : int
        Block width (1024 in the paper), number of residual blocks (3) and ``P`` (512).
    """

    def __init__(self, in_features: int, width: int = 1024, depth: int = 3, feature_dim: int = 512):
        super().__init__()
        self.feature_dim = feature_dim
        self.input_shape = (in_features,)
        self.stem = nn.Sequential(nn.Linear(in_features, width), nn.PReLU())
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(depth)])
        self.proj = nn.Linear(width, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.blocks(self.stem(x)))

    def rotate_features(self, q: np.ndarray | torch.Tensor) -> None:
        rotate_linear_output(self.proj, q)

    def map_features(self, m: torch.Tensor, delta: torch.Tensor) -> None:
        map_linear_output(self.proj, m, delta)

    def output_layer(self) -> nn.Linear:
        return self.proj


class ImageBackbone(Backbone):
    """A torchvision `ResNet` whose ``fc`` is the ``512 -> P`` projection
    after global average pooling (the features have no activation)."""

    is_image = True

    def __init__(self, net: nn.Module, input_shape: tuple[int, int, int], feature_dim: int):
        super().__init__()
        self.net = net
        self.input_shape = tuple(input_shape)
        self.feature_dim = feature_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def rotate_features(self, q: np.ndarray | torch.Tensor) -> None:
        rotate_linear_output(self.output_layer(), q)

    def map_features(self, m: torch.Tensor, delta: torch.Tensor) -> None:
        map_linear_output(self.output_layer(), m, delta)

    def output_layer(self) -> nn.Linear:
        fc = self.net.fc
        if not isinstance(fc, nn.Linear):
            raise ModelError(
                f"the image network's fc must be an nn.Linear (the features' layer), got {type(fc).__name__}"
            )
        return fc


def _kaiming_conv(conv: nn.Conv2d) -> nn.Conv2d:
    # the same initialisation torchvision's ResNet gives its convolutions
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    return conv


def _narrow(
    net: ResNet, in_channels: int, layers: list[int], width: int, feature_dim: int, stem: nn.Conv2d
) -> nn.Module:
    """Rebuild a torchvision ResNet's stem, stages and fc for base width ``width`` (stages of
    ``width, 2 width, 4 width, 8 width`` channels), initialised as torchvision initialises them."""
    # torchvision (slow to import): only the ResNet backbones need it
    from torchvision.models.resnet import BasicBlock

    net.inplanes = width
    net.conv1 = stem
    net.bn1 = net._norm_layer(width)
    net.layer1 = net._make_layer(BasicBlock, width, layers[0])
    net.layer2 = net._make_layer(BasicBlock, 2 * width, layers[1], stride=2)
    net.layer3 = net._make_layer(BasicBlock, 4 * width, layers[2], stride=2)
    net.layer4 = net._make_layer(BasicBlock, 8 * width, layers[3], stride=2)
    net.fc = nn.Linear(8 * width, feature_dim)
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            _kaiming_conv(m)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.constant_(m.weight, 1)
            nn.init.constant_(m.bias, 0)
    return net


def torchvision_resnet(depth: int, in_channels: int, feature_dim: int, width: int = 64) -> nn.Module:
    """torchvision ResNet-18/34 from scratch with ``in_channels`` inputs and a ``8 width -> P`` fc.

    ``width`` is the first stage's channel count (64: torchvision's network exactly; smaller
    widths keep the layout, e.g. for CPU smoke runs)."""
    # imported here: torchvision costs seconds at import, paid by every Ray worker and deployed
    # ClientApp process even when it only trains a ResMLP
    from torchvision.models.resnet import BasicBlock, ResNet

    layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3]}
    if depth not in layers:
        raise ModelError(f"resnet depth must be 18 or 34, got {depth}")
    net = ResNet(BasicBlock, layers[depth], num_classes=feature_dim)
    if width != 64:
        stem = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        return _narrow(net, in_channels, layers[depth], width, feature_dim, stem)
    if in_channels != 3:
        net.conv1 = _kaiming_conv(nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False))
    return net


def residual_cnn(in_channels: int, feature_dim: int, groups: int = 8, width: int = 64) -> nn.Module:
    """ResNet-18 layout with ``GroupNorm(groups)`` instead of BatchNorm, a 3x3 stride-1 stem and no
    max-pool (docs/theory.md §10 "residual CNN"); ``width`` channels in the first stage."""
    # torchvision (slow to import): only the ResNet backbones need it
    from torchvision.models.resnet import BasicBlock, ResNet

    net = ResNet(BasicBlock, [2, 2, 2, 2], num_classes=feature_dim, norm_layer=lambda c: nn.GroupNorm(groups, c))
    stem = nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
    if width != 64:
        net = _narrow(net, in_channels, [2, 2, 2, 2], width, feature_dim, stem)
    else:
        net.conv1 = _kaiming_conv(stem)
    # torchvision annotates the slot as MaxPool2d; any module may fill it
    net.maxpool = nn.Identity()  # pyright: ignore[reportAttributeAccessIssue]
    return net


class FreeFeatureBackbone(Backbone):
    """The unconstrained feature model as a network: one trainable ``P``-vector per training sample.

    Input: sample indices ``(B,)`` int64 in ``[0, n_samples)``; output ``table[idx]`` ``(B, P)``.
    Initialised ``N(0, init_scale^2 / P)`` so each feature has norm about ``init_scale``. The
    table's gradient is dense, so (Adam)W moves every row at every step, as for any network
    parameter; full-batch training is exactly the UFM of docs/theory.md §2.
    """

    expects_indices = True

    def __init__(self, n_samples: int, feature_dim: int = 512, init_scale: float = 1.0):
        super().__init__()
        self.feature_dim = feature_dim
        self.input_shape = None
        self.n_samples = n_samples
        self.table = nn.Parameter(torch.randn(n_samples, feature_dim) * (init_scale / math.sqrt(feature_dim)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table.index_select(0, idx)

    @torch.no_grad()
    def rotate_features(self, q: np.ndarray | torch.Tensor) -> None:
        qt = _as_rotation(q, self.feature_dim, "FreeFeatureBackbone.rotate_features")
        qt = qt.to(self.table.device)
        self.table.copy_((self.table.double() @ qt).to(self.table.dtype))

    @torch.no_grad()
    def map_features(self, m: torch.Tensor, delta: torch.Tensor) -> None:
        m = m.to(device=self.table.device, dtype=torch.float64)
        delta = delta.to(device=self.table.device, dtype=torch.float64)
        self.table.copy_(((self.table.double() + delta) @ m.T).to(self.table.dtype))


def build_head(feature_dim: int, n_targets: int, seed: int) -> nn.Linear:
    """The shared head ``Linear(P, C)`` with bias, initialised from ``seed`` (torch's default init).

    Its ``weight`` is ``W`` ``(C, P)`` and its ``bias`` is ``b`` ``(C,)`` (docs/theory.md notation).
    """
    if feature_dim < 1 or n_targets < 1:
        raise ModelError(f"head needs feature_dim >= 1 and n_targets >= 1, got {feature_dim}, {n_targets}")
    if n_targets > feature_dim:
        raise ModelError(f"head needs P >= C (docs/theory.md notation), got P={feature_dim} < C={n_targets}")
    with seeded(seed):
        return nn.Linear(feature_dim, n_targets)


def initial_head(feature_dim: int, n_targets: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The arrays ``(W_0 (C, P), b_0 (C,))`` float64 of [`build_head`][fedhead.models.build_head] ``(feature_dim,
    n_targets, seed)``:
    the common initial head a server broadcasts first."""
    head = build_head(feature_dim, n_targets, seed)
    return head.weight.detach().double().numpy().copy(), head.bias.detach().double().numpy().copy()
