"""The training loop of train_local: determinism, divergence, CPU fast path and compiled step,
BatchNorm state, and the recipe against a plain textbook loop (theory.md §10)."""

import dataclasses

import numpy as np
import pytest
import torch
from train_helpers import (
    LITERAL,
    SIGMA_CEN,
    rel,
    setup,
    tabular_client,
    train_resmlp,
)

from fedhead.models import ResMLPConfig, ResNetConfig, build_backbone, build_head
from fedhead.train import (
    TrainDivergedError,
    evaluate_local,
    moment_correction_torch,
    train_local,
)


def test_deterministic_on_cpu():
    x, y = tabular_client()
    (r1, b1), (r2, b2), (r3, _) = train_resmlp(0, x, y), train_resmlp(0, x, y), train_resmlp(1, x, y)
    assert np.array_equal(r1.weight, r2.weight) and np.array_equal(r1.bias, r2.bias)
    assert all(torch.equal(a, b) for a, b in zip(b1.state_dict().values(), b2.state_dict().values()))
    assert r1.metrics.objective == r2.metrics.objective
    assert not np.array_equal(r1.weight, r3.weight)  # another permutation seed
    assert r1.metrics.n_steps == 3 * 3


def test_divergence_raises():
    """A NaN in the last layer: the first gradient norm is NaN (the last-layer solve, which would
    replace that layer, is off here; see the next test for a NaN it cannot remove)."""
    x, y = tabular_client()
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
    x, y = tabular_client()
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (5,), 40, seed=3)
    with torch.no_grad():
        bb.stem[0].weight[0, 0] = float("nan")
    with pytest.raises(TrainDivergedError, match="non-finite"):
        train_local(bb, build_head(8, 3, seed=4), x, y, *setup(epochs=1, batch_size=16), device="cpu")


def test_cuda_only_flags_are_ignored_on_cpu(caplog):
    x, y = tabular_client()
    plain, _ = train_resmlp(0, x, y)
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
    x, y = tabular_client()  # N = 40, batches 16, 16, 8
    plain, _ = train_resmlp(0, x, y)
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
    x, y = tabular_client(n=64)
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
    x, y = tabular_client(seed=2, n=40, f=5, c=2)
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
