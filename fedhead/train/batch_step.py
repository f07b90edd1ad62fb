"""One minibatch step of local training: the interface the training loop's epoch calls, and its two
implementations.

A [`Step`][fedhead.train.batch_step.Step] takes one batch: the gradients of the minibatch loss
(each implementation its own way), then what every step does alike: the gradients of the
head-only terms, the gradient clip with its stop at a non-finite norm, the AdamW update at the
step's learning rate, and the step count.
[`AutogradStep`][fedhead.train.batch_step.AutogradStep] is the reference path (autograd and
``torch.optim.AdamW``: any backbone, CUDA, ``torch.compile``);
[`WrittenOutStep`][fedhead.train.batch_step.WrittenOutStep] is a ResMLP backbone's step written
out for the CPU ([`ResMLPStep`][fedhead.train.resmlp_step.ResMLPStep]) with AdamW's fused kernel
called directly, with the same results, bit for bit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch
from torch import nn

from fedhead.train.config import TrainDivergedError
from fedhead.train.local_loss import head_penalty_grads
from fedhead.train.problem import LocalProblem
from fedhead.train.resmlp_step import ResMLPStep
from fedhead.train.steps import StepLoss, clip_gradients, forward_loss
from fedhead.train.torch_private import fused_adamw_

__all__ = ["AutogradStep", "DirectAdamW", "Step", "StepRecipe", "WrittenOutStep"]


@dataclass(frozen=True)
class StepRecipe:
    """What every step of one training call does alike after its gradients.

    Attributes
    ----------
    problem : LocalProblem
        ``lambda_H``, ``lambda_W``, ``rho`` and ``gamma`` of the head-only terms.
    broadcast : Tensor or None
        The proximal term's ``W_t`` (None: no proximal term).
    delta : Tensor or None
        ``Sigma_cen - Sigma_m`` of the moment correction, float64 (None: no correction).
    clip_norm : float or None
        The gradient clip's threshold (None: no clip).
    lrs : list of float
        The learning rate of every step of the call.
    betas, eps
        AdamW's constants.
    """

    problem: LocalProblem
    broadcast: torch.Tensor | None
    delta: torch.Tensor | None
    clip_norm: float | None
    lrs: list[float]
    betas: tuple[float, float]
    eps: float


class Step(ABC):
    """One minibatch step: forward, backward, head-only terms, clip, optimizer update, count.

    Implementations give the minibatch loss's gradients and the clip and update on their own
    gradient storage; calling the step runs them in the order every step shares.
    """

    def __init__(self, weight: torch.Tensor, recipe: StepRecipe):
        self.weight, self.recipe = weight, recipe
        self.k = 0  #: the steps taken

    def __call__(
        self, xb: torch.Tensor, yb: torch.Tensor, center: torch.Tensor | None, batch_center: bool
    ) -> torch.Tensor:
        """One step on the batch ``(xb, yb)``; returns the batch's feature sum ``(P,)``.

        ``center`` and ``batch_center`` centre the features as in
        [`forward_loss`][fedhead.train.steps.forward_loss]. Raises
        [`TrainDivergedError`][fedhead.train.TrainDivergedError] at a non-finite gradient norm
        (where the clip reads it: on the CPU), before the update.
        """
        r, pb = self.recipe, self.recipe.problem
        hsum = self._gradients(xb, yb, center, batch_center)
        with torch.no_grad():
            head_penalty_grads(
                self.weight,
                self._head_grad(),
                lambda_w=pb.lambda_w,
                lambda_h=pb.lambda_h,
                rho=pb.rho,
                broadcast=r.broadcast,
                gamma=pb.gamma,
                sigma_delta=r.delta,
            )
            if r.clip_norm is not None:
                norm = self._clip(r.clip_norm)
                if norm is not None and not math.isfinite(norm):
                    self._diverged()
            self._update(r.lrs[self.k])
        self.k += 1
        return hsum

    @abstractmethod
    def close(self) -> None:
        """At the end of training: leave every ``.grad`` None, as after ``zero_grad(set_to_none=True)``."""

    @abstractmethod
    def _gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, center: torch.Tensor | None, batch_center: bool
    ) -> torch.Tensor:
        """The minibatch loss's gradients of every trained tensor; the batch's feature sum ``(P,)``."""

    @abstractmethod
    def _head_grad(self) -> torch.Tensor:
        """The head weight's gradient, where the head-only terms' gradients are added."""

    @abstractmethod
    def _clip(self, max_norm: float) -> float | None:
        """[`clip_gradients`][fedhead.train.steps.clip_gradients] of the step's gradients."""

    @abstractmethod
    def _update(self, lr: float) -> None:
        """The AdamW update at the learning rate ``lr``."""

    def _diverged(self) -> NoReturn:
        lrs = self.recipe.lrs
        raise TrainDivergedError(
            f"train_local: non-finite gradient norm at step {self.k} of {len(lrs)} "
            f"(lr {lrs[self.k]:.3g}); the model state is corrupted"
        )


