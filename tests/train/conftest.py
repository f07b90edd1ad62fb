"""Shared fixtures of the training tests: small targets with exactly prescribed moments."""

import numpy as np
import pytest
import torch
from train_helpers import MU_M, SIGMA_M, N


def exact_targets(n: int, mean: np.ndarray, cov: np.ndarray, seed: int) -> np.ndarray:
    """``(n, C)`` targets whose sample mean and (1/n) covariance are exactly ``mean`` and ``cov``."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, len(mean)))
    z -= z.mean(axis=0)
    z = z @ np.linalg.inv(np.linalg.cholesky(z.T @ z / n)).T
    return z @ np.linalg.cholesky(cov).T + mean


@pytest.fixture
def make_targets():
    return exact_targets


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every training test runs with one torch thread (``tests/conftest.py``)."""


@pytest.fixture
def y_m(make_targets):
    return torch.tensor(make_targets(N, MU_M, SIGMA_M, seed=0), dtype=torch.float32)
