"""train_local against the closed forms of theory.md §4/§5/§8 (free features = the UFM as a network)."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from fedhead.models import FreeFeatureConfig, ResMLPConfig, ResNetConfig, build_backbone, build_head
from fedhead.train import (
    LocalProblem,
    TrainConfig,
    TrainDivergedError,
    TrainInputError,
    add_head_penalty_grads,
    clip_gradients,
    cosine_schedule,
    evaluate_local,
    minibatch_loss,
    moment_correction_grad,
    moment_correction_torch,
    objective_from_features,
    select_device,
    train_local,
)
from fedhead.ufm import closest_head, moment_correction, optimal_gram, optimal_loss, profiled_objective

LAM = 0.1
N, C, P = 16, 2, 4
SIGMA_M = np.array([[1.5, 0.3], [0.3, 0.6]])
MU_M = np.array([0.5, -1.0])
SIGMA_CEN = np.array([[0.8, -0.4], [-0.4, 2.0]])


# The literal theory.md §10 recipe: trained bias, no warm start of the last layer, no finishing step, no warm-up.
LITERAL = dict(optimal_bias=False, solve_last_layer=False, finish_features=False, warmup_steps=0)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


PROBLEM_FIELDS = {f.name for f in dataclasses.fields(LocalProblem)}


def setup(**kw) -> tuple[TrainConfig, LocalProblem]:
    """The recipe and the problem of ``train_local`` from one set of keywords (defaults elsewhere)."""
    problem = {k: v for k, v in kw.items() if k in PROBLEM_FIELDS}
    return TrainConfig(**{k: v for k, v in kw.items() if k not in PROBLEM_FIELDS}), LocalProblem(**problem)


def ufm_config(**kw) -> tuple[TrainConfig, LocalProblem]:
    """Full-batch Adam long enough to reach the UFM optimum (a larger lr than the paper recipe)."""
    base = dict(epochs=1000, batch_size=N, lr=1e-2, lr_min=1e-5, lambda_h=LAM, lambda_w=LAM, clip_norm=None)
    base.update(kw)
    return setup(**base)


def free_model(seed=0, head_seed=1):
    return build_backbone(FreeFeatureConfig(feature_dim=P), (), N, seed), build_head(P, C, head_seed)


@pytest.fixture
def y_m(make_targets):
    return torch.tensor(make_targets(N, MU_M, SIGMA_M, seed=0), dtype=torch.float32)


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


def _tabular_client(seed=0, n=40, f=5, c=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g), torch.randn(n, c, generator=g)


def _train_resmlp(seed, x, y):
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (x.shape[1],), x.shape[0], seed=3)
    head = build_head(8, y.shape[1], seed=4)
    res = train_local(bb, head, x, y, *setup(epochs=3, batch_size=16, lr=1e-2), device="cpu", seed=seed)
    return res, bb


def test_deterministic_on_cpu():
    x, y = _tabular_client()
    (r1, b1), (r2, b2), (r3, _) = _train_resmlp(0, x, y), _train_resmlp(0, x, y), _train_resmlp(1, x, y)
    assert np.array_equal(r1.weight, r2.weight) and np.array_equal(r1.bias, r2.bias)
    assert all(torch.equal(a, b) for a, b in zip(b1.state_dict().values(), b2.state_dict().values()))
    assert r1.metrics.objective == r2.metrics.objective
    assert not np.array_equal(r1.weight, r3.weight)  # another permutation seed
    assert r1.metrics.n_steps == 3 * 3


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


def test_divergence_raises():
    """A NaN in the last layer: the first gradient norm is NaN (the last-layer solve, which would
    replace that layer, is off here; see the next test for a NaN it cannot remove)."""
    x, y = _tabular_client()
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3)
    with torch.no_grad():
        bb.proj.weight[0, 0] = float("nan")
    with pytest.raises(TrainDivergedError, match="non-finite gradient norm at step 0"):
        train_local(
            bb, build_head(8, 3, seed=4), x, y, *setup(epochs=1, batch_size=16, solve_last_layer=False), device="cpu"
        )
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3)
    with torch.no_grad():
        bb.proj.weight[0, 0] = float("nan")
    with pytest.raises(TrainDivergedError, match="training diverged"):
        train_local(
            bb,
            build_head(8, 3, seed=4),
            x,
            y,
            *setup(epochs=1, batch_size=16, clip_norm=None, solve_last_layer=False),
            device="cpu",
        )


def test_non_finite_features_are_refused_before_training():
    x, y = _tabular_client()
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3)
    with torch.no_grad():
        bb.stem[0].weight[0, 0] = float("nan")
    with pytest.raises(TrainDivergedError, match="non-finite"):
        train_local(bb, build_head(8, 3, seed=4), x, y, *setup(epochs=1, batch_size=16), device="cpu")


def test_cuda_only_flags_are_ignored_on_cpu(caplog):
    x, y = _tabular_client()
    plain, _ = _train_resmlp(0, x, y)
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3)
    cfg = setup(epochs=3, batch_size=16, lr=1e-2, bf16=True, cuda_graphs=True)
    with caplog.at_level("INFO", logger="fedhead.train"):
        fast = train_local(bb, build_head(8, 3, seed=4), x, y, *cfg, device="cpu", seed=0)
    assert "bf16/cuda_graphs are CUDA-only and ignored" in caplog.text
    assert np.array_equal(fast.weight, plain.weight)


def test_compiled_step_is_cached_across_calls_and_backbone_objects(monkeypatch, caplog):
    """cfg.compile: one compiled step per process; a new backbone object (as the client builds
    every round) and a new head reuse its graph; the short last batch runs eagerly; same result.
    Dynamo only (backend "eager"), so the test does not pay for an inductor compile."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import fedhead.train.steps as steps

    monkeypatch.setattr(steps, "_COMPILE_BACKEND", "eager")
    monkeypatch.setattr(steps, "_COMPILED_STEPS", {})
    torch._dynamo.reset()
    counters.clear()
    x, y = _tabular_client()  # N = 40, batches 16, 16, 8
    plain, _ = _train_resmlp(0, x, y)
    cfg = setup(epochs=3, batch_size=16, lr=1e-2, compile=True)
    results = []
    with caplog.at_level("INFO", logger="fedhead.train"):  # the trainer's and the compiled step's lines
        for _ in range(2):
            bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3)
            results.append(train_local(bb, build_head(8, 3, seed=4), x, y, *cfg, device="cpu", seed=0))
            # batch 16 only, traced once for both objects: one graph for the first epoch (the bias from the
            # batch's own mean feature) and one for the later epochs (from the previous epoch's mean)
            assert counters["stats"]["unique_graphs"] == 2
    assert caplog.text.count("created the torch.compile(mode=None) step") == 1
    assert "shorter last batch runs eagerly" in caplog.text
    np.testing.assert_allclose(results[0].weight, plain.weight, rtol=1e-5, atol=1e-6)
    assert np.array_equal(results[0].weight, results[1].weight)
    torch._dynamo.reset()


