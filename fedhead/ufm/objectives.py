"""Objectives with exact derivatives: profiled F, moment correction C_m, joint UFM loss (docs/theory.md §2, §4, §8).

Hessians are dense matrices in row-major ``vec`` order (``W.ravel()``), ready for
``scipy.optimize.minimize(method="trust-exact")``; :func:`scipy_callables` turns any of the
head objectives into the ``fun, jac, hess`` triple on flat vectors.
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

    ``A = W W^T + lambda_H I``; gradient ``-lambda_H A^{-1} D A^{-1} W`` with
    ``D = Sigma_cen - Sigma_m``; Hessian as in :func:`profiled_objective` with ``T = D``,
    ``lambda_W = 0``. ``F(W; Sigma_m) + C_m(W) = F(W; Sigma_cen)`` for every ``W``.

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

    ``objective`` maps a ``shape`` array to an :class:`ObjectiveValue` (e.g.
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
    """A local minimiser of the profiled objective reached from a given head (:func:`local_head`).

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
    (:func:`profiled_objective`). With ``rho = 0`` the minimisers form the orbit ``W* Q`` (``Q``
    orthogonal) and the one reached lies near ``W0``; with ``rho > 0`` (inside the fully active
    regime) the minimiser near ``W_ref`` is the proximal step of the local objective, the head that
    a client of the proximal procedure returns at its local optimum.

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


# ---------------------------------------------------------------------------------- joint UFM


class JointValue(NamedTuple):
    """Value and gradient of the joint UFM objective (docs/theory.md §2).

    Attributes
    ----------
    value : float
    grad_w : ndarray, shape (C, P)
    grad_b : ndarray, shape (C,)
    grad_h : ndarray, shape (N, P)
    """

    value: float
    grad_w: np.ndarray
    grad_b: np.ndarray
    grad_h: np.ndarray

    def grad_flat(self) -> np.ndarray:
        """Gradient in the order of :func:`pack_joint`, shape (C*P + C + N*P,)."""
        return np.concatenate([self.grad_w.ravel(), self.grad_b.ravel(), self.grad_h.ravel()])


def pack_joint(W, b, H) -> np.ndarray:
    """Flatten ``(W (C,P), b (C,), H (N,P))`` to ``[vec W, b, vec H]`` (row-major).

    Returns
    -------
    ndarray, shape (C*P + C + N*P,), float64
    """
    return np.concatenate([np.ravel(W), np.ravel(b), np.ravel(H)]).astype(np.float64)


