"""Per-example DP in local training (fedhead/train/private_step.py): every row's gradient clipped to C,
the epsilon of a run's steps equal to Opacus's accountant for the same history, the refusals of what reads
rows outside the private steps, and DP off moving nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

from fedhead.federation.run_privacy import (
    release_event,
    round_training,
    run_accountant,
    run_epsilon,
    training_event,
)
from fedhead.models.backbones import FreeFeatureBackbone, ResMLP
from fedhead.train import LocalProblem, TrainConfig, train_local
from fedhead.train.batch_step import StepRecipe
from fedhead.train.config import TrainInputError
from fedhead.train.local_loss import minibatch_loss
from fedhead.train.private_step import PrivateStep

#: The recipe's parts that read rows outside the private steps, off.
PRIVATE = {"optimal_bias": False, "solve_last_layer": False, "finish_features": False, "local_tol": None}


def _net(seed: int = 0) -> tuple[nn.Module, nn.Linear]:
    torch.manual_seed(seed)
    return ResMLP(3, width=8, depth=1, feature_dim=4), nn.Linear(4, 2)


def _data(n: int = 24, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)


def _per_row_gradients(backbone, head, x, y, lambda_h) -> list[torch.Tensor]:
    """Each row's gradient of its own loss by plain autograd, flattened over every trained tensor."""
    params = list(backbone.parameters()) + list(head.parameters())
    out = []
    for i in range(x.shape[0]):
        h = backbone(x[i : i + 1])
        grads = torch.autograd.grad(minibatch_loss(h, head(h), y[i : i + 1], lambda_h), params)
        out.append(torch.cat([g.reshape(-1) for g in grads]))
    return out


def test_every_rows_gradient_is_clipped_to_c():
    backbone, head = _net()
    x, y = _data()
    y[3] *= 1e3  # one row far out: its gradient is far longer than C
    clip, batch = 0.5, 10
    rows = _per_row_gradients(backbone, head, x, y, 0.01)
    norms = torch.stack([r.norm() for r in rows])
    assert norms.max() > 100 * clip and norms.min() < clip  # some rows clipped, some not
    recipe = StepRecipe(LocalProblem(epochs=1), None, None, None, [1e-3], (0.9, 0.999), 1e-8)
    step = PrivateStep(
        backbone,
        head,
        recipe,
        noise_multiplier=0.0,
        max_grad_norm=clip,
        expected_batch_size=batch,
        generator=torch.Generator().manual_seed(0),
    )
    params = step.params
    for i, row in enumerate(rows):  # one row at a time: its contribution is exactly its clipped gradient
        step._gradients(x[i : i + 1], y[i : i + 1], None, False)
        contribution = torch.cat([p.grad.reshape(-1) for p in params]) * batch  # pyright: ignore[reportOptionalMemberAccess]
        assert contribution.norm() <= clip * (1 + 1e-5)
        expected = row * min(1.0, clip / (float(row.norm()) + 1e-6))
        torch.testing.assert_close(contribution, expected, rtol=1e-4, atol=1e-6)
        step.opt.zero_grad(set_to_none=True)
    # all rows at once: the sum of the clipped gradients over the expected batch
    step._gradients(x, y, None, False)
    summed = torch.cat([p.grad.reshape(-1) for p in params]) * batch  # pyright: ignore[reportOptionalMemberAccess]
    expected = sum(r * min(1.0, clip / (float(r.norm()) + 1e-6)) for r in rows)
    torch.testing.assert_close(summed, expected, rtol=1e-4, atol=1e-5)
    step.opt.zero_grad(set_to_none=True)
    step._gradients(x[:0], y[:0], None, False)  # an empty Poisson sample: a step of noise alone (here none)
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)  # pyright: ignore[reportArgumentType]
    step.close()
    assert not backbone._forward_hooks and not head._forward_hooks
    assert not any(hasattr(p, "grad_sample") or hasattr(p, "summed_grad") for p in params)


def test_a_private_run_reports_the_accountants_epsilon():
    backbone, head = _net()
    x, y = _data(40)
    cfg = TrainConfig(dp_noise=1.5, dp_clip=1.0, dp_sample_rate=0.1, warmup_steps=0, **PRIVATE)
    epochs, delta = 3, 1e-3
    before = [p.detach().clone() for p in head.parameters()]
    result = train_local(backbone, head, x, y, cfg, LocalProblem(epochs=epochs), device="cpu")
    assert result.metrics.n_steps == epochs * 10  # int(1 / q) Poisson-sampled steps an epoch
    assert not torch.equal(before[0], head.weight.detach())  # it trained
    assert np.all(np.isfinite(result.weight))
    training = round_training(cfg, epochs)
    assert training is not None and training.steps == result.metrics.n_steps
    reported = [run_epsilon((), (), training, t, delta) for t in (1, 2, 3)]
    # Opacus's own RDP accountant, at the same orders, for the same history (the two libraries' numerics
    # of the sampled Gaussian's RDP agree to a few 1e-4 here)
    orders = list(run_accountant([])._orders)
    opacus = RDPAccountant()
    for t, eps in zip((1, 2, 3), reported, strict=True):
        opacus.history = [(1.5, 0.1, result.metrics.n_steps)] * t
        assert eps == pytest.approx(opacus.get_epsilon(delta, alphas=orders), rel=1e-3)
    # and dp-accounting composed one step at a time, with an exchange (row unit) in front
    steps = [training_event(dataclasses.replace(training, steps=1))] * (2 * training.steps)
    whole = run_accountant([release_event(2.0), *steps])
    assert run_epsilon([2.0], (), training, 2, delta) == pytest.approx(whole.get_epsilon(delta), rel=1e-9)
    assert reported[0] < reported[1] < reported[2]
    assert run_epsilon(None, (), training, 1, delta) == float("inf")  # an exact exchange


