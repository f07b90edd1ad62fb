"""Local training (torch): the theory.md §2 objective, the theory.md §10 recipe, alignment (theory.md §5).

See ``docs/architecture.md``. The Flower client calls [`train_local`][fedhead.train.train_local]
with the recipe ([`TrainConfig`][fedhead.train.TrainConfig]) and the local problem
([`LocalProblem`][fedhead.train.LocalProblem]), [`align`][fedhead.train.align.align] and
[`evaluate_local`][fedhead.train.evaluate_local]; [`select_device`][fedhead.train.select_device]
picks the device at run time.

The torch modules are imported on first use ([`lazy_exports`][fedhead.analysis.lazy.lazy_exports]): a
job's config ([`TrainConfig`][fedhead.train.TrainConfig]) is read without torch. ``align`` and
``mismatch_objectives`` name their modules here; their functions are imported from them.
"""

from typing import TYPE_CHECKING

from fedhead.analysis.lazy import lazy_exports
from fedhead.analysis.seeds import backbone_seed
from fedhead.train.client_math import HeadDistances, exact_head, head_distances, round_seed, target_moments
from fedhead.train.config import TrainConfig, TrainDivergedError, TrainInputError
from fedhead.train.problem import LocalProblem

if TYPE_CHECKING:
    from fedhead.train.align import AlignResult, procrustes_rotation
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
    from fedhead.train.mismatch_objectives import MismatchObjectives
    from fedhead.train.steps import clip_gradients, cosine_schedule, select_device
    from fedhead.train.trainer import train_local

__getattr__ = lazy_exports(
    __name__,
    {
        "fedhead.train.align": ("AlignResult", "procrustes_rotation"),
        "fedhead.train.finishing": ("LocalMetrics", "LocalResult"),
        "fedhead.train.local_loss": (
            "LocalEvaluation",
            "add_head_penalty_grads",
            "compute_features",
            "evaluate_local",
            "minibatch_loss",
            "moment_correction_grad",
            "moment_correction_torch",
            "objective_from_features",
        ),
        "fedhead.train.mismatch_objectives": ("MismatchObjectives",),
        "fedhead.train.steps": ("clip_gradients", "cosine_schedule", "select_device"),
        "fedhead.train.trainer": ("train_local",),
    },
)

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
    "backbone_seed",
    "clip_gradients",
    "compute_features",
    "cosine_schedule",
    "evaluate_local",
    "exact_head",
    "head_distances",
    "minibatch_loss",
    "moment_correction_grad",
    "moment_correction_torch",
    "objective_from_features",
    "procrustes_rotation",
    "round_seed",
    "select_device",
    "target_moments",
    "train_local",
]
