"""The user's model and data: a small MLP backbone and a synthetic regression loader per site."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from clients import SITES  # the user's own package, not fedhead.clients

IN_FEATURES = 4
FEATURE_DIM = 8


class Net(nn.Module):
    """Features ``(N, P)`` from a final linear layer over the inputs and a tanh layer of them."""

    def __init__(self, in_features: int = IN_FEATURES, feature_dim: int = FEATURE_DIM, width: int = 32):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(in_features, width), nn.Tanh())
        self.out = nn.Linear(in_features + width, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([x, self.hidden(x)], dim=1))


def load_partition(partition_id: int, num_partitions: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Site ``partition_id``'s inputs ``(N_m, 4)`` and targets ``(N_m, 2)`` (float32).

    The targets are a linear function of the inputs, ``y = A_m B x + mu_m``: ``B x`` (one ``B``
    for every site) whitened per site, then given the site's orientation, scales and mean.
    """
    if num_partitions != len(SITES):
        raise ValueError(f"num-partitions={num_partitions}, but the app knows {len(SITES)} sites")
    site = SITES[partition_id]
    rng = np.random.default_rng(seed * 101 + partition_id)
    b = np.random.default_rng(seed).standard_normal((IN_FEATURES, 2))  # shared by the sites
    x = rng.standard_normal((site.n, IN_FEATURES))
    z = x @ b
    z = (z - z.mean(0)) @ np.linalg.inv(np.linalg.cholesky(np.cov(z.T, bias=True))).T  # whitened exactly
    a = np.deg2rad(site.angle)
    rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    y = z @ (rot @ np.diag(site.scales)).T + np.asarray(site.mean)
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
