"""The client's objectives of the mismatch measurement (docs/theory.md §13) and the initial
backbone seeds of ``init=common|independent``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhead.analysis.seeds import INIT_MODES, backbone_seed
from fedhead.models import FreeFeatureConfig, ResMLPConfig, build_backbone
from fedhead.train import TrainInputError, evaluate_local
from fedhead.train.mismatch_objectives import mismatch_objectives


def _orthogonal(p: int, seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((p, p)))
    return q * np.sign(np.diag(r))


@pytest.mark.parametrize("model", ["resmlp", "free"])
def test_aligned_model_with_rotated_backbone_is_the_local_model(model):
    """Own head W with rotation Q: (W, backbone), (W, same backbone) and (W Q, features Q^T h) are
    one model, so all three objectives agree; the client's backbone is left as it was."""
    n, c, p = 30, 3, 8
    if model == "resmlp":
        bb, x = build_backbone(ResMLPConfig(width=16, feature_dim=p), (5,), n, seed=0), torch.randn(n, 5)
    else:
        bb, x = build_backbone(FreeFeatureConfig(feature_dim=p), (), n, seed=0), torch.arange(n)
    bb.train()
    before = {k: v.clone() for k, v in bb.state_dict().items()}
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((c, p)), rng.standard_normal(c)
    y = torch.randn(n, c)
    q = _orthogonal(p, 2)
    offset = np.array([0.1, -0.2, 0.3])
    ev = mismatch_objectives(
        bb,
        x,
        y,
        own_head=(w, b),
        trained_head=(w, b),
        aligned_head=(w @ q, b),
        rotation=q,
        lambda_h=0.01,
        lambda_w=0.02,
        target_offset=offset,
    )
    ref = evaluate_local(bb, (w, b), x, y, lambda_h=0.01, lambda_w=0.02, target_offset=offset).objective
    assert ev.local == pytest.approx(ref, rel=1e-12) and ev.trained == pytest.approx(ref, rel=1e-12)
    assert ev.aligned == pytest.approx(ref, rel=1e-5)  # float32 features through the rotated layer
    assert bb.training
    for k, v in bb.state_dict().items():
        assert torch.equal(v, before[k]), k
    # a different average costs more than the client's own (optimal-ish) model only by its own terms
    other = mismatch_objectives(
        bb,
        x,
        y,
        own_head=(w, b),
        trained_head=(0 * w, b),
        aligned_head=(w, b),
        rotation=np.eye(p),
        lambda_h=0.01,
        lambda_w=0.02,
    )
    assert other.aligned == pytest.approx(other.local, rel=1e-12) and other.trained != other.local


def test_mismatch_objectives_checks_shapes():
    bb = build_backbone(ResMLPConfig(width=8, feature_dim=4), (3,), 10, seed=0)
    x, y = torch.randn(10, 3), torch.randn(10, 2)
    head = (np.zeros((2, 4)), np.zeros(2))
    with pytest.raises(TrainInputError, match="rotation"):
        mismatch_objectives(
            bb,
            x,
            y,
            own_head=head,
            trained_head=head,
            aligned_head=head,
            rotation=np.eye(3),
            lambda_h=0.01,
            lambda_w=0.01,
        )
    with pytest.raises(TrainInputError, match="trained_head"):
        mismatch_objectives(
            bb,
            x,
            y,
            own_head=head,
            trained_head=(np.zeros((2, 5)), np.zeros(2)),
            aligned_head=head,
            rotation=np.eye(4),
            lambda_h=0.01,
            lambda_w=0.01,
        )


def _states(init: str, seed: int, clients: int = 3):
    return [
        build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 20, backbone_seed(seed, m, init)).state_dict()
        for m in range(clients)
    ]


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_common_init_gives_one_backbone_and_independent_one_per_client():
    common, independent = _states("common", 0), _states("independent", 0)
    assert all(_same(common[0], s) for s in common[1:])
    assert not any(_same(independent[i], independent[j]) for i in range(3) for j in range(i + 1, 3))
    assert not any(_same(common[0], s) for s in independent)
    # the same seed gives the same backbones; another seed other ones
    assert all(_same(a, b) for a, b in zip(independent, _states("independent", 0)))
    assert not any(_same(a, b) for a, b in zip(independent, _states("independent", 1)))
    assert backbone_seed(5, 2, "common") == 5 and INIT_MODES == ("common", "independent")
    with pytest.raises(ValueError, match="init"):
        backbone_seed(0, 0, "shared")
