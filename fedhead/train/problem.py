"""The local problem of one training call: what the federation fixes, as opposed to the recipe.

[`fedhead.train.train_local`][fedhead.train.train_local] minimises (docs/theory.md §2, §8)::

    L_m(W, b, H) + rho/2 ||W - W_t||_F^2 + gamma C_m(W)

for ``E`` epochs. Which problem that is (``lambda_H``, ``lambda_W``, ``rho``, ``gamma``,
client-wise centring) and the epoch budget ``E`` are set by the procedure
([`fedhead.settings.procedure.ProcedureConfig`][fedhead.settings.procedure.ProcedureConfig]) and
the run's top-level settings, where each is stored and validated;
[`LocalProblem`][fedhead.train.LocalProblem] is the trainer's frozen view of them, built per job by
[`fedhead.settings.job.JobConfig.local_problem`][fedhead.settings.job.JobConfig.local_problem]
(never stored in a config). How the problem is solved (optimiser, batches, learning rate,
clipping, warm-up, ``local_tol``, the finishing step) is the recipe,
[`fedhead.train.TrainConfig`][fedhead.train.TrainConfig].
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhead.analysis.procedure import ProcedureTerms, gamma_problem, penalty_problem, rho_problem
from fedhead.train.config import TrainInputError


@dataclass(frozen=True)
class LocalProblem:
    """The objective and the budget of one client's training call (docs/theory.md §2, §8, §10).

    Attributes
    ----------
    epochs : int
        ``E``, passes over the client's data per call (the cap when ``TrainConfig.local_tol`` is
        set); top-level ``local_epochs``.
    lambda_h, lambda_w : float
        ``lambda_H``, ``lambda_W`` of docs/theory.md §2, both > 0; top-level ``lambda_h`` /
        ``lambda_w``.
    rho : float
        Proximal weight: ``rho/2 ||W - W_t||_F^2`` to the broadcast head (0 = off); the
        procedure's ``rho`` (or the top-level ``rho=``).
    gamma : float
        Weight of the moment correction ``C_m(W)`` (docs/theory.md §8), in [0, 1] (0 = off, 1 =
        full); the procedure's ``gamma``.
    center_targets : bool
        Client-wise target centring: train on ``y - mu_m`` (the reference becomes ``G_within``);
        the procedure's ``centered``.

    The checks use the rules of [`fedhead.analysis.procedure`][fedhead.analysis.procedure] (one rule
    per parameter), so a problem built from a valid procedure and valid settings is valid; a bad one
    built by hand raises [`fedhead.train.TrainInputError`][fedhead.train.TrainInputError] naming the
    field.
    """

    epochs: int = 4000
    lambda_h: float = 0.01
    lambda_w: float = 0.01
    rho: float = 0.0
    gamma: float = 0.0
    center_targets: bool = False

    def __post_init__(self) -> None:
        def bad(field: str, need: str) -> TrainInputError:
            return TrainInputError(f"LocalProblem.{field} {need}, got {getattr(self, field)!r}")

        if not isinstance(self.epochs, int) or isinstance(self.epochs, bool) or self.epochs < 1:
            raise bad("epochs", "must be an integer >= 1")
        for field, problem in (
            ("lambda_h", penalty_problem(self.lambda_h)),
            ("lambda_w", penalty_problem(self.lambda_w)),
            ("rho", rho_problem(self.rho)),
            ("gamma", gamma_problem(self.gamma)),
        ):
            if problem:
                raise bad(field, problem)

    @classmethod
    def from_procedure(
        cls, procedure: ProcedureTerms, *, epochs: int, lambda_h: float, lambda_w: float
    ) -> LocalProblem:
        """The problem of ``procedure`` (its ``rho``, ``gamma`` and centring) with the budget
        ``epochs`` and the penalties ``lambda_h``, ``lambda_w``: the one place a procedure's
        switches become the trainer's terms (a run's
        [`fedhead.settings.job.JobConfig.local_problem`][fedhead.settings.job.JobConfig.local_problem],
        a user's own ClientApp, docs/library.md)."""
        return cls(
            epochs=epochs,
            lambda_h=lambda_h,
            lambda_w=lambda_w,
            rho=float(procedure.rho),
            gamma=float(procedure.gamma),
            center_targets=bool(procedure.centered),
        )
