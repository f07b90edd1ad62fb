"""The typed configuration objects of a run: what :func:`fedhead.federation.config.load_config`
builds from the composed Hydra config, and :class:`JobConfig`, the one federation (one
procedure) everything below the entry points receives.

Every class is a frozen dataclass that validates itself. The data, model and train configs are
the data/models/train layers' own classes; they are imported for the annotations only, so this
module (and ``fedhead-run``'s start-up) stays free of torch until a job is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhead.analysis.procedure import ConfigError, ProcedureConfig, penalty_problem, rho_problem
from fedhead.analysis.seeds import INIT_MODES
from fedhead.federation.checkpoint import config_hash
from fedhead.federation.limits import FailurePolicy, Timeouts

if TYPE_CHECKING:  # torch-importing layers: annotations only (see the module docstring)
    from fedhead.data.config import DatasetConfig
    from fedhead.models.config import ModelConfig
    from fedhead.train.config import TrainConfig
    from fedhead.train.problem import LocalProblem

__all__ = [
    "DEVICES",
    "ExperimentConfig",
    "FedheadConfig",
    "JobConfig",
    "OutputConfig",
    "ResourcesConfig",
    "RunSettings",
]

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ExperimentConfig:
    """Which procedures a run executes one after another (Hydra group ``experiment/``); the
    names are checked against ``conf/procedure/`` by :func:`fedhead.federation.config.load_config`."""

    name: str = "single"
    procedures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "procedures", tuple(str(p) for p in self.procedures))


@dataclass(frozen=True)
class ResourcesConfig:
    """Ray simulation resources (per virtual SuperNode / client)."""

    client_cpus: float = 1.0
    client_gpus: float | None = None
    ray_num_cpus: int | None = None
    ray_num_gpus: int | None = None
    evaluate_mse: bool = True

    def __post_init__(self) -> None:
        if not self.client_cpus > 0:
            raise ConfigError(f"resources.client_cpus must be > 0, got {self.client_cpus}")
        if self.client_gpus is not None and not 0 <= self.client_gpus <= 1:
            raise ConfigError(
                f"resources.client_gpus must be a GPU share in [0, 1] (fractions let clients share a GPU), "
                f"got {self.client_gpus}"
            )

    def backend_config(self, num_clients: int, use_cuda: bool) -> dict[str, Any]:
        """The ``backend_config`` of :func:`flwr.simulation.run_simulation` (Ray backend)."""
        gpus = self.client_gpus
        if gpus is None:
            gpus = (1.0 / num_clients) if use_cuda else 0.0
        init_args: dict[str, Any] = {}
        if self.ray_num_cpus is not None:
            init_args["num_cpus"] = int(self.ray_num_cpus)
        if self.ray_num_gpus is not None:
            init_args["num_gpus"] = int(self.ray_num_gpus)
        return {
            "client_resources": {"num_cpus": float(self.client_cpus), "num_gpus": float(gpus)},
            "init_args": init_args,
        }


@dataclass(frozen=True)
class OutputConfig:
    """Where and what a run writes."""

    dir: str | None = None
    tensorboard: bool = True
    figures: bool = True
    keep_client_state: bool = False
    #: each client saves its final model (backbone + shared head + offsets and scales) for
    #: ``fedhead-predict``: :mod:`fedhead.clients.export`
    export_model: bool = True


@dataclass(frozen=True)
class RunSettings:
    """Top-level keys users type (``rounds=``, ``local_epochs=``, ``seed=`` ...)."""

    rounds: int
    local_epochs: int
    seed: int
    rho: float | None
    lambda_h: float
    lambda_w: float
    num_clients: int
    device: str
    diagnose_only: bool
    #: ``common``: every client's backbone from the run seed; ``independent``: each from its own
    #: seed (:func:`fedhead.analysis.seeds.backbone_seed`)
    init: str = "common"
    #: round 1: measure the cost of mismatched coordinates (:mod:`fedhead.analysis.mismatch_cost`)
    measure_mismatch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise ConfigError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if not isinstance(self.local_epochs, int) or self.local_epochs < 1:
            raise ConfigError(f"local_epochs must be an integer >= 1, got {self.local_epochs!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.rho is not None and rho_problem(self.rho):
            raise ConfigError(f"rho {rho_problem(self.rho)} or null, got {self.rho!r}")
        for key in ("lambda_h", "lambda_w"):
            problem = penalty_problem(getattr(self, key))
            if problem:
                raise ConfigError(f"{key} {problem}, got {getattr(self, key)!r}")
        if not isinstance(self.num_clients, int) or self.num_clients < 2:
            raise ConfigError(f"num_clients must be an integer >= 2, got {self.num_clients!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.init not in INIT_MODES:
            raise ConfigError(f"init must be one of {INIT_MODES}, got {self.init!r}")
        if not isinstance(self.measure_mismatch, bool):
            raise ConfigError(f"measure_mismatch must be true or false, got {self.measure_mismatch!r}")


@dataclass(frozen=True)
class JobConfig:
    """Everything one federation (one procedure) needs; small and picklable (sent to Ray)."""

    settings: RunSettings
    procedure: ProcedureConfig
    dataset: DatasetConfig
    model: ModelConfig
    #: the local recipe only (the objective's terms: :meth:`local_problem`)
    train: TrainConfig
    resources: ResourcesConfig
    output: OutputConfig
    output_dir: Path
    state_dir: Path
    resolved: dict[str, Any] = field(default_factory=dict, compare=False)
    timeouts: Timeouts = field(default_factory=Timeouts)
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    #: :func:`fedhead.federation.checkpoint.config_hash` of ``resolved`` (checkpoints, the simulation's state key)
    config_hash: str = ""
    #: continue from ``output_dir/checkpoint.npz`` (``resume=<run folder>``)
    resume: bool = False

    @property
    def name(self) -> str:
        return self.procedure.name

    def local_problem(self) -> LocalProblem:
        """The trainer's :class:`fedhead.train.LocalProblem`, from where each term is stored: the
        procedure (``rho``, ``gamma``, centring) and the top-level settings (``local_epochs``,
        ``lambda_h``, ``lambda_w``). Built on demand, never stored."""
        from fedhead.train.problem import LocalProblem  # torch: this module is imported without it

        st = self.settings
        return LocalProblem.from_procedure(
            self.procedure, epochs=st.local_epochs, lambda_h=st.lambda_h, lambda_w=st.lambda_w
        )


@dataclass(frozen=True)
class FedheadConfig:
    """The whole typed configuration of one ``fedhead-run`` invocation."""

    settings: RunSettings
    dataset: DatasetConfig
    model: ModelConfig
    train: TrainConfig
    procedures: tuple[ProcedureConfig, ...]
    experiment: ExperimentConfig
    resources: ResourcesConfig
    output: OutputConfig
    resolved: dict[str, Any]
    timeouts: Timeouts = field(default_factory=Timeouts)
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    resume: str | None = None  # a run folder to continue (``resume=``)

    def output_root(self, output_dir: str | Path) -> Path:
        """Where the run writes: the ``resume`` folder, else ``output.dir``, else ``output_dir``."""
        if self.resume:
            return Path(self.resume)
        return Path(self.output.dir) if self.output.dir else Path(output_dir)

    def jobs(self, output_dir: str | Path) -> list[JobConfig]:
        """One :class:`JobConfig` per procedure; each writes into ``<root>/<procedure>``
        (:meth:`output_root`)."""
        root = self.output_root(output_dir)
        hash_ = config_hash(self.resolved)
        out = []
        for proc in self.procedures:
            if self.settings.rho is not None and proc.rho > 0.0 and self.settings.rho != proc.rho:
                # the top-level rho= sets the weight of procedures that have a proximal term only:
                # ordinary, corrected, centered, ... stay what their names say
                proc = dataclasses.replace(proc, rho=float(self.settings.rho))
            job_dir = root / proc.name
            out.append(
                JobConfig(
                    settings=self.settings,
                    procedure=proc,
                    dataset=self.dataset,
                    model=self.model,
                    train=self.train,
                    resources=self.resources,
                    output=self.output,
                    output_dir=job_dir,
                    state_dir=job_dir / "client_state",
                    resolved=self.resolved,
                    timeouts=self.timeouts,
                    failure=self.failure,
                    config_hash=hash_,
                    resume=bool(self.resume),
                )
            )
        return out
