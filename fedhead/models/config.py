"""Typed model configuration: every file of ``conf/model/`` names one of these as ``_target_``;
frozen, each class checked by its constraint table (``RULES``, the base class's rows first).

[`build_backbone`][fedhead.models.build_backbone] turns a config, the data set's input shape, the client's sample count
and a seed into a [`Backbone`][fedhead.models.Backbone]; the same seed gives the same weights on every client
(docs/theory.md §10: all clients start from one common random backbone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedhead.analysis.constraints import Field, Together, check, integer, number
from fedhead.models.errors import ModelError

if TYPE_CHECKING:  # the backbones (torch) are imported where one is built: a job's config is read without torch
    from fedhead.models.backbones import Backbone


@dataclass(frozen=True)
class ModelConfig:
    """Options shared by every backbone.

    Attributes
    ----------
    name : str
        Label used in logs and result files.
    feature_dim : int
        ``P``, the feature dimension (512 in docs/theory.md §10).
    """

    name: str = ""
    feature_dim: int = 512

    #: the class's rules (``model <name>: <field> must be ...``), checked when it is built
    RULES = (Field("feature_dim", integer(1), "must be >= 1"),)

    def __post_init__(self) -> None:
        check(self, type(self).RULES, prefix=f"model {self.name!r}: ", error=ModelError)

    def build(self, input_shape: tuple[int, ...], n_samples: int) -> Backbone:
        """Build the backbone with the current RNG (use [`build_backbone`][fedhead.models.build_backbone] for a seeded
        one)."""
        raise NotImplementedError(f"{type(self).__name__} is a base class; use a concrete model config")


def _tabular_features(cfg: ModelConfig, input_shape: tuple[int, ...]) -> int:
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ModelError(f"model {cfg.name!r} needs tabular inputs (F,), got input shape {tuple(input_shape)}")
    return int(input_shape[0])


def _image_shape(cfg: ModelConfig, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(channels, height, width)``; a clear error for any other input shape."""
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ModelError(
            f"model {cfg.name!r} needs image inputs (channels, height, width), got input shape {tuple(input_shape)}"
        )
    channels, height, width = (int(n) for n in input_shape)
    return channels, height, width


@dataclass(frozen=True)
class ResMLPConfig(ModelConfig):
    """ResMLP (docs/theory.md §10 tabular model): ``depth`` residual blocks of ``width`` with PReLU."""

    name: str = "resmlp"
    width: int = 1024
    depth: int = 3

    RULES = (
        *ModelConfig.RULES,
        Field("width", integer(1), "must be >= 1"),
        Field("depth", integer(0), "must be >= 0"),
    )

    def build(self, input_shape: tuple[int, ...], n_samples: int) -> Backbone:
        from fedhead.models.backbones import ResMLP

        return ResMLP(_tabular_features(self, input_shape), self.width, self.depth, self.feature_dim)


@dataclass(frozen=True)
class ResNetConfig(ModelConfig):
    """torchvision ResNet-18/34 from scratch, ``fc`` replaced by a ``512 -> P`` projection."""

    name: str = "resnet18"
    depth: int = 18
    width: int = 64  # first-stage channels (64: torchvision's ResNet; smaller for CPU smoke runs)

    RULES = (
        *ModelConfig.RULES,
        Field("depth", lambda v: v in (18, 34), "must be 18 or 34"),
        Field("width", integer(1), "must be >= 1"),
    )

    def build(self, input_shape: tuple[int, ...], n_samples: int) -> Backbone:
        image_shape = _image_shape(self, input_shape)
        from fedhead.models.backbones import ImageBackbone, torchvision_resnet

        net = torchvision_resnet(self.depth, image_shape[0], self.feature_dim, self.width)
        return ImageBackbone(net, image_shape, self.feature_dim)


@dataclass(frozen=True)
class ResidualCNNConfig(ModelConfig):
    """ResNet-18 layout, ``GroupNorm(groups)``, 3x3 stride-1 stem, no max-pool."""

    name: str = "rescnn"
    groups: int = 8
    width: int = 64  # first-stage channels (the paper's 64; smaller for CPU smoke runs)

    RULES = (
        *ModelConfig.RULES,
        Together(
            lambda c: integer(1)(c.width) and integer(1)(c.groups) and c.width % c.groups == 0,
            "model {name!r}: groups must divide width (GroupNorm over the first stage's channels), "
            "got groups={groups}, width={width}",
        ),
    )

    def build(self, input_shape: tuple[int, ...], n_samples: int) -> Backbone:
        image_shape = _image_shape(self, input_shape)
        from fedhead.models.backbones import ImageBackbone, residual_cnn

        net = residual_cnn(image_shape[0], self.feature_dim, self.groups, self.width)
        return ImageBackbone(net, image_shape, self.feature_dim)


@dataclass(frozen=True)
class FreeFeatureConfig(ModelConfig):
    """Free features (the UFM as a network): one trainable ``P``-vector per training sample."""

    name: str = "free"
    init_scale: float = 1.0

    RULES = (*ModelConfig.RULES, Field("init_scale", number(0, low_open=True), "must be > 0"))

    def build(self, input_shape: tuple[int, ...], n_samples: int) -> Backbone:
        if n_samples < 1:
            raise ModelError(f"model {self.name!r} needs n_samples >= 1 (one feature per sample), got {n_samples}")
        from fedhead.models.backbones import FreeFeatureBackbone

        return FreeFeatureBackbone(int(n_samples), self.feature_dim, self.init_scale)


def build_backbone(cfg: ModelConfig, input_shape: tuple[int, ...], n_samples: int, seed: int) -> Backbone:
    """Build the backbone described by ``cfg`` on the CPU from ``seed``.

    Parameters
    ----------
    cfg : ModelConfig
        A concrete config ([`ResMLPConfig`][fedhead.models.ResMLPConfig], [`ResNetConfig`][fedhead.models.ResNetConfig],
        [`ResidualCNNConfig`][fedhead.models.ResidualCNNConfig],
        [`FreeFeatureConfig`][fedhead.models.FreeFeatureConfig]).
    input_shape : tuple of int
        One sample's shape: ``(F,)`` tabular, ``(ch, H, W)`` images (ignored by free features).
    n_samples : int
        The client's training-sample count (used by free features only).
    seed : int
        Same seed, same initial weights (the global RNG is left untouched).
    """
    if not isinstance(cfg, ModelConfig):
        raise ModelError(f"build_backbone needs a ModelConfig, got {type(cfg).__name__}")
    from fedhead.models.backbones import seeded

    with seeded(seed):
        return cfg.build(tuple(int(s) for s in input_shape), int(n_samples))
