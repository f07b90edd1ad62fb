"""The terms of the local objective and the loop's building blocks: minibatch loss, moment correction,
head penalty gradients, cosine schedule, gradient clipping, device choice (theory.md §2, §8)."""

import numpy as np
import pytest
import torch
from torch import nn
from train_helpers import (
    LAM,
)

from fedhead.train import (
    TrainInputError,
    add_head_penalty_grads,
    clip_gradients,
    cosine_schedule,
    minibatch_loss,
    moment_correction_grad,
    moment_correction_torch,
    objective_from_features,
    select_device,
)
from fedhead.ufm import moment_correction, profiled_objective


def test_minibatch_loss_full_pass_is_local_objective():
    rng = np.random.default_rng(0)
    h, y = rng.standard_normal((7, 5)), rng.standard_normal((7, 3))
    w, b = rng.standard_normal((3, 5)), rng.standard_normal(3)
    l_m = (0.5 / 7) * (np.sum((h @ w.T + b - y) ** 2) + LAM * np.sum(h**2)) + 0.5 * 0.3 * np.sum(w**2)  # theory.md §2
    ht, yt, wt, bt = (torch.tensor(a) for a in (h, y, w, b))
    loss = minibatch_loss(ht, ht @ wt.T + bt, yt, LAM) + 0.5 * 0.3 * wt.square().sum()
    assert float(loss) == pytest.approx(l_m, rel=1e-14)
    ev = objective_from_features(ht, yt, wt, bt, LAM, 0.3)
    assert ev.objective == pytest.approx(l_m, rel=1e-14)
    assert ev.mse == pytest.approx(np.mean((h @ w.T + b - y) ** 2), rel=1e-14)


def test_moment_correction_value_and_gradient():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 6))
    s_m, s_c = (a @ a.T + 0.5 * np.eye(3) for a in rng.standard_normal((2, 3, 3)))
    a_mat = w @ w.T + LAM * np.eye(3)
    expected = 0.5 * LAM * np.trace((s_c - s_m) @ np.linalg.inv(a_mat))  # theory.md §2
    wt = torch.tensor(w, requires_grad=True)
    d = torch.tensor(s_c - s_m)
    val = moment_correction_torch(wt, d, LAM)
    assert val.dtype == torch.float64 and val.item() == pytest.approx(expected, rel=1e-13)
    val.backward()
    np.testing.assert_allclose(moment_correction_grad(wt.detach(), d, LAM).numpy(), wt.grad.numpy(), rtol=1e-12)
    # central finite differences of the theory formula
    eps, fd = 1e-6, np.zeros_like(w)
    for i in np.ndindex(*w.shape):
        e = np.zeros_like(w)
        e[i] = eps
        f = [
            0.5 * LAM * np.trace((s_c - s_m) @ np.linalg.inv((w + s * e) @ (w + s * e).T + LAM * np.eye(3)))
            for s in (1, -1)
        ]
        fd[i] = (f[0] - f[1]) / (2 * eps)
    np.testing.assert_allclose(wt.grad.numpy(), fd, rtol=1e-6, atol=1e-9)


def test_torch_correction_matches_math_core_and_spec8_identity():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 7))
    s_m, s_c = (a @ a.T + 0.3 * np.eye(4) for a in rng.standard_normal((2, 4, 4)))
    wt = torch.tensor(w, requires_grad=True)
    val = moment_correction_torch(wt, torch.tensor(s_c - s_m), LAM)
    val.backward()
    ref = moment_correction(w, s_m, s_c, LAM, hessian=False)
    assert val.item() == pytest.approx(ref.value, rel=1e-12)
    np.testing.assert_allclose(wt.grad.numpy(), ref.grad, rtol=1e-10, atol=1e-13)
    # F(W; Sigma_m) + C_m(W) = F(W; Sigma_cen) (theory.md §8), value and gradient
    f_m, f_c = (profiled_objective(w, t, LAM, 0.2, hessian=False) for t in (s_m, s_c))
    assert f_m.value + val.item() == pytest.approx(f_c.value, rel=1e-12)
    np.testing.assert_allclose(f_m.grad + wt.grad.numpy(), f_c.grad, rtol=1e-10, atol=1e-13)


def test_head_penalty_grads_match_autograd_of_full_objective():
    rng = np.random.default_rng(2)
    w0, w_t = rng.standard_normal((2, 5)), rng.standard_normal((2, 5))
    d = torch.tensor(np.array([[0.4, 0.1], [0.1, -0.3]]))
    rho, gamma, lw = 0.2, 0.7, 0.05
    ref = torch.tensor(w0, requires_grad=True)
    total = (
        0.5 * lw * ref.square().sum()
        + 0.5 * rho * (ref - torch.tensor(w_t)).square().sum()
        + gamma * moment_correction_torch(ref, d, LAM)
    )
    total.backward()
    w = torch.tensor(w0, requires_grad=True)
    w.grad = torch.zeros_like(w)
    add_head_penalty_grads(
        w, lambda_w=lw, lambda_h=LAM, rho=rho, broadcast=torch.tensor(w_t), gamma=gamma, sigma_delta=d
    )
    np.testing.assert_allclose(w.grad.numpy(), ref.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_cosine_schedule_matches_torch_scheduler():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=37, eta_min=1e-5)
    ref = []
    for _ in range(37):
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(cosine_schedule(1e-3, 1e-5, 37), ref, rtol=1e-12)


@pytest.mark.parametrize("scale", [1e-3, 10.0])
def test_clip_gradients_matches_torch(scale):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(7, 3, generator=g) * scale, torch.randn(5, generator=g) * scale]
    ours = [nn.Parameter(torch.zeros_like(t)) for t in grads]
    ref = [nn.Parameter(torch.zeros_like(t)) for t in grads]
    for p_o, p_r, t in zip(ours, ref, grads):
        p_o.grad, p_r.grad = t.clone(), t.clone()
    norm = clip_gradients(ours, 5.0, host_check=True)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref, 5.0)
    assert norm == pytest.approx(float(ref_norm), rel=1e-6)
    for p_o, p_r in zip(ours, ref):
        torch.testing.assert_close(p_o.grad, p_r.grad, rtol=1e-6, atol=0)
    assert clip_gradients(ours, 5.0, host_check=False) is None


def test_select_device():
    assert select_device("cpu") == torch.device("cpu")
    assert select_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(TrainInputError, match="device must be"):
        select_device("tpu-ish")
    if not torch.cuda.is_available():
        with pytest.raises(TrainInputError, match="CUDA is not available"):
            select_device("cuda")
