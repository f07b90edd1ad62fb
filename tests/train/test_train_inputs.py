"""train_local refuses bad inputs and bad recipes or problems with messages that say what is wrong."""

import numpy as np
import pytest
import torch
from train_helpers import (
    PROBLEM_FIELDS,
    C,
    N,
    P,
    free_model,
    ufm_config,
)

from fedhead.models import ResMLPConfig, build_backbone, build_head
from fedhead.train import (
    LocalProblem,
    TrainConfig,
    TrainInputError,
    train_local,
)


def test_bad_inputs_raise_clear_errors(y_m):
    bb, head = free_model()
    idx = torch.arange(N)
    cfg = ufm_config(epochs=1)
    with pytest.raises(TrainInputError, match="15 inputs but 16 targets"):
        train_local(bb, head, idx[:15], y_m, *cfg, device="cpu")
    y_nan = y_m.clone()
    y_nan[3, 1] = float("nan")
    with pytest.raises(TrainInputError, match="non-finite target values.*sample 3"):
        train_local(bb, head, idx, y_nan, *cfg, device="cpu")
    with pytest.raises(TrainInputError, match="no training samples"):
        train_local(bb, head, idx[:0], y_m[:0], *cfg, device="cpu")
    with pytest.raises(TrainInputError, match="C = 3 columns but the head has 2"):
        train_local(bb, head, idx, torch.zeros(N, 3), *cfg, device="cpu")
    with pytest.raises(TrainInputError, match="integer sample indices"):
        train_local(bb, head, idx.float(), y_m, *cfg, device="cpu")
    with pytest.raises(TrainInputError, match=r"indices must lie in \[0, 16\)"):
        train_local(bb, head, idx + 1, y_m, *cfg, device="cpu")
    with pytest.raises(TrainInputError, match="problem must be a LocalProblem, got TrainConfig"):
        train_local(bb, head, idx, y_m, cfg[0], cfg[0], device="cpu")
    with pytest.raises(TrainInputError, match="seed must be a non-negative integer, got -1"):
        train_local(bb, head, idx, y_m, *cfg, device="cpu", seed=-1)
    with pytest.raises(TrainInputError, match="broadcast_weight is required"):
        train_local(bb, head, idx, y_m, *ufm_config(epochs=1, rho=0.1), device="cpu")
    with pytest.raises(TrainInputError, match=r"broadcast_weight must have shape \(2, 4\)"):
        train_local(bb, head, idx, y_m, *ufm_config(epochs=1, rho=0.1), broadcast_weight=np.zeros((4, 2)), device="cpu")
    with pytest.raises(TrainInputError, match="sigma_cen is required"):
        train_local(bb, head, idx, y_m, *ufm_config(epochs=1, gamma=1.0), device="cpu")
    with pytest.raises(TrainInputError, match="sigma_cen must be symmetric"):
        train_local(
            bb,
            head,
            idx,
            y_m,
            *ufm_config(epochs=1, gamma=1.0),
            sigma_cen=np.array([[1.0, 0.2], [0.0, 1.0]]),
            device="cpu",
        )
    mlp = build_backbone(ResMLPConfig(width=8, feature_dim=P), (5,), N, seed=0)
    with pytest.raises(TrainInputError, match=r"per-sample shape \(6,\) but the backbone was built for \(5,\)"):
        train_local(mlp, head, torch.zeros(N, 6), y_m, *cfg, device="cpu")
    x_nan = torch.zeros(N, 5)
    x_nan[0, 0] = float("inf")
    with pytest.raises(TrainInputError, match="non-finite input"):
        train_local(mlp, head, x_nan, y_m, *cfg, device="cpu")
    with pytest.raises(TrainInputError, match="takes P = 3 features but the backbone produces 4"):
        train_local(bb, build_head(3, C, seed=0), idx, y_m, *cfg, device="cpu")


@pytest.mark.parametrize(
    "field,value,msg",
    [
        ("lambda_h", 0.0, "must be > 0"),
        ("lambda_w", -1.0, "must be > 0"),
        ("rho", -1e-3, "must be >= 0"),
        ("gamma", -0.5, "must be >= 0"),
        ("epochs", 0, "must be an integer >= 1"),
        ("batch_size", 0, "must be an integer >= 1"),
        ("lr_min", 1.0, "must be in"),
        ("clip_norm", 0.0, "must be > 0"),
        ("lambda_h", float("nan"), "must be > 0"),
        ("local_tol", 0.0, "must be a relative gap in"),
        ("local_tol", -1e-3, "must be a relative gap in"),
        ("local_tol", 1.0, "must be a relative gap in"),
        ("check_every", -1, "must be an integer >= 0"),
        ("warmup_steps", -5, "must be an integer >= 0"),
        ("last_layer_ridge", -1e-4, "must be >= 0"),
    ],
)
def test_bad_config_raises(field, value, msg):
    cls = LocalProblem if field in PROBLEM_FIELDS else TrainConfig
    with pytest.raises(TrainInputError, match=f"{cls.__name__}.{field} {msg}"):
        cls(**{field: value})
