"""A user's own backbone for ``model=torch model.module=my_nets:TinyNet``: any ``torch.nn.Module``
whose ``forward`` returns features ``(N, P)`` from a final ``nn.Linear`` with a bias."""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    """``Linear -> tanh -> Linear -> tanh -> Linear(width, feature_dim)``."""

    def __init__(self, in_features: int, feature_dim: int, width: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.out = nn.Linear(width, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x))
