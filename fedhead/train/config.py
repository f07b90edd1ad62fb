"""Typed local-training recipe (docs/theory.md §10) and the training layer's errors.

[`TrainConfig`][fedhead.train.TrainConfig] says how a client solves its local problem; the
problem itself (the objective's terms and the epoch budget) is
[`fedhead.train.problem.LocalProblem`][fedhead.train.LocalProblem].
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhead.analysis.constraints import Field, Together, check, integer, number, optional


class TrainInputError(ValueError):
    """Bad training configuration or input: the message says what was wrong and where."""


class TrainDivergedError(RuntimeError):
    """Local training produced non-finite values; the message says at which step."""


def _betas(v: object) -> bool:
    return isinstance(v, tuple) and len(v) == 2 and all(number(0, 1, high_open=True)(b) for b in v)


#: The recipe's rules, in the order they are checked.
_RULES = (
    Field("batch_size", integer(1), "must be an integer >= 1"),
    Field("lr", number(0, low_open=True), "must be > 0"),
    Field("lr_min", number(0), "must be in [0, lr]"),
    Together(lambda c: c.lr_min <= c.lr, "TrainConfig.lr_min must be in [0, lr={lr}], got {lr_min!r}"),
    Field("betas", _betas, "must be two numbers in [0, 1)"),
    Field("eps", number(0, low_open=True), "must be > 0"),
    Field("clip_norm", optional(number(0, low_open=True)), "must be > 0 or None (no clipping)"),
    Field("last_layer_ridge", number(0), "must be >= 0"),
    Field("warmup_steps", integer(0), "must be an integer >= 0"),
    Field(
        "local_tol",
        optional(number(0, 1, low_open=True, high_open=True)),
        "must be a relative gap in (0, 1) or null (no tolerance: always run all epochs)",
    ),
    Field("check_every", integer(0), "must be an integer >= 0 (0: about 50 checks per call)"),
    Field("eval_batch_size", integer(1), "must be an integer >= 1"),
    Field("dp_noise", number(0), "must be a finite number >= 0 (0: no per-example differential privacy)"),
    Field("dp_clip", number(0, low_open=True), "must be a finite number > 0"),
    Field("dp_sample_rate", number(0, 1, low_open=True), "must be a number in (0, 1]"),
    Together(
        lambda c: (
            c.dp_noise == 0
            or not (c.optimal_bias or c.solve_last_layer or c.finish_features or c.local_tol is not None)
        ),
        "TrainConfig.dp_noise={dp_noise} (per-example DP-SGD) needs optimal_bias, solve_last_layer and "
        "finish_features false and local_tol null: each reads the site's rows outside the private steps",
    ),
)


@dataclass(frozen=True)
class TrainConfig:
    """How one client trains for one round: the local recipe (docs/theory.md §10 defaults).

    What is trained for (``lambda_H``, ``lambda_W``, ``rho``, ``gamma``, centring) and for how
    many epochs is not configured here: those come from the procedure and the top-level settings,
    where each is stored and validated, through
    [`fedhead.train.problem.LocalProblem`][fedhead.train.LocalProblem]; the minibatch seed is an
    argument of [`fedhead.train.train_local`][fedhead.train.train_local].

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
        backbones, CUDA graphs (``torch.compile`` mode ``"reduce-overhead"``), TF32
        matmuls/convolutions.
    compile : bool
        ``torch.compile`` of the forward + loss, on CUDA and on the CPU. Compiled once per process
        (the full-batch shape; a shorter last batch runs eagerly) and reused by every later call
        and backbone object. Off by default: the first call pays for the compile, so it can pay off
        only in long runs (``benchmarks/bench_trainer.py --fast`` measures what it gains end to
        end).
    fast_step : bool
        On the CPU, a [`ResMLP`][fedhead.models.ResMLP] backbone trains with its step written out
        ([`fedhead.train.resmlp_step`][fedhead.train.resmlp_step]): forward and backward without
        autograd into buffers kept from step to step, and the fused AdamW kernel and the gradient
        clip called without ``torch.optim``'s per-step Python work. The same gradients, updates and
        results, bit for bit (tested); faster per step at the ``cpu`` scale's shapes
        (``benchmarks/bench_step_flops.py`` measures by how much).
        False: autograd and ``torch.optim.AdamW`` (the reference path; other backbones, CUDA and
        ``compile`` always take it).
    optimal_bias : bool
        Hold the head bias at its least-squares optimum ``mu - W m`` for the current features
        instead of training it, and centre the features exactly after training (see
        [`fedhead.train.train_local`][fedhead.train.train_local]): removes the slowest direction of
        local training and changes no optimum. False: the bias is trained by AdamW like the other parameters.
    solve_last_layer : bool
        Before training, set the backbone's last linear layer to the (slightly ridge-filtered)
        minimiser of the objective for the initial head, the rest of the network fixed
        ([`fedhead.train.last_layer`][fedhead.train.last_layer]): the features start where the
        broadcast head needs them instead of pulling the head toward arbitrary features. At every
        tolerance check and after training, the layer solved for the current head (kept when it
        ends training, and only where it lowers the objective), and after training the head and the
        layer at their joint optimum ([`fedhead.ufm.local_head`][fedhead.ufm.local_head]; not with
        ``rho > 0`` and no ``finish_rotation``: the head solve would select the head as the
        rotation does, so the head stays as training left it). Exact partial minimisations and an
        initialisation: change no optimum.
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
        Show a progress bar over epochs (a terminal only; see `fedhead.progress`).
    dp_noise : float
        The noise multiplier ``sigma`` of per-example differential privacy in local training
        (DP-SGD through Opacus, [`fedhead.train.private_step`][fedhead.train.private_step]); 0 (the
        default): off, and nothing of training changes. Needs ``optimal_bias``, ``solve_last_layer``
        and ``finish_features`` false and ``local_tol`` null.
    dp_clip : float
        ``C``: every per-example gradient is clipped to this L2 norm (over all trained tensors).
    dp_sample_rate : float
        ``q``: Poisson sampling, each row joins each step's batch with probability ``q``; an epoch is
        ``int(1 / q)`` steps ([`dp_steps_per_epoch`][fedhead.train.config.TrainConfig.dp_steps_per_epoch]).
        Public, like ``sigma`` and ``C``: the accountant needs nothing of a site's rows.
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
    fast_step: bool = True
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
    dp_noise: float = 0.0
    dp_clip: float = 1.0
    dp_sample_rate: float = 0.05

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (str, bytes)):  # Hydra passes a list
            object.__setattr__(self, "betas", tuple(float(b) if number()(b) else b for b in self.betas))
        self.validate()

    def validate(self) -> None:
        """Raise [`TrainInputError`][fedhead.train.config.TrainInputError] naming the first bad field."""
        check(self, _RULES, prefix="TrainConfig.", error=TrainInputError)

    @property
    def private(self) -> bool:
        """Whether local training is per-example differentially private (``dp_noise > 0``)."""
        return self.dp_noise > 0

    @property
    def dp_steps_per_epoch(self) -> int:
        """The Poisson-sampled steps of one DP-SGD epoch, ``int(1 / q)`` (Opacus's sampler's default)."""
        return int(1 / self.dp_sample_rate)
