"""The client's part of the mismatch measurement (docs/theory.md §13): three objectives, eval mode.

[`mismatch_objectives`][fedhead.train.mismatch_objectives.mismatch_objectives] evaluates the client's
local objective ``L_m`` (theory.md §2: data fit, ``lambda_H`` feature penalty, ``lambda_W`` head penalty;
no proximal or correction term) on its full training data for

* its own trained local model ``(backbone, W~_m, b~_m)`` (``local``),
* the trained heads' average ``(W_bar, b_bar)`` with the same trained backbone (``trained``),
* the aligned average ``(W_bar_a, b_bar)`` with the backbone aligned like the ``aligned``
  procedure does it, features ``h -> Q_m^T h`` (``aligned``; a rotated copy: the client's
  stored backbone is left untouched).

The server forms the averages and ``Q_m``
([`fedhead.analysis.mismatch_cost.mismatch_averages`][fedhead.analysis.mismatch_cost.mismatch_averages]).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedhead.models import require_backbone
from fedhead.train.config import TrainInputError
from fedhead.train.local_loss import _head_tensors, compute_features, objective_from_features


@dataclass(frozen=True)
class MismatchObjectives:
    """One client's ``L_m`` of its local model, of the trained average and of the aligned average."""

    local: float
    trained: float
    aligned: float


@torch.no_grad()
def mismatch_objectives(
    backbone: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    own_head: tuple[np.ndarray, np.ndarray],
    trained_head: tuple[np.ndarray, np.ndarray],
    aligned_head: tuple[np.ndarray, np.ndarray],
    rotation: np.ndarray,
    lambda_h: float,
    lambda_w: float,
    target_offset: np.ndarray | None = None,
    device: torch.device | str | None = None,
    batch_size: int = 1024,
) -> MismatchObjectives:
    """The three objectives of one client (see the module docstring).

    Parameters
    ----------
    backbone : Backbone
        The client's trained backbone (evaluated in eval mode; neither it nor its mode changes).
    x, y : Tensor
        Training inputs and ``(N, C)`` targets.
    own_head, trained_head, aligned_head : (ndarray (C, P), ndarray (C,))
        ``(W~_m, b~_m)``, ``(W_bar, b_bar)``, ``(W_bar_a, b_bar)``.
    rotation : ndarray (P, P)
        ``Q_m`` (orthogonal); the aligned backbone's features are ``Q_m^T h``.
    lambda_h, lambda_w : float
        Penalties of ``L_m``.
    target_offset : ndarray (C,), optional
        Subtracted from ``y`` (a client that trains on centred targets passes its ``mu_m``).
    """
    if x.shape[0] != y.shape[0] or y.ndim != 2 or y.shape[0] == 0:
        raise TrainInputError(
            f"mismatch_objectives: need N >= 1 inputs and (N, C) targets, got x {tuple(x.shape)}, y {tuple(y.shape)}"
        )
    if not hasattr(backbone, "rotate_features"):
        raise TrainInputError(f"mismatch_objectives: backbone {type(backbone).__name__} has no rotate_features(Q)")
    dev = torch.device(device) if device is not None else next(backbone.parameters()).device
    heads = [_head_tensors(h, dev) for h in (own_head, trained_head, aligned_head)]
    for name, (w, _) in zip(("own_head", "trained_head", "aligned_head"), heads):
        if w.shape != heads[0][0].shape or w.shape[0] != y.shape[1]:
            raise TrainInputError(
                f"mismatch_objectives: {name} weight {tuple(w.shape)} does not match "
                f"{tuple(heads[0][0].shape)} with C = {y.shape[1]} targets"
            )
    q = np.asarray(rotation, dtype=np.float64)
    p = heads[0][0].shape[1]
    if q.shape != (p, p) or not np.all(np.isfinite(q)):
        raise TrainInputError(f"mismatch_objectives: rotation must be a finite ({p}, {p}) matrix, got {q.shape}")
    y64 = y.to(device=dev, dtype=torch.float64)
    if target_offset is not None:
        y64 = y64 - torch.as_tensor(np.asarray(target_offset, dtype=np.float64), device=dev)
    h = compute_features(backbone, x, batch_size=batch_size, device=dev)
    local = objective_from_features(h, y64, *heads[0], lambda_h, lambda_w).objective
    trained = objective_from_features(h, y64, *heads[1], lambda_h, lambda_w).objective
    del h
    rotated = require_backbone(copy.deepcopy(backbone).to(dev), "the mismatch objectives")
    rotated.rotate_features(q)
    h_a = compute_features(rotated, x, batch_size=batch_size, device=dev)
    aligned = objective_from_features(h_a, y64, *heads[2], lambda_h, lambda_w).objective
    return MismatchObjectives(local=float(local), trained=float(trained), aligned=float(aligned))
