"""Random-instance builders shared by the math-core tests (float64, seeded)."""

from __future__ import annotations

import numpy as np
import pytest


def random_orthogonal(rng: np.random.Generator, C: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.normal(size=(C, C)))
    return Q * np.sign(np.diag(R))


def random_spd(rng: np.random.Generator, C: int, lo: float = 0.5, hi: float = 3.0, *, basis=None) -> np.ndarray:
    Q = random_orthogonal(rng, C) if basis is None else basis
    return (Q * rng.uniform(lo, hi, C)) @ Q.T


def targets_with_moments(rng: np.random.Generator, N: int, mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """(N, C) samples whose population mean and covariance are exactly mu and sigma."""
    C = mu.shape[0]
    Z = rng.normal(size=(N, C))
    Z -= Z.mean(axis=0)
    w, V = np.linalg.eigh(Z.T @ Z / N)
    Z = Z @ (V / np.sqrt(w)) @ V.T
    w, V = np.linalg.eigh(sigma)
    return Z @ (V * np.sqrt(w)) @ V.T + mu


class Instance:
    """Random fully active federated instance."""

    def __init__(self, seed: int, C: int = 3, M: int = 4, lam: float = 0.1, lo: float = 0.4, hi: float = 3.0):
        from fedhead.ufm import TargetMoments

        rng = np.random.default_rng(seed)
        self.rng = rng
        self.C, self.M, self.lh, self.lw = C, M, lam, lam
        self.covs = np.stack([random_spd(rng, C, lo, hi) for _ in range(M)])
        self.means = rng.normal(size=(M, C))
        self.weights = rng.dirichlet(2.0 * np.ones(M))
        self.moments = TargetMoments(weights=self.weights, means=self.means, covs=self.covs)


@pytest.fixture
def instance():
    """Factory: ``instance(seed, C=3, M=4, lam=0.1)``."""
    return Instance


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def helpers():
    class H:
        orthogonal = staticmethod(random_orthogonal)
        spd = staticmethod(random_spd)
        targets = staticmethod(targets_with_moments)

    return H
