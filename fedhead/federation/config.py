"""Typed configuration of ``fedhead-run``, built once from the composed Hydra config.

:func:`load_config` is the one place that reads raw keys: it instantiates every ``_target_``
node (``dataset``, ``model``, ``train``, ``procedure``, ``experiment``, ``resources``,
``output``) into the dataclasses below and validates the whole thing before anything starts.
Everything deeper receives a :class:`JobConfig` (one federation: one procedure).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from fedhead.analysis.procedure import PROCEDURES, ConfigError, ProcedureConfig, penalty_problem, rho_problem
from fedhead.analysis.seeds import INIT_MODES
from fedhead.federation.limits import FailurePolicy, Timeouts

__all__ = [
    "DEVICES",
    "INIT_MODES",
    "PROCEDURES",
    "ConfigError",
    "ExperimentConfig",
    "FedheadConfig",
    "JobConfig",
    "OutputConfig",
    "ProcedureConfig",
    "ResourcesConfig",
    "RunSettings",
    "compose_config",
    "conf_dir",
    "hydra_config_path",
    "job_from_context",
    "load_config",
    "load_procedure",
]

DEVICES = ("auto", "cpu", "cuda")
#: Keys that are not part of the ``train:`` recipe, and where each is set instead (stored and
#: validated once there; the trainer receives them through :meth:`JobConfig.local_problem`).
_NOT_TRAIN_KEYS = {
    "epochs": "local_epochs=",
    "local_epochs": "local_epochs=",
    "lambda_h": "lambda_h=",
    "lambda_w": "lambda_w=",
    "seed": "seed=",
    "rho": "procedure.rho= (or rho= for every procedure)",
    "gamma": "procedure.gamma=",
    "center_targets": "procedure.centered=",
    "centered": "procedure.centered=",
}


@dataclass(frozen=True)
class ExperimentConfig:
    """Which procedures a run executes one after another (Hydra group ``experiment/``)."""

    name: str = "single"
    procedures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "procedures", tuple(str(p) for p in self.procedures))
        unknown = [p for p in self.procedures if p not in PROCEDURES]
        if unknown:
            raise ConfigError(f"experiment {self.name!r}: unknown procedures {unknown}; choose from {PROCEDURES}")


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
    dataset: Any  # fedhead.data.config.DatasetConfig (subclass)
    model: Any  # fedhead.models.ModelConfig (subclass)
    train: Any  # fedhead.train.config.TrainConfig: the local recipe only (see local_problem)
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

    def local_problem(self) -> Any:
        """The trainer's :class:`fedhead.train.LocalProblem`, from where each term is stored: the
        procedure (``rho``, ``gamma``, centring) and the top-level settings (``local_epochs``,
        ``lambda_h``, ``lambda_w``). Built on demand, never stored."""
        from fedhead.train.problem import LocalProblem

        st, proc = self.settings, self.procedure
        return LocalProblem(
            epochs=st.local_epochs,
            lambda_h=st.lambda_h,
            lambda_w=st.lambda_w,
            rho=float(proc.rho),
            gamma=float(proc.gamma),
            center_targets=bool(proc.centered),
        )


@dataclass(frozen=True)
class FedheadConfig:
    """The whole typed configuration of one ``fedhead-run`` invocation."""

    settings: RunSettings
    dataset: Any
    model: Any
    train: Any
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
        from fedhead.federation.checkpoint import config_hash

        root = self.output_root(output_dir)
        hash_ = config_hash(self.resolved)
        out = []
        for proc in self.procedures:
            rho = self.settings.rho if self.settings.rho is not None else proc.rho
            if rho != proc.rho:
                proc = dataclasses.replace(proc, rho=float(rho))
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


def conf_dir():
    """The Hydra config tree: the installed package ``conf`` (``pkg://conf``), or, in a source
    checkout where ``conf`` is not installed, the ``conf/`` folder beside the ``fedhead`` package."""
    import importlib.util

    spec = importlib.util.find_spec("fedhead.conf")
    if spec is not None and spec.submodule_search_locations:
        root = resources.files("fedhead.conf")
        if root.joinpath("config.yaml").is_file():
            return root
    local = Path(__file__).resolve().parent.parent / "conf"
    if (local / "config.yaml").is_file():
        return local
    raise ConfigError("cannot find the Hydra config tree: install the 'conf' package or run from a source checkout")


def hydra_config_path() -> str:
    """``config_path`` for ``hydra.main``: ``pkg://conf`` when installed, else the folder."""
    root = conf_dir()
    return str(root) if isinstance(root, Path) else "pkg://conf"


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """Compose ``conf/config.yaml`` with ``overrides`` outside a Hydra app (tests, ``flwr run``)."""
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    root = conf_dir()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name="config", overrides=list(overrides))
    if isinstance(root, Path):
        ctx = initialize_config_dir(config_dir=str(root), version_base=None)
    else:
        ctx = initialize_config_module(config_module="fedhead.conf", version_base=None)
    with ctx:
        return compose(config_name="config", overrides=list(overrides))


