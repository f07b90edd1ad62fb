"""Shared pieces of the UFM experiment suite (docs/theory.md §12).

Instance generators (random eigenbases, samples whose moments are exactly the prescribed ones),
the experiment-specific solvers (trust-exact on penalised profiled / joint objectives,
unregularised L-BFGS, Adam joint training of ``(W, b, H)``) and the result record every
experiment writes.  Every formula of the model itself (objectives, gradients, Hessians, Grams,
transport maps, barycenters) is called from :mod:`fedhead.ufm`.

Conventions: targets ``(N, C)`` (rows are samples), heads ``W`` ``(C, P)``, bias ``b`` ``(C,)``,
free features ``H`` ``(N, P)`` (rows are samples, as in :func:`fedhead.ufm.joint_objective`),
float64 throughout.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy import optimize

from fedhead import ufm
from fedhead.io import provenance, write_json_atomic
from fedhead.metrics import relative_error

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
    "SolveResult",
    "prox_profiled_solve",
    "lbfgs_profiled",
    "ridge_features",
    "JointState",
    "joint_prox_solve",
    "lbfgs_joint",
    "adam_joint",
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
        Every number a figure shows (JSON-serialisable after :func:`fedhead.io.to_jsonable`).
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
    seeds: dict[str, int],
    results: dict[str, Any],
    headline: list[Headline],
    figures: list[Path],
) -> ExperimentResult:
    """Write ``results.json`` atomically (settings, headline, results, provenance) and return."""
    payload = {
        "experiment": name,
        "settings": dataclasses.asdict(settings) if dataclasses.is_dataclass(settings) else settings,
        "headline": {h.name: {"value": h.value, "theory": h.expected} for h in headline},
        "results": results,
        "figures": [p.name for p in figures],
        "provenance": provenance(seeds),
    }
    write_json_atomic(Path(out_dir) / "results.json", payload)
    return ExperimentResult(name=name, out_dir=Path(out_dir), results=results, headline=headline,
                            figures=list(figures))


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
    """``e_F = ||a - ref||_F / ||ref||_F`` (docs/theory.md §11) for Grams or heads, via :func:`fedhead.metrics.relative_error`."""
    return float(relative_error(a, ref))


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (the scaling exponent)."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    return float(np.polyfit(lx, ly, 1)[0])


def quartiles(a: np.ndarray, axis: int = 0) -> dict[str, np.ndarray]:
    """``{"q25", "median", "q75"}`` along ``axis`` (for results.json next to IQR bands)."""
    q = np.nanpercentile(np.asarray(a, dtype=float), [25.0, 50.0, 75.0], axis=axis)
    return {"q25": q[0], "median": q[1], "q75": q[2]}


# ----------------------------------------------------------------------------- solvers
class SolveResult(NamedTuple):
    """Outcome of a local solve: the minimiser, iterations, final gradient norm, success flag."""

    x: np.ndarray
    n_iter: int
    grad_norm: float
    success: bool


class _Cached:
    """Cache ``fg(x) -> (value, grad)`` and ``h(x) -> hess`` per point for SciPy's callbacks.

    The Hessian is computed only when asked for (trial points of a line search need only the
    gradient).
    """

    def __init__(self, fg: Callable[[np.ndarray], tuple[float, np.ndarray]],
                 h: Callable[[np.ndarray], np.ndarray] | None = None):
        self.fg, self.h = fg, h
        self._x_fg: np.ndarray | None = None
        self._fg: tuple[float, np.ndarray] | None = None
        self._x_h: np.ndarray | None = None
        self._h: np.ndarray | None = None

    def fun_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if self._x_fg is None or not np.array_equal(x, self._x_fg):
            self._x_fg = np.array(x, copy=True)
            self._fg = self.fg(self._x_fg)
        return self._fg

    def hess(self, x: np.ndarray) -> np.ndarray:
        if self.h is None:
            raise ValueError("_Cached: no Hessian function given")
        if self._x_h is None or not np.array_equal(x, self._x_h):
            self._x_h = np.array(x, copy=True)
            self._h = self.h(self._x_h)
        return self._h


def _newton_polish(cached: _Cached, x: np.ndarray, gtol: float, max_steps: int = 40):
    """Newton steps ``x <- x - t H^{-1} g`` with ``t`` halved until the gradient norm decreases.

    Near-degenerate minimisers (the joint problem with ``P > C`` has Hessian eigenvalues of order
    ``rho lambda_H / N``) need the damping: there full Newton steps overshoot on higher-order
    terms.  Stops when no step size down to 1e-3 reduces the gradient.
    """
    g = cached.fun_grad(x)[1]
    gnorm = float(np.linalg.norm(g))
    steps = 0
    for _ in range(max_steps):
        if gnorm <= gtol:
            break
        try:
            dx = np.linalg.solve(cached.hess(x), g)
        except np.linalg.LinAlgError:
            break
        t, accepted = 1.0, False
        while t > 1e-3:
            g_new = cached.fun_grad(x - t * dx)[1]
            gn_new = float(np.linalg.norm(g_new))
            if gn_new < gnorm:
                accepted = True
                break
            t *= 0.5
        if not accepted:
            break
        x, g, gnorm = x - t * dx, g_new, gn_new
        steps += 1
    return x, gnorm, steps


def _trust_exact(fg, h, x0: np.ndarray, gtol: float, maxiter: int) -> SolveResult:
    """SciPy trust-exact, then Newton polishing; one restart if the gradient is still large.

    trust-exact stops once value differences fall below rounding; Newton steps on the gradient
    (which stays accurate) finish the quadratic convergence near the minimiser.
    """
    cached = _Cached(fg, h)
    x = np.asarray(x0, dtype=np.float64)
    nit, success, gnorm = 0, False, np.inf
    for _attempt in range(2):
        res = optimize.minimize(cached.fun_grad, x, jac=True, hess=cached.hess, method="trust-exact",
                                options={"gtol": gtol, "maxiter": maxiter})
        x, gnorm, steps = _newton_polish(cached, np.asarray(res.x), gtol)
        nit += int(res.nit) + steps
        success = bool(res.success) or gnorm <= 100 * gtol
        if gnorm <= 100 * gtol:
            break
    if gnorm > 1e3 * gtol:
        warnings.warn(f"trust-exact local solve stopped with gradient norm {gnorm:.2e} > {1e3 * gtol:.1e} "
                      f"({x.size} unknowns); the solution is less accurate than requested", stacklevel=3)
    return SolveResult(x, nit, gnorm, success)


def _lbfgs(fg, x0: np.ndarray, gtol: float, maxiter: int) -> SolveResult:
    cached = _Cached(fg)
    res = optimize.minimize(cached.fun_grad, x0, jac=True, method="L-BFGS-B",
                            options={"gtol": gtol, "ftol": 0.0, "maxiter": maxiter, "maxcor": 30,
                                     "maxfun": 4 * maxiter})
    gnorm = float(np.linalg.norm(cached.fun_grad(res.x)[1]))
    return SolveResult(np.asarray(res.x), int(res.nit), gnorm, bool(gnorm <= 1e3 * gtol))


def prox_profiled_solve(
    W0: np.ndarray,
    anchor: np.ndarray,
    T: np.ndarray,
    lambda_h: float,
    lambda_w: float,
    rho: float,
    *,
    gamma: float = 0.0,
    sigma_cen: np.ndarray | None = None,
    gtol: float = 1e-13,
    maxiter: int = 500,
) -> SolveResult:
    """Minimise ``F(W; T) + gamma C(W) + rho/2 ||W - anchor||_F^2`` with SciPy trust-exact.

    ``F`` (value, gradient, Hessian in row-major ``vec(W)``) is
    :func:`fedhead.ufm.profiled_objective` (docs/theory.md §4) and the correction ``C`` (docs/theory.md §2, §8) is
    :func:`fedhead.ufm.moment_correction`, both with analytic Hessians.  Trust-exact is followed
    by a few plain Newton steps, because near the minimiser the objective's value stops
    resolving progress (differences below rounding) long before its gradient does; along the
    rotation directions the curvature is only ``rho``, so this matters for small ``rho``.

    Parameters
    ----------
    W0 : (C, P) start; anchor : (C, P) broadcast head ``W_t``; T : (C, C) client covariance.
    lambda_h, lambda_w, rho : float (rho >= 0; rho = 0 is the unregularised problem).
    gamma : float in [0, 1]; sigma_cen : (C, C), required when gamma > 0.

    Returns
    -------
    SolveResult
        ``x`` is the minimiser reshaped to (C, P).
    """
    C, P = W0.shape
    target = np.asarray(T, dtype=np.float64)
    if gamma and sigma_cen is None:
        raise ValueError("prox_profiled_solve: gamma > 0 needs sigma_cen")

    def terms(x, hessian):
        W = x.reshape(C, P)
        out = [ufm.profiled_objective(W, target, lambda_h, lambda_w, rho=rho, w_ref=anchor, hessian=hessian)]
        if gamma:
            out.append(ufm.moment_correction(W, target, sigma_cen, lambda_h, gamma=gamma, hessian=hessian))
        return out

    def fg(x):
        t = terms(x, False)
        return sum(o.value for o in t), sum(o.grad for o in t).ravel()

    def h(x):
        return sum(o.hess for o in terms(x, True))

    r = _trust_exact(fg, h, W0.ravel().astype(np.float64), gtol, maxiter)
    return r._replace(x=r.x.reshape(C, P))


def lbfgs_profiled(
    W0: np.ndarray,
    T: np.ndarray,
    lambda_h: float,
    lambda_w: float,
    *,
    gtol: float = 1e-12,
    maxiter: int = 20_000,
) -> SolveResult:
    """Unregularised L-BFGS on the profiled objective ``F(W; T)`` started at ``W0``."""
    C, P = W0.shape
    target = np.asarray(T, dtype=np.float64)

    def fg(x):
        o = ufm.profiled_objective(x.reshape(C, P), target, lambda_h, lambda_w, hessian=False)
        return o.value, o.grad.ravel()

    r = _lbfgs(fg, W0.ravel().astype(np.float64), gtol, maxiter)
    return r._replace(x=r.x.reshape(C, P))


def ridge_features(W: np.ndarray, b: np.ndarray, Y: np.ndarray, lambda_h: float) -> np.ndarray:
    """Features minimising the UFM loss for fixed ``(W, b)``: ``H = (Y - 1 b^T) A^{-1} W``.

    Rows-as-samples form of docs/theory.md §4's ``H = W^T A^{-1} (Y - b 1^T)``, ``A = W W^T + lambda_H I``;
    ``Y`` is ``(N, C)``, the result ``(N, P)``.
    """
    C = W.shape[0]
    A = gram(W) + lambda_h * np.eye(C)
    return np.linalg.solve(A, (Y - b).T).T @ W


class JointState(NamedTuple):
    """A point of the joint UFM problem: head ``W`` (C, P), bias ``b`` (C,), features ``H`` (N, P)."""

    W: np.ndarray
    b: np.ndarray
    H: np.ndarray

    def pack(self) -> np.ndarray:
        """``[vec W, b, vec H]`` (row-major), :func:`fedhead.ufm.pack_joint`."""
        return ufm.pack_joint(self.W, self.b, self.H)

    @staticmethod
    def unpack(x: np.ndarray, C: int, P: int, N: int) -> JointState:
        """Inverse of :meth:`pack`."""
        return JointState(*ufm.unpack_joint(x, C, P, N))


def _joint_callables(state_shape, Y, lambda_h, lambda_w, anchor, rho):
    """``(fg, h)`` on packed ``(W, b, H)`` for the joint objective plus ``rho/2 ||W - anchor||^2``."""
    C, P, N = state_shape

    def fg(x):
        s = JointState.unpack(x, C, P, N)
        jv = ufm.joint_objective(s.W, s.b, s.H, Y, lambda_h, lambda_w, rho=rho, w_ref=anchor)
        return jv.value, jv.grad_flat()

    def h(x):
        s = JointState.unpack(x, C, P, N)
        return ufm.joint_hessian(s.W, s.b, s.H, Y, lambda_h, lambda_w, rho=rho, w_ref=anchor)

    return fg, h


def joint_prox_solve(
    start: JointState,
    Y: np.ndarray,
    anchor: np.ndarray,
    lambda_h: float,
    lambda_w: float,
    rho: float,
    *,
    gtol: float = 1e-13,
    maxiter: int = 500,
) -> tuple[JointState, SolveResult]:
    """Minimise ``L_m(W, b, H) + rho/2 ||W - anchor||^2`` over ``(W, b, H)`` with trust-exact.

    ``L_m`` with gradient and Hessian comes from :func:`fedhead.ufm.joint_objective` /
    :func:`fedhead.ufm.joint_hessian` (docs/theory.md §2).
    """
    C, P = start.W.shape
    N = Y.shape[0]
    fg, h = _joint_callables((C, P, N), Y, lambda_h, lambda_w, anchor, rho)
    r = _trust_exact(fg, h, start.pack(), gtol, maxiter)
    return JointState.unpack(r.x, C, P, N), r


def lbfgs_joint(
    start: JointState,
    Y: np.ndarray,
    lambda_h: float,
    lambda_w: float,
    *,
    gtol: float = 1e-11,
    maxiter: int = 50_000,
) -> tuple[JointState, SolveResult]:
    """Unregularised L-BFGS on the joint UFM objective ``L_m(W, b, H)`` from ``start``."""
    C, P = start.W.shape
    N = Y.shape[0]
    fg, _ = _joint_callables((C, P, N), Y, lambda_h, lambda_w, None, 0.0)
    r = _lbfgs(fg, start.pack(), gtol, maxiter)
    return JointState.unpack(r.x, C, P, N), r


def adam_joint(
    start: JointState,
    Y: np.ndarray,
    lambda_h: float,
    lambda_w: float,
    *,
    lr: float,
    steps: int,
    snapshots: Sequence[int] = (),
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> tuple[JointState, dict[int, JointState]]:
    """Full-batch Adam on the joint UFM objective ``L_m(W, b, H)`` (no proximal term).

    Gradients from :func:`fedhead.ufm.joint_objective`; the Adam update is the standard one
    (bias-corrected first and second moments) applied to ``W``, ``b`` and ``H`` alike.

    Parameters
    ----------
    start : JointState
    Y : (N, C) targets
    lambda_h, lambda_w : float
    lr : float, steps : int
    snapshots : step counts at which to record the state (0 = the start)

    Returns
    -------
    (final JointState, {step: JointState})
    """
    b1, b2 = betas
    params = [start.W.copy(), start.b.copy(), start.H.copy()]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    snaps: dict[int, JointState] = {}
    wanted = set(int(s) for s in snapshots)
    if 0 in wanted:
        snaps[0] = JointState(*(p.copy() for p in params))
    for t in range(1, steps + 1):
        jv = ufm.joint_objective(params[0], params[1], params[2], Y, lambda_h, lambda_w)
        grads = (jv.grad_w, jv.grad_b, jv.grad_h)
        c1, c2 = 1.0 - b1**t, 1.0 - b2**t
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1.0 - b1) * g
            v[i] = b2 * v[i] + (1.0 - b2) * g * g
            params[i] = params[i] - lr * (m[i] / c1) / (np.sqrt(v[i] / c2) + eps)
        if t in wanted:
            snaps[t] = JointState(*(p.copy() for p in params))
    return JointState(*params), snaps
