"""Target moments of the clients (docs/theory.md §3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validate import UFMInputError, as_float_array, as_spd, as_weights
from .psd import sym


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class TargetMoments:
    """First and second target moments of ``M`` clients (docs/theory.md §3).

    Attributes
    ----------
    weights : ndarray, shape (M,)
        Aggregation weights ``p_m > 0`` summing to one (default ``N_m / N``).
    means : ndarray, shape (M, C)
        Client target means ``mu_m = Y_m 1 / N_m``.
    covs : ndarray, shape (M, C, C)
        Client population covariances ``Sigma_m = Y_m Y_m^T / N_m - mu_m mu_m^T``.
    counts : ndarray, shape (M,), or None
        Sample counts ``N_m`` when known.

    Arrays are validated (finite, symmetric PSD covariances, weights positive and summing to
    one) and stored read-only.
    """

    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    counts: np.ndarray | None = None

    def __post_init__(self) -> None:
        means = as_float_array("means", self.means, ndim=2)
        M, C = means.shape
        if M < 1 or C < 1:
            raise UFMInputError(f"means: need at least one client and one target, shape {means.shape}")
        covs = as_float_array("covs", self.covs, ndim=3)
        if covs.shape != (M, C, C):
            raise UFMInputError(f"covs: expected shape {(M, C, C)} to match means {means.shape}, got {covs.shape}")
        covs = as_spd("covs", covs, batch=True, label="client", strict=False)
        weights = as_weights("weights", self.weights, M)
        counts = None
        if self.counts is not None:
            counts = as_float_array("counts", self.counts, ndim=1)
            if counts.shape[0] != M:
                raise UFMInputError(f"counts: expected {M} counts (one per client), got {counts.shape[0]}")
            bad = (counts < 1) | (counts != np.round(counts))
            if np.any(bad):
                i = int(np.argwhere(bad)[0, 0])
                raise UFMInputError(f"counts: client {i} has count {float(counts[i])!r}; counts must be integers >= 1")
        object.__setattr__(self, "means", _readonly(means))
        object.__setattr__(self, "covs", _readonly(covs))
        object.__setattr__(self, "weights", _readonly(weights))
        object.__setattr__(self, "counts", None if counts is None else _readonly(counts))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_targets(cls, targets, weights=None) -> TargetMoments:
        """Moments from per-client target arrays.

        Parameters
        ----------
        targets : sequence of array_like, each shape (N_m, C)
            Rows are samples (docs/theory.md's ``Y_m`` is ``targets[m].T``).
        weights : array_like, shape (M,), optional
            Aggregation weights; default ``N_m / N``.

        Returns
        -------
        TargetMoments
            Population moments ``mu_m = Y_m 1 / N_m``, ``Sigma_m = Y_m Y_m^T / N_m - mu_m mu_m^T``.
        """
        if isinstance(targets, np.ndarray) and targets.ndim == 2:
            raise UFMInputError("targets: expected a sequence of (N_m, C) arrays, one per client, got one array")
        ys = [as_float_array(f"targets[{m}]", y, ndim=2) for m, y in enumerate(targets)]
        if not ys:
            raise UFMInputError("targets: no clients given")
        C = ys[0].shape[1]
        for m, y in enumerate(ys):
            if y.shape[1] != C:
                raise UFMInputError(f"targets[{m}]: has {y.shape[1]} target columns, client 0 has {C}")
            if y.shape[0] < 1:
                raise UFMInputError(f"targets[{m}]: client {m} has no samples")
        counts = np.array([y.shape[0] for y in ys], dtype=np.float64)
        means = np.stack([y.mean(axis=0) for y in ys])
        covs = np.stack([sym((y - mu).T @ (y - mu) / y.shape[0]) for y, mu in zip(ys, means)])
        if weights is None:
            weights = counts / counts.sum()
        return cls(weights=weights, means=means, covs=covs, counts=counts)

    @classmethod
    def from_stats(cls, counts, means, covs, weights=None) -> TargetMoments:
        """Moments from uploaded statistics ``(N_m, mu_m, Sigma_m)`` (docs/theory.md §3, server side).

        Parameters
        ----------
        counts : array_like, shape (M,)
            Sample counts ``N_m`` (integers >= 1).
        means : array_like, shape (M, C)
            Client means ``mu_m``.
        covs : array_like, shape (M, C, C)
            Client population covariances ``Sigma_m`` (symmetric PSD).
        weights : array_like, shape (M,), optional
            Aggregation weights; default ``N_m / N``.

        Returns
        -------
        TargetMoments
        """
        counts_a = as_float_array("counts", counts, ndim=1)
        if weights is None:
            if np.any(counts_a <= 0):
                i = int(np.argwhere(counts_a <= 0)[0, 0])
                raise UFMInputError(f"counts: client {i} has count {float(counts_a[i])!r}; counts must be >= 1")
            weights = counts_a / counts_a.sum()
        return cls(weights=weights, means=means, covs=covs, counts=counts_a)

    # ------------------------------------------------------------------ derived moments
    @property
    def n_clients(self) -> int:
        """Number of clients ``M``."""
        return int(self.means.shape[0])

    @property
    def dim(self) -> int:
        """Number of targets ``C``."""
        return int(self.means.shape[1])

    @property
    def mean_global(self) -> np.ndarray:
        """``mu_g = sum_m p_m mu_m``, shape (C,)."""
        return self.weights @ self.means

    @property
    def sigma_within(self) -> np.ndarray:
        """``Sigma_within = sum_m p_m Sigma_m``, shape (C, C)."""
        return sym(np.einsum("m,mij->ij", self.weights, self.covs))

    @property
    def sigma_mu(self) -> np.ndarray:
        """``Sigma_mu = sum_m p_m (mu_m - mu_g)(mu_m - mu_g)^T``, shape (C, C)."""
        d = self.means - self.mean_global
        return sym(np.einsum("m,mi,mj->ij", self.weights, d, d))

    @property
    def sigma_cen(self) -> np.ndarray:
        """Centralised covariance by the server-side formula of docs/theory.md §3, shape (C, C).

        ``Sigma_cen = sum_m p_m (Sigma_m + mu_m mu_m^T) - mu_g mu_g^T`` (with ``p_m = N_m / N``
        this is ``(1/N) sum N_m (...)``); equals ``sigma_within + sigma_mu``.
        """
        mg = self.mean_global
        second = np.einsum("m,mij->ij", self.weights, self.covs + np.einsum("mi,mj->mij", self.means, self.means))
        return sym(second - np.outer(mg, mg))