def test_training_lowers_objective_and_clip_keeps_finite():
    x, y = _tabular_client(n=64)
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 64, seed=0)
    head = build_head(8, 3, seed=1)
    before = evaluate_local(bb, head, x, y, lambda_h=0.01, lambda_w=0.01).objective
    res = train_local(bb, head, x, y, *setup(epochs=20, batch_size=16, lr=3e-3), device="cpu")
    assert np.isfinite(res.metrics.objective) and res.metrics.objective < 0.9 * before


def test_batchnorm_statistics_stay_with_backbone():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 1, 16, 16), dtype=torch.uint8, generator=g)
    y = torch.randn(8, 2, generator=g)
    bb = build_backbone(ResNetConfig(depth=18, feature_dim=8), (1, 16, 16), 8, seed=0)
    head = build_head(8, 2, seed=1)
    cfg = setup(epochs=1, batch_size=4)
    train_local(bb, head, x, y, *cfg, device="cpu")
    bn = bb.net.bn1
    assert int(bn.num_batches_tracked) == 2
    mean1 = bn.running_mean.clone()
    assert not torch.allclose(mean1, torch.zeros_like(mean1))
    train_local(bb, head, x, y, *cfg, device="cpu")
    assert int(bn.num_batches_tracked) == 4 and not torch.equal(bn.running_mean, mean1)


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


