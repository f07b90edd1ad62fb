"""Typed local-training recipe (docs/theory.md §10) and the training layer's errors.

:class:`TrainConfig` says how a client solves its local problem; the problem itself (the
objective's terms and the epoch budget) is :class:`fedhead.train.problem.LocalProblem`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class TrainInputError(ValueError):
    """Bad training configuration or input: the message says what was wrong and where."""


class TrainDivergedError(RuntimeError):
    """Local training produced non-finite values; the message says at which step."""


@dataclass
class TrainConfig:
    """How one client trains for one round: the local recipe (docs/theory.md §10 defaults).

    What is trained for (``lambda_H``, ``lambda_W``, ``rho``, ``gamma``, centring) and for how
    many epochs is not configured here: those come from the procedure and the top-level settings,
    where each is stored and validated, through :class:`fedhead.train.problem.LocalProblem`; the
    minibatch seed is an argument of :func:`fedhead.train.train_local`.

    Attributes
    ----------
    batch_size : int
        Shuffled minibatches of this size (256); a batch size ``>= N_m`` means full-batch
        training (no shuffling, the data are used as stored).
    lr, lr_min : float
        Cosine schedule from ``lr`` (1e-3) to ``lr_min`` (1e-5) over the call's steps:
        ``lr_k = lr_min + (lr - lr_min) (1 + cos(pi k / S)) / 2`` for step ``k`` of ``S``.
    betas, eps : AdamW moments and epsilon; the optimiser has weight decay 0 (the ``lambda_W``
        penalty is part of the objective) and is re-created at every call.
    clip_norm : float or None
        Global gradient-norm clip (5); None disables clipping.
    bf16, channels_last, cuda_graphs, tf32 : bool
        Fast-path switches used on CUDA only (ignored on CPU, with a log line for bf16 and
        cuda_graphs): bfloat16 autocast of the backbone, channels-last memory format for image
        backbones (no gain measured on the CPU), CUDA graphs (``torch.compile`` mode
        ``"reduce-overhead"``), TF32 matmuls/convolutions.
    compile : bool
        ``torch.compile`` of the forward + loss, on CUDA and on the CPU. Compiled once per process
        (the full-batch shape; a shorter last batch runs eagerly) and reused by every later call
        and backbone object. Off by default; worth trying only for long runs: on the shared 2-core
        CPU here compiling the width-1024 ResMLP forward + loss took about 90 s (cold cache) and its
        forward + backward ran about 1.2x faster in isolation, but the end-to-end benchmark
        (``benchmarks/bench_trainer.py --fast``) showed no gain beyond the machine's noise.
    optimal_bias : bool
        Hold the head bias at its least-squares optimum ``mu - W m`` for the current features
        instead of training it, and centre the features exactly after training (see
        :func:`fedhead.train.train_local`): removes the slowest direction of local training and
        changes no optimum. False: the bias is trained by AdamW like the other parameters.
    solve_last_layer : bool
        Before training, set the backbone's last linear layer to the (slightly ridge-filtered)
        minimiser of the objective for the initial head, the rest of the network fixed
        (:mod:`fedhead.train.last_layer`): the features start where the broadcast head needs them
        instead of pulling the head toward arbitrary features. At every tolerance check and after
        training, the layer solved for the current head (kept when it ends training, and only where
        it lowers the objective), and after training the head and the layer at their joint optimum
        (:func:`fedhead.ufm.local_head`; not with ``rho > 0`` and no ``finish_rotation``: the head
        solve would select the head as the rotation does, so the head stays as training left it). Exact
        partial minimisations and an initialisation: change no optimum.
    last_layer_ridge : float
        The filter of the solve before training, relative to the largest squared singular value of
        the layer's inputs (0: the exact minimiser, whose weights can be very large); the later
        solves try it and six smaller ones and keep the best.
    warmup_steps : int
        Linear learning-rate warm-up over the first steps of each call (100; 0: none). AdamW is
        re-created in every round, and its first steps move every parameter by about ``lr``
        whatever its gradient: a warm-up keeps them from undoing a warm start.
    finish_rotation : bool
        With ``finish_features`` and a proximal term (``rho > 0``): the finishing step also rotates
        the head and the features, ``W -> W Q``, ``h -> Q^T h`` with the orthogonal ``Q`` that
        brings ``W`` closest to the broadcast ``W_t``. ``L_m`` and ``C_m`` cannot tell these heads
        apart, so this is the exact minimiser of the proximal term along that symmetry, the one
        direction in which training moves only at the rate ``rho``. Changes no optimum.
    finish_features : bool
        After training, map the features by ``h -> P_W (h - m)`` (``m`` their mean, ``P_W`` the
        projection on the head's row space) through the last layer, and set ``b = mu``: of all
        maps that keep every prediction this has the least feature penalty (an exact partial
        minimisation; changes no optimum).
    local_tol : float or None
        Stop local training once the relative gap of the client's objective (``L_m``, or
        ``L_m + gamma C_m`` when corrected) to its closed-form optimum is at most this; the
        problem's ``epochs`` is the cap. None: always run ``epochs``.
    check_every : int
        Epochs between two checks of ``local_tol`` (each a full-data forward pass in eval mode);
        0 chooses ``max(1, epochs // 50)``.
    eval_batch_size : int
        Chunk size of the full-data evaluation after training.
    progress : bool
        Show a tqdm bar over epochs.
    """

    batch_size: int = 256
    lr: float = 1e-3
    lr_min: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip_norm: float | None = 5.0
    bf16: bool = False
    channels_last: bool = True
    compile: bool = False
    cuda_graphs: bool = False
    tf32: bool = True
    optimal_bias: bool = True
    solve_last_layer: bool = True
    last_layer_ridge: float = 1e-4
    finish_features: bool = True
    finish_rotation: bool = True
    warmup_steps: int = 100
    local_tol: float | None = None
    check_every: int = 0
    eval_batch_size: int = 1024
    progress: bool = False

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # Hydra passes ListConfig
        self.validate()

    def validate(self) -> None:
        """Raise :class:`TrainInputError` naming the first bad field."""

        def bad(field: str, need: str) -> TrainInputError:
            return TrainInputError(f"TrainConfig.{field} {need}, got {getattr(self, field)!r}")

        def finite(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise bad("batch_size", "must be an integer >= 1")
        if not (finite(self.lr) and self.lr > 0):
            raise bad("lr", "must be > 0")
        if not (finite(self.lr_min) and 0 <= self.lr_min <= self.lr):
            raise bad("lr_min", f"must be in [0, lr={self.lr}]")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise bad("betas", "must be two numbers in [0, 1)")
        if not (finite(self.eps) and self.eps > 0):
            raise bad("eps", "must be > 0")
        if self.clip_norm is not None and not (finite(self.clip_norm) and self.clip_norm > 0):
            raise bad("clip_norm", "must be > 0 or None (no clipping)")
        if not (finite(self.last_layer_ridge) and self.last_layer_ridge >= 0):
            raise bad("last_layer_ridge", "must be >= 0")
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise bad("warmup_steps", "must be an integer >= 0")
        if self.local_tol is not None and not (finite(self.local_tol) and 0 < self.local_tol < 1):
            raise bad("local_tol", "must be a relative gap in (0, 1) or null (no tolerance: always run all epochs)")
        if not isinstance(self.check_every, int) or isinstance(self.check_every, bool) or self.check_every < 0:
            raise bad("check_every", "must be an integer >= 0 (0: about 50 checks per call)")
        if not isinstance(self.eval_batch_size, int) or self.eval_batch_size < 1:
            raise bad("eval_batch_size", "must be an integer >= 1")
