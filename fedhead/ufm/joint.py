"""The joint UFM objective ``L_m(W, b, H)`` over head, bias and features, exact derivatives (docs/theory.md §2).

[`pack_joint`][fedhead.ufm.pack_joint] and [`unpack_joint`][fedhead.ufm.unpack_joint] map the
three blocks to one flat vector for ``scipy.optimize``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._validate import UFMInputError, as_float_array, as_positive_scalar
from .objectives import _check_prox


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
        """Gradient in the order of [`pack_joint`][fedhead.ufm.pack_joint], shape (C*P + C + N*P,)."""
        return np.concatenate([self.grad_w.ravel(), self.grad_b.ravel(), self.grad_h.ravel()])


def pack_joint(W, b, H) -> np.ndarray:
    """Flatten ``(W (C,P), b (C,), H (N,P))`` to ``[vec W, b, vec H]`` (row-major).

    Returns
    -------
    ndarray, shape (C*P + C + N*P,), float64
    """
    return np.concatenate([np.ravel(W), np.ravel(b), np.ravel(H)]).astype(np.float64)


def unpack_joint(x, C: int, P: int, N: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of [`pack_joint`][fedhead.ufm.pack_joint]: ``(W (C,P), b (C,), H (N,P))``."""
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
    """Exact Hessian of [`joint_objective`][fedhead.ufm.joint_objective] over ``x = pack_joint(W, b, H)``.

    ``Hess = J^T J / N + (cross term R[n,c] d_pq / N between W[c,p] and H[n,q])
    + diag(lambda_W + rho on W, 0 on b, lambda_H / N on H)`` with ``J`` the Jacobian of the
    residual ``R`` (row-major ``(n, c)``).

    Parameters
    ----------
    W, b, H, Y, lambda_h, lambda_w, rho, w_ref
        As in [`joint_objective`][fedhead.ufm.joint_objective].

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
