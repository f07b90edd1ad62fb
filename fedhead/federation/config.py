"""The one reader of the composed Hydra config of ``fedhead-run`` (and of ``flwr run .``).

:func:`load_config` is the one place that reads raw keys: it instantiates every ``_target_``
node (``dataset``, ``model``, ``train``, ``procedure``, ``experiment``, ``resources``,
``output``) into the typed objects of :mod:`fedhead.federation.job` and validates the whole
thing before anything starts. Everything deeper receives a :class:`JobConfig` (one federation:
one procedure). The procedures a run knows are the files of ``conf/procedure/``
(:func:`procedure_names`): a procedure is declared there once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedhead.analysis.procedure import ConfigError, ProcedureConfig
from fedhead.analysis.seeds import INIT_MODES
from fedhead.federation.job import (
    DEVICES,
    ExperimentConfig,
    FedheadConfig,
    JobConfig,
    OutputConfig,
    ResourcesConfig,
    RunSettings,
)
from fedhead.federation.limits import FailurePolicy, Timeouts

if TYPE_CHECKING:  # flwr: not imported at fedhead-run's start-up
    from flwr.app import Context

__all__ = [
    "DEVICES",
    "INIT_MODES",
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
    "procedure_names",
]

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


def conf_dir():
    """The Hydra config tree: the installed package ``conf`` (``pkg://conf``), or, in a source
    checkout where ``conf`` is not installed, the ``conf/`` folder beside the ``fedhead`` package."""
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


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose ``conf/config.yaml`` with ``overrides`` outside a Hydra app (tests, ``flwr run``)."""
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


def procedure_names() -> tuple[str, ...]:
    """The procedures a run knows: the files ``conf/procedure/<name>.yaml``, sorted by name.

    A procedure is one declaration, its yaml file (a :class:`ProcedureConfig` whose switches say
    what the clients and the server do); nothing else lists the names.
    """
    folder = conf_dir().joinpath("procedure")
    return tuple(sorted(f.name[: -len(".yaml")] for f in folder.iterdir() if f.name.endswith(".yaml")))


def load_procedure(name: str) -> ProcedureConfig:
    """Instantiate ``conf/procedure/<name>.yaml`` (used for an experiment's procedure list)."""
    path = _conf_file("procedure", name)
    if not path.is_file():
        raise ConfigError(
            f"unknown procedure {name!r} (no conf/procedure/{name}.yaml); choose from {procedure_names()}"
        )
    proc = _instantiate(OmegaConf.create(path.read_text()), f"procedure {name}", ProcedureConfig)
    if proc.name != name:
        raise ConfigError(f"conf/procedure/{name}.yaml declares name {proc.name!r}; the name must be the file's")
    return proc


def _check_proximal_term(proc: ProcedureConfig) -> None:
    """Refuse ``procedure.rho=`` that gives a procedure without a proximal term (``ordinary``,
    ``corrected``, ``centered``, ...: ``rho = 0`` in its yaml) one: the run would be another
    procedure under that procedure's name."""
    path = _conf_file("procedure", proc.name)
    if proc.rho == 0.0 or not path.is_file():
        return
    declared = float(OmegaConf.create(path.read_text()).get("rho", 0.0))
    if declared == 0.0:
        raise ConfigError(
            f"procedure {proc.name} has no proximal term (rho = 0 in conf/procedure/{proc.name}.yaml); "
            f"procedure.rho={proc.rho:g} would make it another procedure: choose one with a proximal term "
            f"(e.g. procedure=proximal or corrected_proximal)"
        )


def _instantiate(node, where: str, expected: type | tuple[type, ...]):
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


def load_config(cfg: DictConfig) -> FedheadConfig:
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
    # the torch layers' config classes: imported here, not at start-up (fedhead-run's own import)
    from fedhead.data.config import DatasetConfig
    from fedhead.models.config import FreeFeatureConfig, ModelConfig
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
    dataset = _instantiate(cfg.dataset, "dataset", DatasetConfig)
    model = _instantiate(cfg.model, "model", ModelConfig)
    train = _instantiate(cfg.train, "train", TrainConfig)
    resources_cfg = _instantiate(cfg.resources, "resources", ResourcesConfig)
    output = _instantiate(cfg.output, "output", OutputConfig)
    if cfg.get("experiment") is not None:
        experiment = _instantiate(cfg.experiment, "experiment", ExperimentConfig)
    else:
        experiment = ExperimentConfig()
    unknown = [p for p in experiment.procedures if not _conf_file("procedure", p).is_file()]
    if unknown:
        raise ConfigError(
            f"experiment {experiment.name!r}: unknown procedures {unknown}; choose from {procedure_names()}"
        )
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
        procedures: tuple[ProcedureConfig, ...] = (_instantiate(cfg.procedure, "procedure", ProcedureConfig),)
        _check_proximal_term(procedures[0])
    else:
        if not experiment.procedures:
            raise ConfigError(
                f"no procedure selected: pass procedure=NAME or use an experiment with a procedure list "
                f"(experiment {experiment.name!r} has none)"
            )
        procedures = tuple(load_procedure(p) for p in experiment.procedures)
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


def _plain_section(cfg: DictConfig, key: str, cls: type):
    """A section of plain keys (no ``_target_``) as ``cls``; defaults when absent."""
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


def job_from_context(context: Context) -> JobConfig:
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
