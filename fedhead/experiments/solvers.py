"""Local solvers of the UFM experiment suite (docs/theory.md §12).

Trust-exact (with Newton polishing) on the penalised profiled and joint objectives, unregularised
L-BFGS on both, full-batch Adam joint training of ``(W, b, H)`` and the ridge features of a fixed
head; objectives, gradients and Hessians come from `fedhead.ufm`. Conventions as in `.common`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import optimize

from fedhead import ufm

from .common import gram

__all__ = [
    "SolveResult",
    "prox_profiled_solve",
    "lbfgs_profiled",
    "ridge_features",
    "JointState",
    "joint_prox_solve",
    "lbfgs_joint",
    "adam_joint",
]


class SolveResult(NamedTuple):
    """Outcome of a local solve: the minimiser, iterations, final gradient norm, success flag."""

    x: np.ndarray
    n_iter: int
    grad_norm: float
    success: bool


class _Cached:
    """Cache ``value_and_grad(x) -> (value, grad)`` and ``hessian(x) -> hess`` per point for SciPy's callbacks.

    The Hessian is computed only when asked for (trial points of a line search need only the
    gradient).
    """

    def __init__(
        self,
        value_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
        hessian: Callable[[np.ndarray], np.ndarray] | None = None,
    ):
        self.value_and_grad, self.hessian = value_and_grad, hessian
        self._x_fg: np.ndarray | None = None
        self._fg: tuple[float, np.ndarray] | None = None
        self._x_h: np.ndarray | None = None
        self._h: np.ndarray | None = None

    def fun_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """``(value, grad)`` at ``x``, recomputed only when ``x`` changes."""
        if self._x_fg is None or not np.array_equal(x, self._x_fg):
            self._x_fg = np.array(x, copy=True)
            self._fg = self.value_and_grad(self._x_fg)
        assert self._fg is not None  # set together with _x_fg
        return self._fg

    def hess(self, x: np.ndarray) -> np.ndarray:
        """Hessian at ``x``, recomputed only when ``x`` changes."""
        if self.hessian is None:
            raise ValueError("_Cached: no Hessian function given")
        if self._x_h is None or not np.array_equal(x, self._x_h):
            self._x_h = np.array(x, copy=True)
            self._h = self.hessian(self._x_h)
        assert self._h is not None  # set together with _x_h
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


def _trust_exact(value_and_grad, hessian, x0: np.ndarray, gtol: float, maxiter: int) -> SolveResult:
    """SciPy trust-exact, then Newton polishing; one restart if the gradient is still large.

    trust-exact stops once value differences fall below rounding; Newton steps on the gradient
    (which stays accurate) finish the quadratic convergence near the minimiser.
    """
    cached = _Cached(value_and_grad, hessian)
    x = np.asarray(x0, dtype=np.float64)
    nit, success, gnorm = 0, False, np.inf
    for _attempt in range(2):
        res = optimize.minimize(
            cached.fun_grad,
            x,
            jac=True,
            hess=cached.hess,
            method="trust-exact",
            options={"gtol": gtol, "maxiter": maxiter},
        )
        x, gnorm, steps = _newton_polish(cached, np.asarray(res.x), gtol)
        nit += int(res.nit) + steps
        success = bool(res.success) or gnorm <= 100 * gtol
        if gnorm <= 100 * gtol:
            break
    if gnorm > 1e3 * gtol:
        warnings.warn(
            f"trust-exact local solve stopped with gradient norm {gnorm:.2e} > {1e3 * gtol:.1e} "
            f"({x.size} unknowns); the solution is less accurate than requested",
            stacklevel=3,
        )
    return SolveResult(x, nit, gnorm, success)


def _lbfgs(value_and_grad, x0: np.ndarray, gtol: float, maxiter: int) -> SolveResult:
    """SciPy L-BFGS-B (no bounds, ``ftol = 0``); success when the final gradient norm is <= 1e3 gtol."""
    cached = _Cached(value_and_grad)
    res = optimize.minimize(
        cached.fun_grad,
        x0,
        jac=True,
        method="L-BFGS-B",
        options={"gtol": gtol, "ftol": 0.0, "maxiter": maxiter, "maxcor": 30, "maxfun": 4 * maxiter},
    )
    gnorm = float(np.linalg.norm(cached.fun_grad(res.x)[1]))
    return SolveResult(np.asarray(res.x), int(res.nit), gnorm, bool(gnorm <= 1e3 * gtol))


def _given_hessian(o: ufm.ObjectiveValue) -> np.ndarray:
    """``o.hess`` of a term computed with ``hessian=True``."""
    if o.hess is None:
        raise ValueError("objective term computed without its Hessian (hessian=False)")
    return o.hess


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
    [`fedhead.ufm.profiled_objective`][fedhead.ufm.profiled_objective] (docs/theory.md §4) and the
    correction ``C`` (docs/theory.md §2, §8) is
    [`fedhead.ufm.moment_correction`][fedhead.ufm.moment_correction], both with analytic Hessians.
    Trust-exact is followed by a few plain Newton steps, because near the minimiser the objective's value
    stops resolving progress (differences below rounding) long before its gradient does; along the
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

    def terms(x: np.ndarray, with_hessian: bool) -> list[ufm.ObjectiveValue]:
        W = x.reshape(C, P)
        out = [ufm.profiled_objective(W, target, lambda_h, lambda_w, rho=rho, w_ref=anchor, hessian=with_hessian)]
        if gamma:
            out.append(ufm.moment_correction(W, target, sigma_cen, lambda_h, gamma=gamma, hessian=with_hessian))
        return out

    # sums of one or two terms: asarray only tells the checker that sum's start (0) never stays
    def value_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
        t = terms(x, False)
        return sum(o.value for o in t), np.asarray(sum(o.grad for o in t)).ravel()

    def hessian(x: np.ndarray) -> np.ndarray:
        return np.asarray(sum(_given_hessian(o) for o in terms(x, True)))

    r = _trust_exact(value_and_grad, hessian, W0.ravel().astype(np.float64), gtol, maxiter)
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

    def value_and_grad(x):
        o = ufm.profiled_objective(x.reshape(C, P), target, lambda_h, lambda_w, hessian=False)
        return o.value, o.grad.ravel()

    r = _lbfgs(value_and_grad, W0.ravel().astype(np.float64), gtol, maxiter)
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
        """``[vec W, b, vec H]`` (row-major), [`fedhead.ufm.pack_joint`][fedhead.ufm.pack_joint]."""
        return ufm.pack_joint(self.W, self.b, self.H)

    @staticmethod
    def unpack(x: np.ndarray, C: int, P: int, N: int) -> JointState:
        """Inverse of [`pack`][fedhead.experiments.solvers.JointState.pack]."""
        return JointState(*ufm.unpack_joint(x, C, P, N))


def _joint_callables(state_shape, Y, lambda_h, lambda_w, anchor, rho):
    """``(value_and_grad, hessian)`` on packed ``(W, b, H)`` for the joint objective plus ``rho/2 ||W - anchor||^2``."""
    C, P, N = state_shape

    def value_and_grad(x):
        s = JointState.unpack(x, C, P, N)
        jv = ufm.joint_objective(s.W, s.b, s.H, Y, lambda_h, lambda_w, rho=rho, w_ref=anchor)
        return jv.value, jv.grad_flat()

    def hessian(x):
        s = JointState.unpack(x, C, P, N)
        return ufm.joint_hessian(s.W, s.b, s.H, Y, lambda_h, lambda_w, rho=rho, w_ref=anchor)

    return value_and_grad, hessian


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

    ``L_m`` with gradient and Hessian comes from [`fedhead.ufm.joint_objective`][fedhead.ufm.joint_objective] /
    [`fedhead.ufm.joint_hessian`][fedhead.ufm.joint_hessian] (docs/theory.md §2).
    """
    C, P = start.W.shape
    N = Y.shape[0]
    value_and_grad, hessian = _joint_callables((C, P, N), Y, lambda_h, lambda_w, anchor, rho)
    r = _trust_exact(value_and_grad, hessian, start.pack(), gtol, maxiter)
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
    value_and_grad, _ = _joint_callables((C, P, N), Y, lambda_h, lambda_w, None, 0.0)
    r = _lbfgs(value_and_grad, start.pack(), gtol, maxiter)
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

    Gradients from [`fedhead.ufm.joint_objective`][fedhead.ufm.joint_objective]; the Adam update is the standard one
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
