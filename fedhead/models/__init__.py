"""Backbones and the shared head (torch). See ``docs/architecture.md`` and docs/theory.md §10.

Every backbone outputs ``(B, P)`` features and has ``rotate_features(Q)`` (``h -> Q^T h``). The
free-feature backbone takes sample indices ``(B,)`` int64 as input.
"""

from fedhead.models.backbones import (
    Backbone,
    FreeFeatureBackbone,
    ImageBackbone,
    ModelError,
    ResidualBlock,
    ResMLP,
    build_head,
    residual_cnn,
    rotate_linear_output,
    seeded,
    torchvision_resnet,
)
from fedhead.models.config import (
    FreeFeatureConfig,
    ModelConfig,
    ResidualCNNConfig,
    ResMLPConfig,
    ResNetConfig,
    build_backbone,
)

__all__ = [
    "Backbone",
    "FreeFeatureBackbone",
    "FreeFeatureConfig",
    "ImageBackbone",
    "ModelConfig",
    "ModelError",
    "ResMLP",
    "ResMLPConfig",
    "ResNetConfig",
    "ResidualBlock",
    "ResidualCNNConfig",
    "build_backbone",
    "build_head",
    "residual_cnn",
    "rotate_linear_output",
    "seeded",
    "torchvision_resnet",
]
