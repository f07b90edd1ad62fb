"""Users' own backbones for tests/models/test_user_model.py (``model=torch
model.module=user_backbones:NAME``; the tests put this folder on PYTHONPATH for the Ray workers)."""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    """Tabular: ``Linear -> tanh -> Linear(width, feature_dim)`` (the features)."""

    def __init__(self, in_features: int, feature_dim: int, width: int = 16):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, width), nn.Tanh())
        self.out = nn.Linear(width, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x))


class TinyConv(nn.Module):
    """Images: one convolution, global average pooling, ``Linear(width, feature_dim)``."""

    def __init__(self, in_channels: int, feature_dim: int, width: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1)
        self.head = nn.Linear(width, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class EndsWithActivation(nn.Module):
    """Its last layer is a ReLU: refused."""

    def __init__(self, in_features: int, feature_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, feature_dim), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class ActivationAfterLinear(nn.Module):
    """Last registered layer a Linear, but forward applies tanh after it: refused."""

    def __init__(self, in_features: int, feature_dim: int):
        super().__init__()
        self.out = nn.Linear(in_features, feature_dim)

    def forward(self, x):
        return torch.tanh(self.out(x))


class WrongShape(nn.Module):
    """Returns (N, 2P): refused."""

    def __init__(self, in_features: int, feature_dim: int):
        super().__init__()
        self.out = nn.Linear(in_features, feature_dim)

    def forward(self, x):
        return self.out(x).repeat(1, 2)


class NeedsWidth(nn.Module):
    """Its constructor requires ``width`` (no default)."""

    def __init__(self, in_features: int, feature_dim: int, width: int):
        super().__init__()
        self.body = nn.Linear(in_features, width)
        self.out = nn.Linear(width, feature_dim)

    def forward(self, x):
        return self.out(self.body(x))


NOT_A_MODULE = 3
