"""Local training (torch): the theory.md §2 objective, the theory.md §10 recipe, alignment (theory.md §5).

See ``docs/architecture.md``. The Flower client calls [`train_local`][fedhead.train.train_local]
with the recipe ([`TrainConfig`][fedhead.train.TrainConfig]) and the local problem
([`LocalProblem`][fedhead.train.LocalProblem]), [`align`][fedhead.train.align.align] and
[`evaluate_local`][fedhead.train.evaluate_local]; [`select_device`][fedhead.train.select_device]
picks the device at run time.
"""

from fedhead.analysis.seeds import backbone_seed
from fedhead.train.align import AlignResult, align, procrustes_rotation
from fedhead.train.client_math import HeadDistances, exact_head, head_distances, round_seed, target_moments
from fedhead.train.config import TrainConfig, TrainDivergedError, TrainInputError
from fedhead.train.finishing import LocalMetrics, LocalResult
from fedhead.train.local_loss import (
    LocalEvaluation,
    add_head_penalty_grads,
    compute_features,
    evaluate_local,
    minibatch_loss,
    moment_correction_grad,
    moment_correction_torch,
    objective_from_features,
)
from fedhead.train.mismatch_objectives import MismatchObjectives, mismatch_objectives
from fedhead.train.problem import LocalProblem
from fedhead.train.steps import clip_gradients, cosine_schedule, select_device
from fedhead.train.trainer import train_local

__all__ = [
    "AlignResult",
    "HeadDistances",
    "LocalEvaluation",
    "LocalMetrics",
    "LocalProblem",
    "LocalResult",
    "MismatchObjectives",
    "TrainConfig",
    "TrainDivergedError",
    "TrainInputError",
    "add_head_penalty_grads",
    "align",
    "backbone_seed",
    "clip_gradients",
    "compute_features",
    "cosine_schedule",
    "evaluate_local",
    "exact_head",
    "head_distances",
    "minibatch_loss",
    "mismatch_objectives",
    "moment_correction_grad",
    "moment_correction_torch",
    "objective_from_features",
    "procrustes_rotation",
    "round_seed",
    "select_device",
    "target_moments",
    "train_local",
]
