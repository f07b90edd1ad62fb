"""The typed local-training procedure every layer reads (Hydra group ``procedure/``).

[`ProcedureConfig`][fedhead.analysis.procedure.ProcedureConfig] carries and validates a procedure's
parameters (``rho``, ``gamma``, alignment, centring, full-model averaging, the exact rule);
[`reference_name`][fedhead.analysis.procedure.reference_name] is the one rule for the Gram a procedure
should reach. Pure Python: the server, the clients, the training layer and the configuration all import
it.

A procedure is declared once, as a file ``conf/procedure/<name>.yaml`` naming this class; the
procedures a run knows are those files
([`fedhead.settings.config.procedure_names`][fedhead.settings.config.procedure_names]).
Every layer acts on the switches below, never on the name, so a procedure that combines existing
switches differently needs only its yaml file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

from fedhead.analysis.constraints import SAFE_NAME_NEED, Field, Together, check, safe_name

REFERENCES = ("star", "cen", "corrected", "within")
GAMMA_NEED = "must be >= 0 and <= 1 (correction strength in [0, 1])"
RHO_NEED = "must be >= 0 (proximal weight)"


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def gamma_problem(value: object) -> str | None:
    """Why ``value`` is not a correction strength ``gamma`` in [0, 1] (None when it is).

    The one rule for ``gamma``, shared by [`ProcedureConfig`][fedhead.analysis.procedure.ProcedureConfig] and the
    trainer's input check
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


class ConfigError(ValueError):
    """Invalid configuration: the message names the key, the value and what is allowed."""


_PROCEDURE_RULES = (
    # the name is a folder under the run folder (outputs, client state): no path may leave it
    Field("name", safe_name, SAFE_NAME_NEED),
    Together(lambda p: not rho_problem(p.rho), "procedure {name!r}: rho " + RHO_NEED + ", got {rho!r}"),
    Together(lambda p: not gamma_problem(p.gamma), "procedure {name!r}: gamma " + GAMMA_NEED + ", got {gamma!r}"),
    Together(
        lambda p: not (p.exact and (p.align or p.full_model)),
        "procedure {name!r}: exact cannot be combined with align/full_model",
    ),
    Together(lambda p: not (p.full_model and p.align), "procedure {name!r}: full_model cannot be combined with align"),
    # centred clients' covariances average to Sigma_within, not Sigma_cen: the correction toward
    # the pooled Sigma_cen would put the mean term back (theory.md §7-8)
    Together(
        lambda p: not (p.centered and p.gamma > 0),
        "procedure {name!r}: centered cannot be combined with the moment correction (gamma={gamma}); "
        "centring already removes the mean term",
    ),
)


@dataclass(frozen=True)
class ProcedureConfig:
    """A local-training procedure (theory.md §10; Hydra group ``procedure/``).

    Attributes
    ----------
    name : str
        The name users type (``procedure=corrected_proximal``); also the folder of the procedure's
        outputs, so ``[A-Za-z0-9][A-Za-z0-9_.-]*`` without ``..``.
    rho : float
        Proximal weight (``rho/2 ||W - W_t||^2``); the top-level ``rho=`` overrides it.
    gamma : float
        Moment-correction strength in [0, 1] (0 off, 1 full; theory.md §8). Validated here, the one
        place it enters; the training layer and the server read it from this object.
    align : bool
        Align the trained head to the broadcast before upload (theory.md §5).
    centered : bool
        Client-wise target centring (reference ``G_within``).
    full_model : bool
        Average the backbone too (BatchNorm statistics stay private).
    exact : bool
        Return ``Pi_m(W_t)`` in closed form instead of training (the theory's rule).
    """

    name: str
    rho: float = 0.0
    gamma: float = 0.0
    align: bool = False
    centered: bool = False
    full_model: bool = False
    exact: bool = False

    def __post_init__(self) -> None:
        check(self, _PROCEDURE_RULES, error=ConfigError)

    @property
    def strategy_kind(self) -> str:
        """``"full_model"``, ``"aligned"`` or ``"head"`` (see
        [`strategies.make_strategy`][fedhead.strategies.make_strategy])."""
        if self.full_model:
            return "full_model"
        return "aligned" if self.align else "head"

    @property
    def reference(self) -> str:
        """The Gram the procedure should reach; see [`reference_name`][fedhead.analysis.procedure.reference_name]."""
        return reference_name(self.gamma, self.centered)