def unpack_joint(x, C: int, P: int, N: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_joint`: ``(W (C,P), b (C,), H (N,P))``."""
    x = np.asarray(x, dtype=np.float64)
    n = C * P + C + N * P
    if x.shape != (n,):
        raise UFMInputError(f"x: expected shape ({n},) for C={C}, P={P}, N={N}, got {x.shape}")
    return x[: C * P].reshape(C, P), x[C * P : C * P + C], x[C * P + C :].reshape(N, P)


def _check_joint(W, b, H, Y, lambda_h, lambda_w, rho, w_ref):
    W = as_float_array("W", W, ndim=2)
    C, P = W.shape
    b = as_float_array("b", b, ndim=1)
    H = as_float_array("H", H, ndim=2)
    Y = as_float_array("Y", Y, ndim=2)
    if b.shape != (C,):
        raise UFMInputError(f"b: expected shape ({C},) to match W {W.shape}, got {b.shape}")
    if Y.shape[1] != C:
        raise UFMInputError(f"Y: expected (N, {C}) targets (rows are samples) to match W {W.shape}, got {Y.shape}")
    if H.shape != (Y.shape[0], P):
        raise UFMInputError(
            f"H: expected features of shape (N, P) = {(Y.shape[0], P)} (rows are samples), got {H.shape}"
        )
    lh = as_positive_scalar("lambda_h", lambda_h)
    lw = as_positive_scalar("lambda_w", lambda_w)
    rho, ref = _check_prox(W, rho, w_ref)
    return W, b, H, Y, lh, lw, rho, ref


def joint_objective(W, b, H, Y, lambda_h: float, lambda_w: float, *, rho: float = 0.0, w_ref=None) -> JointValue:
    """Joint UFM objective ``L_m(W, b, H)`` (docs/theory.md §2), optionally plus ``rho/2 ||W - W_ref||^2``.

    With rows as samples (docs/theory.md's ``Y_m = Y.T``, ``H_m = H.T``) and ``R = H W^T + 1 b^T - Y``:
    ``L = 1/(2N) ||R||_F^2 + lambda_H/(2N) ||H||_F^2 + lambda_W/2 ||W||_F^2``;
    ``grad_W = R^T H / N + lambda_W W``, ``grad_b = R^T 1 / N``,
    ``grad_H = (R W + lambda_H H) / N``.

    Parameters
    ----------
    W : array_like, shape (C, P)
    b : array_like, shape (C,)
    H : array_like, shape (N, P)
        Free features, one row per sample.
    Y : array_like, shape (N, C)
        Targets, one row per sample.
    lambda_h, lambda_w : float, > 0
    rho : float, >= 0
    w_ref : array_like, shape (C, P), optional

    Returns
    -------
    JointValue
    """
    W, b, H, Y, lh, lw, rho, ref = _check_joint(W, b, H, Y, lambda_h, lambda_w, rho, w_ref)
    N = Y.shape[0]
    R = H @ W.T + b - Y
    value = 0.5 / N * float(np.sum(R * R)) + 0.5 * lh / N * float(np.sum(H * H)) + 0.5 * lw * float(np.sum(W * W))
    gw = R.T @ H / N + lw * W
    gb = R.sum(axis=0) / N
    gh = (R @ W + lh * H) / N
    if ref is not None and rho > 0:
        D = W - ref
        value += 0.5 * rho * float(np.sum(D * D))
        gw = gw + rho * D
    return JointValue(value, gw, gb, gh)


def joint_hessian(W, b, H, Y, lambda_h: float, lambda_w: float, *, rho: float = 0.0, w_ref=None) -> np.ndarray:
    """Exact Hessian of :func:`joint_objective` over ``x = pack_joint(W, b, H)``.

    ``Hess = J^T J / N + (cross term R[n,c] d_pq / N between W[c,p] and H[n,q])
    + diag(lambda_W + rho on W, 0 on b, lambda_H / N on H)`` with ``J`` the Jacobian of the
    residual ``R`` (row-major ``(n, c)``).

    Parameters
    ----------
    W, b, H, Y, lambda_h, lambda_w, rho, w_ref
        As in :func:`joint_objective`.

    Returns
    -------
    ndarray, shape (D, D), ``D = C*P + C + N*P``
    """
    W, b, H, Y, lh, lw, rho, ref = _check_joint(W, b, H, Y, lambda_h, lambda_w, rho, w_ref)
    C, P = W.shape
    N = Y.shape[0]
    R = H @ W.T + b - Y
    IC, IN, IP = np.eye(C), np.eye(N), np.eye(P)
    JW = np.einsum("ck,np->nckp", IC, H).reshape(N * C, C * P)
    Jb = np.tile(IC, (N, 1))
    JH = np.einsum("nm,cp->ncmp", IN, W).reshape(N * C, N * P)
    J = np.concatenate([JW, Jb, JH], axis=1)
    Hm = J.T @ J / N
    cross = np.einsum("nc,pq->cpnq", R, IP).reshape(C * P, N * P) / N
    nw = C * P
    nh0 = nw + C
    Hm[:nw, nh0:] += cross
    Hm[nh0:, :nw] += cross.T
    Hm[np.arange(nw), np.arange(nw)] += lw + (rho if ref is not None else 0.0)
    Hm[np.arange(nh0, Hm.shape[0]), np.arange(nh0, Hm.shape[0])] += lh / N
    return 0.5 * (Hm + Hm.T)
