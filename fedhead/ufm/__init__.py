"""Pure math core of fedhead (docs/theory.md §3-9): numpy/scipy only, float64.

Targets are ``(N_m, C)`` arrays (rows are samples), Grams ``(C, C)``, heads ``(C, P)``.
Every public function validates its input and raises [`UFMInputError`][fedhead.ufm.UFMInputError] (a ``ValueError``)
saying which argument, where and what value was wrong.
"""

from ._validate import ConvergenceWarning, NotFullyActiveError, UFMInputError
from .barycenter import BarycenterResult, bw_barycenter, gram_recursion, gram_step, selection_round
from .bw import bw_distance, bw_distance_squared, closest_head, transport_map
from .closed_forms import (
    FullyActiveReport,
    check_fully_active,
    corrected_covariance,
    fully_active_margins,
    optimal_features,
    optimal_gram,
    optimal_loss,
)
from .contraction import gram_map_jacobian, jacobian_spectral_radius, theta_min
from .displacement import commuting_delta, displacement_delta, psi_gradient, psi_value
from .finite_steps import FiniteStepResult, GramMapStep, finite_step_fixed_point, profiled_gram_map, profiled_round
from .gap import GapDecomposition, gap_decomposition
from .joint import JointValue, joint_hessian, joint_objective, pack_joint, unpack_joint
from .moments import TargetMoments
from .objectives import (
    LocalHead,
    ObjectiveValue,
    local_head,
    moment_correction,
    profiled_objective,
    proximal_term,
    scipy_callables,
)
from .psd import psd_inv_sqrt, psd_power, psd_sqrt, sym

__all__ = [
    "BarycenterResult",
    "ConvergenceWarning",
    "FullyActiveReport",
    "FiniteStepResult",
    "GramMapStep",
    "commuting_delta",
    "displacement_delta",
    "finite_step_fixed_point",
    "gram_map_jacobian",
    "jacobian_spectral_radius",
    "profiled_gram_map",
    "profiled_round",
    "psi_gradient",
    "psi_value",
    "theta_min",
    "GapDecomposition",
    "JointValue",
    "LocalHead",
    "ObjectiveValue",
    "gap_decomposition",
    "joint_hessian",
    "joint_objective",
    "local_head",
    "moment_correction",
    "pack_joint",
    "profiled_objective",
    "proximal_term",
    "scipy_callables",
    "unpack_joint",
    "NotFullyActiveError",
    "TargetMoments",
    "UFMInputError",
    "bw_barycenter",
    "bw_distance",
    "bw_distance_squared",
    "check_fully_active",
    "corrected_covariance",
    "fully_active_margins",
    "closest_head",
    "gram_recursion",
    "gram_step",
    "optimal_features",
    "optimal_gram",
    "optimal_loss",
    "psd_inv_sqrt",
    "psd_power",
    "psd_sqrt",
    "selection_round",
    "sym",
    "transport_map",
]