def test_select_device():
    assert select_device("cpu") == torch.device("cpu")
    assert select_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(TrainInputError, match="device must be"):
        select_device("tpu-ish")
    if not torch.cuda.is_available():
        with pytest.raises(TrainInputError, match="CUDA is not available"):
            select_device("cuda")


def _textbook_round(
    bb, head, x, y, *, epochs, batch, lr, lr_min, clip, lam_h, lam_w, rho, w_t, gamma, sigma_cen, center, seed
):
    """An independent plain implementation of one theory.md §2/§10 local round (all terms in autograd)."""
    y64 = y.double().numpy()
    mu, cov = y64.mean(0), np.cov(y64.T, bias=True)
    yt = y - torch.tensor(mu, dtype=torch.float32) if center else y
    d = torch.tensor(np.asarray(sigma_cen) - cov)
    params = list(bb.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=False)
    n = x.shape[0]
    steps = epochs * -(-n // batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr_min)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n, batch):
            idx = perm[s : s + batch]
            h = bb(x[idx])
            r = head(h) - yt[idx]
            loss = (
                0.5 * r.square().sum(1).mean()
                + 0.5 * lam_h * h.square().sum(1).mean()
                + 0.5 * lam_w * head.weight.square().sum()
                + 0.5 * rho * (head.weight - torch.tensor(w_t, dtype=torch.float32)).square().sum()
                + gamma * moment_correction_torch(head.weight, d, lam_h)
            )
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            sched.step()


def test_recipe_matches_textbook_loop_over_two_calls():
    """Minibatch scaling, lambda_W once per step, proximal and correction terms, centring, AdamW (wd 0)
    re-created per call, cosine per call, shuffled batches with a short last one, clip over all
    parameters including the head: train_local equals a plain loop with every term in autograd."""
    x, y = _tabular_client(seed=2, n=40, f=5, c=2)
    y = y * torch.tensor([2.0, 0.5]) + torch.tensor([1.0, -3.0])
    w_t = np.random.default_rng(7).standard_normal((2, 8))
    kw = dict(
        epochs=3, batch=16, lr=3e-3, lr_min=1e-4, clip=0.5, lam_h=0.05, lam_w=0.02, rho=0.3, gamma=0.8, center=True
    )
    cfg = setup(
        epochs=3,
        batch_size=16,
        lr=3e-3,
        lr_min=1e-4,
        clip_norm=0.5,
        lambda_h=0.05,
        lambda_w=0.02,
        rho=0.3,
        gamma=0.8,
        center_targets=True,
        **LITERAL,
    )
    models = [
        (build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3), build_head(8, 2, seed=4))
        for _ in range(2)
    ]
    for call, seed in enumerate((11, 12)):
        res = train_local(*models[0], x, y, *cfg, broadcast_weight=w_t, sigma_cen=SIGMA_CEN, device="cpu", seed=seed)
        _textbook_round(*models[1], x, y, w_t=w_t, sigma_cen=SIGMA_CEN, seed=seed, **kw)
        ours, ref = models[0][1].weight.detach().double().numpy(), models[1][1].weight.detach().double().numpy()
        assert rel(ours, ref) < 1e-5, f"call {call}"
        np.testing.assert_allclose(res.weight, ours)
        for (name, p0), p1 in zip(models[0][0].named_parameters(), models[1][0].parameters()):
            torch.testing.assert_close(p0, p1, rtol=1e-5, atol=1e-6, msg=f"call {call}: {name}")
    assert res.metrics.n_steps == 3 * 3
    # clipping was active (an unclipped run ends elsewhere)
    bb, head = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3), build_head(8, 2, seed=4)
    unclipped = train_local(
        bb,
        head,
        x,
        y,
        dataclasses.replace(cfg[0], clip_norm=None),
        cfg[1],
        broadcast_weight=w_t,
        sigma_cen=SIGMA_CEN,
        device="cpu",
        seed=11,
    )
    first_ours = build_head(8, 2, seed=4)
    train_local(
        build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3),
        first_ours,
        x,
        y,
        *cfg,
        broadcast_weight=w_t,
        sigma_cen=SIGMA_CEN,
        device="cpu",
        seed=11,
    )
    assert rel(unclipped.weight, first_ours.weight.detach().double().numpy()) > 1e-3


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
