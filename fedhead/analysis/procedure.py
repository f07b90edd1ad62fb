"""The rules of a local-training procedure's parameters, below every layer that reads them.

[`gamma_problem`][fedhead.analysis.procedure.gamma_problem],
[`rho_problem`][fedhead.analysis.procedure.rho_problem] and
[`penalty_problem`][fedhead.analysis.procedure.penalty_problem] are the one rule of each parameter
(the procedure's config and the trainer's input check both apply them);
[`reference_name`][fedhead.analysis.procedure.reference_name] is the one rule for the Gram a procedure
should reach; [`ProcedureTerms`][fedhead.analysis.procedure.ProcedureTerms] is what of a procedure sets a
client's local problem. Pure Python. The procedure itself, a file of ``conf/procedure/``, is read into
[`fedhead.settings.procedure.ProcedureConfig`][fedhead.settings.procedure.ProcedureConfig].
"""

from __future__ import annotations

import math
from typing import Protocol, TypeGuard

REFERENCES = ("star", "cen", "corrected", "within")
GAMMA_NEED = "must be >= 0 and <= 1 (correction strength in [0, 1])"
RHO_NEED = "must be >= 0 (proximal weight)"


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def gamma_problem(value: object) -> str | None:
    """Why ``value`` is not a correction strength ``gamma`` in [0, 1] (None when it is).

    The one rule for ``gamma``, shared by
    [`ProcedureConfig`][fedhead.settings.procedure.ProcedureConfig] and the trainer's input check
    ([`fedhead.train.LocalProblem`][fedhead.train.LocalProblem]).
    """
    return None if _finite(value) and 0.0 <= value <= 1.0 else GAMMA_NEED


def rho_problem(value: object) -> str | None:
    """Why ``value`` is not a proximal weight ``rho >= 0`` (None when it is); the one rule for ``rho``."""
    return None if _finite(value) and value >= 0 else RHO_NEED


def penalty_problem(value: object) -> str | None:
    """Why ``value`` is not a penalty ``lambda_H`` / ``lambda_W > 0`` (None when it is)."""
    return None if _finite(value) and value > 0 else "must be > 0"


def reference_name(gamma: float, centered: bool) -> str:
    """The Gram a procedure should reach (theory.md §6-8).

    * ``"within"``: client-wise centring, ``G_within = phi(Sigma_within)``;
    * ``"star"``: no correction (``gamma = 0``), the BW barycenter ``G_star`` of the ``G_m``;
    * ``"cen"``: full correction (``gamma = 1``), every client fits ``Sigma_cen``: ``G_cen``;
    * ``"corrected"``: partial correction (``0 < gamma < 1``), the BW barycenter of the corrected
      Grams ``phi((1 - gamma) Sigma_m + gamma Sigma_cen)`` (not ``G_cen``).
    """
    if centered:
        return "within"
    if gamma <= 0:
        return "star"
    return "cen" if gamma >= 1 else "corrected"


class ProcedureTerms(Protocol):
    """What of a procedure sets a client's local problem: ``rho``, ``gamma`` and the centring
    (``centered``). [`fedhead.settings.procedure.ProcedureConfig`][fedhead.settings.procedure.ProcedureConfig]
    has them; the training layer, below the settings, reads a procedure through this view
    ([`fedhead.train.LocalProblem.from_procedure`][fedhead.train.LocalProblem.from_procedure])."""

    @property
    def rho(self) -> float: ...

    @property
    def gamma(self) -> float: ...

    @property
    def centered(self) -> bool: ...