class AutogradStep(Step):
    """The reference step: ``loss.backward()`` and ``torch.optim.AdamW(fused=True)``.

    ``loss`` is [`forward_loss`][fedhead.train.steps.forward_loss] or a compiled copy of it, used
    for batches of ``batch_size`` rows only (a shorter last batch would cost a second compile and
    runs eagerly). ``bias`` is the head bias as the step uses it (detached when held fixed);
    ``params`` the trained tensors; ``host_check``: read the clip's norm (CPU).
    """

    def __init__(
        self,
        backbone: nn.Module,
        weight: torch.Tensor,
        bias: torch.Tensor,
        params: list[torch.Tensor],
        recipe: StepRecipe,
        *,
        loss: StepLoss,
        batch_size: int,
        bf16: bool,
        host_check: bool,
    ):
        super().__init__(weight, recipe)
        self.backbone, self.bias, self.params = backbone, bias, params
        self.loss, self.batch_size, self.bf16, self.host_check = loss, batch_size, bf16, host_check
        self.opt = torch.optim.AdamW(
            params, lr=recipe.lrs[0], betas=recipe.betas, eps=recipe.eps, weight_decay=0.0, fused=True
        )
        self._group = self.opt.param_groups[0]

    def _gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, center: torch.Tensor | None, batch_center: bool
    ) -> torch.Tensor:
        fn = self.loss if xb.shape[0] == self.batch_size else forward_loss
        lambda_h = self.recipe.problem.lambda_h
        loss, hsum = fn(self.backbone, self.weight, self.bias, xb, yb, lambda_h, self.bf16, center, batch_center)
        loss.backward()
        return hsum

    def _head_grad(self) -> torch.Tensor:
        g = self.weight.grad
        assert g is not None  # the loss depends on the head weight
        return g

    def _clip(self, max_norm: float) -> float | None:
        return clip_gradients(self.params, max_norm, host_check=self.host_check)

    def _update(self, lr: float) -> None:
        self._group["lr"] = lr
        self.opt.step()
        for q in self.params:  # = opt.zero_grad(set_to_none=True), without its per-call hook overhead
            q.grad = None

    def close(self) -> None:
        """Nothing to do: every update leaves the gradients None."""


class WrittenOutStep(Step):
    """A ResMLP backbone's step on the CPU: the gradients of
    [`ResMLPStep`][fedhead.train.resmlp_step.ResMLPStep] (``kernel``), its screened clip and
    [`DirectAdamW`][fedhead.train.batch_step.DirectAdamW]: the same operations on the same values
    as [`AutogradStep`][fedhead.train.batch_step.AutogradStep], less Python and no autograd graph.
    ``bias`` is the head bias as the step uses it (detached when held fixed).
    """

    def __init__(self, kernel: ResMLPStep, bias: torch.Tensor, recipe: StepRecipe):
        super().__init__(kernel.head_weight, recipe)
        self.kernel, self.bias = kernel, bias
        self.adamw = DirectAdamW(kernel.params, kernel.grads, betas=recipe.betas, eps=recipe.eps)

    def _gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, center: torch.Tensor | None, batch_center: bool
    ) -> torch.Tensor:
        return self.kernel(self.bias, xb, yb, self.recipe.problem.lambda_h, center, batch_center)

    def _head_grad(self) -> torch.Tensor:
        return self.kernel.grad_head

    def _clip(self, max_norm: float) -> float:
        return self.kernel.clip_grad_norm(max_norm)

    def _update(self, lr: float) -> None:
        self.adamw.step(lr)

    def close(self) -> None:
        self.kernel.release()


class DirectAdamW:
    """``torch.optim.AdamW(params, fused=True, weight_decay=0)`` where every parameter has a
    gradient at every step: the same fused kernel
    ([`fused_adamw_`][fedhead.train.torch_private.fused_adamw_]) on the same state, without the
    optimizer's per-step Python work (grouping, state look-ups, hooks, one step counter per
    tensor). The kernel reads the step count only, so one counter serves every tensor.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        *,
        betas: tuple[float, float],
        eps: float,
    ):
        self.params, self.grads = list(params), list(grads)
        self.exp_avgs = [torch.zeros_like(p) for p in params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in params]
        self.step_count = torch.zeros((), dtype=torch.float32)
        self.steps = [self.step_count] * len(params)
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)

    def step(self, lr: float) -> None:
        """One update at the learning rate ``lr`` from the gradients in ``grads``."""
        self.step_count.add_(1)
        fused_adamw_(
            self.params,
            self.grads,
            self.exp_avgs,
            self.exp_avg_sqs,
            self.steps,
            lr=lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
        )