def _conf_file(group: str, name: str):
    return conf_dir().joinpath(group, f"{name}.yaml")


def load_procedure(name: str) -> ProcedureConfig:
    """Instantiate ``conf/procedure/<name>.yaml`` (used for an experiment's procedure list)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    if name not in PROCEDURES:
        raise ConfigError(f"unknown procedure {name!r}; choose from {PROCEDURES}")
    path = _conf_file("procedure", name)
    if not path.is_file():
        raise ConfigError(f"procedure {name!r} has no config file conf/procedure/{name}.yaml")
    return _instantiate(instantiate, OmegaConf.create(path.read_text()), f"procedure {name}", ProcedureConfig)


def _instantiate(instantiate, node, where: str, expected: type | tuple[type, ...]):
    try:
        obj = instantiate(node, _convert_="all")
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, ValueError) else None
        if cause is not None:  # the config class's own check (Hydra wraps it): its message says it all
            raise ConfigError(f"{where}: {cause}") from exc
        raise ConfigError(f"{where}: could not build the config object: {exc}") from exc
    if not isinstance(obj, expected):
        raise ConfigError(f"{where}: _target_ must build a {expected}, got {type(obj).__name__}")
    return obj


def load_config(cfg: Any) -> FedheadConfig:
    """Turn the composed Hydra ``DictConfig`` into typed objects and validate them.

    Parameters
    ----------
    cfg : omegaconf.DictConfig
        Hydra's composition of ``conf/config.yaml`` with the groups and the user's overrides.

    Returns
    -------
    FedheadConfig
        Procedures: the one selected with ``procedure=NAME``, else the experiment's list.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from fedhead.data.config import DatasetConfig
    from fedhead.models import ModelConfig
    from fedhead.train.config import TrainConfig

    for key in ("dataset", "model", "train", "resources", "output"):
        if cfg.get(key) is None:
            raise ConfigError(f"the composed config has no '{key}' section (check conf/config.yaml)")
    misplaced = [k for k in _NOT_TRAIN_KEYS if k in cfg.train]
    if misplaced:
        key = misplaced[0]
        raise ConfigError(
            f"train.{key} is not a train setting (train: is the local recipe); set {_NOT_TRAIN_KEYS[key]}"
        )
    resolved = OmegaConf.to_container(cfg, resolve=True)
    dataset = _instantiate(instantiate, cfg.dataset, "dataset", DatasetConfig)
    model = _instantiate(instantiate, cfg.model, "model", ModelConfig)
    train = _instantiate(instantiate, cfg.train, "train", TrainConfig)
    resources_cfg = _instantiate(instantiate, cfg.resources, "resources", ResourcesConfig)
    output = _instantiate(instantiate, cfg.output, "output", OutputConfig)
    if cfg.get("experiment") is not None:
        experiment = _instantiate(instantiate, cfg.experiment, "experiment", ExperimentConfig)
    else:
        experiment = ExperimentConfig()
    num_clients = cfg.get("num_clients")
    if num_clients is None:
        num_clients = dataset.num_clients
    rho = cfg.get("rho")
    settings = RunSettings(
        rounds=cfg.rounds,
        local_epochs=cfg.local_epochs,
        seed=cfg.seed,
        rho=None if rho is None else float(rho),
        lambda_h=float(cfg.lambda_h),
        lambda_w=float(cfg.lambda_w),
        num_clients=int(num_clients),
        device=str(cfg.device),
        diagnose_only=bool(cfg.diagnose_only),
        init=str(cfg.get("init", "common")),
        measure_mismatch=cfg.get("measure_mismatch", False),
    )
    if cfg.get("procedure") is not None:
        procedures: tuple[ProcedureConfig, ...] = (
            _instantiate(instantiate, cfg.procedure, "procedure", ProcedureConfig),
        )
    else:
        if not experiment.procedures:
            raise ConfigError(
                f"no procedure selected: pass procedure=NAME or use an experiment with a procedure list "
                f"(experiment {experiment.name!r} has none)"
            )
        procedures = tuple(load_procedure(p) for p in experiment.procedures)
    from fedhead.models import FreeFeatureConfig

    if isinstance(model, FreeFeatureConfig) and any(p.full_model for p in procedures):
        raise ConfigError(
            "procedure full_model cannot average free-feature backbones (one private feature per "
            "sample: their shapes differ between clients); pick another model= or procedure="
        )
    names = [p.name for p in procedures]
    if len(set(names)) != len(names):
        raise ConfigError(f"procedures must be distinct, got {names}")
    timeouts = _plain_section(cfg, "timeouts", Timeouts)
    failure = _plain_section(cfg, "failure", FailurePolicy)
    failure.check(settings.num_clients)
    return FedheadConfig(
        settings=settings,
        dataset=dataset,
        model=model,
        train=train,
        procedures=procedures,
        experiment=experiment,
        resources=resources_cfg,
        output=output,
        resolved=resolved,
        timeouts=timeouts,
        failure=failure,
        resume=None if cfg.get("resume") in (None, "") else str(cfg.get("resume")),
    )


