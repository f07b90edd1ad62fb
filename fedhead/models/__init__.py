"""Backbones and the shared head (torch). See ``docs/architecture.md`` and docs/theory.md §10.

Every backbone outputs ``(B, P)`` features and has ``rotate_features(Q)`` (``h -> Q^T h``). The
free-feature backbone takes sample indices ``(B,)`` int64 as input.

The model configs are torch-free; the backbones (torch) are imported on first use
([`lazy_exports`][fedhead.analysis.lazy.lazy_exports]), so that a job's config is read without torch.
"""

from typing import TYPE_CHECKING

from fedhead.analysis.lazy import lazy_exports
from fedhead.models.config import (
    FreeFeatureConfig,
    ModelConfig,
    ResidualCNNConfig,
    ResMLPConfig,
    ResNetConfig,
    build_backbone,
)
from fedhead.models.errors import ModelError

if TYPE_CHECKING:
    from fedhead.models.backbones import (
        Backbone,
        FreeFeatureBackbone,
        ImageBackbone,
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

_USER = ("UserBackbone", "UserModelError", "as_backbone")
# every other export not imported above is a backbone's
__getattr__ = lazy_exports(
    __name__,
    {
        "fedhead.models.user": _USER,
        "fedhead.models.backbones": tuple(n for n in __all__ if n not in globals() and n not in _USER),
    },
)
