"""Exact minimisation of the local objective over the backbone's last linear layer.

For a fixed head the objective is a ridge problem in the last ``Linear`` layer (docs/theory.md
§14): [`solve_output_layer`][fedhead.train.last_layer.solve_output_layer] sets the layer to its
(filtered) minimiser, or the free-feature table to the optimal features themselves.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedhead.data.base import batch_to_float
from fedhead.models import backbone_output_layer, feature_table
from fedhead.train.config import TrainDivergedError, TrainInputError
from fedhead.ufm import optimal_features


@torch.no_grad()
def output_layer_inputs(
    backbone: nn.Module,
    layer: nn.Linear,
    x: torch.Tensor,
    *,
    batch_size: int,
    device: torch.device,
    channels_last: bool = False,
) -> torch.Tensor:
    """The inputs ``z`` ``(N, width)`` of ``layer`` over all of ``x``, backbone in eval mode (float64)."""
    captured: list[torch.Tensor] = []
    hook = layer.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach().double()))
    was_training = backbone.training
    backbone.eval()
    try:
        for s in range(0, x.shape[0], batch_size):
            xb = batch_to_float(x[s : s + batch_size].to(device, non_blocking=True))
            if channels_last and xb.ndim == 4:
                xb = xb.contiguous(memory_format=torch.channels_last)
            backbone(xb)
    finally:
        hook.remove()
        backbone.train(was_training)
    return torch.cat(captured)


#: the filters tried by [`solve_output_layer`][fedhead.train.last_layer.solve_output_layer], each a factor 10 apart
RIDGE_STEPS = 7
#: the relative objective decrease a solve must bring to replace the current layer: below it the
#: difference is rounding (the layer is float32), and a layer already at the optimum stays as it is
KEEP_MARGIN = 1e-12


def _layer_objective(
    h: np.ndarray, yc: np.ndarray, weight: np.ndarray, lambda_h: float, row_basis: np.ndarray | None
) -> float:
    """The part of the local objective that the last layer changes, for features ``h`` ``(N, P)``:
    ``1/(2N) ||(h - m) W^T - Y_c||^2 + lambda_H/(2N) ||h'||^2`` with ``h' = P_W (h - m)`` (``row_basis``
    ``(P, C)``, an orthonormal basis of the head's row space: as the finishing step leaves the
    features) or ``h' = h`` (None); the bias is at its optimum."""
    n = h.shape[0]
    m = h.mean(0)
    hc = h - m
    fit = hc @ weight.T - yc
    if row_basis is not None:
        pen = float(np.sum((hc @ row_basis) ** 2))
    else:
        pen = float(np.sum(h**2))
    return 0.5 / n * float(np.sum(fit**2)) + 0.5 * lambda_h / n * pen