def _plain_section(cfg: Any, key: str, cls: type):
    """A section of plain keys (no ``_target_``) as ``cls``; defaults when absent."""
    from omegaconf import OmegaConf

    node = cfg.get(key)
    if node is None:
        return cls()
    values = OmegaConf.to_container(node, resolve=True)
    if not isinstance(values, dict):
        raise ConfigError(f"{key} must be a mapping, got {values!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{key}: unknown keys {unknown}; expected some of {sorted(names)}")
    return cls(**values)


# ------------------------------------------------------------------------------ flwr run .
#: Run-config keys of a deployment (``[tool.flwr.app.config]``).
RUN_CONFIG_OVERRIDES = "overrides"
RUN_CONFIG_PROCEDURE_INDEX = "procedure-index"
RUN_CONFIG_OUTPUT_DIR = "output-dir"
#: ``true``: continue the run whose ``<output-dir>/<procedure>/checkpoint.npz`` is there
RUN_CONFIG_RESUME = "resume"

_JOBS: dict[tuple[str, str, int, bool], JobConfig] = {}


def run_config_flag(value: Any, key: str) -> bool:
    """A boolean run-config value (TOML ``true``/``false``; the strings too, as ``--run-config`` may pass them)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"run config {key}={value!r}: expected true or false")


def job_from_context(context: Any) -> JobConfig:
    """The job named by a deployment's run config (``overrides``, ``procedure-index``,
    ``output-dir``, ``resume``).

    ``resume = true`` continues from ``<output-dir>/<procedure>/checkpoint.npz`` (the ServerApp
    refuses a folder written with another config, as ``fedhead-run resume=`` does);
    ``resume=<folder>`` among the overrides works as in ``fedhead-run`` (the folder replaces
    ``output-dir``). ``context`` is the :class:`flwr.app.Context` of the ServerApp or
    ClientApp; jobs are built once per process and run config.
    """
    rc = context.run_config
    overrides = str(rc.get(RUN_CONFIG_OVERRIDES, ""))
    out = str(rc.get(RUN_CONFIG_OUTPUT_DIR, "outputs/flwr"))
    idx = int(rc.get(RUN_CONFIG_PROCEDURE_INDEX, 0))
    resume = run_config_flag(rc.get(RUN_CONFIG_RESUME, False), RUN_CONFIG_RESUME)
    key = (overrides, out, idx, resume)
    if key not in _JOBS:
        jobs = load_config(compose_config(overrides.split())).jobs(out)
        if not 0 <= idx < len(jobs):
            raise ValueError(f"procedure-index {idx} outside 0..{len(jobs) - 1} ({[j.name for j in jobs]})")
        job = jobs[idx]
        _JOBS[key] = dataclasses.replace(job, resume=True) if resume and not job.resume else job
    return _JOBS[key]
