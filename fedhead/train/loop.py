"""The training loop behind [`train_local`][fedhead.train.train_local] (docs/theory.md §14).

[`TrainLoop`][fedhead.train.loop.TrainLoop] holds one call's state: set-up with the last-layer
warm start, epochs with the bias at its optimum and the tolerance checks, and the closing
solves and finishing step that leave the client at its local optimum.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch
from torch import nn

from fedhead.data.base import batch_to_float
from fedhead.models import backbone_expects_indices, backbone_output_layer, feature_table, require_backbone
from fedhead.progress import progress
from fedhead.train.batch_step import AutogradStep, Step, StepRecipe, WrittenOutStep
from fedhead.train.config import TrainConfig, TrainDivergedError
from fedhead.train.finishing import Fit, LocalMetrics, LocalResult, ObjectiveTerms, evaluate_fit, relative
from fedhead.train.inputs import check_every
from fedhead.train.last_layer import solve_output_layer
from fedhead.train.private_step import PrivateStep, poisson_batches, private_generator
from fedhead.train.problem import LocalProblem
from fedhead.train.resmlp_step import ResMLPStep
from fedhead.train.steps import StepLoss, compiled_forward_loss, cosine_schedule, forward_loss, place_for_training
from fedhead.ufm import local_head, optimal_loss

__all__ = ["TrainLoop"]

log = logging.getLogger(__name__)


class TrainLoop:
    """The steps of [`train_local`][fedhead.train.train_local]: set-up, epochs with tolerance checks, finishing.

    Fast data path: the client's tensors move to the device once; each epoch draws one permutation
    and gathers minibatches by index (no DataLoader) and runs one [`Step`][fedhead.train.batch_step.Step]
    per batch; the learning rates are a precomputed list; AdamW is fused; the head-only
    ``lambda_W``, proximal and correction terms enter as exact gradient terms. On CUDA nothing
    synchronises with the host inside the loop (TF32, optional bf16 autocast, channels-last images,
    CUDA graphs); on the CPU the gradient norm is read to skip an inactive clip and to stop at a
    non-finite gradient. Optional ``torch.compile`` of the forward + loss, one compiled function
    per process. On the CPU a ResMLP backbone's step is written out (``cfg.fast_step``,
    [`WrittenOutStep`][fedhead.train.batch_step.WrittenOutStep]: no autograd, buffers kept from step
    to step, AdamW's fused kernel called directly), with the same results. Under per-example
    differential privacy (``cfg.dp_noise > 0``) every step is a
    [`PrivateStep`][fedhead.train.private_step.PrivateStep] on a Poisson sample of the rows.
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Linear,
        x: torch.Tensor,
        y: torch.Tensor,
        cfg: TrainConfig,
        problem: LocalProblem,
        terms: ObjectiveTerms,
        dev: torch.device,
        seed: int,
    ):
        self.backbone, self.head, self.cfg, self.terms, self.dev = backbone, head, cfg, terms, dev
        self.problem = problem
        self.cuda = dev.type == "cuda"
        self.n = n = y.shape[0]
        self.channels_last = place_for_training(backbone, head, cfg, dev)

        # resident data: moved once; float inputs converted once, uint8 images per batch
        x_dev = x.detach().to(dev, non_blocking=True)
        self.x = x_dev.float().contiguous() if x_dev.is_floating_point() else x_dev
        offset = torch.as_tensor(terms.target_offset, dtype=torch.float32, device=dev)
        self.y = (y.detach().to(dev, torch.float32) - offset).contiguous()
        self.weight = head.weight
        if cfg.solve_last_layer:
            self._solve_last_layer(keep_better=False)
        if cfg.optimal_bias:
            with torch.no_grad():
                head.bias.copy_(torch.as_tensor(terms.mu, dtype=head.bias.dtype, device=dev))
        self.bias = head.bias
        self.broadcast = (
            None if terms.broadcast is None else torch.as_tensor(terms.broadcast, dtype=self.weight.dtype, device=dev)
        )
        self.bsz = min(cfg.batch_size, n)
        self.step = self._build_step()
        self.gen = private_generator() if cfg.private else torch.Generator().manual_seed(int(seed))
        self.center: torch.Tensor | None = None  # the previous epoch's mean feature (minibatches)
        self.l_star = float(optimal_loss(terms.sigma, problem.lambda_h, problem.lambda_w))
        self.trained_l_star = (
            self.l_star
            if terms.delta is None
            else float(optimal_loss(terms.trained_sigma, problem.lambda_h, problem.lambda_w))
        )
        self.epochs_run = 0
        self.gap_trace: list[tuple[int, float]] = []
        self.seconds = 0.0

    def _build_step(self) -> Step:
        """The written-out ResMLP step where it applies (CPU, eager, float inputs, ``cfg.fast_step``),
        else the autograd step, with the call's learning rates and head-only terms."""
        cfg, dev, terms, optimal = self.cfg, self.dev, self.terms, self.cfg.optimal_bias
        steps_per_epoch = cfg.dp_steps_per_epoch if cfg.private else math.ceil(self.n / self.bsz)
        recipe = StepRecipe(
            problem=self.problem,
            broadcast=self.broadcast,
            delta=None if terms.delta is None else torch.as_tensor(terms.delta, dtype=torch.float64, device=dev),
            clip_norm=cfg.clip_norm,
            lrs=cosine_schedule(cfg.lr, cfg.lr_min, self.problem.epochs * steps_per_epoch, warmup=cfg.warmup_steps),
            betas=cfg.betas,
            eps=cfg.eps,
        )
        if cfg.private:
            return PrivateStep(
                self.backbone,
                self.head,
                recipe,
                noise_multiplier=cfg.dp_noise,
                max_grad_norm=cfg.dp_clip,
                expected_batch_size=round(cfg.dp_sample_rate * self.n),
                generator=private_generator(),
            )
        # the bias held at its optimum (a constant of each step: no gradient) or trained
        step_bias = self.bias.detach() if optimal else self.bias
        trained = list(self.backbone.parameters()) + [self.weight] + ([] if optimal else [self.bias])
        params = [q for q in trained if q.requires_grad]
        if cfg.fast_step and not self.cuda and not cfg.compile and self.x.is_floating_point():
            kernel = ResMLPStep.for_backbone(self.backbone, self.weight, None if optimal else self.bias)
            if kernel is not None:
                assert [id(q) for q in kernel.params] == [id(q) for q in params]
                return WrittenOutStep(kernel, step_bias, recipe)
        bf16 = self.cuda and cfg.bf16
        loss: StepLoss = forward_loss
        if cfg.compile or (self.cuda and cfg.cuda_graphs):
            # one compiled function per process and mode, reused across calls, rounds and backbone
            # objects; CUDA graphs through torch.compile's "reduce-overhead" mode (forward + backward)
            mode = "reduce-overhead" if self.cuda and cfg.cuda_graphs else None
            loss = compiled_forward_loss(mode)
            log.info(
                "train_local on %s: torch.compile(mode=%s)%s for batches of %d; a shorter last batch runs eagerly",
                dev,
                mode,
                ", bf16 autocast" if bf16 else "",
                self.bsz,
            )
        return AutogradStep(
            self.backbone,
            self.weight,
            step_bias,
            params,
            recipe,
            loss=loss,
            batch_size=self.bsz,
            bf16=bf16,
            host_check=not self.cuda,
        )

    def _solve_last_layer(self, *, keep_better: bool) -> bool:
        return solve_output_layer(
            self.backbone,
            self.x,
            self.y,
            self.weight.detach().cpu().double().numpy(),
            self.problem.lambda_h,
            batch_size=self.cfg.eval_batch_size,
            device=self.dev,
            channels_last=self.channels_last,
            ridge=self.cfg.last_layer_ridge,
            keep_better=keep_better,
            finish=self.cfg.finish_features,
        )

    def _prepare(self, xb: torch.Tensor) -> torch.Tensor:
        xb = batch_to_float(xb)
        return xb.contiguous(memory_format=torch.channels_last) if self.channels_last else xb

    def _batches(self):
        if self.cfg.private:  # Poisson samples, drawn from the operating system's entropy
            for idx in poisson_batches(self.n, self.cfg.dp_sample_rate, self.cfg.dp_steps_per_epoch, self.gen):
                idx = idx.to(self.dev, non_blocking=True)
                yield self._prepare(self.x.index_select(0, idx)), self.y.index_select(0, idx)
            return
        if self.bsz >= self.n:
            yield self._prepare(self.x), self.y
            return
        perm = torch.randperm(self.n, generator=self.gen).to(self.dev, non_blocking=True)
        for s in range(0, self.n, self.bsz):
            idx = perm[s : s + self.bsz]
            yield self._prepare(self.x.index_select(0, idx)), self.y.index_select(0, idx)

    def _epoch(self) -> None:
        """One pass over the data, one step per batch; with the optimal bias, also the epoch's mean feature."""
        optimal = self.cfg.optimal_bias
        batch_center = optimal and (self.bsz >= self.n or self.center is None)
        center = None if batch_center or not optimal else self.center
        total = None
        for xb, yb in self._batches():
            hsum = self.step(xb, yb, center, batch_center)
            total = hsum if total is None else total + hsum
        if optimal and total is not None:  # (there is always a batch: empty data is refused)
            self.center = total / self.n

    def _evaluate(self, *, final: bool = False) -> Fit:
        # the rotation changes neither L_m nor C_m, so the tolerance checks leave it out
        rotate = final and self.cfg.finish_rotation
        return evaluate_fit(
            self.backbone,
            self.x,
            self.y,
            self.weight,
            None if self.cfg.optimal_bias else self.bias,
            self.cfg,
            self.problem,
            self.terms,
            dev=self.dev,
            channels_last=self.channels_last,
            finish=self.cfg.finish_features,
            rotate_to=self.terms.broadcast if rotate else None,
        )

    def _full_objective(self) -> float:
        """The objective the client minimises, proximal term included, as
        [`finish`][fedhead.train.loop.TrainLoop.finish] leaves the model."""
        fit = self._evaluate()
        if self.broadcast is None:
            return fit.trained_objective
        diff = self.weight.detach().double() - self.broadcast.double()
        return fit.trained_objective + 0.5 * self.problem.rho * float((diff * diff).sum())

    @torch.no_grad()
    def _solve_head(self) -> bool:
        """The head and last layer at their joint optimum, the rest of the network fixed.

        The head goes to the minimiser of the profiled objective (plus the proximal term) that
        L-BFGS reaches from the trained head ([`fedhead.ufm.local_head`][fedhead.ufm.local_head]),
        and the last layer is solved for it. Where the layer's inputs span the client's samples
        (``N - 1 <= width``) this is the exact joint minimiser: the client ends at its local
        optimum. Kept only where it lowers the objective (proximal term included). With a proximal
        term this also selects the head closest to the broadcast, as the finishing rotation does.
        """
        solved = self._solved_tensors()
        if not solved:
            return False
        before = self._full_objective()
        w_now = self.weight.detach().clone()
        saved = [t.detach().clone() for t in solved]
        sol = local_head(
            w_now.cpu().double().numpy(),
            self.terms.trained_sigma,
            self.problem.lambda_h,
            self.problem.lambda_w,
            rho=self.problem.rho,
            w_ref=self.terms.broadcast,
        )
        self.weight.copy_(torch.as_tensor(sol.head, dtype=self.weight.dtype, device=self.weight.device))
        self._solve_last_layer(keep_better=True)
        if self._full_objective() < before:
            return True
        self.weight.copy_(w_now)
        for t, v in zip(solved, saved, strict=True):
            t.copy_(v)
        return False

    def _solved_tensors(self) -> tuple[torch.Tensor, ...]:
        """What a last-layer solve writes: the last ``Linear``'s weight and bias, the free-feature
        table, or nothing (a backbone without either)."""
        layer = backbone_output_layer(self.backbone)
        if layer is not None:
            return (layer.weight, layer.bias)
        table = feature_table(self.backbone)
        if table is not None:
            return (table,)
        return ()

    def _check(self, tol: float) -> float:
        """The trained gap of the model as [`finish`][fedhead.train.loop.TrainLoop.finish] would
        leave it now (last layer solved).

        The solved layer is kept only when it ends training (gap within ``tol``, the
        ``local_tol``): training on from it would start from the large weights that the weak
        directions of the layer's inputs need, a stiff point for the optimiser.
        """
        if not self.cfg.solve_last_layer:
            return relative(self._evaluate().trained_objective, self.trained_l_star)
        # the free-feature table has no stiff directions: its solve is kept
        solved = () if backbone_expects_indices(self.backbone) else self._solved_tensors()
        saved = [t.detach().clone() for t in solved]
        changed = self._solve_last_layer(keep_better=True)
        gap = relative(self._evaluate().trained_objective, self.trained_l_star)
        if changed and not gap <= tol:
            with torch.no_grad():
                for t, v in zip(solved, saved, strict=True):
                    t.copy_(v)
        return gap

    def run(self) -> None:
        """Epochs up to ``problem.epochs``, stopping early once ``cfg.local_tol`` is reached."""
        cfg, n_epochs = self.cfg, self.problem.epochs
        tol = cfg.local_tol
        every = check_every(cfg, n_epochs)
        epochs = range(n_epochs)
        if cfg.progress:
            epochs = progress(epochs, desc="local epochs")
        t0 = time.perf_counter()
        try:
            for e in epochs:
                self._epoch()
                self.epochs_run = e + 1
                if tol is not None and (e + 1) % every == 0 and e + 1 < n_epochs:
                    gap = self._check(tol)
                    self.gap_trace.append((e + 1, gap))
                    if gap <= tol:
                        break
        finally:
            self.step.close()
        if self.cuda:
            torch.cuda.synchronize(self.dev)
        self.seconds = time.perf_counter() - t0

    @torch.no_grad()
    def finish(self) -> LocalResult:
        """The final evaluation and the finishing step (``cfg.finish_features``)."""
        if self.cfg.solve_last_layer:
            self._solve_last_layer(keep_better=True)
            # with a proximal term the head solve also moves the head along the symmetry W -> W Q to
            # the broadcast, as the finishing rotation does; without that rotation (what rho does in
            # training: the rho sweep) the head stays as training left it, with the selection and
            # the pull that rho made, and only the last layer is solved for it
            if self.cfg.finish_rotation or self.problem.rho == 0:
                self._solve_head()
        fit = self._evaluate(final=True)
        if fit.feature_map is not None:
            require_backbone(self.backbone, "the centred finish").map_features(*fit.feature_map)
            self.weight.copy_(fit.weight.to(self.weight.dtype))
        self.bias.copy_(torch.as_tensor(fit.bias, dtype=self.bias.dtype, device=self.dev))
        w = self.weight
        if not (math.isfinite(fit.objective) and torch.isfinite(w).all() and np.all(np.isfinite(fit.bias))):
            raise TrainDivergedError(
                f"train_local: training diverged (objective {fit.objective}, non-finite head "
                f"or features after {self.step.k} steps); lower cfg.lr or keep clip_norm set"
            )
        trained_gap = relative(fit.trained_objective, self.trained_l_star)
        tol = self.cfg.local_tol
        trace = list(self.gap_trace)
        if tol is not None and (not trace or trace[-1][0] != self.epochs_run):
            trace.append((self.epochs_run, trained_gap))
        metrics = LocalMetrics(
            objective=fit.objective,
            optimal_objective=self.l_star,
            relative_gap=relative(fit.objective, self.l_star),
            trained_objective=fit.trained_objective,
            trained_optimal_objective=self.trained_l_star,
            trained_gap=trained_gap,
            train_mse=fit.mse,
            n_samples=int(self.n),
            epochs=self.epochs_run,
            n_steps=self.step.k,
            converged=None if tol is None else bool(trained_gap <= tol),
            gap_trace=tuple(trace),
            seconds=self.seconds,
            steps_per_second=self.step.k / self.seconds if self.seconds > 0 else float("inf"),
            device=str(self.dev),
        )
        return LocalResult(
            weight=w.detach().cpu().double().numpy().copy(),
            bias=np.asarray(fit.bias, dtype=np.float64).copy(),
            target_offset=np.asarray(self.terms.target_offset, dtype=np.float64).copy(),
            metrics=metrics,
        )
