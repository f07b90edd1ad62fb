"""The written-out ResMLP step (``TrainConfig.fast_step``, fedhead.train.resmlp_step) against the
reference path (autograd and ``torch.optim.AdamW``): the same gradients and the same training
calls, bit for bit (tolerance 0: ``torch.equal`` / ``np.array_equal``), and a clean fall-back
to autograd for everything it does not cover."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from train_helpers import LITERAL, SIGMA_CEN, setup

from fedhead.models import FreeFeatureConfig, ResMLPConfig, build_backbone, build_head
from fedhead.models.backbones import ResMLP
from fedhead.train import TrainDivergedError, train_local
from fedhead.train.resmlp_step import ResMLPStep
from fedhead.train.steps import forward_loss


def _client(n, f, c, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, f, generator=g), torch.randn(n, c, generator=g)
    x[0, 0] = 0.0  # an exact zero into the stem (PReLU at 0 takes the slope's branch)
    return x, y


def _model(f, c, width=16, depth=2, p=8, seed=3):
    bb = build_backbone(ResMLPConfig(width=width, depth=depth, feature_dim=p), (f,), 1, seed=seed)
    with torch.no_grad():  # distinct slopes, one negative, so every PReLU branch is exercised
        for i, m in enumerate(m for m in bb.modules() if isinstance(m, torch.nn.PReLU)):
            m.weight.fill_(0.3 - 0.17 * i)
    return bb, build_head(p, c, seed=seed + 1)


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.parametrize("mode", ["batch_center", "given_center", "trained_bias"])
@pytest.mark.parametrize(
    ("n", "f", "c", "width", "depth", "p"), [(100, 11, 3, 64, 3, 16), (7, 5, 2, 16, 2, 8), (3, 1, 1, 4, 0, 1)]
)
def test_gradients_equal_autograd(mode, n, f, c, width, depth, p):
    x, y = _client(n, f, c)
    bb, head = _model(f, c, width, depth, p)
    bb2, head2 = copy.deepcopy(bb), copy.deepcopy(head)
    center = torch.randn(p, generator=torch.Generator().manual_seed(5)) if mode == "given_center" else None
    batch_center = mode == "batch_center"
    trained = mode == "trained_bias"

    loss, hsum = forward_loss(
        bb, head.weight, head.bias if trained else head.bias.detach(), x, y, 0.07, False, center, batch_center
    )
    loss.backward()
    step = ResMLPStep.for_backbone(bb2, head2.weight, head2.bias if trained else None)
    assert step is not None
    hsum2 = step(head2.bias if trained else head2.bias.detach(), x, y, 0.07, center, batch_center)

    assert torch.equal(hsum, hsum2)
    for (name, p1), p2 in zip(
        [*bb.named_parameters(), *head.named_parameters()], [*bb2.parameters(), *head2.parameters()]
    ):
        if name == "bias" and not trained:
            assert p1.grad is None and p2.grad is None
            continue
        assert p2.grad is not None and torch.equal(p1.grad, p2.grad), name


@pytest.mark.parametrize("factor", [0.5, 0.999, 1.0 - 1e-7, 1.0, 1.001, 1.0099, 1.0101, 2.0])
def test_clip_screen_equals_the_reference_clip_at_and_around_the_threshold(factor):
    """The flat-norm screen of ``clip_grad_norm`` against ``clip_gradients``'s exact norm of norms:
    with ``max_norm`` at, just above and just below the total norm (and either side of the screen's
    margin, 1 % for this small model), the clipped gradients are the same bits and the clip fires
    exactly when it does there."""
    from fedhead.train.steps import clip_gradients

    x, y = _client(100, 11, 3)
    bb, head = _model(11, 3, 64, 3, 16)
    bb2, head2 = copy.deepcopy(bb), copy.deepcopy(head)
    loss, _ = forward_loss(bb, head.weight, head.bias, x, y, 0.07, False, None, True)
    loss.backward()
    params = [*bb.parameters(), head.weight, head.bias]
    exact = torch.nn.utils.get_total_norm([q.grad for q in params], foreach=True).item()
    max_norm = exact * factor
    before = [q.grad.clone() for q in params]
    ref = clip_gradients(params, max_norm, host_check=True)

    step = ResMLPStep.for_backbone(bb2, head2.weight, head2.bias)
    assert step is not None
    step(head2.bias, x, y, 0.07, None, True)
    got = step.clip_grad_norm(max_norm)

    assert all(torch.equal(a.grad, b) for a, b in zip(params, step.grads, strict=True))
    fired = any(not torch.equal(a, q.grad) for a, q in zip(before, params, strict=True))
    assert fired == (exact + 1e-6 > max_norm)
    assert ref is not None and (got == ref if factor < 1.01 else got == pytest.approx(ref, rel=1e-5))


def test_gradient_buffers_start_64_byte_aligned_with_zeros_between():
    """Each gradient starts where a tensor of its own would (MKL's small GEMMs can round
    differently into an output that starts elsewhere), in one flat buffer whose gaps stay zero."""
    x, y = _client(20, 5, 3)
    bb, head = _model(5, 3, width=12, depth=2, p=7)  # odd sizes: every gradient after the first needs a gap
    step = ResMLPStep.for_backbone(bb, head.weight, head.bias)
    assert step is not None
    step(head.bias, x, y, 0.07, None, True)
    flat = step._grads.flat
    assert all(g.data_ptr() % 64 == 0 and g.untyped_storage().data_ptr() == flat.data_ptr() for g in step.grads)
    gaps = torch.ones_like(flat, dtype=torch.bool)
    for g in step.grads:
        start = g.storage_offset()
        gaps[start : start + g.numel()] = False
    assert gaps.any() and not flat[gaps].any() and all(g.abs().sum() > 0 for g in step.grads)


def test_clip_screen_reports_non_finite_gradients():
    x, y = _client(20, 4, 2)
    bb, head = _model(4, 2)
    step = ResMLPStep.for_backbone(bb, head.weight, head.bias)
    assert step is not None
    step(head.bias, x, y, 0.07, None, True)
    step.grads[3].view(-1)[0] = float("nan")
    assert np.isnan(step.clip_grad_norm(1e6))
    step.grads[3].view(-1)[0] = float("inf")
    assert not np.isfinite(step.clip_grad_norm(1e6))


def _train(fast, bb, head, x, y, cfg, problem, **kw):
    return train_local(bb, head, x, y, dataclasses.replace(cfg, fast_step=fast), problem, device="cpu", **kw)


def _both_ways(monkeypatch, make, x, y, cfg, problem, calls=1, **kw):
    """Train the same seeded problem ``calls`` times with the reference path and with the fast
    step; return both final results and models, and how many fast steps ran."""
    ran = []
    original = ResMLPStep.__call__

    def counted(self, *a, **k):
        ran.append(1)
        return original(self, *a, **k)

    out = []
    for fast in (False, True):
        bb, head = make()
        with monkeypatch.context() as m:
            if fast:
                m.setattr(ResMLPStep, "__call__", counted)
            for call in range(calls):
                res = _train(fast, bb, head, x, y, cfg, problem, seed=11 + call, **kw)
        out.append((res, bb, head))
    return out, len(ran)


def _assert_same(ref, new):
    (r0, b0, h0), (r1, b1, h1) = ref, new
    assert np.array_equal(r0.weight, r1.weight) and np.array_equal(r0.bias, r1.bias)
    assert _same_state(b0, b1) and _same_state(h0, h1)
    assert r0.metrics.objective == r1.metrics.objective and r0.metrics.trained_gap == r1.metrics.trained_gap
    assert r0.metrics.n_steps == r1.metrics.n_steps


def test_rho_preset_call_equals_reference_bit_for_bit(monkeypatch):
    """The fixed-E tabular call of the rho preset at scale=cpu in small: full batch, proximal term,
    no tolerance stop, no finishing rotation, the default recipe (optimal bias, last-layer warm
    start, warm-up, clip); two calls, as two rounds."""
    x, y = _client(100, 11, 3)
    w_t = np.random.default_rng(7).standard_normal((3, 16)) * 0.1
    cfg, problem = setup(epochs=30, lr=3e-3, finish_rotation=False, rho=1e-3)
    (ref, new), n_fast = _both_ways(
        monkeypatch, lambda: _model(11, 3, 64, 3, 16), x, y, cfg, problem, calls=2, broadcast_weight=w_t
    )
    assert n_fast == 2 * 30
    _assert_same(ref, new)


def test_minibatches_literal_recipe_correction_and_active_clip_equal_reference(monkeypatch):
    """Shuffled minibatches with a short last one, the trained bias, the moment correction, the
    proximal term, centring, and a clip that is active in every step."""
    x, y = _client(40, 5, 2, seed=2)
    w_t = np.random.default_rng(7).standard_normal((2, 8))
    cfg, problem = setup(
        epochs=4, batch_size=16, lr=3e-3, lr_min=1e-4, clip_norm=1e-3, lambda_h=0.05, lambda_w=0.02,
        rho=0.3, gamma=0.8, center_targets=True, **LITERAL,
    )  # fmt: skip
    (ref, new), n_fast = _both_ways(
        monkeypatch, lambda: _model(5, 2), x, y, cfg, problem, broadcast_weight=w_t, sigma_cen=SIGMA_CEN
    )
    assert n_fast == 4 * 3
    _assert_same(ref, new)


def test_minibatches_optimal_bias_with_tolerance_checks_equal_reference(monkeypatch):
    """Minibatches with the previous epoch's mean feature as the centre, and tolerance checks
    (last-layer solves between epochs) that keep running while the step holds its buffers."""
    x, y = _client(40, 5, 3, seed=4)
    cfg, problem = setup(epochs=12, batch_size=16, lr=1e-2, local_tol=1e-9, check_every=3)
    (ref, new), _ = _both_ways(monkeypatch, lambda: _model(5, 3), x, y, cfg, problem)
    assert len(ref[0].metrics.gap_trace) > 1
    _assert_same(ref, new)


def test_gradients_left_before_training_are_added_and_none_remain_after(monkeypatch):
    x, y = _client(40, 5, 3)
    cfg, problem = setup(epochs=2, batch_size=16, lr=1e-2)

    def make():
        bb, head = _model(5, 3)
        for p in [*bb.parameters(), head.weight]:
            p.grad = torch.full_like(p, 0.01)
        return bb, head

    (ref, new), n_fast = _both_ways(monkeypatch, make, x, y, cfg, problem)
    assert n_fast == 2 * 3
    _assert_same(ref, new)
    assert all(p.grad is None for p in [*new[1].parameters(), *new[2].parameters()])


def test_non_finite_gradient_raises_on_the_fast_path():
    x, y = _client(40, 5, 3)
    bb, head = _model(5, 3)
    with torch.no_grad():
        bb.proj.weight[0, 0] = float("nan")
    cfg, problem = setup(epochs=1, batch_size=16, solve_last_layer=False)
    with pytest.raises(TrainDivergedError, match="non-finite gradient norm at step 0"):
        _train(True, bb, head, x, y, cfg, problem)


def test_other_models_fall_back_to_autograd(monkeypatch):
    """Hooks, a slope per channel, a frozen layer, a subclass and another backbone: no fast step,
    and training runs (and equals the reference path, which it then is)."""
    x, y = _client(40, 5, 3)
    cfg, problem = setup(epochs=2, batch_size=16, lr=1e-2)

    class Sub(ResMLP):
        pass

    def hooked():
        bb, head = _model(5, 3)
        bb.blocks[0].register_forward_hook(lambda m, i, o: o * 1.0)
        return bb, head

    def channel_slopes():
        bb, head = _model(5, 3)
        bb.blocks[0].act1 = torch.nn.PReLU(16)
        return bb, head

    def frozen():
        bb, head = _model(5, 3)
        bb.stem[0].weight.requires_grad_(False)
        return bb, head

    def subclass():
        bb, head = _model(5, 3)
        bb.__class__ = Sub
        return bb, head

    built = []
    original = ResMLPStep.for_backbone.__func__

    def spy(cls, *a, **k):
        built.append(original(cls, *a, **k))
        return built[-1]

    monkeypatch.setattr(ResMLPStep, "for_backbone", classmethod(spy))
    for make in (hooked, channel_slopes, frozen, subclass):
        built.clear()
        (ref, new), n_fast = _both_ways(monkeypatch, make, x, y, cfg, problem)
        assert built == [None] and n_fast == 0, make.__name__
        _assert_same(ref, new)
    # free features take indices, not float inputs: the step is not even looked for
    built.clear()
    (ref, new), n_fast = _both_ways(
        monkeypatch,
        lambda: (build_backbone(FreeFeatureConfig(feature_dim=8), (), 40, 0), build_head(8, 3, seed=1)),
        torch.arange(40),
        y,
        cfg,
        problem,
    )
    assert built == [] and n_fast == 0
    _assert_same(ref, new)
