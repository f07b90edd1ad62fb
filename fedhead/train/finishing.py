"""The objective data of one local training call, its full-data evaluation and its results
(docs/theory.md §2, §11).

[`objective_terms`][fedhead.train.finishing.objective_terms] checks and prepares what
[`fedhead.train.train_local`][fedhead.train.train_local] needs of the client's targets and of the
head-only terms; [`evaluate_fit`][fedhead.train.finishing.evaluate_fit] evaluates the model on all
of the client's data, optionally as the exact finishing step leaves it
([`feature_projection`][fedhead.train.finishing.feature_projection]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedhead.train.align import procrustes_rotation
from fedhead.train.config import TrainConfig, TrainDivergedError, TrainInputError
from fedhead.train.inputs import check_matrix as _check_matrix
from fedhead.train.local_loss import compute_features, moment_correction_torch, objective_from_features
from fedhead.train.problem import LocalProblem
from fedhead.ufm import TargetMoments, corrected_covariance


@dataclass(frozen=True)
class LocalMetrics:
    """What one local training call measured.

    Attributes
    ----------
    objective : float
        ``L_m`` (theory.md §2) of the trained backbone + head on the full local data, eval mode, without
        proximal or correction terms (on the centred targets when ``problem.center_targets``).
    optimal_objective : float
        ``L*_m`` from [`fedhead.ufm.optimal_loss`][fedhead.ufm.optimal_loss] (``Sigma_m``, ``lambda_H``, ``lambda_W``).
    relative_gap : float
        ``(L_m - L*_m) / L*_m`` (theory.md §11 local fit); NaN when ``L*_m = 0``.
    trained_objective, trained_optimal_objective, trained_gap : float
        The objective the client minimised, without the proximal term: ``L_m + gamma C_m(W)``,
        whose optimum is ``L*`` of the corrected covariance ``(1 - gamma) Sigma_m + gamma
        Sigma_cen`` (theory.md §8). Equal to the three fields above when ``gamma = 0``. For a corrected
        client the original gap says nothing about convergence (``L_m`` is not minimised there);
        this one does.
    train_mse : float
        Mean squared error over samples and outputs on the training data (no penalties).
    n_samples : int
    epochs : int
        Epochs run (at most ``problem.epochs``; fewer when ``cfg.local_tol`` was reached).
    n_steps : int
        Optimiser steps run.
    converged : bool or None
        Whether ``trained_gap <= cfg.local_tol`` was reached; None without a tolerance.
    gap_trace : tuple of (int, float)
        ``(epochs run, trained gap)`` at every tolerance check (empty without ``cfg.local_tol``).
    seconds : float
        Wall time of the training loop (excluding the final evaluation).
    steps_per_second : float
    device : str
    """

    objective: float
    optimal_objective: float
    relative_gap: float
    trained_objective: float
    trained_optimal_objective: float
    trained_gap: float
    train_mse: float
    n_samples: int
    epochs: int
    n_steps: int
    converged: bool | None
    gap_trace: tuple[tuple[int, float], ...]
    seconds: float
    steps_per_second: float
    device: str


@dataclass(frozen=True)
class LocalResult:
    """The trained head and metrics of one [`train_local`][fedhead.train.train_local] call.

    Attributes
    ----------
    weight : ndarray (C, P) float64
        Trained head weight ``W~``.
    bias : ndarray (C,) float64
        Trained head bias ``b~``.
    target_offset : ndarray (C,) float64
        ``mu_m`` when the targets were centred (add it to predictions), else zeros.
    metrics : LocalMetrics
    """

    weight: np.ndarray
    bias: np.ndarray
    target_offset: np.ndarray
    metrics: LocalMetrics


@dataclass(frozen=True)
class ObjectiveTerms:
    """The client's objective data, checked: its moments and the head-only terms' tensors."""

    mu: np.ndarray  # (C,) mean of the targets trained on (zeros when centred)
    sigma: np.ndarray  # (C, C) Sigma_m
    trained_sigma: np.ndarray  # (C, C) (1 - gamma) Sigma_m + gamma Sigma_cen (= Sigma_m without correction)
    target_offset: np.ndarray  # (C,) mu_m when the targets are centred, else zeros
    broadcast: np.ndarray | None  # (C, P) W_t of the proximal term
    delta: np.ndarray | None  # (C, C) Sigma_cen - Sigma_m of the correction (the released Sigma_m under DP)


def objective_terms(
    y: torch.Tensor, problem: LocalProblem, p: int, broadcast_weight, sigma_cen, sigma_m, released_sigma_m=None
) -> ObjectiveTerms:
    """Moments of the targets and the checked proximal / correction inputs of
    [`train_local`][fedhead.train.train_local] (``released_sigma_m``: the correction's ``Sigma_m``)."""
    c = y.shape[1]
    y64 = y.detach().cpu().numpy().astype(np.float64)
    moments = TargetMoments.from_targets([y64])
    mu_m = np.array(moments.means[0])
    sig_m = np.asarray(moments.covs[0])  # the covariance of the targets trained on (centring keeps it)
    if sigma_m is not None:
        given = _check_matrix("sigma_m", sigma_m, (c, c), True)
        err = np.linalg.norm(given - sig_m) / max(np.linalg.norm(sig_m), np.finfo(np.float64).tiny)
        if err > 1e-5:
            raise TrainInputError(
                f"train_local: sigma_m differs from the covariance of the targets y (relative "
                f"difference {err:.3g}); pass Sigma_m in the units of the targets trained on, or "
                f"leave it None"
            )
    w_t = _check_matrix("broadcast_weight", broadcast_weight, (c, p)) if problem.rho > 0 else None
    cen = _check_matrix("sigma_cen", sigma_cen, (c, c), True) if problem.gamma > 0 else None
    delta = None if cen is None else cen - sig_m
    trained_sigma = sig_m if cen is None else corrected_covariance(sig_m, cen, problem.gamma)
    if cen is not None and released_sigma_m is not None:  # the correction of the released Sigma_m
        delta = cen - _check_matrix("released_sigma_m", released_sigma_m, (c, c), True)
        trained_sigma = corrected_covariance(sig_m, sig_m + delta, problem.gamma)  # its optimum's covariance
    offset = mu_m if problem.center_targets else np.zeros(c)
    return ObjectiveTerms(
        mu=mu_m - offset, sigma=sig_m, trained_sigma=trained_sigma, target_offset=offset, broadcast=w_t, delta=delta
    )


@dataclass
class Fit:
    """Full-data evaluation of the current model (see [`evaluate_fit`][fedhead.train.finishing.evaluate_fit])."""

    objective: float  # L_m
    trained_objective: float  # L_m + gamma C_m(W)
    mse: float
    bias: np.ndarray  # (C,) the bias used
    feature_map: tuple[torch.Tensor, torch.Tensor] | None  # (M, delta) of the finishing step
    weight: torch.Tensor  # (C, P) float64 head after the finishing step


def feature_projection(weight: torch.Tensor) -> torch.Tensor:
    """``P_W = W^T (W W^T)^+ W`` ``(P, P)`` float64: the orthogonal projection on the head's row space."""
    w = weight.detach().double()
    return w.T @ torch.linalg.pinv(w @ w.T, hermitian=True) @ w


@torch.no_grad()
def evaluate_fit(
    backbone: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: TrainConfig,
    problem: LocalProblem,
    terms: ObjectiveTerms,
    *,
    dev: torch.device,
    channels_last: bool,
    finish: bool,
    rotate_to: np.ndarray | None = None,
) -> Fit:
    """``L_m`` and ``L_m + gamma C_m`` of the model on all of the client's data (eval mode).

    ``bias`` None: the optimal bias ``mu - W m`` for the features' mean ``m``. ``finish``: the
    features evaluated as the finishing step of [`train_local`][fedhead.train.train_local] leaves them,
    ``h -> P_W (h - m)`` with ``b = mu``. Of all affine maps of the features that keep every
    prediction ``W h + b`` this one gives the smallest feature penalty (the part of ``h - m``
    outside the head's row space only adds to ``lambda_H ||h||^2``): an exact partial
    minimisation. ``rotate_to`` (with ``finish``): also the rotation ``W -> W Q``, ``h -> Q^T h``
    (``Q`` orthogonal ``(P, P)``) that brings ``W`` closest to this head
    ([`procrustes_rotation`][fedhead.train.procrustes_rotation]); it keeps every prediction and
    penalty and is the exact minimiser of the proximal term over the heads the objective cannot
    tell apart. The head to use is [`Fit.weight`][fedhead.train.finishing.Fit.weight].
    """
    h = compute_features(backbone, x, batch_size=cfg.eval_batch_size, device=dev, channels_last=channels_last).double()
    w64 = weight.detach().double()
    if not (torch.isfinite(h).all() and torch.isfinite(w64).all()):
        raise TrainDivergedError(
            "train_local: training diverged (non-finite head or features); lower cfg.lr or keep clip_norm set"
        )
    m = h.mean(0)
    feature_map = None
    if finish:
        proj = feature_projection(w64)
        if rotate_to is not None:
            q = torch.as_tensor(procrustes_rotation(w64.cpu().numpy(), rotate_to), dtype=torch.float64, device=dev)
            w64 = w64 @ q
            proj = q.T @ proj
        h = (h - m) @ proj.T
        b = torch.as_tensor(terms.mu, dtype=torch.float64, device=dev)
        feature_map = (proj, -m)
    elif bias is None:
        b = torch.as_tensor(terms.mu, dtype=torch.float64, device=dev) - w64 @ m
    else:
        b = bias.detach().double()
    ev = objective_from_features(h, y, w64, b, problem.lambda_h, problem.lambda_w)
    trained = ev.objective
    if terms.delta is not None:
        delta = torch.as_tensor(terms.delta, dtype=torch.float64, device=dev)
        trained += problem.gamma * float(moment_correction_torch(w64, delta, problem.lambda_h))
    return Fit(
        objective=ev.objective,
        trained_objective=trained,
        mse=ev.mse,
        bias=b.cpu().numpy().copy(),
        feature_map=feature_map,
        weight=w64,
    )


def relative(value: float, best: float) -> float:
    return (value - best) / best if best > 0 else float("nan")