@torch.no_grad()
def solve_output_layer(
    backbone: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    weight: np.ndarray,
    lambda_h: float,
    *,
    batch_size: int = 1024,
    device: torch.device | None = None,
    channels_last: bool = False,
    ridge: float = 1e-4,
    keep_better: bool = False,
    finish: bool = True,
) -> bool:
    """Set the backbone's last layer to the exact minimiser of the local objective for head ``W``.

    Parameters
    ----------
    backbone : Backbone
        A backbone with an output layer ([`backbone_output_layer`][fedhead.models.backbone_output_layer]: a
        ``Linear`` with bias), or the free-feature backbone (its table is set to the optimal features).
    x : Tensor
        The client's inputs (``(N,)`` indices for free features).
    y : Tensor
        Targets ``(N, C)`` trained on (centred here with their own mean).
    weight : ndarray (C, P)
        The head ``W``.
    lambda_h : float
        ``lambda_H``.
    batch_size, device, channels_last
        How the layer's inputs are computed (eval mode).
    ridge : float
        Tikhonov filter of the solve, relative to the largest squared singular value ``s_1^2`` of
        the centred layer inputs: ``V`` minimises the objective plus ``ridge s_1^2 / 2 ||V||_F^2``
        (directions of ``z`` with ``s_k^2 << ridge s_1^2`` are left out; docs/theory.md §14 says why).
    keep_better : bool
        Try ``ridge`` and [`RIDGE_STEPS`][fedhead.train.last_layer.RIDGE_STEPS] - 1 smaller filters (each a
        factor 10 below the previous) and set the layer to the one with the lowest objective, or
        leave the layer as it is when none is lower by more than ``KEEP_MARGIN`` (relative). The
        objectives are computed exactly from ``z``
        ([`_layer_objective`][fedhead.train.last_layer._layer_objective]): the solve never raises
        the objective.
    finish : bool
        Compare objectives as the finishing step leaves the features (``h -> P_W (h - m)``).

    Returns
    -------
    bool
        Whether the layer was changed.
    """
    device = device or next(backbone.parameters()).device
    y64 = y.detach().cpu().double().numpy()
    target = optimal_features(weight, y64, lambda_h)  # (N, P), mean zero
    layer = backbone_output_layer(backbone)
    if layer is None:
        _set_feature_table(backbone, x, target)
        return True  # the exact minimiser: no filter, never above the current objective
    if layer.bias is None:
        raise TrainInputError("solve_output_layer: the backbone's last Linear layer needs a bias")
    z = _finite_inputs(backbone, layer, x, batch_size=batch_size, device=device, channels_last=channels_last)
    z_mean = z.mean(0)
    u, sv, vt = np.linalg.svd(z - z_mean, full_matrices=False)
    if not (sv.size and sv[0] > 0):
        return False
    ut_target = u.T @ target
    if keep_better:
        basis = np.linalg.qr(weight.T)[0] if finish else None
        best = _best_ridge(layer, z, u, sv, ut_target, y64, weight, lambda_h, ridge, basis)
        if best is None:
            return False
    else:
        best = ridge
    filt = sv / (sv**2 + best * sv[0] ** 2)
    v = ((vt.T * filt) @ ut_target).T  # (P, width): Z_c V^T ~ target, filtered
    layer.weight.copy_(torch.as_tensor(v, dtype=layer.weight.dtype, device=layer.weight.device))
    layer.bias.copy_(torch.as_tensor(-v @ z_mean, dtype=layer.bias.dtype, device=layer.bias.device))
    return True


def _set_feature_table(backbone: nn.Module, x: torch.Tensor, target: np.ndarray) -> None:
    """The free-feature backbone's rows ``x`` set to the optimal features ``target`` ``(N, P)``."""
    table = feature_table(backbone)
    if table is None:
        raise TrainInputError(f"solve_output_layer: {type(backbone).__name__} has no output_layer()")
    idx = x.detach().to(table.device, torch.long)
    table[idx] = torch.as_tensor(target, dtype=table.dtype, device=table.device)


def _finite_inputs(
    backbone: nn.Module,
    layer: nn.Linear,
    x: torch.Tensor,
    *,
    batch_size: int,
    device: torch.device,
    channels_last: bool,
) -> np.ndarray:
    """[`output_layer_inputs`][fedhead.train.last_layer.output_layer_inputs] as an array, checked finite."""
    z = (
        output_layer_inputs(backbone, layer, x, batch_size=batch_size, device=device, channels_last=channels_last)
        .cpu()
        .numpy()
    )
    if not np.all(np.isfinite(z)):
        raise TrainDivergedError(
            "solve_output_layer: the backbone produces non-finite features (before its last "
            "layer); its state is corrupted"
        )
    return z


def _best_ridge(
    layer: nn.Linear,
    z: np.ndarray,
    u: np.ndarray,
    sv: np.ndarray,
    ut_target: np.ndarray,
    y64: np.ndarray,
    weight: np.ndarray,
    lambda_h: float,
    ridge: float,
    basis: np.ndarray | None,
) -> float | None:
    """The filter among ``ridge`` and the [`RIDGE_STEPS`][fedhead.train.last_layer.RIDGE_STEPS] - 1 below it
    whose solve has the lowest objective, or None when none lowers the layer's current objective by
    more than [`KEEP_MARGIN`][fedhead.train.last_layer.KEEP_MARGIN] (relative)."""
    v_now = layer.weight.detach().cpu().double().numpy()
    c_now = layer.bias.detach().cpu().double().numpy()
    yc = y64 - y64.mean(0)
    current = _layer_objective(z @ v_now.T + c_now, yc, weight, lambda_h, basis)
    best, best_value = None, current * (1.0 - KEEP_MARGIN)
    for r in [ridge * 10.0**-k for k in range(RIDGE_STEPS)]:
        h = (u * (sv**2 / (sv**2 + r * sv[0] ** 2))) @ ut_target  # Z_c V_r^T, mean zero
        value = _layer_objective(h, yc, weight, lambda_h, basis)
        if value < best_value:
            best, best_value = r, value
    return best
