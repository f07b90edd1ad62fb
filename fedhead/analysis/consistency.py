"""What the theory says an honest reply looks like, measured (numpy only; docs/deployment.md, "Threat model").

* [`gram_errors`][fedhead.analysis.consistency.gram_errors]: a site at its local optimum returns a head
  whose Gram is the optimal Gram of the covariance it sent (``phi(Sigma_m)``, theory.md §2).
* [`outlier_scores`][fedhead.analysis.consistency.outlier_scores]: how far a site's covariance lies from
  the others' in BW distance, relative to how far the sites lie from each other.

Both only flag: a site far from its optimum or a genuinely different site is not a liar, and a
liar whose head and moments agree with each other passes.
"""

from __future__ import annotations

import numpy as np

from fedhead import ufm

__all__ = ["gram_errors", "outlier_scores"]


def gram_errors(heads: np.ndarray, grams: np.ndarray) -> np.ndarray:
    """Relative distance of each returned head's Gram to the optimal Gram of its site.

    Parameters
    ----------
    heads : ndarray, shape (M, C, P)
        Returned heads ``W~_m``.
    grams : ndarray, shape (M, C, C)
        The optimal Grams ``G_m`` the sites fit (``phi`` of the covariances they sent).

    Returns
    -------
    ndarray, shape (M,)
        ``||W~_m W~_m^T - G_m||_F / ||G_m||_F`` (the absolute distance where ``G_m = 0``).
    """
    w = np.asarray(heads, dtype=np.float64)
    g = np.asarray(grams, dtype=np.float64)
    trained = np.einsum("mcp,mdp->mcd", w, w)
    dist = np.linalg.norm(trained - g, axis=(1, 2))
    norm = np.linalg.norm(g, axis=(1, 2))
    return np.where(norm > 0, dist / np.where(norm > 0, norm, 1.0), dist)


def outlier_scores(covs: np.ndarray) -> np.ndarray | None:
    """How far each site's covariance lies from the others', relative to the federation's spread.

    Parameters
    ----------
    covs : ndarray, shape (M, C, C)
        The sites' covariances ``Sigma_m`` (symmetric PSD).

    Returns
    -------
    ndarray, shape (M,) or None
        ``r_m / median_k r_k`` where ``r_m`` is the lower median of ``d_BW(Sigma_m, Sigma_k)`` over
        the other sites ``k`` (the nearest one of three sites): robust to one liar, which is far from
        every honest site while the honest ones are near each other. None with fewer than three
        sites (two sites are each other's outlier). A zero median is replaced by ``1e-12`` times
        the sites' typical standard deviation.
    """
    s = np.asarray(covs, dtype=np.float64)
    m = s.shape[0]
    if m < 3:
        return None
    i, k = np.triu_indices(m, 1)
    pair = np.zeros((m, m))
    pair[i, k] = pair[k, i] = np.asarray(ufm.bw_distance(s[i], s[k]))
    others = np.sort(pair + np.diag(np.full(m, np.inf)), axis=1)[:, : m - 1]
    r = others[:, (m - 2) // 2]
    scale = max(float(np.median(r)), 1e-12 * float(np.sqrt(np.mean(np.trace(s, axis1=1, axis2=2)))), 1e-300)
    return r / scale
