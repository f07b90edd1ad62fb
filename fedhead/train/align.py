"""Alignment (theory.md §5): rotate a trained model's feature coordinates towards the broadcast head.

Given the trained head ``W^`` ``(C, P)`` and the broadcast ``W_t`` ``(C, P)``, the orthogonal
``Q`` ``(P, P)`` minimising ``||W^ Q - W_t||_F`` is the orthogonal Procrustes solution. It is
computed from ``C x C`` quantities plus an orthogonal completion:

* thin SVDs ``W^ = U1 S1 V1^T``, ``W_t = U2 S2 V2^T`` (``V1``, ``V2`` are ``P x r`` bases of the
  row spaces);
* ``K = S1 U1^T U2 S2 = V1^T W^^T W_t V2`` (``C x C``), SVD ``K = A S B^T``;
* ``Q = (V1 A)(V2 B)^T + U_perp R V_perp^T`` where ``U_perp``, ``V_perp`` complete ``V1 A``,
  ``V2 B`` to orthonormal bases and ``R`` is the polar factor of ``U_perp^T V_perp`` (an SVD), the
  completion closest to the identity (so ``W^ = W_t`` gives ``Q = I``). Outside the joint span of
  the two row spaces (at most ``2C`` dimensions) that factor is the identity, so everything is
  computed in that span: ``O(P C^2)`` work, not ``O(P^3)``.

``W^ Q`` does not depend on the completion. The head becomes ``W^ Q`` and the backbone's features
``Q^T h`` ([`fedhead.models.Backbone.rotate_features`][fedhead.models.Backbone.rotate_features]),
so predictions ``W^ Q Q^T h = W^ h``, the Gram ``W^ W^^T`` and the feature penalty are unchanged.
When both heads have full row rank, ``W^ Q`` is the head with Gram ``W^ W^^T`` closest to
``W_t``, i.e. ``Pi(W_t)`` for that Gram.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedhead.analysis.mismatch_cost import procrustes_rotation as _procrustes
from fedhead.models import Backbone
from fedhead.train.config import TrainInputError


def procrustes_rotation(weight: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Orthogonal ``Q`` ``(P, P)`` minimising ``||weight Q - target||_F`` (theory.md §5 alignment).

    Parameters
    ----------
    weight : ndarray (C, P)
        Trained head ``W^``.
    target : ndarray (C, P)
        Broadcast head ``W_t``.

    Returns
    -------
    ndarray (P, P) float64
        Orthogonal; among the minimisers, the one closest to the identity on the complement of
        the two row spaces.
    """
    w = np.asarray(weight, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    if w.ndim != 2 or w.shape != t.shape:
        raise TrainInputError(
            f"procrustes_rotation: weight and target must both be (C, P), got {w.shape} and {t.shape}"
        )
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(t))):
        raise TrainInputError("procrustes_rotation: non-finite head entries")
    return _procrustes(w, t)


@dataclass(frozen=True)
class AlignResult:
    """Result of [`align`][fedhead.train.align.align].

    Attributes
    ----------
    weight : ndarray (C, P) float64
        Aligned head ``W^ Q``.
    bias : ndarray (C,) float64
        Head bias (unchanged).
    rotation : ndarray (P, P) float64
        ``Q``.
    distance_before, distance_after : float
        ``||W^ - W_t||_F`` and ``||W^ Q - W_t||_F``.
    """

    weight: np.ndarray
    bias: np.ndarray
    rotation: np.ndarray
    distance_before: float
    distance_after: float


@torch.no_grad()
def align(head: nn.Linear, backbone: nn.Module, broadcast_weight: np.ndarray) -> AlignResult:
    """Align a trained head and backbone to the broadcast head ``W_t`` in place (theory.md §5).

    ``head.weight <- W^ Q`` and ``backbone.rotate_features(Q)`` (features ``h -> Q^T h``), so the
    model's predictions, its head Gram and its penalties are unchanged.

    Parameters
    ----------
    head : nn.Linear
        The trained head ``Linear(P, C)``.
    backbone : Backbone
        The client's backbone (must implement ``rotate_features``).
    broadcast_weight : ndarray (C, P)
        ``W_t``.
    """
    if not isinstance(backbone, Backbone):
        raise TrainInputError(f"align: backbone {type(backbone).__name__} has no rotate_features(Q)")
    w = head.weight.detach().cpu().double().numpy()
    w_t = np.asarray(broadcast_weight, dtype=np.float64)
    if w_t.shape != w.shape:
        raise TrainInputError(f"align: broadcast_weight must have the head's shape {w.shape}, got {w_t.shape}")
    q = procrustes_rotation(w, w_t)
    w_al = w @ q
    backbone.rotate_features(q)
    head.weight.copy_(torch.as_tensor(w_al, dtype=head.weight.dtype, device=head.weight.device))
    bias = head.bias.detach().cpu().double().numpy().copy() if head.bias is not None else np.zeros(w.shape[0])
    return AlignResult(
        weight=w_al,
        bias=bias,
        rotation=q,
        distance_before=float(np.linalg.norm(w - w_t)),
        distance_after=float(np.linalg.norm(w_al - w_t)),
    )
