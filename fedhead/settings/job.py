"""The typed configuration objects of a run: what [`load_config`][fedhead.settings.config.load_config]
builds, and [`JobConfig`][fedhead.settings.job.JobConfig], the one federation (one procedure)
everything below the entry points receives. Every class is a frozen dataclass checked by its
constraint table ([`fedhead.analysis.constraints`][fedhead.analysis.constraints]); the data, model
and train configs are imported for the annotations only (no torch at ``fedhead-run``'s start-up).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhead.analysis.constraints import ConfigError, Field, Together, boolean, check, integer, number, one_of, optional
from fedhead.analysis.frozen import FrozenDict, freeze
from fedhead.analysis.procedure import penalty_problem, rho_problem
from fedhead.analysis.seeds import INIT_MODES
from fedhead.results.io import to_jsonable
from fedhead.settings.limits import FailurePolicy, Timeouts
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.settings.procedure import ProcedureConfig
from fedhead.settings.trust import TrustPolicy

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
    "config_hash",
]

DEVICES = ("auto", "cpu", "cuda")
#: Top-level config keys left out of the hash: they may change between a run and its resume.
UNHASHED_KEYS = ("resume", "output", "hydra")


def config_hash(resolved: dict[str, Any]) -> str:
    """SHA-256 (hex) of the resolved config without [`UNHASHED_KEYS`][fedhead.settings.job.UNHASHED_KEYS]
    (canonical JSON): a checkpoint's config identity, and the simulation's state key.

    A ``_target_`` counts by its class name only, so that moving a config class to another module
    keeps every finished run and checkpoint resumable."""
    kept = {k: v for k, v in resolved.items() if k not in UNHASHED_KEYS}
    text = json.dumps(_class_names_only(to_jsonable(kept)), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _class_names_only(node: Any) -> Any:
    """``node`` with every ``_target_`` value cut to its last dotted part (the class name)."""
    if isinstance(node, dict):
        return {
            k: v.rsplit(".", 1)[-1] if k == "_target_" and isinstance(v, str) else _class_names_only(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_class_names_only(v) for v in node]
    return node


@dataclass(frozen=True)
class ExperimentConfig:
    """Which procedures a run executes one after another (Hydra group ``experiment/``); the
    names are checked against ``conf/procedure/`` by
    [`fedhead.settings.config.load_config`][fedhead.settings.config.load_config]."""

    name: str = "single"
    procedures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "procedures", tuple(str(p) for p in self.procedures))


_RESOURCES_RULES = (
    Field("client_cpus", number(0, low_open=True), "must be > 0"),
    Field(
        "ray_address",
        lambda v: v is None or (isinstance(v, str) and v.strip() != ""),
        "must be host:port, auto or null",
    ),
    Together(
        lambda r: not r.ray_address or (r.ray_num_cpus is None and r.ray_num_gpus is None),
        "resources.ray_num_cpus and ray_num_gpus must be null with resources.ray_address={ray_address}: "
        "the cluster decides its resources",
    ),
    Field(
        "client_gpus",
        optional(number(0, 1)),
        "must be a GPU share in [0, 1] (fractions let clients share a GPU)",
    ),
)


@dataclass(frozen=True)
class ResourcesConfig:
    """Ray simulation resources (per virtual SuperNode / client)."""

    client_cpus: float = 1.0
    client_gpus: float | None = None
    ray_num_cpus: int | None = None
    ray_num_gpus: int | None = None
    evaluate_mse: bool = True
    #: a running Ray cluster to join (``host:port`` of its head, or ``auto``); None: ``RAY_ADDRESS``
    #: if set, else Ray starts on this machine ([`fedhead.driver.cluster`][fedhead.driver.cluster])
    ray_address: str | None = None

    def __post_init__(self) -> None:
        check(self, _RESOURCES_RULES, prefix="resources.", error=ConfigError)

    def backend_config(self, num_clients: int, use_cuda: bool) -> dict[str, Any]:
        """The ``backend_config`` of `flwr.simulation.run_simulation` (Ray backend)."""
        gpus = self.client_gpus
        if gpus is None:
            gpus = (1.0 / num_clients) if use_cuda else 0.0
        init_args: dict[str, Any] = {}
        if self.ray_address:
            init_args["address"] = str(self.ray_address)
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
    #: ``fedhead-predict``: [`fedhead.clients.export`][fedhead.clients.export]
    export_model: bool = True


_SETTINGS_RULES = (
    Field("rounds", integer(1), "must be an integer >= 1"),
    Field("local_epochs", integer(1), "must be an integer >= 1"),
    Field("seed", integer(0), "must be a non-negative integer"),
    Field("rho", lambda v: v is None or not rho_problem(v), f"{rho_problem(-1.0)} or null"),
    Field("lambda_h", lambda v: not penalty_problem(v), f"{penalty_problem(0.0)}"),
    Field("lambda_w", lambda v: not penalty_problem(v), f"{penalty_problem(0.0)}"),
    Field("num_clients", integer(2), "must be an integer >= 2"),
    Field("device", one_of(DEVICES), f"must be one of {DEVICES}"),
    Field("diagnose_only", boolean, "must be true or false"),
    Field("init", one_of(INIT_MODES), f"must be one of {INIT_MODES}"),
    Field("measure_mismatch", boolean, "must be true or false"),
)


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
    #: seed ([`fedhead.analysis.seeds.backbone_seed`][fedhead.analysis.seeds.backbone_seed])
    init: str = "common"
    #: round 1: measure the cost of mismatched coordinates
    # ([`fedhead.analysis.mismatch_cost`][fedhead.analysis.mismatch_cost])
    measure_mismatch: bool = False

    def __post_init__(self) -> None:
        check(self, _SETTINGS_RULES, error=ConfigError)
        for key in ("lambda_h", "lambda_w"):
            object.__setattr__(self, key, float(getattr(self, key)))
        if self.rho is not None:
            object.__setattr__(self, "rho", float(self.rho))


@dataclass(frozen=True)
class JobConfig:
    """Everything one federation (one procedure) needs; small and picklable (sent to Ray)."""

    settings: RunSettings
    procedure: ProcedureConfig
    dataset: DatasetConfig
    model: ModelConfig
    #: the local recipe only (the objective's terms: [`local_problem`][fedhead.settings.job.JobConfig.local_problem])
    train: TrainConfig
    resources: ResourcesConfig
    output: OutputConfig
    output_dir: Path
    state_dir: Path
    #: the resolved Hydra config, read-only (results.json's ``config``; its hash: ``config_hash``)
    resolved: FrozenDict = field(default_factory=FrozenDict, compare=False)
    timeouts: Timeouts = field(default_factory=Timeouts)
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    trust: TrustPolicy = field(default_factory=TrustPolicy)
    #: what each site keeps to itself (its own ClientApp applies it)
    privacy: PrivacyPolicy = field(default_factory=PrivacyPolicy)
    #: [`config_hash`][fedhead.settings.job.config_hash] of ``resolved`` (checkpoints, the simulation's state key)
    config_hash: str = ""
    #: continue from ``output_dir/checkpoint.npz`` (``resume=<run folder>``)
    resume: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "resolved", freeze(self.resolved))

    @property
    def name(self) -> str:
        return self.procedure.name

    @property
    def private_heads(self) -> bool:
        """Whether the rounds' heads are already private for one row (``privacy.dp_unit=row``): DP-SGD outputs
        (``train.dp_noise > 0``) or the exact rule's closed forms from the site's own release
        ([`reads_own_release`][fedhead.settings.job.JobConfig.reads_own_release]). Their secure sums then carry
        no further noise and no site's row count, each head weighted by the public ``privacy.dp_max_rows``
        (docs/privacy.md §10)."""
        return self.privacy.row_level and (self.train.dp_noise > 0 or self.procedure.exact)

    @property
    def min_summed_sites(self) -> int:
        """``m_min``: the fewest sites whose secure sum the server may decode (the failure policy's minimum, at
        least 2); each site draws its share of a sum's noise for that many."""
        return max(2, self.failure.required(self.settings.num_clients))

    @property
    def reads_own_release(self) -> bool:
        """Whether each site reads its own moments from its row-level exchange release, which it keeps: the exact
        rule's closed forms, or the correction's ``Sigma_m`` under DP-SGD (``gamma > 0``). That release, noised by
        the site's share alone, is then a Gaussian mechanism of its own."""
        own = self.procedure.exact or (self.train.dp_noise > 0 and self.procedure.gamma > 0)
        return self.privacy.row_level and own

    @property
    def exchange_row_noise(self) -> float:
        """The noise multiplier at which the row-level exchange is accounted for one row: ``z``, or
        ``z / sqrt(m_min)`` when the site's own release, noised by its share alone, is used
        ([`reads_own_release`][fedhead.settings.job.JobConfig.reads_own_release])."""
        z = self.privacy.dp_noise
        return z / math.sqrt(self.min_summed_sites) if self.reads_own_release else z

    def local_problem(self) -> LocalProblem:
        """The trainer's [`fedhead.train.LocalProblem`][fedhead.train.LocalProblem], from where each term is stored: the
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
    resolved: FrozenDict
    timeouts: Timeouts = field(default_factory=Timeouts)
    failure: FailurePolicy = field(default_factory=FailurePolicy)
    trust: TrustPolicy = field(default_factory=TrustPolicy)
    privacy: PrivacyPolicy = field(default_factory=PrivacyPolicy)
    resume: str | None = None  # a run folder to continue (``resume=``)

    def __post_init__(self) -> None:
        object.__setattr__(self, "resolved", freeze(self.resolved))

    def output_root(self, output_dir: str | Path) -> Path:
        """Where the run writes: the ``resume`` folder, else ``output.dir``, else ``output_dir``."""
        if self.resume:
            return Path(self.resume)
        return Path(self.output.dir) if self.output.dir else Path(output_dir)

    def jobs(self, output_dir: str | Path) -> list[JobConfig]:
        """One [`JobConfig`][fedhead.settings.job.JobConfig] per procedure; each writes into ``<root>/<procedure>``
        ([`output_root`][fedhead.settings.job.FedheadConfig.output_root])."""
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
                    trust=self.trust,
                    privacy=self.privacy,
                    config_hash=hash_,
                    resume=bool(self.resume),
                )
            )
        return out
