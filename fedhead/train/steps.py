"""Building blocks of the training loop: device choice, learning-rate schedule, gradient clipping."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedhead.train.config import TrainInputError


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