@pytest.mark.parametrize("field", ["optimal_bias", "solve_last_layer", "finish_features", "local_tol"])
def test_dp_refuses_what_reads_rows_outside_the_private_steps(field):
    on = {**PRIVATE, field: 0.01 if field == "local_tol" else True}
    with pytest.raises(TrainInputError, match=r"per-example DP-SGD\) needs optimal_bias"):
        TrainConfig(dp_noise=1.0, **on)


def test_dp_refuses_the_correction_without_a_released_sigma_and_centring():
    backbone, head = _net()
    x, y = _data()
    cfg = TrainConfig(dp_noise=1.0, **PRIVATE)
    for problem in (LocalProblem(epochs=1, gamma=1.0), LocalProblem(epochs=1, center_targets=True)):
        with pytest.raises(TrainInputError, match=r"refuses gamma > 0 without a released Sigma_m, and centred"):
            train_local(backbone, head, x, y, cfg, problem, sigma_cen=np.eye(2), device="cpu")
    with pytest.raises(TrainInputError, match=r"centred targets"):
        train_local(backbone, head, x, y, cfg, LocalProblem(epochs=1, center_targets=True), released_sigma_m=np.eye(2))


def test_the_correction_under_dp_reads_the_released_sigma_not_the_rows():
    """With a released ``Sigma_m`` the correction's ``Sigma_cen - Sigma_m`` is the released one's: the corrected
    objective's covariance is ``Sigma_m + gamma (Sigma_cen - released)``, whatever the rows' own covariance."""
    from fedhead.train.finishing import objective_terms

    _, y = _data()
    cen, released = np.diag([2.0, 0.5]), np.array([[1.5, 0.2], [0.2, 0.7]])
    problem = LocalProblem(epochs=1, gamma=0.5)
    exact = objective_terms(y, problem, 4, None, cen, None)
    private = objective_terms(y, problem, 4, None, cen, None, released)
    np.testing.assert_allclose(private.delta, cen - released, rtol=0, atol=1e-15)
    np.testing.assert_allclose(exact.delta, cen - exact.sigma, rtol=0, atol=1e-15)
    np.testing.assert_allclose(private.trained_sigma, exact.sigma + 0.5 * (cen - released), rtol=1e-14, atol=1e-15)
    backbone, head = _net()
    x, _ = _data()
    result = train_local(
        backbone,
        head,
        x,
        y,
        TrainConfig(dp_noise=1.0, dp_sample_rate=0.5, **PRIVATE),
        problem,
        sigma_cen=cen,
        released_sigma_m=released,
        device="cpu",
    )
    assert np.isfinite(result.weight).all()


def test_dp_refuses_free_features_and_batchnorm():
    cfg = TrainConfig(dp_noise=1.0, **PRIVATE)
    x, y = _data(12)
    free = FreeFeatureBackbone(n_samples=12, feature_dim=4)
    with pytest.raises(TrainInputError, match=r"cannot train free features \(one per row\)"):
        train_local(free, nn.Linear(4, 2), torch.arange(12), y, cfg, LocalProblem(epochs=1), device="cpu")
    batchnorm = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Linear(8, 4))
    with pytest.raises(NotImplementedError, match=r"trainable layer with buffers"):  # Opacus's own refusal
        train_local(batchnorm, nn.Linear(4, 2), x, y, cfg, LocalProblem(epochs=1), device="cpu")


def test_dp_off_moves_nothing():
    """With dp_noise = 0 the DP settings change nothing, bit for bit (the fast step and the seeded batches)."""
    x, y = _data(30)
    results = []
    base = TrainConfig(batch_size=8, warmup_steps=0)
    for cfg in (base, dataclasses.replace(base, dp_clip=0.01, dp_sample_rate=0.5)):
        backbone, head = _net()
        results.append(train_local(backbone, head, x, y, cfg, LocalProblem(epochs=2), device="cpu", seed=3))
    a, b = results
    assert np.array_equal(a.weight, b.weight) and np.array_equal(a.bias, b.bias)
    assert a.metrics.n_steps == b.metrics.n_steps == 2 * 4
