"""Input checks of [`fedhead.train.train_local`][fedhead.train.train_local] (shapes, finiteness, model/data
agreement)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedhead.models.backbones import Backbone, FreeFeatureBackbone
from fedhead.train.config import TrainConfig, TrainInputError
from fedhead.train.problem import LocalProblem


def check_matrix(name: str, a: np.ndarray | None, shape: tuple[int, int], symmetric: bool = False) -> np.ndarray:
    """``a`` as float64 after checking it is given, has ``shape``, is finite (and symmetric)."""
    if a is None:
        raise TrainInputError(f"train_local: {name} is required by the configuration but was not given")
    arr = np.asarray(a, dtype=np.float64)
    if arr.shape != shape:
        raise TrainInputError(f"train_local: {name} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise TrainInputError(f"train_local: {name} has non-finite entries")
    if symmetric and not np.allclose(arr, arr.T, rtol=1e-8, atol=1e-10 * max(1.0, np.abs(arr).max())):
        raise TrainInputError(f"train_local: {name} must be symmetric")
    return arr


def check_inputs(backbone: nn.Module, head: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> None:
    """Check the model and the data of one [`fedhead.train.train_local`][fedhead.train.train_local] call; raise
    [`TrainInputError`][fedhead.train.TrainInputError]."""
    if not isinstance(head, nn.Linear) or head.bias is None:
        raise TrainInputError("train_local: head must be an nn.Linear(P, C) with bias")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TrainInputError("train_local: x and y must be torch tensors")
    if y.ndim != 2:
        raise TrainInputError(f"train_local: targets must be (N, C), got shape {tuple(y.shape)}")
    n = y.shape[0]
    if n == 0:
        raise TrainInputError("train_local: the client has no training samples (empty data)")
    if x.shape[0] != n:
        raise TrainInputError(
            f"train_local: {x.shape[0]} inputs but {n} targets (x {tuple(x.shape)}, y {tuple(y.shape)})"
        )
    if y.shape[1] != head.out_features:
        raise TrainInputError(
            f"train_local: targets have C = {y.shape[1]} columns but the head has {head.out_features} outputs"
        )
    if not torch.isfinite(y).all():
        bad = int((~torch.isfinite(y)).any(dim=1).nonzero()[0, 0])
        raise TrainInputError(f"train_local: non-finite target values (first at sample {bad})")
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise TrainInputError("train_local: non-finite input values")
    if not isinstance(backbone, Backbone):
        return
    if head.in_features != backbone.feature_dim:
        raise TrainInputError(
            f"train_local: head takes P = {head.in_features} features but the backbone produces {backbone.feature_dim}"
        )
    if backbone.expects_indices:
        if x.ndim != 1 or x.dtype not in (torch.int64, torch.int32):
            raise TrainInputError(
                f"train_local: the free-feature backbone takes (N,) integer sample indices, "
                f"got {x.dtype} of shape {tuple(x.shape)}"
            )
        if isinstance(backbone, FreeFeatureBackbone) and (int(x.min()) < 0 or int(x.max()) >= backbone.n_samples):
            raise TrainInputError(
                f"train_local: sample indices must lie in [0, {backbone.n_samples}), "
                f"got [{int(x.min())}, {int(x.max())}]"
            )
    elif backbone.input_shape is not None and tuple(x.shape[1:]) != tuple(backbone.input_shape):
        raise TrainInputError(
            f"train_local: inputs have per-sample shape {tuple(x.shape[1:])} but the backbone "
            f"was built for {tuple(backbone.input_shape)}"
        )


def check_arguments(cfg: TrainConfig, problem: LocalProblem, seed: int, *, released: bool = False) -> int:
    """The recipe, the problem and the seed of a [`fedhead.train.train_local`][fedhead.train.train_local] call, checked;
    the seed as int (``released``: the correction's ``Sigma_m`` is a differentially private release)."""
    if not isinstance(cfg, TrainConfig):
        raise TrainInputError(f"train_local: cfg must be a TrainConfig, got {type(cfg).__name__}")
    if not isinstance(problem, LocalProblem):
        raise TrainInputError(f"train_local: problem must be a LocalProblem, got {type(problem).__name__}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise TrainInputError(f"train_local: seed must be a non-negative integer, got {seed!r}")
    cfg.validate()
    if cfg.private and ((problem.gamma > 0 and not released) or problem.center_targets):
        raise TrainInputError(
            "train_local: per-example DP (TrainConfig.dp_noise > 0) refuses gamma > 0 without a released Sigma_m, "
            "and centred targets: the correction and the centring would read the site's own covariance and mean "
            "outside the private steps"
        )
    return int(seed)


def check_private_backbone(cfg: TrainConfig, backbone: nn.Module) -> None:
    """Refuse per-example DP for the free-feature backbone: its features are one row each (no DP-SGD
    can train them); its head follows from the statistics in closed form."""
    if cfg.private and isinstance(backbone, FreeFeatureBackbone):
        raise TrainInputError(
            "train_local: per-example DP (TrainConfig.dp_noise > 0) cannot train free features (one per row)"
        )


def check_every(cfg: TrainConfig, epochs: int) -> int:
    """Epochs between two tolerance checks: ``cfg.check_every``, or about 50 checks in ``epochs``."""
    return cfg.check_every if cfg.check_every > 0 else max(1, epochs // 50)
