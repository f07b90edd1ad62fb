"""Local training of one client: the public entry point [`train_local`][fedhead.train.train_local].

It checks the arguments and hands them to [`TrainLoop`][fedhead.train.loop.TrainLoop]; the
recipe that takes a client to its local optimum is docs/theory.md §14.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedhead.train.config import TrainConfig
from fedhead.train.finishing import LocalResult, objective_terms
from fedhead.train.inputs import check_arguments, check_inputs, check_private_backbone
from fedhead.train.loop import TrainLoop
from fedhead.train.problem import LocalProblem
from fedhead.train.steps import select_device

__all__ = ["train_local"]


def train_local(
    backbone: nn.Module,
    head: nn.Linear,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainConfig,
    problem: LocalProblem,
    *,
    broadcast_weight: np.ndarray | None = None,
    sigma_cen: np.ndarray | None = None,
    sigma_m: np.ndarray | None = None,
    released_sigma_m: np.ndarray | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> LocalResult:
    """Train ``backbone`` and ``head`` in place on one client's data, for at most ``problem.epochs``.

    Minibatch objective (theory.md §2; a full pass of the first two terms plus the third equals ``L_m``)::

        1/(2B) sum_i ||W h_i + b - y_i||^2 + lambda_H/(2B) sum_i ||h_i||^2 + lambda_W/2 ||W||_F^2
        + rho/2 ||W - W_t||_F^2 + gamma C_m(W)

    with ``C_m(W) = lambda_H/2 Tr((Sigma_cen - Sigma_m)(W W^T + lambda_H I)^{-1})``, the weights
    of ``problem`` and, if ``problem.center_targets``, ``y_i - mu_m`` in place of ``y_i``. AdamW
    (weight decay 0) is created afresh, the learning rate follows a cosine from ``cfg.lr`` to
    ``cfg.lr_min`` over ``problem.epochs``, gradients are clipped to global norm ``cfg.clip_norm``.
    How the optimum is reached: docs/theory.md §14; the literal recipe turns those steps off.

    Parameters
    ----------
    backbone : Backbone
        The client's private backbone; trained in place (BatchNorm statistics stay with it) and
        left on ``device``.
    head : nn.Linear
        The head ``Linear(P, C)`` initialised by the caller (usually to the broadcast head);
        trained in place (its bias set to the optimum with ``cfg.optimal_bias``).
    x : Tensor
        Inputs ``(N, F)`` float32, ``(N, ch, H, W)`` uint8 images (converted per batch) or, for the
        free-feature backbone, ``torch.arange(N)``.
    y : Tensor
        Targets ``(N, C)`` float32.
    cfg : TrainConfig
        The recipe (how to train).
    problem : LocalProblem
        What to train for (a run's: [`JobConfig.local_problem`][fedhead.settings.job.JobConfig.local_problem]).
    broadcast_weight, sigma_cen : ndarray (C, P), ndarray (C, C), optional
        ``W_t`` of the proximal term (required when ``problem.rho > 0``) and the pooled
        ``Sigma_cen`` of the correction (required when ``problem.gamma > 0``).
    sigma_m : ndarray (C, C), optional
        The client's ``Sigma_m`` (theory.md §3), always computed from ``y`` (centring does not change
        it); a given one is only checked against it (relative Frobenius difference <= 1e-5).
    released_sigma_m : ndarray (C, C), optional
        ``Sigma_m`` of a differentially private release, which the correction reads instead (DP-SGD needs it).
    device : str or torch.device, optional
        ``"auto"`` (default), ``"cpu"``, ``"cuda"``; see [`select_device`][fedhead.train.select_device].
    seed : int
        Seed of the minibatch permutations (a client's: [`fedhead.train.round_seed`][fedhead.train.round_seed]).

    Returns
    -------
    LocalResult
        ``weight (C, P)``, ``bias (C,)`` float64, ``target_offset (C,)`` and
        [`LocalMetrics`][fedhead.train.LocalMetrics].

    Raises
    ------
    TrainInputError
        Mismatched sizes, empty data, non-finite targets, a missing ``broadcast_weight`` or
        ``sigma_cen``, a ``sigma_m`` that is not the targets' covariance.
    TrainDivergedError
        A non-finite gradient norm (CPU) or non-finite head or objective after training.
    """
    seed = check_arguments(cfg, problem, seed, released=released_sigma_m is not None)
    check_inputs(backbone, head, x, y)
    check_private_backbone(cfg, backbone)
    terms = objective_terms(y, problem, head.in_features, broadcast_weight, sigma_cen, sigma_m, released_sigma_m)
    dev = select_device(device)
    loop = TrainLoop(backbone, head, x, y, cfg, problem, terms, dev, seed)
    loop.run()
    return loop.finish()
