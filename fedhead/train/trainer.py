"""Local training of one client: backbone + head on the local objective (docs/theory.md §2) with
the recipe of §10, built to reach the client's optimum, which the theory assumes.

Reaching the optimum. Each of these is an exact partial minimisation or an initialisation, so
the optimum and every stationary point of the objective stay where they are:

* The bias (``cfg.optimal_bias``). It is not penalised, so for given features and ``W`` its
  optimum is ``b = mu - W m`` (``m`` the mean feature). Trained by the optimiser it lags behind
  the features and the head, the slowest direction of the problem when ``mu_m`` is large. It is
  held at that optimum at every step (exactly for full-batch training, where ``m`` is the batch
  mean; with minibatches ``m`` is the previous epoch's mean feature, the first epoch using each
  batch's own).
* The last layer (``cfg.solve_last_layer``). Before training it is set to the (ridge-filtered)
  minimiser for the broadcast head, the rest of the network fixed, and at every tolerance check and
  after training to the minimiser for the current head
  (:func:`fedhead.train.last_layer.solve_output_layer`), each time only where that lowers the
  objective. The optimiser fits the part of the optimal features that lies along weak directions
  of the layer's inputs last (their curvature is their squared singular value): the slowest
  direction once the bias is held at its optimum.
* The head (``cfg.solve_last_layer``). After training the head goes to the minimiser of its
  profiled objective plus the proximal term that L-BFGS reaches from the trained head
  (:func:`fedhead.ufm.local_head`) and the last layer is solved for it, kept only where that lowers
  the objective: where the layer's inputs span the client's samples, the exact local optimum. With
  a proximal term it also selects the head closest to the broadcast, like the finishing rotation,
  so with ``rho > 0`` and ``cfg.finish_rotation=False`` it does not run: the head stays as
  training left it (the selection and the pull that ``rho`` made in training), the last layer
  solved for it.
* The finishing step (``cfg.finish_features``, ``cfg.finish_rotation``). After training the
  features are mapped by ``h -> P_W (h - m)`` through the last layer (the least feature penalty
  among the maps that keep every prediction) and ``b = mu``; with a proximal term the head and
  features are also rotated by the orthogonal ``Q`` that brings ``W`` closest to ``W_t``, the
  exact minimiser of the proximal term along the symmetry ``W -> W Q`` of ``L_m`` and ``C_m``
  (:func:`fedhead.train.finishing.evaluate_fit`).
* The stop (``cfg.local_tol``). Every ``check_every`` epochs the model is evaluated on all of the
  client's data as the finishing step would leave it, and training stops once the relative gap
  of the objective it minimises (``L_m + gamma C_m`` without the proximal term, against its
  closed-form optimum) is at most ``local_tol``; ``problem.epochs`` is the cap.

``optimal_bias=False, solve_last_layer=False, finish_features=False, warmup_steps=0`` is the
literal recipe.

Fast data path: the client's tensors are moved to the training device once and stay there; each
epoch draws one permutation and gathers minibatches by index (no DataLoader, no workers); the
learning-rate schedule is a precomputed list; AdamW is fused; gradients are set to None; the
head-only ``lambda_W``, proximal and correction terms enter as exact gradient terms instead of
graph nodes. On CUDA nothing synchronises with the host inside the loop; on the CPU the gradient
norm is read (free there) to skip an inactive clip and to stop at a non-finite gradient. On
CUDA: TF32, optional bf16 autocast, channels-last image batches and CUDA graphs. Optional
``torch.compile`` (CUDA and CPU) of the forward + loss, one compiled function per process that
every later call, round and backbone object reuses.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from fedhead.data.base import batch_to_float
from fedhead.train.config import TrainConfig, TrainDivergedError
from fedhead.train.finishing import (
    Fit,
    LocalMetrics,
    LocalResult,
    ObjectiveTerms,
    evaluate_fit,
    objective_terms,
    relative,
)
from fedhead.train.inputs import check_arguments, check_every, check_inputs
from fedhead.train.last_layer import solve_output_layer
from fedhead.train.objective import add_head_penalty_grads
from fedhead.train.problem import LocalProblem
from fedhead.train.steps import (
    clip_gradients,
    compiled_forward_loss,
    cosine_schedule,
    forward_loss,
    place_for_training,
    select_device,
)
from fedhead.ufm import local_head, optimal_loss

__all__ = ["train_local"]

log = logging.getLogger(__name__)


def train_local(
    backbone: nn.Module,
    head: nn.Linear,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainConfig,
    problem: LocalProblem,
    *,
    broadcast_weight: np.ndarray | None = None,
    sigma_cen: np.ndarray | None = None,
    sigma_m: np.ndarray | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
) -> LocalResult:
    """Train ``backbone`` and ``head`` in place on one client's data, for at most ``problem.epochs``.

    Minibatch objective (theory.md §2; a full pass of the first two terms plus the third equals ``L_m``)::

        1/(2B) sum_i ||W h_i + b - y_i||^2 + lambda_H/(2B) sum_i ||h_i||^2 + lambda_W/2 ||W||_F^2
        + rho/2 ||W - W_t||_F^2 + gamma C_m(W)

    with ``C_m(W) = lambda_H/2 Tr((Sigma_cen - Sigma_m)(W W^T + lambda_H I)^{-1})``, the weights
    of ``problem`` and, if ``problem.center_targets``, ``y_i - mu_m`` in place of ``y_i``. AdamW
    (weight decay 0) is created afresh, the learning rate follows a cosine from ``cfg.lr`` to
    ``cfg.lr_min`` over ``problem.epochs``, gradients are clipped to global norm ``cfg.clip_norm``.

    How the optimum is reached (bias, last layer, finishing step, tolerance): see the module
    docstring.

    Parameters
    ----------
    backbone : Backbone
        The client's private backbone; trained in place (BatchNorm statistics stay with it) and
        left on ``device``.
    head : nn.Linear
        The head ``Linear(P, C)`` initialised by the caller (usually to the broadcast head);
        trained in place (its bias set to the optimum with ``cfg.optimal_bias``).
    x : Tensor
        Inputs ``(N, F)`` float32, ``(N, ch, H, W)`` uint8 images (converted per batch) or, for the
        free-feature backbone, ``torch.arange(N)``.
    y : Tensor
        Targets ``(N, C)`` float32.
    cfg : TrainConfig
        The recipe (how to train).
    problem : LocalProblem
        What to train for (in a run: :meth:`fedhead.federation.config.JobConfig.local_problem`).
    broadcast_weight : ndarray (C, P), optional
        ``W_t`` of the proximal term; required when ``problem.rho > 0``.
    sigma_cen : ndarray (C, C), optional
        Pooled ``Sigma_cen`` of the correction; required when ``problem.gamma > 0``.
    sigma_m : ndarray (C, C), optional
        The client's ``Sigma_m`` (theory.md §3). It is always computed from ``y`` (in the units of the
        targets trained on; client-wise centring does not change it); a given one is checked
        against it (relative Frobenius difference <= 1e-5) and used for nothing else.
    device : str or torch.device, optional
        ``"auto"`` (default), ``"cpu"``, ``"cuda"``; see :func:`select_device`.
    seed : int
        Seed of the minibatch permutations (a client's: :func:`fedhead.train.round_seed`).

    Returns
    -------
    LocalResult
        ``weight (C, P)``, ``bias (C,)`` float64, ``target_offset (C,)`` and :class:`LocalMetrics`.

    Raises
    ------
    TrainInputError
        Mismatched sizes, empty data, non-finite targets, missing ``broadcast_weight`` /
        ``sigma_cen`` when the configuration needs them, a ``sigma_m`` that is not the targets'
        covariance.
    TrainDivergedError
        A non-finite gradient norm (CPU) or non-finite head or objective after training.
    """
    seed = check_arguments(cfg, problem, seed)
    check_inputs(backbone, head, x, y)
    terms = objective_terms(y, problem, head.in_features, broadcast_weight, sigma_cen, sigma_m)
    dev = select_device(device)
    loop = _TrainLoop(backbone, head, x, y, cfg, problem, terms, dev, seed)
    loop.run()
    return loop.finish()


class _TrainLoop:
    """The steps of :func:`train_local`: set-up, epochs with tolerance checks, finishing."""

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
        self.cuda = cuda = dev.type == "cuda"
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
        # held at its optimum (a constant of each step: no gradient) or trained
        self.step_bias = self.bias.detach() if cfg.optimal_bias else self.bias
        self.broadcast = (
            torch.as_tensor(terms.broadcast, dtype=self.weight.dtype, device=dev)
            if terms.broadcast is not None
            else None
        )
        self.delta = torch.as_tensor(terms.delta, dtype=torch.float64, device=dev) if terms.delta is not None else None
        self.bf16 = cuda and cfg.bf16
        self.bsz = min(cfg.batch_size, n)
        self.step_loss = forward_loss
        if cfg.compile or (cuda and cfg.cuda_graphs):
            # one compiled function per process and mode, reused across calls, rounds and backbone
            # objects; CUDA graphs through torch.compile's "reduce-overhead" mode (forward + backward)
            mode = "reduce-overhead" if cuda and cfg.cuda_graphs else None
            self.step_loss = compiled_forward_loss(mode)
            log.info(
                "train_local on %s: torch.compile(mode=%s)%s for batches of %d; a shorter last batch runs eagerly",
                dev,
                mode,
                ", bf16 autocast" if self.bf16 else "",
                self.bsz,
            )
        self.steps_per_epoch = math.ceil(n / self.bsz)
        self.lrs = cosine_schedule(cfg.lr, cfg.lr_min, problem.epochs * self.steps_per_epoch, warmup=cfg.warmup_steps)
        trained = list(backbone.parameters()) + [self.weight] + ([] if cfg.optimal_bias else [self.bias])
        self.params = [q for q in trained if q.requires_grad]
        self.opt = torch.optim.AdamW(
            self.params, lr=self.lrs[0], betas=cfg.betas, eps=cfg.eps, weight_decay=0.0, fused=True
        )
        self.gen = torch.Generator().manual_seed(int(seed))
        self.center: torch.Tensor | None = None  # the previous epoch's mean feature (minibatches)
        self.l_star = float(optimal_loss(terms.sigma, problem.lambda_h, problem.lambda_w))
        self.trained_l_star = (
            self.l_star
            if terms.delta is None
            else float(optimal_loss(terms.trained_sigma, problem.lambda_h, problem.lambda_w))
        )
        self.k = 0
        self.epochs_run = 0
        self.gap_trace: list[tuple[int, float]] = []
        self.seconds = 0.0

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
        if self.bsz >= self.n:
            yield self._prepare(self.x), self.y
            return
        perm = torch.randperm(self.n, generator=self.gen).to(self.dev, non_blocking=True)
        for s in range(0, self.n, self.bsz):
            idx = perm[s : s + self.bsz]
            yield self._prepare(self.x.index_select(0, idx)), self.y.index_select(0, idx)

    def _epoch(self) -> None:
        """One pass over the data; with the optimal bias, also the epoch's mean feature."""
        cfg, pb, optimal = self.cfg, self.problem, self.cfg.optimal_bias
        batch_center = optimal and (self.bsz >= self.n or self.center is None)
        total = None
        group = self.opt.param_groups[0]
        for xb, yb in self._batches():
            # the compiled step for the full batch size only: a short last batch would cost a second compile
            fn = self.step_loss if xb.shape[0] == self.bsz else forward_loss
            loss, hsum = fn(
                self.backbone,
                self.weight,
                self.step_bias,
                xb,
                yb,
                pb.lambda_h,
                self.bf16,
                None if batch_center or not optimal else self.center,
                batch_center,
            )
            total = hsum if total is None else total + hsum
            loss.backward()
            add_head_penalty_grads(
                self.weight,
                lambda_w=pb.lambda_w,
                lambda_h=pb.lambda_h,
                rho=pb.rho,
                broadcast=self.broadcast,
                gamma=pb.gamma,
                sigma_delta=self.delta,
            )
            if cfg.clip_norm is not None:
                norm = clip_gradients(self.params, cfg.clip_norm, host_check=not self.cuda)
                if norm is not None and not math.isfinite(norm):
                    raise TrainDivergedError(
                        f"train_local: non-finite gradient norm at step {self.k} of "
                        f"{len(self.lrs)} (lr {self.lrs[self.k]:.3g}); the model state is "
                        f"corrupted"
                    )
            group["lr"] = self.lrs[self.k]
            self.opt.step()
            for q in self.params:  # = opt.zero_grad(set_to_none=True), without its per-call hook overhead
                q.grad = None
            self.k += 1
        if optimal:
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
        """The objective the client minimises, proximal term included, as :meth:`finish` leaves the model."""
        fit = self._evaluate()
        if self.broadcast is None:
            return fit.trained_objective
        diff = self.weight.detach().double() - self.broadcast.double()
        return fit.trained_objective + 0.5 * self.problem.rho * float((diff * diff).sum())

    @torch.no_grad()
    def _solve_head(self) -> bool:
        """The head and last layer at their joint optimum, the rest of the network fixed.

        The head goes to the minimiser of the profiled objective (plus the proximal term) that
        L-BFGS reaches from the trained head (:func:`fedhead.ufm.local_head`), and the last layer is
        solved for it. Where the layer's inputs span the client's samples (``N - 1 <= width``) this
        is the exact joint minimiser: the client ends at its local optimum. Kept only where it lowers
        the objective (proximal term included). With a proximal term this also selects the head
        closest to the broadcast, as the finishing rotation does.
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
        layer = self.backbone.output_layer() if hasattr(self.backbone, "output_layer") else None
        if layer is not None:
            return (layer.weight, layer.bias)
        if getattr(self.backbone, "expects_indices", False):
            return (self.backbone.table,)
        return ()

    def _check(self) -> float:
        """The trained gap of the model as :meth:`finish` would leave it now (last layer solved).

        The solved layer is kept only when it ends training (gap within ``local_tol``): training on
        from it would start from the large weights that the weak directions of the layer's inputs
        need, a stiff point for the optimiser.
        """
        if not self.cfg.solve_last_layer:
            return relative(self._evaluate().trained_objective, self.trained_l_star)
        # the free-feature table has no stiff directions: its solve is kept
        solved = () if getattr(self.backbone, "expects_indices", False) else self._solved_tensors()
        saved = [t.detach().clone() for t in solved]
        changed = self._solve_last_layer(keep_better=True)
        gap = relative(self._evaluate().trained_objective, self.trained_l_star)
        if changed and not gap <= self.cfg.local_tol:
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
            epochs = tqdm(epochs, desc="local epochs", leave=False)
        t0 = time.perf_counter()
        for e in epochs:
            self._epoch()
            self.epochs_run = e + 1
            if tol is not None and (e + 1) % every == 0 and e + 1 < n_epochs:
                gap = self._check()
                self.gap_trace.append((e + 1, gap))
                if gap <= tol:
                    break
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
            self.backbone.map_features(*fit.feature_map)
            self.weight.copy_(fit.weight.to(self.weight.dtype))
        self.bias.copy_(torch.as_tensor(fit.bias, dtype=self.bias.dtype, device=self.dev))
        w = self.weight
        if not (math.isfinite(fit.objective) and torch.isfinite(w).all() and np.all(np.isfinite(fit.bias))):
            raise TrainDivergedError(
                f"train_local: training diverged (objective {fit.objective}, non-finite head "
                f"or features after {self.k} steps); lower cfg.lr or keep clip_norm set"
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
            n_steps=self.k,
            converged=None if tol is None else bool(trained_gap <= tol),
            gap_trace=tuple(trace),
            seconds=self.seconds,
            steps_per_second=self.k / self.seconds if self.seconds > 0 else float("inf"),
            device=str(self.dev),
        )
        return LocalResult(
            weight=w.detach().cpu().double().numpy().copy(),
            bias=np.asarray(fit.bias, dtype=np.float64).copy(),
            target_offset=np.asarray(self.terms.target_offset, dtype=np.float64).copy(),
            metrics=metrics,
        )
