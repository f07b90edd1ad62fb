"""Alignment (theory.md §5): Procrustes rotation from C x C quantities, applied to head and backbone."""

import numpy as np
import pytest
import torch
from scipy.linalg import orthogonal_procrustes

from fedhead.models import FreeFeatureConfig, ResMLPConfig, build_backbone, build_head
from fedhead.train import (
    LocalProblem,
    TrainConfig,
    TrainInputError,
    evaluate_local,
    procrustes_rotation,
    train_local,
)
from fedhead.train.align import align
from fedhead.ufm import closest_head, optimal_gram, psd_sqrt


def _orthonormal_rows(c, p, rng):
    q, _ = np.linalg.qr(rng.standard_normal((p, c)))
    return q.T  # (c, p), orthonormal rows


def _head_with_gram(g, p, rng):
    return psd_sqrt(g) @ _orthonormal_rows(g.shape[0], p, rng)


@pytest.mark.parametrize("c,p", [(2, 2), (3, 8), (6, 40)])
def test_procrustes_matches_scipy_and_is_orthogonal(c, p):
    rng = np.random.default_rng(c * 100 + p)
    w, w_t = rng.standard_normal((c, p)), rng.standard_normal((c, p))
    q = procrustes_rotation(w, w_t)
    np.testing.assert_allclose(q.T @ q, np.eye(p), atol=1e-12)
    r = orthogonal_procrustes(w, w_t)[0]  # independent full P x P SVD solver
    np.testing.assert_allclose(w @ q, w @ r, atol=1e-11)
    assert np.linalg.norm(w @ q - w_t) <= np.linalg.norm(w - w_t) + 1e-12


def test_procrustes_identity_and_rank_deficient():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 7))
    np.testing.assert_allclose(procrustes_rotation(w, w), np.eye(7), atol=1e-12)
    w_low = np.outer(rng.standard_normal(3), rng.standard_normal(7))  # rank 1
    w_t = rng.standard_normal((3, 7))
    q = procrustes_rotation(w_low, w_t)
    np.testing.assert_allclose(q.T @ q, np.eye(7), atol=1e-12)
    r = orthogonal_procrustes(w_low, w_t)[0]
    assert np.linalg.norm(w_low @ q - w_t) == pytest.approx(np.linalg.norm(w_low @ r - w_t), rel=1e-12)
    np.testing.assert_allclose(procrustes_rotation(np.zeros((3, 7)), w_t), np.eye(7))
    with pytest.raises(TrainInputError, match="both be"):
        procrustes_rotation(w, w_t[:, :5])


def test_aligned_head_is_selection_rule():
    """A head with Gram G_m aligned to W_t becomes Pi_m(W_t) = closest_head(W_t, G_m)."""
    rng = np.random.default_rng(3)
    c, p = 3, 9
    s = rng.standard_normal((c, c))
    g_m = optimal_gram(s @ s.T + np.eye(c), 0.1, 0.1)
    w_hat, w_t = _head_with_gram(g_m, p, rng), rng.standard_normal((c, p))
    q = procrustes_rotation(w_hat, w_t)
    np.testing.assert_allclose(w_hat @ q, closest_head(w_t, g_m), atol=1e-10)


@pytest.mark.parametrize("kind", ["resmlp", "free"])
def test_align_keeps_predictions_and_gram(kind):
    rng = np.random.default_rng(5)
    c, p, n = 3, 16, 12
    if kind == "resmlp":
        bb = build_backbone(ResMLPConfig(width=8, feature_dim=p), (4,), n, seed=0)
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    else:
        bb = build_backbone(FreeFeatureConfig(feature_dim=p), (), n, seed=0)
        x = torch.arange(n)
    head = build_head(p, c, seed=1)
    g_m = optimal_gram(np.diag([2.0, 1.0, 0.5]), 0.1, 0.1)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(_head_with_gram(g_m, p, rng)))
    w_t = rng.standard_normal((c, p))
    bb.eval()
    with torch.no_grad():
        pred0, h0 = head(bb(x)).double().numpy(), bb(x).double().numpy()
    w0 = head.weight.detach().double().numpy()
    res = align(head, bb, w_t)
    with torch.no_grad():
        pred1, h1 = head(bb(x)).double().numpy(), bb(x).double().numpy()
    w1 = head.weight.detach().double().numpy()
    assert np.abs(pred1 - pred0).max() <= 1e-5 * np.abs(pred0).max()
    np.testing.assert_allclose(w1 @ w1.T, w0 @ w0.T, atol=1e-5 * np.abs(w0 @ w0.T).max())
    np.testing.assert_allclose(np.linalg.norm(h1, axis=1), np.linalg.norm(h0, axis=1), rtol=1e-5)  # penalty
    np.testing.assert_allclose(res.weight, closest_head(w_t, w0 @ w0.T), atol=1e-9)
    np.testing.assert_allclose(w1, res.weight, atol=1e-6)
    assert res.distance_after <= res.distance_before
    assert res.distance_after == pytest.approx(np.linalg.norm(res.weight - w_t), rel=1e-12)
    np.testing.assert_allclose(res.bias, head.bias.detach().double().numpy())


def test_align_after_training_keeps_objective():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 5, generator=g), torch.randn(32, 2, generator=g)
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 32, seed=0)
    head = build_head(8, 2, seed=1)
    res = train_local(bb, head, x, y, TrainConfig(batch_size=16, lr=1e-2), LocalProblem(epochs=2), device="cpu")
    before = evaluate_local(bb, head, x, y, lambda_h=0.01, lambda_w=0.01)
    out = align(head, bb, np.random.default_rng(0).standard_normal((2, 8)))
    after = evaluate_local(bb, (out.weight, out.bias), x, y, lambda_h=0.01, lambda_w=0.01)
    assert after.objective == pytest.approx(before.objective, rel=1e-5)
    assert after.mse == pytest.approx(res.metrics.train_mse, rel=1e-5)


def test_align_bad_shapes():
    bb = build_backbone(FreeFeatureConfig(feature_dim=4), (), 3, seed=0)
    with pytest.raises(TrainInputError, match="head's shape"):
        align(build_head(4, 2, seed=0), bb, np.zeros((2, 5)))
    with pytest.raises(TrainInputError, match="rotate_features"):
        align(build_head(4, 2, seed=0), torch.nn.Identity(), np.zeros((2, 4)))
