"""The typed local-training procedure (Hydra group ``procedure/``):
[`ProcedureConfig`][fedhead.settings.procedure.ProcedureConfig] carries and validates a procedure's
parameters (``rho``, ``gamma``, alignment, centring, full-model averaging, the exact rule) with the
rules of [`fedhead.analysis.procedure`][fedhead.analysis.procedure].

A procedure is declared once, as a file ``conf/procedure/<name>.yaml`` naming this class; the
procedures a run knows are those files
([`fedhead.settings.config.procedure_names`][fedhead.settings.config.procedure_names]).
Every layer acts on the switches below, never on the name, so a procedure that combines existing
switches differently needs only its yaml file.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhead.analysis.constraints import SAFE_NAME_NEED, ConfigError, Field, Together, check, safe_name
from fedhead.analysis.procedure import GAMMA_NEED, RHO_NEED, gamma_problem, reference_name, rho_problem

__all__ = ["ProcedureConfig"]

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
        """The Gram the procedure should reach; see
        [`reference_name`][fedhead.analysis.procedure.reference_name]."""
        return reference_name(self.gamma, self.centered)
