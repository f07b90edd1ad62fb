"""Every private PyTorch API of the training step, each behind one named function.

The written-out ResMLP step ([`fedhead.train.resmlp_step`][fedhead.train.resmlp_step]) calls ATen
kernels that ``torch.nn.functional`` and ``torch.optim`` wrap in Python, and reads the hook
dictionaries that decide whether a hand-written forward and backward may stand in for a module's
own. None of these is public API: a PyTorch release may rename or change them.
``tests/train/test_torch_private.py`` pins what each does on the installed torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "foreach_norm",
    "fused_adamw_",
    "has_global_module_hooks",
    "has_hooks",
    "leaky_relu",
    "leaky_relu_backward",
]

_leaky_relu = torch._C._nn.leaky_relu  # pyright: ignore[reportAttributeAccessIssue]
_leaky_relu_backward = torch.ops.aten.leaky_relu_backward.grad_input


def leaky_relu(x: torch.Tensor, slope: float, out: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.leaky_relu(x, slope)`` (``x > 0 ? x : slope x``) into ``out``; returns ``out``."""
    return _leaky_relu(x, slope, out=out)


def leaky_relu_backward(g: torch.Tensor, x: torch.Tensor, slope: float, out: torch.Tensor) -> torch.Tensor:
    """The gradient ``x > 0 ? g : slope g`` of ``leaky_relu(x, slope)`` for the output gradient
    ``g``, as autograd computes it, into ``out``; returns ``out``."""
    return _leaky_relu_backward(g, x, slope, False, grad_input=out)


def foreach_norm(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The 2-norm of each tensor (the per-tensor norms of ``torch.nn.utils.get_total_norm``)."""
    return list(torch._foreach_norm(list(tensors)))  # pyright: ignore[reportPrivateImportUsage]


def fused_adamw_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """The kernel of ``torch.optim.AdamW(fused=True, weight_decay=0, amsgrad=False)``: updates
    ``params``, ``exp_avgs`` and ``exp_avg_sqs`` in place for the step counts ``steps`` (float32
    scalars), which it reads only: the caller adds 1 to them first, as the optimizer does."""
    torch._fused_adamw_(  # pyright: ignore[reportPrivateImportUsage]
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        amsgrad=False,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=0.0,
        eps=eps,
        maximize=False,
        grad_scale=None,
        found_inf=None,
    )


def has_hooks(module: nn.Module) -> bool:
    """Whether ``module`` or one of its own parameters (not a submodule's) holds a hook that a
    hand-written forward or backward would skip: forward, forward-pre, backward and backward-pre
    hooks of the module, gradient and post-accumulate-grad hooks of its parameters."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
        or any(
            getattr(p, "_backward_hooks", None) or getattr(p, "_post_accumulate_grad_hooks", None)
            for p in module.parameters(recurse=False)
        )
    )


def has_global_module_hooks() -> bool:
    """Whether a hook is registered for every module (``torch.nn.modules.module.register_module_*_hook``)."""
    m = torch.nn.modules.module
    return bool(
        m._global_forward_hooks
        or m._global_forward_pre_hooks
        or m._global_backward_hooks
        or m._global_backward_pre_hooks
    )
