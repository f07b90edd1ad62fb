"""train_local against the closed forms of theory.md §4/§5/§8 (free features: the UFM as a network); its metrics."""

import numpy as np
import pytest
import torch
from train_helpers import (
    LAM,
    MU_M,
    SIGMA_CEN,
    SIGMA_M,
    C,
    N,
    P,
    free_model,
    rel,
    setup,
    ufm_config,
)

from fedhead.models import ResNetConfig, build_backbone, build_head
from fedhead.train import (
    TrainInputError,
    evaluate_local,
    train_local,
)
from fedhead.ufm import closest_head, optimal_gram, optimal_loss


@pytest.mark.parametrize("center", [False, True])
def test_free_features_reach_optimal_gram_and_bias(y_m, center):
    bb, head = free_model()
    res = train_local(bb, head, torch.arange(N), y_m, *ufm_config(center_targets=center), device="cpu")
    g_m = optimal_gram(SIGMA_M, LAM, LAM)
    assert rel(res.weight @ res.weight.T, g_m) < 1e-3
    expected_bias = np.zeros(C) if center else MU_M
    np.testing.assert_allclose(res.bias, expected_bias, atol=1e-3)
    np.testing.assert_allclose(res.target_offset, MU_M if center else np.zeros(C), atol=1e-6)
    m = res.metrics
    assert m.optimal_objective == pytest.approx(optimal_loss(SIGMA_M, LAM, LAM), rel=1e-6)  # float32 targets
    assert -1e-5 < m.relative_gap < 1e-5
    assert m.n_steps == 1000 and m.epochs == 1000 and m.n_samples == N and m.steps_per_second > 0
    # the returned head is the module's head, and the metrics match an independent evaluation
    np.testing.assert_allclose(res.weight, head.weight.detach().double().numpy())
    ev = evaluate_local(
        bb, (res.weight, res.bias), torch.arange(N), y_m, lambda_h=LAM, lambda_w=LAM, target_offset=res.target_offset
    )
    assert ev.objective == pytest.approx(m.objective, rel=1e-6) and ev.mse == pytest.approx(m.train_mse, rel=1e-6)


@pytest.mark.parametrize("gamma,center", [(1.0, False), (0.5, True)])
def test_correction_moves_optimum_to_phi_of_mixed_covariance(y_m, gamma, center):
    """gamma = 1: optimal Gram phi(Sigma_cen); gamma = 0.5 with client-wise centring (Sigma_m is the
    centred targets' covariance too): phi of the mixture, bias 0 (theory.md §8)."""
    bb, head = free_model()
    res = train_local(
        bb,
        head,
        torch.arange(N),
        y_m,
        *ufm_config(gamma=gamma, center_targets=center),
        sigma_cen=SIGMA_CEN,
        device="cpu",
    )
    target = optimal_gram((1 - gamma) * SIGMA_M + gamma * SIGMA_CEN, LAM, LAM)  # theory.md §8
    assert rel(res.weight @ res.weight.T, target) < 1e-3
    np.testing.assert_allclose(res.bias, np.zeros(C) if center else MU_M, atol=1e-3)


def test_small_rho_returns_head_closer_to_selection(y_m):
    w_t = np.random.default_rng(10).standard_normal((C, P)) * 0.7
    pi_m = closest_head(w_t, optimal_gram(SIGMA_M, LAM, LAM))
    dist = {}
    for rho in (0.0, 1e-2):
        bb, head = free_model()
        with torch.no_grad():
            head.weight.copy_(torch.as_tensor(w_t))
        res = train_local(bb, head, torch.arange(N), y_m, *ufm_config(rho=rho), broadcast_weight=w_t, device="cpu")
        dist[rho] = np.linalg.norm(res.weight - pi_m)
    assert dist[1e-2] < 0.6 * dist[0.0]


def test_metrics_are_plain_objective_in_eval_mode():
    """objective = L_m of the trained model (eval-mode BatchNorm, no proximal/correction terms),
    relative gap against optimal_loss(cov(y)), train MSE; an independent float64 computation."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (12, 1, 16, 16), dtype=torch.uint8, generator=g)
    y = torch.randn(12, 2, generator=g) * 3 + 1
    bb = build_backbone(ResNetConfig(depth=18, feature_dim=8), (1, 16, 16), 12, seed=0)
    head = build_head(8, 2, seed=1)
    w_t = np.ones((2, 8))
    cfg = setup(epochs=2, batch_size=8, rho=0.5, gamma=1.0, lambda_h=0.03, lambda_w=0.02)
    res = train_local(bb, head, x, y, *cfg, broadcast_weight=w_t, sigma_cen=SIGMA_CEN, device="cpu")
    assert bb.training  # left in training mode, BatchNorm statistics updated by the 4 steps
    assert int(bb.net.bn1.num_batches_tracked) == 4
    bb.eval()
    with torch.no_grad():
        h = bb(x.float() / 255).double().numpy()
    y64 = y.double().numpy()
    w, b = res.weight, res.bias
    l_m = (0.5 * np.sum((h @ w.T + b - y64) ** 2) + 0.5 * 0.03 * np.sum(h**2)) / 12 + 0.5 * 0.02 * np.sum(w**2)
    m = res.metrics
    assert m.objective == pytest.approx(l_m, rel=1e-5)
    l_star = optimal_loss(np.cov(y64.T, bias=True), 0.03, 0.02)
    assert m.optimal_objective == pytest.approx(l_star, rel=1e-10)
    assert m.relative_gap == pytest.approx((l_m - l_star) / l_star, rel=1e-4)
    assert m.train_mse == pytest.approx(np.mean((h @ w.T + b - y64) ** 2), rel=1e-5)
    assert m.n_steps == 4 and m.steps_per_second > 0 and m.device == "cpu"


def test_sigma_m_must_be_the_targets_covariance(y_m):
    bb, head = free_model()
    cfg = ufm_config(epochs=1, gamma=1.0)
    cov = np.cov(y_m.double().numpy().T, bias=True)
    res = train_local(bb, head, torch.arange(N), y_m, *cfg, sigma_cen=SIGMA_CEN, sigma_m=cov, device="cpu")
    assert np.isfinite(res.metrics.objective)
    with pytest.raises(TrainInputError, match="sigma_m differs from the covariance of the targets"):
        train_local(bb, head, torch.arange(N), y_m, *cfg, sigma_cen=SIGMA_CEN, sigma_m=4 * cov, device="cpu")
