"""A client's local loss ``L_m`` (docs/theory.md §2) in torch, for training and evaluation.

The minibatch loss, the gradients of the head-only terms (penalty, proximal, moment correction)
and the full-data evaluation; the numpy closed forms of the same objective are in
`fedhead.ufm.objectives`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedhead.data.base import batch_to_float
from fedhead.train.config import TrainInputError


def minibatch_loss(h: torch.Tensor, pred: torch.Tensor, y: torch.Tensor, lambda_h: float) -> torch.Tensor:
    """Per-sample part of ``L_m`` averaged over the batch (theory.md §2, minibatch form).

    ``1/(2B) sum_i ||W h_i + b - y_i||^2 + lambda_H/(2B) sum_i ||h_i||^2`` for features ``h``
    ``(B, P)``, predictions ``pred = W h + b`` ``(B, C)`` and targets ``y`` ``(B, C)``. A full
    pass (``B = N_m``) plus ``lambda_W/2 ||W||_F^2`` equals ``L_m``.
    """
    return (pred - y).square().sum().add(h.square().sum(), alpha=lambda_h).mul(0.5 / y.shape[0])


def moment_correction_torch(weight: torch.Tensor, sigma_delta: torch.Tensor, lambda_h: float) -> torch.Tensor:
    """Differentiable moment correction ``C_m(W) = lambda_H/2 Tr((Sigma_cen - Sigma_m) A^{-1})``.

    theory.md §2 and §8, ``A = W W^T + lambda_H I``; ``F(W; Sigma_m) + C_m(W) = F(W; Sigma_cen)``. The
    ``C x C`` solve runs in float64; the gradient is ``-lambda_H A^{-1} D A^{-1} W``.

    Parameters
    ----------
    weight : Tensor
        Head weight ``W`` ``(C, P)`` (any float dtype; autograd flows through it).
    sigma_delta : Tensor
        ``D = Sigma_cen - Sigma_m`` ``(C, C)`` float64, symmetric, on ``weight``'s device.
    lambda_h : float
        ``lambda_H > 0``.

    Returns
    -------
    Tensor
        Scalar, float64.
    """
    w = weight.double()
    a = w @ w.T
    a = a + lambda_h * torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    return 0.5 * lambda_h * torch.linalg.solve(a, sigma_delta).diagonal().sum()


@torch.no_grad()
def moment_correction_grad(weight: torch.Tensor, sigma_delta: torch.Tensor, lambda_h: float) -> torch.Tensor:
    """Gradient of [`moment_correction_torch`][fedhead.train.moment_correction_torch] without
    autograd: ``-lambda_H A^{-1} D A^{-1} W``.

    ``A = W W^T + lambda_H I`` and ``D = Sigma_cen - Sigma_m`` (symmetric); computed in float64
    and returned in ``weight``'s dtype, shape ``(C, P)``. The trainer adds it to the head's
    gradient directly (cheaper than a graph node for a ``C x C`` term).
    """
    w = weight.double()
    a = torch.addmm(torch.eye(w.shape[0], dtype=w.dtype, device=w.device), w, w.T, beta=lambda_h)
    a_inv = torch.linalg.inv_ex(a).inverse  # A is SPD (lambda_H > 0): no error check, no host sync
    return (a_inv @ sigma_delta @ a_inv @ w).mul_(-lambda_h).to(weight.dtype)


@torch.no_grad()
def add_head_penalty_grads(
    weight: torch.Tensor,
    *,
    lambda_w: float,
    lambda_h: float,
    rho: float = 0.0,
    broadcast: torch.Tensor | None = None,
    gamma: float = 0.0,
    sigma_delta: torch.Tensor | None = None,
) -> None:
    """Add the gradients of the head-only terms to ``weight.grad`` in place.

    ``grad += lambda_W W + rho (W - W_t) + gamma grad C_m(W)``: the gradient of
    ``lambda_W/2 ||W||^2 + rho/2 ||W - W_t||^2 + gamma C_m(W)`` (theory.md §2), ``W`` ``(C, P)``.
    The proximal term needs ``broadcast`` (``W_t``), the correction ``sigma_delta``
    (``Sigma_cen - Sigma_m``, float64); a term whose tensor is None is left out.
    """
    g = weight.grad
    if g is None:
        raise RuntimeError("add_head_penalty_grads: weight.grad is None (call backward() first)")
    head_penalty_grads(
        weight,
        g,
        lambda_w=lambda_w,
        lambda_h=lambda_h,
        rho=rho,
        broadcast=broadcast,
        gamma=gamma,
        sigma_delta=sigma_delta,
    )


def head_penalty_grads(
    weight: torch.Tensor,
    g: torch.Tensor,
    *,
    lambda_w: float,
    lambda_h: float,
    rho: float,
    broadcast: torch.Tensor | None,
    gamma: float,
    sigma_delta: torch.Tensor | None,
) -> None:
    """[`add_head_penalty_grads`][fedhead.train.add_head_penalty_grads] into a given gradient ``g`` of
    ``weight``, for a caller already under ``torch.no_grad()`` (the CPU fast step, once per step)."""
    g.add_(weight, alpha=lambda_w + (rho if broadcast is not None else 0.0))
    if broadcast is not None:
        g.sub_(broadcast, alpha=rho)
    if sigma_delta is not None:
        g.add_(moment_correction_grad(weight, sigma_delta, lambda_h), alpha=gamma)


@dataclass(frozen=True)
class LocalEvaluation:
    """Full-data evaluation of a backbone + head on one client (eval mode, no extra terms).

    Attributes
    ----------
    objective : float
        ``L_m`` of theory.md §2 (squared error, feature and head penalties).
    mse : float
        ``1/(N_m C) sum ||W h + b - y||^2`` (no penalties).
    n_samples : int
        ``N_m``.
    """

    objective: float
    mse: float
    n_samples: int


def _head_tensors(head: nn.Linear | tuple[np.ndarray, np.ndarray], device: torch.device):
    if isinstance(head, nn.Linear):
        w, b = head.weight.detach(), head.bias
        b = torch.zeros(w.shape[0], device=w.device) if b is None else b.detach()
    else:
        try:
            w, b = head
        except (TypeError, ValueError):
            raise TrainInputError("head must be an nn.Linear or a (weight (C, P), bias (C,)) pair") from None
        w, b = torch.as_tensor(np.asarray(w)), torch.as_tensor(np.asarray(b))
    w = w.to(device=device, dtype=torch.float64)
    b = b.to(device=device, dtype=torch.float64)
    if w.ndim != 2 or b.shape != (w.shape[0],):
        raise TrainInputError(f"head weight must be (C, P) and bias (C,), got {tuple(w.shape)} and {tuple(b.shape)}")
    return w, b


@torch.no_grad()
def compute_features(
    backbone: nn.Module,
    x: torch.Tensor,
    *,
    batch_size: int = 1024,
    device: torch.device | None = None,
    channels_last: bool = False,
) -> torch.Tensor:
    """Backbone features of all inputs in eval mode, ``(N, P)`` float32 on ``device``.

    The backbone's train/eval mode is restored afterwards.
    """
    device = device or next(backbone.parameters()).device
    was_training = backbone.training
    backbone.eval()
    try:
        out = []
        for s in range(0, x.shape[0], batch_size):
            xb = batch_to_float(x[s : s + batch_size].to(device, non_blocking=True))
            if channels_last and xb.ndim == 4:
                xb = xb.contiguous(memory_format=torch.channels_last)
            out.append(backbone(xb).float())
        return torch.cat(out) if out else torch.empty(0, 0, device=device)
    finally:
        backbone.train(was_training)


def objective_from_features(
    h: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, lambda_h: float, lambda_w: float
) -> LocalEvaluation:
    """``L_m`` and MSE from features ``h`` ``(N, P)``, targets ``y`` ``(N, C)``, head ``(W, b)`` (float64)."""
    h = h.double()
    y = y.to(device=h.device, dtype=torch.float64)
    n = y.shape[0]
    sse = (h @ weight.T + bias - y).square().sum()
    obj = 0.5 * (sse + lambda_h * h.square().sum()) / n + 0.5 * lambda_w * weight.square().sum()
    return LocalEvaluation(objective=float(obj), mse=float(sse / (n * y.shape[1])), n_samples=int(n))


def evaluate_local(
    backbone: nn.Module,
    head: nn.Linear | tuple[np.ndarray, np.ndarray],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    lambda_h: float,
    lambda_w: float,
    target_offset: np.ndarray | None = None,
    device: torch.device | str | None = None,
    batch_size: int = 1024,
) -> LocalEvaluation:
    """Evaluate a backbone with a given head on one client's data (theory.md §2 objective, theory.md §11 MSE).

    Parameters
    ----------
    backbone : nn.Module
        The client's backbone (run in eval mode; its mode is restored).
    head : nn.Linear or (ndarray (C, P), ndarray (C,))
        The head, e.g. the shared head as numpy arrays.
    x : Tensor
        Inputs ``(N, F)`` float32, ``(N, ch, H, W)`` uint8 images, or ``(N,)`` int64 indices.
    y : Tensor
        Targets ``(N, C)``.
    lambda_h, lambda_w : float
        Penalties of ``L_m``.
    target_offset : ndarray (C,), optional
        Subtracted from ``y`` first (a client that trained on centred targets passes its ``mu_m``).
    device : optional
        Where to run (default: the backbone's device).
    """
    if x.shape[0] != y.shape[0] or y.ndim != 2 or y.shape[0] == 0:
        raise TrainInputError(
            f"evaluate_local: need N >= 1 inputs and (N, C) targets, got x {tuple(x.shape)}, y {tuple(y.shape)}"
        )
    dev = torch.device(device) if device is not None else next(backbone.parameters()).device
    w, b = _head_tensors(head, dev)
    if w.shape[0] != y.shape[1]:
        raise TrainInputError(f"evaluate_local: head has {w.shape[0]} outputs but targets have {y.shape[1]} columns")
    y64 = y.to(device=dev, dtype=torch.float64)
    if target_offset is not None:
        y64 = y64 - torch.as_tensor(np.asarray(target_offset, dtype=np.float64), device=dev)
    h = compute_features(backbone, x, batch_size=batch_size, device=dev)
    return objective_from_features(h, y64, w, b, lambda_h, lambda_w)
