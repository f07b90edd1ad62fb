"""Shared pieces of the UFM experiment suite (docs/theory.md §12): instance generators, helpers, results.

Random eigenbases and samples with exactly the prescribed moments, small numeric helpers (Grams,
relative errors, scaling slopes, quartiles) and the result record every experiment writes. The
model's own formulas come from `fedhead.ufm`, the solvers from `.solvers`. Conventions: targets
``(N, C)`` and free features ``H`` ``(N, P)`` (rows are samples), heads ``W`` ``(C, P)``, bias
``b`` ``(C,)``, float64.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from fedhead import ufm
from fedhead.analysis.metrics import relative_error
from fedhead.results.io import provenance, write_json_atomic

log = logging.getLogger(__name__)

__all__ = [
    "Headline",
    "ExperimentResult",
    "finish",
    "rotation",
    "random_orthogonal",
    "random_spd",
    "random_head",
    "matched_samples",
    "dirichlet_weights",
    "gram",
    "rel_err",
    "loglog_slope",
    "quartiles",
]


# ----------------------------------------------------------------------------- result record
@dataclass(frozen=True)
class Headline:
    """One headline number with the value the theory predicts (as text, for the table)."""

    name: str
    value: float
    expected: str


@dataclass
class ExperimentResult:
    """What one experiment returns: its numbers, headline, written files.

    Attributes
    ----------
    name : str
        Experiment name (the CLI name).
    out_dir : Path
        Folder holding ``results.json`` and the PNG figures.
    results : dict
        Every number a figure shows (JSON-serialisable after
        [`fedhead.results.io.to_jsonable`][fedhead.results.io.to_jsonable]).
    headline : list of Headline
        The headline numbers, also stored in ``results.json``.
    figures : list of Path
        The PNG files written.
    """

    name: str
    out_dir: Path
    results: dict[str, Any]
    headline: list[Headline]
    figures: list[Path] = field(default_factory=list)

    @property
    def headline_dict(self) -> dict[str, float]:
        """``{name: value}`` of the headline numbers."""
        return {h.name: h.value for h in self.headline}

    def table(self) -> str:
        """A plain-text table of the headline numbers (name, value, theory)."""
        w = max([len(h.name) for h in self.headline] + [8])
        lines = [f"[{self.name}]", f"  {'quantity':<{w}}  {'value':>12}  theory"]
        for h in self.headline:
            lines.append(f"  {h.name:<{w}}  {h.value:>12.4g}  {h.expected}")
        return "\n".join(lines)


def finish(
    name: str,
    out_dir: Path,
    settings: Any,
    seeds: Mapping[str, int | list[int]],
    results: dict[str, Any],
    headline: list[Headline],
    figures: list[Path],
) -> ExperimentResult:
    """Write ``results.json`` atomically (settings, headline, results, provenance) and return."""
    payload = {
        "experiment": name,
        "settings": (
            dataclasses.asdict(settings)
            if dataclasses.is_dataclass(settings) and not isinstance(settings, type)
            else settings
        ),
        "headline": {h.name: {"value": h.value, "theory": h.expected} for h in headline},
        "results": results,
        "figures": [p.name for p in figures],
        "provenance": provenance(seeds),
    }
    write_json_atomic(Path(out_dir) / "results.json", payload)
    return ExperimentResult(name=name, out_dir=Path(out_dir), results=results, headline=headline, figures=list(figures))


# ----------------------------------------------------------------------------- generators
def rotation(degrees: float) -> np.ndarray:
    """Planar rotation ``R(a)`` by ``a`` degrees, shape (2, 2)."""
    a = np.deg2rad(degrees)
    return np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])


def random_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """Haar-distributed orthogonal ``(n, n)`` matrix (QR of a Gaussian with sign fix)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def random_spd(c: int, low: float, high: float, rng: np.random.Generator) -> np.ndarray:
    """``Q diag(U[low, high]) Q^T`` with a Haar-random eigenbasis ``Q``, shape (c, c)."""
    q = random_orthogonal(c, rng)
    return ufm.sym((q * rng.uniform(low, high, size=c)) @ q.T)


def random_head(c: int, p: int, sv_low: float, sv_high: float, rng: np.random.Generator) -> np.ndarray:
    """Head ``U diag(s) V^T`` of shape (c, p), singular values ``s ~ U[sv_low, sv_high]``."""
    u = random_orthogonal(c, rng)
    v = random_orthogonal(p, rng)[:c]
    return (u * rng.uniform(sv_low, sv_high, size=c)) @ v


def matched_samples(mean: np.ndarray, cov: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` samples whose empirical mean and (1/n) covariance are exactly ``mean`` and ``cov``.

    A Gaussian draw is centred and whitened (``Z <- Z S^{-1/2}`` with ``S`` its empirical
    covariance), then mapped to ``mean + Z cov^{1/2}``.

    Parameters
    ----------
    mean : (C,), cov : (C, C) symmetric positive definite, n : int > C

    Returns
    -------
    ndarray, shape (n, C)
    """
    mean = np.asarray(mean, dtype=np.float64)
    c = mean.shape[0]
    if n <= c:
        raise ValueError(f"matched_samples: need n > C samples to match a covariance, got n={n}, C={c}")
    z = rng.standard_normal((n, c))
    z -= z.mean(axis=0)
    z = z @ ufm.psd_inv_sqrt(z.T @ z / n)
    z -= z.mean(axis=0)
    return mean + z @ ufm.psd_sqrt(cov)


def dirichlet_weights(m: int, concentration: float, rng: np.random.Generator) -> np.ndarray:
    """Aggregation weights ``p ~ Dirichlet(concentration)``, floored at 1e-3 and renormalised."""
    p = np.maximum(rng.dirichlet(np.full(m, float(concentration))), 1e-3)
    return p / p.sum()


def gram(W: np.ndarray) -> np.ndarray:
    """Head Gram ``W W^T`` (symmetrised), shape (..., C, C)."""
    return ufm.sym(W @ np.swapaxes(W, -1, -2))


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    """``e_F = ||a - ref||_F / ||ref||_F`` (docs/theory.md §11) for Grams or heads.

    Via [`fedhead.analysis.metrics.relative_error`][fedhead.analysis.metrics.relative_error].
    """
    return float(relative_error(a, ref))


def loglog_slope(x: ArrayLike, y: ArrayLike) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the scaling exponent)."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    return float(np.polyfit(lx, ly, 1)[0])


def quartiles(a: np.ndarray, axis: int = 0) -> dict[str, np.ndarray]:
    """``{"q25", "median", "q75"}`` along ``axis`` (for results.json next to IQR bands)."""
    q = np.nanpercentile(np.asarray(a, dtype=float), [25.0, 50.0, 75.0], axis=axis)
    return {"q25": q[0], "median": q[1], "q75": q[2]}
