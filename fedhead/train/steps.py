"""Building blocks of the training loop: device choice, learning-rate schedule, gradient clipping,
and the step's forward + loss (eager, or compiled once per process)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedhead.models import backbone_is_image
from fedhead.train.config import TrainConfig, TrainInputError
from fedhead.train.local_loss import minibatch_loss

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


def cosine_schedule(lr: float, lr_min: float, n_steps: int, warmup: int = 0) -> list[float]:
    """``lr_k = lr_min + (lr - lr_min) (1 + cos(pi k / S)) / 2`` for ``k = 0..S-1`` (as ``CosineAnnealingLR``),
    times ``min(1, (k + 1) / warmup)`` during the first ``warmup`` steps (none for 0)."""
    k = np.arange(n_steps, dtype=np.float64)
    lrs = lr_min + (lr - lr_min) * 0.5 * (1.0 + np.cos(np.pi * k / max(n_steps, 1)))
    if warmup > 0:
        lrs *= np.minimum(1.0, (k + 1) / warmup)
    return lrs.tolist()


def clip_gradients(params: Sequence[torch.Tensor], max_norm: float, *, host_check: bool) -> float | None:
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


def place_for_training(backbone: nn.Module, head: nn.Module, cfg: TrainConfig, dev: torch.device) -> bool:
    """Move ``backbone`` and ``head`` to ``dev`` in training mode with the recipe's CUDA settings
    (TF32, cuDNN autotuning and channels-last memory for image backbones; bf16 and CUDA graphs
    are CUDA-only, logged and ignored elsewhere). Returns whether image batches go channels-last."""
    cuda = dev.type == "cuda"
    if not cuda and (cfg.bf16 or cfg.cuda_graphs):
        log.info("train_local on %s: bf16/cuda_graphs are CUDA-only and ignored (fp32)", dev)
    if cuda and cfg.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    image = backbone_is_image(backbone)
    channels_last = cuda and cfg.channels_last and image
    if cuda and image:
        torch.backends.cudnn.benchmark = True
    backbone.to(dev)
    head.to(dev)
    if channels_last:
        backbone.to(memory_format=torch.channels_last)
    backbone.train()
    head.train()
    return channels_last


def forward_loss(
    backbone: nn.Module,
    weight: torch.Tensor,
    bias: torch.Tensor,
    xb: torch.Tensor,
    yb: torch.Tensor,
    lambda_h: float,
    bf16: bool,
    center: torch.Tensor | None,
    batch_center: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Minibatch loss of one step and the batch's feature sum ``(P,)`` (detached).

    Predictions are ``W h + b`` (trained bias: ``center`` None, ``batch_center`` False) or
    ``W (h - m) + b`` with the bias ``b = mu`` fixed and ``m`` the batch's own feature mean
    (``batch_center``) or a given estimate ``center`` of the full-data mean: the optimal bias
    ``mu - W m`` for the current features (see [`fedhead.train.train_local`][fedhead.train.train_local]).
    """
    if bf16:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = backbone(xb)
    else:
        h = backbone(xb)
    h = h.float()
    hsum = h.detach().sum(0)
    if batch_center:
        center = hsum / h.shape[0]
    pred = F.linear(h if center is None else h - center, weight, bias)
    return minibatch_loss(h, pred, yb, lambda_h), hsum


#: The step's forward + loss: ``forward_loss`` or a compiled copy of it.
StepLoss = Callable[..., tuple[torch.Tensor, torch.Tensor]]
_COMPILED_STEPS: dict[tuple[str | None, str], StepLoss] = {}
_COMPILE_BACKEND = "inductor"  # tests swap in "eager" (dynamo only) to check the caching quickly


def compiled_forward_loss(mode: str | None) -> StepLoss:
    """The process-wide ``torch.compile`` of the step's forward + loss for one compile mode.

    ``mode`` is None (default inductor) or ``"reduce-overhead"`` (CUDA graphs). One wrapper per mode
    lives for the whole process and takes the backbone and the head tensors as *arguments*, so
    dynamo's guards check their types, shapes and dtypes but not their identity: the clients'
    backbones, re-built from the backbone store in every round, and a new head per call reuse the
    graphs compiled in the first round (a new graph only for a new architecture, batch shape,
    ``lambda_H`` or bias mode; [`fedhead.train.train_local`][fedhead.train.train_local] runs a
    shorter last batch eagerly instead of compiling it). Verified on the CPU (backend
    ``"eager"``) by the tests. CUDA graphs re-record when the parameters' storage moves (a new
    backbone object), which costs a recording, not a compile.
    """
    key = (mode, _COMPILE_BACKEND)
    fn = _COMPILED_STEPS.get(key)
    if fn is None:
        fn = cast(StepLoss, torch.compile(forward_loss, mode=mode, dynamic=False, backend=_COMPILE_BACKEND))
        _COMPILED_STEPS[key] = fn
        log.info(
            "train_local: created the torch.compile(mode=%s) step; graphs are compiled on first use "
            "and reused by later calls and rounds",
            mode,
        )
    return fn
