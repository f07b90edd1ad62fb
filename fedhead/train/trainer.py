"""Local training of one client: backbone + head on the SPEC 2 objective with the SPEC 10 recipe.

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
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedhead.data.base import batch_to_float
from fedhead.train.config import TrainConfig, TrainDivergedError, TrainInputError
from fedhead.train.inputs import check_inputs as _check_inputs
from fedhead.train.inputs import check_matrix as _check_matrix
from fedhead.train.objective import (
    add_head_penalty_grads,
    compute_features,
    minibatch_loss,
    objective_from_features,
)
from fedhead.ufm import TargetMoments, optimal_loss

log = logging.getLogger(__name__)


def select_device(spec: str | torch.device | None = "auto") -> torch.device:
    """Training device from ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
    if spec is None or (isinstance(spec, str) and spec == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise TrainInputError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {spec!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TrainInputError(f"device {spec!r} requested but CUDA is not available here; use 'cpu' or 'auto'")
    if dev.type not in ("cpu", "cuda"):
        raise TrainInputError(f"device must be a CPU or CUDA device, got {spec!r}")
    return dev


def cosine_schedule(lr: float, lr_min: float, n_steps: int) -> list[float]:
    """``lr_k = lr_min + (lr - lr_min) (1 + cos(pi k / S)) / 2`` for ``k = 0..S-1`` (as ``CosineAnnealingLR``)."""
    k = np.arange(n_steps, dtype=np.float64)
    return (lr_min + (lr - lr_min) * 0.5 * (1.0 + np.cos(np.pi * k / max(n_steps, 1)))).tolist()


@dataclass(frozen=True)
class LocalMetrics:
    """What one local training call measured.

    Attributes
    ----------
    objective : float
        ``L_m`` (SPEC 2) of the trained backbone + head on the full local data, eval mode, without
        proximal or correction terms (on the centred targets when ``center_targets``).
    optimal_objective : float
        ``L*_m`` from :func:`fedhead.ufm.optimal_loss` (``Sigma_m``, ``lambda_H``, ``lambda_W``).
    relative_gap : float
        ``(L_m - L*_m) / L*_m`` (SPEC 11 local fit); NaN when ``L*_m = 0``.
    train_mse : float
        Mean squared error over samples and outputs on the training data (no penalties).
    n_samples, epochs, n_steps : int
    seconds : float
        Wall time of the training loop (excluding evaluation).
    steps_per_second : float
    device : str
    """

    objective: float
    optimal_objective: float
    relative_gap: float
    train_mse: float
    n_samples: int
    epochs: int
    n_steps: int
    seconds: float
    steps_per_second: float
    device: str


@dataclass(frozen=True)
class LocalResult:
    """The trained head and metrics of one :func:`train_local` call.

    Attributes
    ----------
    weight : ndarray (C, P) float64
        Trained head weight ``W~``.
    bias : ndarray (C,) float64
        Trained head bias ``b~``.
    target_offset : ndarray (C,) float64
        ``mu_m`` when the targets were centred (add it to predictions), else zeros.
    metrics : LocalMetrics
    """

    weight: np.ndarray
    bias: np.ndarray
    target_offset: np.ndarray
    metrics: LocalMetrics


def clip_gradients(params: list[nn.Parameter], max_norm: float, *, host_check: bool) -> float | None:
    """Global gradient-norm clipping with the result of ``torch.nn.utils.clip_grad_norm_``.

    With ``host_check`` (CPU, where reading a scalar costs no device sync) the gradients are
    rescaled only when the clip is active (``max_norm / (norm + 1e-6) < 1``) and the norm is
    returned; otherwise (CUDA) the rescale by ``min(1, max_norm / (norm + 1e-6))`` always runs,
    without a host sync, and None is returned.
    """
    if not host_check:
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        return None
    grads = [q.grad for q in params if q.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    norm = total.item()
    if norm + 1e-6 > max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return norm


def _forward_loss(backbone: nn.Module, weight: torch.Tensor, bias: torch.Tensor, xb: torch.Tensor,
                  yb: torch.Tensor, lambda_h: float, bf16: bool) -> torch.Tensor:
    """Minibatch loss of one step (backbone forward, head, :func:`minibatch_loss`)."""
    if bf16:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = backbone(xb)
    else:
        h = backbone(xb)
    h = h.float()
    return minibatch_loss(h, F.linear(h, weight, bias), yb, lambda_h)


_COMPILED_STEPS: dict[tuple[str | None, str], object] = {}
_COMPILE_BACKEND = "inductor"  # tests swap in "eager" (dynamo only) to check the caching quickly


def compiled_forward_loss(mode: str | None):
    """The process-wide ``torch.compile`` of the step's forward + loss for one compile mode.

    ``mode`` is None (default inductor) or ``"reduce-overhead"`` (CUDA graphs). One wrapper per mode
    lives for the whole process and takes the backbone and the head tensors as *arguments*, so
    dynamo's guards check their types, shapes and dtypes but not their identity: the clients'
    backbones, re-built from the backbone store in every round, and a new head per call reuse the
    graphs compiled in the first round (a new graph only for a new architecture, batch shape or
    ``lambda_H``; :func:`train_local` runs a shorter last batch eagerly instead of compiling it).
    Verified on the CPU (backend ``"eager"``) by the tests. CUDA graphs re-record when the
    parameters' storage moves (a new backbone object), which costs a recording, not a compile.
    """
    key = (mode, _COMPILE_BACKEND)
    fn = _COMPILED_STEPS.get(key)
    if fn is None:
        fn = torch.compile(_forward_loss, mode=mode, dynamic=False, backend=_COMPILE_BACKEND)
        _COMPILED_STEPS[key] = fn
        log.info("train_local: created the torch.compile(mode=%s) step; graphs are compiled on first use "
                 "and reused by later calls and rounds", mode)
    return fn


def train_local(
    backbone: nn.Module,
    head: nn.Linear,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainConfig,
    *,
    broadcast_weight: np.ndarray | None = None,
    sigma_cen: np.ndarray | None = None,
    sigma_m: np.ndarray | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
) -> LocalResult:
    """Train ``backbone`` and ``head`` in place on one client's data for ``cfg.epochs`` epochs.

    Minibatch objective (SPEC 2; a full pass of the first two terms plus the third equals ``L_m``)::

        1/(2B) sum_i ||W h_i + b - y_i||^2 + lambda_H/(2B) sum_i ||h_i||^2 + lambda_W/2 ||W||_F^2
        + rho/2 ||W - W_t||_F^2 + gamma C_m(W)

    with ``C_m(W) = lambda_H/2 Tr((Sigma_cen - Sigma_m)(W W^T + lambda_H I)^{-1})`` and, if
    ``cfg.center_targets``, ``y_i - mu_m`` in place of ``y_i``. AdamW (weight decay 0) is created
    afresh, the learning rate follows a cosine from ``cfg.lr`` to ``cfg.lr_min`` over the call's
    steps, gradients are clipped to global norm ``cfg.clip_norm``.

    Parameters
    ----------
    backbone : Backbone
        The client's private backbone; trained in place (BatchNorm statistics stay with it) and
        left on ``device``.
    head : nn.Linear
        The head ``Linear(P, C)`` initialised by the caller (usually to the broadcast head);
        trained in place.
    x : Tensor
        Inputs ``(N, F)`` float32, ``(N, ch, H, W)`` uint8 images (converted per batch) or, for the
        free-feature backbone, ``torch.arange(N)``.
    y : Tensor
        Targets ``(N, C)`` float32.
    cfg : TrainConfig
    broadcast_weight : ndarray (C, P), optional
        ``W_t`` of the proximal term; required when ``cfg.rho > 0``.
    sigma_cen : ndarray (C, C), optional
        Pooled ``Sigma_cen`` of the correction; required when ``cfg.gamma > 0``.
    sigma_m : ndarray (C, C), optional
        The client's ``Sigma_m`` (SPEC 3). It is always computed from ``y`` (in the units of the
        targets trained on; client-wise centring does not change it); a given one is checked
        against it (relative Frobenius difference <= 1e-5) and used for nothing else.
    device : str or torch.device, optional
        ``"auto"`` (default), ``"cpu"``, ``"cuda"``; see :func:`select_device`.
    seed : int, optional
        Seed of the minibatch permutations; default ``cfg.seed``.

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
    """
    if not isinstance(cfg, TrainConfig):
        raise TrainInputError(f"train_local: cfg must be a TrainConfig, got {type(cfg).__name__}")
    cfg.validate()
    _check_inputs(backbone, head, x, y)
    n, c = y.shape
    seed = cfg.seed if seed is None else seed
    dev = select_device(device)
    mu_m, sig_m = _client_moments(y, sigma_m)
    w_t, delta = _head_term_inputs(cfg, broadcast_weight, sigma_cen, sig_m, c, head.in_features)
    channels_last = _configure_device(cfg, dev, backbone)
    target_offset = mu_m if cfg.center_targets else np.zeros(c)
    x_dev, y_dev = _place_on_device(backbone, head, x, y, target_offset, dev, channels_last)
    n_steps, seconds = _run_epochs(backbone, head, x_dev, y_dev, cfg, dev, channels_last, w_t, delta, seed)
    metrics = _evaluate_trained(backbone, head, x_dev, y_dev, cfg, dev, channels_last, sig_m, n_steps, seconds)
    return LocalResult(
        weight=head.weight.detach().cpu().double().numpy().copy(),
        bias=head.bias.detach().cpu().double().numpy().copy(),
        target_offset=np.asarray(target_offset, dtype=np.float64).copy(),
        metrics=metrics,
    )


def _client_moments(y: torch.Tensor, sigma_m: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``mu_m (C,)`` and ``Sigma_m (C, C)`` of the targets trained on; a given ``sigma_m`` is checked against it."""
    c = y.shape[1]
    y64 = y.detach().cpu().numpy().astype(np.float64)
    moments = TargetMoments.from_targets([y64])
    mu_m = np.array(moments.means[0])
    sig_m = np.asarray(moments.covs[0])  # the covariance of the targets trained on (centring keeps it)
    if sigma_m is not None:
        given = _check_matrix("sigma_m", sigma_m, (c, c), True)
        err = np.linalg.norm(given - sig_m) / max(np.linalg.norm(sig_m), np.finfo(np.float64).tiny)
        if err > 1e-5:
            raise TrainInputError(f"train_local: sigma_m differs from the covariance of the targets y (relative "
                                  f"difference {err:.3g}); pass Sigma_m in the units of the targets trained on, or "
                                  f"leave it None")
    return mu_m, sig_m


def _head_term_inputs(cfg: TrainConfig, broadcast_weight: np.ndarray | None, sigma_cen: np.ndarray | None,
                      sig_m: np.ndarray, c: int, p: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``W_t (C, P)`` of the proximal term (``rho > 0``) and ``Sigma_cen - Sigma_m (C, C)`` of the correction (``gamma > 0``)."""
    w_t = _check_matrix("broadcast_weight", broadcast_weight, (c, p)) if cfg.rho > 0 else None
    delta = (_check_matrix("sigma_cen", sigma_cen, (c, c), True) - sig_m) if cfg.gamma > 0 else None
    return w_t, delta


def _configure_device(cfg: TrainConfig, dev: torch.device, backbone: nn.Module) -> bool:
    """Set the CUDA backend switches of ``cfg``; return whether image batches go channels-last."""
    cuda = dev.type == "cuda"
    if not cuda and (cfg.bf16 or cfg.cuda_graphs):
        log.info("train_local on %s: bf16/cuda_graphs are CUDA-only and ignored (fp32)", dev)
    if cuda and cfg.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    image = bool(getattr(backbone, "is_image", False))
    if cuda and image:
        torch.backends.cudnn.benchmark = True
    return cuda and cfg.channels_last and image


def _place_on_device(backbone: nn.Module, head: nn.Linear, x: torch.Tensor, y: torch.Tensor,
                     target_offset: np.ndarray, dev: torch.device,
                     channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the model (train mode) and the data to ``dev`` once; return ``x_dev`` and the offset targets ``y_dev``."""
    backbone.to(dev)
    head.to(dev)
    if channels_last:
        backbone.to(memory_format=torch.channels_last)
    backbone.train()
    head.train()
    # resident data: moved once; float inputs converted once, uint8 images per batch
    x_dev = x.detach().to(dev, non_blocking=True)
    if x_dev.is_floating_point():
        x_dev = x_dev.float().contiguous()
    offset_dev = torch.as_tensor(target_offset, dtype=torch.float32, device=dev)
    y_dev = (y.detach().to(dev, torch.float32) - offset_dev).contiguous()
    return x_dev, y_dev


def _select_step_loss(cfg: TrainConfig, dev: torch.device, bsz: int):
    """The full-batch step function: :func:`_forward_loss`, or its process-wide compiled form."""
    cuda = dev.type == "cuda"
    if not (cfg.compile or (cuda and cfg.cuda_graphs)):
        return _forward_loss
    # one compiled function per process and mode, reused across calls, rounds and backbone
    # objects; CUDA graphs through torch.compile's "reduce-overhead" mode (forward + backward)
    mode = "reduce-overhead" if cuda and cfg.cuda_graphs else None
    log.info("train_local on %s: torch.compile(mode=%s)%s for batches of %d; a shorter last batch runs eagerly",
             dev, mode, ", bf16 autocast" if cuda and cfg.bf16 else "", bsz)
    return compiled_forward_loss(mode)


def _run_epochs(backbone: nn.Module, head: nn.Linear, x_dev: torch.Tensor, y_dev: torch.Tensor, cfg: TrainConfig,
                dev: torch.device, channels_last: bool, w_t: np.ndarray | None, delta: np.ndarray | None,
                seed: int) -> tuple[int, float]:
    """The optimisation loop (AdamW, cosine schedule, exact head-penalty gradients, clipping).

    Returns the number of steps taken and the loop's wall time in seconds.
    """
    cuda = dev.type == "cuda"
    n = y_dev.shape[0]
    weight, bias = head.weight, head.bias
    w_t_dev = torch.as_tensor(w_t, dtype=weight.dtype, device=dev) if w_t is not None else None
    delta_dev = torch.as_tensor(delta, dtype=torch.float64, device=dev) if delta is not None else None
    lh, lw, rho, gamma = cfg.lambda_h, cfg.lambda_w, cfg.rho, cfg.gamma

    bf16 = cuda and cfg.bf16
    bsz = min(cfg.batch_size, n)
    step_loss = _select_step_loss(cfg, dev, bsz)

    def forward_loss(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        # the compiled step for the full batch size only: a short last batch would cost a second compile
        fn = step_loss if xb.shape[0] == bsz else _forward_loss
        return fn(backbone, weight, bias, xb, yb, lh, bf16)

    def prepare(xb: torch.Tensor) -> torch.Tensor:
        xb = batch_to_float(xb)
        return xb.contiguous(memory_format=torch.channels_last) if channels_last else xb

    full_batch = bsz >= n
    steps_per_epoch = math.ceil(n / bsz)
    n_steps = cfg.epochs * steps_per_epoch
    lrs = cosine_schedule(cfg.lr, cfg.lr_min, n_steps)
    params = [q for q in list(backbone.parameters()) + list(head.parameters()) if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=lrs[0], betas=cfg.betas, eps=cfg.eps, weight_decay=0.0, fused=True)
    group = opt.param_groups[0]
    gen = torch.Generator().manual_seed(int(seed))
    x_full = prepare(x_dev) if full_batch else None
    starts = range(0, n, bsz)

    epochs = range(cfg.epochs)
    if cfg.progress:
        from tqdm.auto import tqdm

        epochs = tqdm(epochs, desc="local epochs", leave=False)
    k = 0
    t0 = time.perf_counter()
    for _ in epochs:
        if full_batch:
            batches = ((x_full, y_dev),)
        else:
            perm = torch.randperm(n, generator=gen).to(dev, non_blocking=True)
            batches = ((prepare(x_dev.index_select(0, idx)), y_dev.index_select(0, idx))
                       for idx in (perm[s:s + bsz] for s in starts))
        for xb, yb in batches:
            loss = forward_loss(xb, yb)
            loss.backward()
            add_head_penalty_grads(weight, lambda_w=lw, lambda_h=lh, rho=rho, broadcast=w_t_dev,
                                   gamma=gamma, sigma_delta=delta_dev)
            if cfg.clip_norm is not None:
                norm = clip_gradients(params, cfg.clip_norm, host_check=not cuda)
                if norm is not None and not math.isfinite(norm):
                    raise TrainDivergedError(f"train_local: non-finite gradient norm at step {k} of {n_steps} "
                                             f"(lr {lrs[k]:.3g}); the model state is corrupted")
            group["lr"] = lrs[k]
            opt.step()
            for q in params:  # = opt.zero_grad(set_to_none=True), without its per-call hook/profiler overhead
                q.grad = None
            k += 1
    if cuda:
        torch.cuda.synchronize(dev)
    return n_steps, time.perf_counter() - t0


def _evaluate_trained(backbone: nn.Module, head: nn.Linear, x_dev: torch.Tensor, y_dev: torch.Tensor,
                      cfg: TrainConfig, dev: torch.device, channels_last: bool, sig_m: np.ndarray,
                      n_steps: int, seconds: float) -> LocalMetrics:
    """Full-data objective ``L_m`` (eval mode) against ``L*_m``; raise when training diverged."""
    weight, bias = head.weight, head.bias
    lh, lw = cfg.lambda_h, cfg.lambda_w
    n = y_dev.shape[0]
    with torch.no_grad():
        h = compute_features(backbone, x_dev, batch_size=cfg.eval_batch_size, device=dev,
                             channels_last=channels_last)
        ev = objective_from_features(h, y_dev, weight.detach().double(), bias.detach().double(), lh, lw)
    if not (math.isfinite(ev.objective) and torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise TrainDivergedError(f"train_local: training diverged (objective {ev.objective}, non-finite head or "
                                 f"features after {n_steps} steps); lower cfg.lr or keep clip_norm set")
    l_star = float(optimal_loss(sig_m, lh, lw))
    return LocalMetrics(
        objective=ev.objective,
        optimal_objective=l_star,
        relative_gap=(ev.objective - l_star) / l_star if l_star > 0 else float("nan"),
        train_mse=ev.mse,
        n_samples=int(n),
        epochs=cfg.epochs,
        n_steps=n_steps,
        seconds=seconds,
        steps_per_second=n_steps / seconds if seconds > 0 else float("inf"),
        device=str(dev),
    )
