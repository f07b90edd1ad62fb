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
    backbone_expects_indices,
    backbone_is_image,
    backbone_output_layer,
    build_head,
    feature_table,
    initial_head,
    require_backbone,
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
from fedhead.models.user import UserBackbone, UserModelError, as_backbone

__all__ = [
    "Backbone",
    "UserBackbone",
    "UserModelError",
    "as_backbone",
    "backbone_expects_indices",
    "backbone_is_image",
    "backbone_output_layer",
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
    "feature_table",
    "initial_head",
    "require_backbone",
    "residual_cnn",
    "rotate_linear_output",
    "seeded",
    "torchvision_resnet",
]
