"""What each private PyTorch API of fedhead.train.torch_private does on the installed torch.

The written-out ResMLP step stands in for ``torch.nn.functional``, autograd and ``torch.optim`` by
calling their kernels directly, and decides from the hook dictionaries whether it may: an upgrade
that renames a kernel, changes its results or moves a hook elsewhere fails here, by name, instead
of changing training results or skipping a user's hook silently.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedhead.train import torch_private as tp


def _inputs(*shape: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    if x.numel() >= 3:
        x.view(-1)[:3] = torch.tensor([0.0, -0.0, 1e-30])  # the branch point and a tiny positive value
    return x


@pytest.mark.parametrize("slope", [0.25, -0.17, 0.0, 1.0])
def test_leaky_relu_is_functional_leaky_relu(slope):
    x = _inputs(100, 64)
    out = torch.empty_like(x)
    got = tp.leaky_relu(x, slope, out)
    assert got is out and torch.equal(out, F.leaky_relu(x, slope))
    # and a one-slope PReLU, which the step computes with it
    assert torch.equal(out, F.prelu(x, torch.tensor([slope])))


@pytest.mark.parametrize("slope", [0.25, -0.17])
def test_leaky_relu_backward_is_autograds_gradient(slope):
    x, g = _inputs(100, 64).requires_grad_(True), _inputs(100, 64, seed=1)
    F.leaky_relu(x, slope).backward(g)
    out = torch.empty_like(g)
    got = tp.leaky_relu_backward(g, x.detach(), slope, out)
    assert got is out and x.grad is not None and torch.equal(out, x.grad)
    assert torch.equal(out, torch.where(x.detach() > 0, g, g * slope))


def test_foreach_norm_is_the_per_tensor_norm_and_gives_get_total_norm():
    tensors = [_inputs(64, 11, seed=1), _inputs(64, seed=2), _inputs(1, seed=3), _inputs(3, 512, seed=4)]
    norms = tp.foreach_norm(tensors)
    assert len(norms) == len(tensors)
    assert all(torch.equal(n, torch.linalg.vector_norm(t, 2.0)) for n, t in zip(norms, tensors, strict=True))
    total = torch.nn.utils.get_total_norm(tensors, foreach=True)
    assert torch.equal(torch.linalg.vector_norm(torch.stack(norms), 2.0), total)


def test_fused_adamw_is_torch_optim_adamw_and_reads_the_shared_step_count():
    """Five updates of three tensors with one step counter for all (as DirectAdamW keeps it),
    against ``torch.optim.AdamW(fused=True)`` (the trainer's reference path) bit for bit, and
    against the single-tensor AdamW to rounding (the kernel is Adam with decoupled decay 0)."""
    shapes = [(16, 11), (16,), (1,)]
    start = [_inputs(*s, seed=i) for i, s in enumerate(shapes)]
    grads = [[_inputs(*s, seed=10 * k + i) for i, s in enumerate(shapes)] for k in range(5)]
    lrs = [1e-3, 2e-3, 3e-3, 1.5e-3, 5e-4]
    betas, eps = (0.9, 0.99), 1e-8

    def optimizer_run(**kind) -> list[torch.Tensor]:
        params = [nn.Parameter(p.clone()) for p in start]
        opt = torch.optim.AdamW(params, lr=lrs[0], betas=betas, eps=eps, weight_decay=0.0, **kind)
        for gs, lr in zip(grads, lrs, strict=True):
            for p, g in zip(params, gs, strict=True):
                p.grad = g.clone()
            opt.param_groups[0]["lr"] = lr
            opt.step()
        return [p.detach() for p in params]

    params = [p.clone() for p in start]
    exp_avgs, exp_avg_sqs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    count = torch.zeros((), dtype=torch.float32)
    for k, (gs, lr) in enumerate(zip(grads, lrs, strict=True)):
        count.add_(1)
        tp.fused_adamw_(params, gs, exp_avgs, exp_avg_sqs, [count] * 3, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps)
        assert count.item() == k + 1  # read, not advanced
    fused = optimizer_run(fused=True)
    assert all(torch.equal(a, b) for a, b in zip(params, fused, strict=True))
    single = optimizer_run(foreach=False)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-9) for a, b in zip(params, single, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(params, start, strict=True))


def _hooks():
    """Every kind of hook the step's check must see: (name, register on a Linear)."""
    return [
        ("forward", lambda m: m.register_forward_hook(lambda mod, i, o: o)),
        ("forward_pre", lambda m: m.register_forward_pre_hook(lambda mod, i: i)),
        ("full_backward", lambda m: m.register_full_backward_hook(lambda mod, gi, go: gi)),
        ("full_backward_pre", lambda m: m.register_full_backward_pre_hook(lambda mod, go: go)),
        ("parameter_grad", lambda m: m.weight.register_hook(lambda g: g)),
        ("parameter_post_accumulate", lambda m: m.bias.register_post_accumulate_grad_hook(lambda p: None)),
    ]


@pytest.mark.parametrize(("kind", "register"), _hooks(), ids=[k for k, _ in _hooks()])
def test_has_hooks_sees_each_kind_on_the_module_only(kind, register):
    layer, outer = nn.Linear(3, 2), nn.Sequential()
    outer.append(layer)
    assert not tp.has_hooks(layer) and not tp.has_hooks(outer)
    handle = register(layer)
    assert tp.has_hooks(layer), kind
    assert not tp.has_hooks(outer)  # a submodule's hooks are its own (the step checks every module)
    handle.remove()
    assert not tp.has_hooks(layer)


@pytest.mark.parametrize(
    "register",
    [
        nn.modules.module.register_module_forward_hook,
        nn.modules.module.register_module_forward_pre_hook,
        nn.modules.module.register_module_full_backward_hook,
        nn.modules.module.register_module_full_backward_pre_hook,
    ],
    ids=lambda f: f.__name__,
)
def test_has_global_module_hooks_sees_each_kind(register):
    assert not tp.has_global_module_hooks()
    handle = register(lambda *a: None)
    try:
        assert tp.has_global_module_hooks()
    finally:
        handle.remove()
    assert not tp.has_global_module_hooks()
