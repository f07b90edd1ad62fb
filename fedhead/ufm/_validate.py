"""Input validation shared by the math core (errors say what was wrong and where).

Every public function of [`fedhead.ufm`][fedhead.ufm] validates its arguments once at entry with these
helpers and then works on plain float64 arrays; the inner iterations call private,
non-validating kernels.
"""

from __future__ import annotations

import numpy as np

#: relative tolerance for symmetry: ``max|A - A^T| <= SYM_RTOL * max(max|A|, tiny)``
SYM_RTOL = 1e-10
#: tolerance for "weights sum to one"
WEIGHT_TOL = 1e-10
#: relative tolerance for positive *semi*-definiteness: ``lambda_min >= -PSD_RTOL * lambda_max``
PSD_RTOL = 1e-12


def pd_floor(lmax, c: int):
    """Smallest eigenvalue a ``c x c`` matrix with largest eigenvalue ``lmax`` must exceed to be
    positive definite numerically: ``c * eps * lmax`` (eigenvalues below it are rounding of 0)."""
    return c * np.finfo(np.float64).eps * lmax


class UFMInputError(ValueError):
    """Bad input to the UFM math core; the message says which argument, where and what value."""


class NotFullyActiveError(UFMInputError):
    """The fully active regime ``lambda_min(Sigma_m) > lambda_H lambda_W`` is violated (docs/theory.md §3)."""


class ConvergenceWarning(UserWarning):
    """An iteration of the math core stopped before reaching its tolerance."""


def _where(index: tuple[int, ...], label: str) -> str:
    if not index:
        return ""
    if len(index) == 1:
        return f" at {label} {index[0]}"
    return f" at {label} {index}"


def as_float_array(name: str, x, *, ndim: int | None = None, min_ndim: int | None = None) -> np.ndarray:
    """Convert to a float64 array; check the number of axes and that every entry is finite."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise UFMInputError(f"{name}: cannot be read as a float64 array ({exc})") from exc
    if ndim is not None and a.ndim != ndim:
        raise UFMInputError(f"{name}: expected {ndim} axes, got shape {a.shape}")
    if min_ndim is not None and a.ndim < min_ndim:
        raise UFMInputError(f"{name}: expected at least {min_ndim} axes, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise UFMInputError(
            f"{name}: contains a non-finite value {float(a[tuple(bad)])!r} at index {tuple(int(i) for i in bad)}"
        )
    return a


def as_square(name: str, x, *, batch: bool = False, label: str = "index") -> np.ndarray:
    """Finite float64 ``(C, C)`` matrix (or ``(..., C, C)`` stack when ``batch``)."""
    a = as_float_array(name, x, ndim=None if batch else 2, min_ndim=2)
    if a.shape[-1] != a.shape[-2]:
        raise UFMInputError(f"{name}: matrix is not square, shape {a.shape}")
    if a.shape[-1] == 0:
        raise UFMInputError(f"{name}: empty matrix, shape {a.shape}")
    return a


def as_symmetric(name: str, x, *, batch: bool = False, label: str = "index") -> np.ndarray:
    """Finite, square, symmetric up to rounding (relative ``SYM_RTOL``); returns the symmetrised copy."""
    a = as_square(name, x, batch=batch, label=label)
    skew = np.abs(a - np.swapaxes(a, -1, -2)).max(axis=(-1, -2))
    scale = np.maximum(np.abs(a).max(axis=(-1, -2)), np.finfo(float).tiny)
    bad = skew > SYM_RTOL * scale
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(np.atleast_1d(bad))[0]) if a.ndim > 2 else ()
        s = float(skew[idx] if idx else skew)
        sc = float(scale[idx] if idx else scale)
        raise UFMInputError(
            f"{name}{_where(idx, label)}: matrix is not symmetric: max|A - A^T| = {s:.3e} "
            f"exceeds {SYM_RTOL:g} x max|A| = {SYM_RTOL * sc:.3e}"
        )
    return 0.5 * (a + np.swapaxes(a, -1, -2))


def as_spd(name: str, x, *, batch: bool = False, label: str = "index", strict: bool = True) -> np.ndarray:
    """Symmetric positive definite (``strict``) or semidefinite up to rounding; symmetrised copy."""
    a = as_symmetric(name, x, batch=batch, label=label)
    w = np.linalg.eigvalsh(a)
    lmin = w[..., 0]
    lmax = np.maximum(np.abs(w).max(axis=-1), np.finfo(float).tiny)
    bad = (lmin <= pd_floor(lmax, a.shape[-1])) if strict else (lmin < -PSD_RTOL * lmax)
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(np.atleast_1d(bad))[0]) if a.ndim > 2 else ()
        val = float(lmin[idx] if idx else lmin)
        kind = "positive definite" if strict else "positive semidefinite"
        detail = f" (largest {float(lmax[idx] if idx else lmax):.6e})" if strict else ""
        raise UFMInputError(f"{name}{_where(idx, label)}: matrix is not {kind}: smallest eigenvalue {val:.6e}{detail}")
    return a


def as_weights(name: str, w, n: int | None = None) -> np.ndarray:
    """Positive weights of shape ``(n,)`` summing to one within ``WEIGHT_TOL``."""
    a = as_float_array(name, w, ndim=1)
    if n is not None and a.shape[0] != n:
        raise UFMInputError(f"{name}: expected {n} weights (one per client), got {a.shape[0]}")
    if a.shape[0] == 0:
        raise UFMInputError(f"{name}: no weights given")
    if np.any(a <= 0):
        i = int(np.argwhere(a <= 0)[0, 0])
        raise UFMInputError(f"{name}: weight of client {i} is {float(a[i])!r}; every weight must be > 0")
    s = float(a.sum())
    if abs(s - 1.0) > WEIGHT_TOL:
        raise UFMInputError(f"{name}: weights sum to {s:.15g}, not 1 (tolerance {WEIGHT_TOL:g})")
    return a


def as_positive_scalar(name: str, x, *, allow_zero: bool = False) -> float:
    """A finite scalar > 0 (or >= 0 when ``allow_zero``)."""
    try:
        v = float(x)
    except (TypeError, ValueError) as exc:
        raise UFMInputError(f"{name}: expected a number, got {x!r}") from exc
    if not np.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        need = ">= 0" if allow_zero else "> 0"
        raise UFMInputError(f"{name}: must be finite and {need}, got {v!r}")
    return v


def as_head(name: str, W, *, c: int | None = None, full_rank: bool = False) -> np.ndarray:
    """A finite ``(C, P)`` head with ``P >= C``; with ``full_rank`` its Gram must be positive definite."""
    a = as_float_array(name, W, ndim=2)
    C, P = a.shape
    if c is not None and c != C:
        raise UFMInputError(f"{name}: head has {C} rows, expected C = {c} (shape {a.shape})")
    if P < C:
        raise UFMInputError(f"{name}: head shape {a.shape} has P = {P} < C = {C}")
    if full_rank:
        w = np.linalg.eigvalsh(a @ a.T)
        if w[0] <= pd_floor(w[-1], C):
            raise UFMInputError(
                f"{name}: head does not have full row rank: smallest eigenvalue of W W^T is {w[0]:.6e} "
                f"(largest {w[-1]:.6e})"
            )
    return a


def as_int(name: str, x, minimum: int) -> int:
    """An integer (int or integral numpy scalar, not bool) ``>= minimum``."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise UFMInputError(f"{name}: must be an integer >= {minimum}, got {x!r}")
    if x < minimum:
        raise UFMInputError(f"{name}: must be an integer >= {minimum}, got {int(x)}")
    return int(x)
