"""Head objectives with exact derivatives: profiled F, proximal term, moment correction C_m (docs/theory.md §2, §4, §8).

Hessians are dense row-major ``vec`` matrices for ``scipy.optimize.minimize(method="trust-exact")``
([`scipy_callables`][fedhead.ufm.scipy_callables]); [`local_head`][fedhead.ufm.local_head]
minimises them from a given head. The joint loss over head and features is in ``fedhead.ufm.joint``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ._validate import (
    UFMInputError,
    as_float_array,
    as_positive_scalar,
    as_spd,
)


class ObjectiveValue(NamedTuple):
    """Value and exact derivatives of a head objective.

    Attributes
    ----------
    value : float
    grad : ndarray, shape (C, P)
    hess : ndarray, shape (C*P, C*P), or None
        Hessian in row-major ``vec(W)``; None when ``hessian=False`` was requested.
    """

    value: float
    grad: np.ndarray
    hess: np.ndarray | None


def _trace_inv_term(W: np.ndarray, T: np.ndarray, lh: float, hessian: bool) -> ObjectiveValue:
    """``f(W) = lh/2 Tr(T A^{-1})``, ``A = W W^T + lh I``: value, gradient ``-lh K W``, Hessian.

    ``K = A^{-1} T A^{-1}``. ``T`` need only be symmetric (used with indefinite ``T`` for C_m).
    """
    C, P = W.shape
    A = W @ W.T + lh * np.eye(C)
    Ainv = np.linalg.inv(A)
    Ainv = 0.5 * (Ainv + Ainv.T)
    K = Ainv @ T @ Ainv
    K = 0.5 * (K + K.T)
    value = 0.5 * lh * float(np.sum(T * Ainv))
    KW = K @ W
    grad = -lh * KW
    if not hessian:
        return ObjectiveValue(value, grad, None)
    AW = Ainv @ W
    WKW = W.T @ KW
    WAW = W.T @ AW
    IP = np.eye(P)
    Hs = -np.einsum("ib,ja->ijba", K, IP)
    Hs += np.einsum("ib,aj->ijba", Ainv, WKW)
    Hs += np.einsum("ia,bj->ijba", AW, KW)
    Hs += np.einsum("ib,aj->ijba", K, WAW)
    Hs += np.einsum("ia,bj->ijba", KW, AW)
    hess = lh * Hs.reshape(C * P, C * P)
    return ObjectiveValue(value, grad, 0.5 * (hess + hess.T))


def _check_prox(W: np.ndarray, rho, w_ref) -> tuple[float, np.ndarray | None]:
    rho = as_positive_scalar("rho", rho, allow_zero=True)
    if w_ref is None:
        if rho > 0:
            raise UFMInputError("w_ref: a reference head is required when rho > 0")
        return rho, None
    ref = as_float_array("w_ref", w_ref, ndim=2)
    if ref.shape != W.shape:
        raise UFMInputError(f"w_ref: shape {ref.shape} does not match W {W.shape}")
    return rho, ref


def _add_prox(val: ObjectiveValue, W: np.ndarray, rho: float, ref: np.ndarray | None) -> ObjectiveValue:
    if ref is None or rho == 0:
        return val
    D = W - ref
    hess = None if val.hess is None else val.hess + rho * np.eye(W.size)
    return ObjectiveValue(val.value + 0.5 * rho * float(np.sum(D * D)), val.grad + rho * D, hess)


def proximal_term(W, w_ref, rho: float, *, hessian: bool = True) -> ObjectiveValue:
    """Proximal term ``rho/2 ||W - W_ref||_F^2`` (docs/theory.md §2).

    Value, gradient ``rho (W - W_ref)``, Hessian ``rho I``.

    Parameters
    ----------
    W, w_ref : array_like, shape (C, P)
    rho : float, >= 0
    """
    W = as_float_array("W", W, ndim=2)
    rho, ref = _check_prox(W, rho, w_ref)
    zero = ObjectiveValue(0.0, np.zeros_like(W), np.zeros((W.size, W.size)) if hessian else None)
    return _add_prox(zero, W, rho, ref)


def profiled_objective(
    W, T, lambda_h: float, lambda_w: float, *, rho: float = 0.0, w_ref=None, hessian: bool = True
) -> ObjectiveValue:
    """Profiled objective ``F(W; T)`` (docs/theory.md §4), optionally plus ``rho/2 ||W - W_ref||_F^2``.

    ``F(W; T) = lambda_H/2 Tr(T A^{-1}) + lambda_W/2 ||W||_F^2`` with ``A = W W^T + lambda_H I``;
    ``grad F = 2 Lambda_T(G) W``, ``Lambda_T(G) = lambda_W/2 I - lambda_H/2 A^{-1} T A^{-1}``.

    Hessian (row-major vec, entry ``[(i,j), (b,a)]``), with ``K = A^{-1} T A^{-1}``:
    ``lambda_W d_ib d_ja - lambda_H K_ib d_ja + lambda_H [A^{-1}_ib (W^T K W)_aj
    + (A^{-1} W)_ia (K W)_bj + K_ib (W^T A^{-1} W)_aj + (K W)_ia (A^{-1} W)_bj]``.

    Parameters
    ----------
    W : array_like, shape (C, P)
        Head (any rank; ``A`` is positive definite).
    T : array_like, shape (C, C)
        Symmetric PSD target covariance.
    lambda_h, lambda_w : float, > 0
    rho : float, >= 0
        Proximal weight; requires ``w_ref`` when > 0.
    w_ref : array_like, shape (C, P), optional
        Proximal reference head (the broadcast ``W_t``).
    hessian : bool
        Compute the ``(C*P, C*P)`` Hessian (else ``hess`` is None).

    Returns
    -------
    ObjectiveValue
    """
    W = as_float_array("W", W, ndim=2)
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    T = as_spd("T", T, strict=False)
    if T.shape[0] != W.shape[0]:
        raise UFMInputError(f"T: shape {T.shape} does not match W with C = {W.shape[0]} rows")
    rho, ref = _check_prox(W, rho, w_ref)
    val = _trace_inv_term(W, T, lh, hessian)
    hess = None if val.hess is None else val.hess + lw * np.eye(W.size)
    val = ObjectiveValue(val.value + 0.5 * lw * float(np.sum(W * W)), val.grad + lw * W, hess)
    return _add_prox(val, W, rho, ref)


def moment_correction(
    W, sigma_m, sigma_cen, lambda_h: float, *, gamma: float = 1.0, hessian: bool = True
) -> ObjectiveValue:
    """Moment correction ``gamma C_m(W)`` (docs/theory.md §2, §8).

    ``C_m(W) = lambda_H/2 Tr((Sigma_cen - Sigma_m) A^{-1})``.

    ``A = W W^T + lambda_H I``; gradient ``-lambda_H A^{-1} D A^{-1} W`` with ``D = Sigma_cen - Sigma_m``; Hessian as in
    [`profiled_objective`][fedhead.ufm.profiled_objective] with ``T = D``, ``lambda_W = 0``.
    ``F(W; Sigma_m) + C_m(W) = F(W; Sigma_cen)`` for every ``W``.

    Parameters
    ----------
    W : array_like, shape (C, P)
    sigma_m, sigma_cen : array_like, shape (C, C)
        Symmetric PSD client and centralised covariances.
    lambda_h : float, > 0
    gamma : float, >= 0
        Correction strength (1 = full correction).
    hessian : bool

    Returns
    -------
    ObjectiveValue
    """
    W = as_float_array("W", W, ndim=2)
    lh = as_positive_scalar("lambda_h", lambda_h)
    g = as_positive_scalar("gamma", gamma, allow_zero=True)
    sm = as_spd("sigma_m", sigma_m, strict=False)
    sc = as_spd("sigma_cen", sigma_cen, strict=False)
    for name, s in (("sigma_m", sm), ("sigma_cen", sc)):
        if s.shape[0] != W.shape[0]:
            raise UFMInputError(f"{name}: shape {s.shape} does not match W with C = {W.shape[0]} rows")
    val = _trace_inv_term(W, g * (sc - sm), lh, hessian)
    return val


def scipy_callables(objective: Callable[[np.ndarray], ObjectiveValue], shape: tuple[int, ...]):
    """``(fun, jac, hess)`` on flat vectors for ``scipy.optimize.minimize`` from a head objective.

    ``objective`` maps a ``shape`` array to an [`ObjectiveValue`][fedhead.ufm.ObjectiveValue] (e.g.
    ``lambda W: profiled_objective(W, T, lh, lw, rho=rho, w_ref=W_t)``); the last evaluation is
    cached so ``fun``, ``jac`` and ``hess`` at the same point cost one call.
    """
    cache: dict = {}

    def ev(x: np.ndarray) -> ObjectiveValue:
        key = np.asarray(x, dtype=np.float64).tobytes()
        if cache.get("key") != key:
            cache["key"] = key
            cache["val"] = objective(np.asarray(x, dtype=np.float64).reshape(shape))
        return cache["val"]

    def fun(x):
        return ev(x).value

    def jac(x):
        return ev(x).grad.ravel()

    def hess(x):
        h = ev(x).hess
        if h is None:
            raise UFMInputError("scipy_callables: the objective returned no Hessian")
        return h

    return fun, jac, hess


class LocalHead(NamedTuple):
    """A local minimiser of the profiled objective reached from a given head ([`local_head`][fedhead.ufm.local_head]).

    Attributes
    ----------
    head : ndarray, shape (C, P)
    value : float
        ``F(W; T) + rho/2 ||W - W_ref||_F^2`` there.
    grad_norm : float
        Frobenius norm of its gradient there.
    iterations : int
    converged : bool
        Whether the gradient norm reached ``gtol max(1, ||grad at W0||)``.
    """

    head: np.ndarray
    value: float
    grad_norm: float
    iterations: int
    converged: bool


def local_head(
    W0, T, lambda_h: float, lambda_w: float, *, rho: float = 0.0, w_ref=None, gtol: float = 1e-9, max_iter: int = 2000
) -> LocalHead:
    """The minimiser of ``F(W; T) + rho/2 ||W - W_ref||_F^2`` that L-BFGS reaches from ``W0``.

    ``F(W; T) = lambda_H/2 Tr(T A^{-1}) + lambda_W/2 ||W||_F^2``, ``A = W W^T + lambda_H I``
    ([`profiled_objective`][fedhead.ufm.profiled_objective]). With ``rho = 0`` the minimisers form the
    orbit ``W* Q`` (``Q`` orthogonal) and the one reached lies near ``W0``; with ``rho > 0`` (inside the
    fully active regime) the minimiser near ``W_ref`` is the proximal step of the local objective, the
    head that a client of the proximal procedure returns at its local optimum.

    Parameters
    ----------
    W0 : array_like, shape (C, P)
        Starting head (a trained head: the result is its nearby exact optimum).
    T : array_like, shape (C, C)
        Symmetric PSD target covariance (``Sigma_m``, or the corrected covariance).
    lambda_h, lambda_w : float, > 0
    rho : float, >= 0
    w_ref : array_like, shape (C, P), optional
        Proximal reference head; required when ``rho > 0``.
    gtol : float
        Stop once the gradient's Frobenius norm is at most ``gtol max(1, ||grad at W0||)``.
    max_iter : int

    Returns
    -------
    LocalHead
    """
    from scipy.optimize import minimize  # scipy.optimize: only here

    W0 = as_float_array("W0", W0, ndim=2)
    shape = W0.shape

    def objective(W: np.ndarray) -> ObjectiveValue:
        return profiled_objective(W, T, lambda_h, lambda_w, rho=rho, w_ref=w_ref, hessian=False)

    start = objective(W0)
    g0 = float(np.linalg.norm(start.grad))
    target = gtol * max(g0, 1.0)
    fun, jac, _ = scipy_callables(objective, shape)

    def stop_at_target(xk: np.ndarray) -> None:  # scipy ends the run on StopIteration
        if np.linalg.norm(jac(xk)) <= target:
            raise StopIteration

    res = minimize(
        fun,
        W0.ravel(),
        jac=jac,
        method="L-BFGS-B",
        options={"maxiter": int(max_iter), "gtol": 0.0, "ftol": 0.0, "maxcor": 30},
        callback=stop_at_target,
    )
    head = np.asarray(res.x, dtype=np.float64).reshape(shape)
    end = objective(head)
    if end.value > start.value:  # never worse than the start
        head, end = W0.copy(), start
    gn = float(np.linalg.norm(end.grad))
    return LocalHead(head, float(end.value), gn, int(res.nit), bool(gn <= target))
