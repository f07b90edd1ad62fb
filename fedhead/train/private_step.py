"""Per-example differential privacy in local training (``TrainConfig.dp_noise > 0``): DP-SGD through Opacus.

[`PrivateStep`][fedhead.train.private_step.PrivateStep] is the training loop's
[`Step`][fedhead.train.batch_step.Step] under DP. Each step takes a Poisson sample of the site's rows
(each row with probability ``q``, Opacus's ``UniformWithReplacementSampler``:
[`poisson_batches`][fedhead.train.private_step.poisson_batches]), computes every row's gradient of
its own loss ``1/2 ||W h_i + b - y_i||^2 + lambda_H/2 ||h_i||^2`` (Opacus's ``GradSampleModule``),
clips each to the L2 norm ``C`` over all trained tensors, sums them, adds Gaussian noise of standard
deviation ``sigma C`` and divides by the expected batch ``q N`` (Opacus's ``DPOptimizer``). That is
one sampled Gaussian mechanism of noise multiplier ``sigma`` at rate ``q`` per step, add-or-remove-one
row (Abadi et al. 2016). The head-only terms (``lambda_W``, the proximal pull to the public
broadcast) are added after the noise: they read no row. AdamW then updates on the noised gradient.

Neither the written-out ResMLP step nor ``torch.compile`` runs under DP: the per-example gradients
need Opacus's hooks, and a fast step that skips them would skip the clip. The randomness (the samples
and the noise) comes from the operating system's entropy, never from the run's seed, which the
server knows.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import torch
from opacus.grad_sample import GradSampleModule
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn

from fedhead.train.batch_step import Step, StepRecipe
from fedhead.train.local_loss import minibatch_loss
from fedhead.train.steps import clip_gradients

__all__ = ["PrivateStep", "poisson_batches", "private_generator"]


class _Predictor(nn.Module):
    """The backbone and the head as one module: ``x -> (W h + b, h)``, whose layers Opacus hooks."""

    def __init__(self, backbone: nn.Module, head: nn.Linear):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.backbone(x).float()
        return self.head(h), h


def private_generator() -> torch.Generator:
    """A CPU generator seeded from the operating system's entropy (a seed the server could know would
    let it remove the noise and see the samples)."""
    generator = torch.Generator()
    generator.seed()
    return generator


def poisson_batches(n: int, sample_rate: float, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` Poisson samples of ``range(n)``, each row in each with probability ``sample_rate``
    (Opacus's ``UniformWithReplacementSampler``); an empty sample is a step too."""
    sampler = UniformWithReplacementSampler(num_samples=n, sample_rate=sample_rate, generator=generator, steps=steps)
    for indices in sampler:
        yield torch.as_tensor(indices, dtype=torch.long)


class PrivateStep(Step):
    """One DP-SGD step (module docstring): Opacus's per-example gradients, clip and noise, then the
    head-only terms, the global clip (``recipe.clip_norm``, post-processing) and AdamW.

    Parameters
    ----------
    backbone, head
        Trained in place (the head's bias too: under DP it is not held at an optimum).
    recipe : StepRecipe
        The call's learning rates and head-only terms (``delta`` must be None: no correction).
    noise_multiplier, max_grad_norm : float
        ``sigma > 0`` and ``C > 0``.
    expected_batch_size : int
        ``q N``, rounded (Opacus divides the noised sum by it).
    generator : torch.Generator
        The noise's generator ([`private_generator`][fedhead.train.private_step.private_generator] in a run).
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Linear,
        recipe: StepRecipe,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        generator: torch.Generator,
    ):
        super().__init__(head.weight, recipe)  # recipe.delta: a released Sigma_m's (train_local checks it)
        self.model = GradSampleModule(_Predictor(backbone, head), loss_reduction="mean")
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        inner = torch.optim.AdamW(
            self.params, lr=recipe.lrs[0], betas=recipe.betas, eps=recipe.eps, weight_decay=0.0, fused=True
        )
        self.opt = DPOptimizer(
            inner,
            noise_multiplier=float(noise_multiplier),
            max_grad_norm=float(max_grad_norm),
            expected_batch_size=max(1, int(expected_batch_size)),
            loss_reduction="mean",
            generator=generator,
        )
        self._group = inner.param_groups[0]

    def _gradients(
        self, xb: torch.Tensor, yb: torch.Tensor, center: torch.Tensor | None, batch_center: bool
    ) -> torch.Tensor:
        if xb.shape[0] == 0:  # an empty Poisson sample: the noise alone
            for p in self.params:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)  # pyright: ignore[reportAttributeAccessIssue]
            hsum = torch.zeros(self.weight.shape[1], device=self.weight.device)
        else:
            pred, h = self.model(xb)
            with warnings.catch_warnings():  # Opacus's hooks on the first layer, whose input needs no gradient
                warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
                minibatch_loss(h, pred, yb, self.recipe.problem.lambda_h).backward()
            hsum = h.detach().sum(0)
        self.opt.pre_step()  # clip every row's gradient to C, sum, add N(0, (sigma C)^2), divide by q N
        return hsum

    def _head_grad(self) -> torch.Tensor:
        g = self.weight.grad
        assert g is not None  # pre_step wrote every trained tensor's noised gradient
        return g

    def _clip(self, max_norm: float) -> float | None:
        return clip_gradients(self.params, max_norm, host_check=self.weight.device.type == "cpu")

    def _update(self, lr: float) -> None:
        self._group["lr"] = lr
        self.opt.original_optimizer.step()
        self.opt.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Remove Opacus's hooks from the backbone and the head, and leave every ``.grad`` None."""
        self.opt.zero_grad(set_to_none=True)
        self.model._close()
        for p in self.params:  # DPOptimizer's own attribute, which _close leaves
            if hasattr(p, "summed_grad"):
                delattr(p, "summed_grad")
