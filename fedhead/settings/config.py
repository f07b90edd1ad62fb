"""The one reader of the composed Hydra config of ``fedhead-run``, ``fedhead-sweep``'s runs and
``flwr run .``: [`load_config`][fedhead.settings.config.load_config] builds every section with
[`build_section`][fedhead.settings.config.build_section] and checks the whole before anything starts.
Outside a Hydra app the config is composed by [`compose_config`][fedhead.settings.config.compose_config].
The procedures a run knows are the files of ``conf/procedure/``
([`procedure_names`][fedhead.settings.config.procedure_names]).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from fedhead.analysis.constraints import ConfigError
from fedhead.analysis.frozen import freeze
from fedhead.analysis.seeds import INIT_MODES
from fedhead.settings.job import (
    DEVICES,
    ExperimentConfig,
    FedheadConfig,
    JobConfig,
    OutputConfig,
    ResourcesConfig,
    RunSettings,
)
from fedhead.settings.limits import FailurePolicy, Timeouts
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.settings.procedure import ProcedureConfig
from fedhead.settings.trust import TrustPolicy

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
    "build_section",
    "run_app",
    "compose_config",
    "CONF_PACKAGE",
    "HYDRA_CONFIG_PATH",
    "conf_dir",
    "job_from_context",
    "load_config",
    "load_procedure",
    "procedure_names",
]

#: Keys that are not part of the ``train:`` recipe, and where each is set instead (stored and
#: validated once there; the trainer receives them through
# [`JobConfig.local_problem`][fedhead.settings.job.JobConfig.local_problem]).
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


#: The Hydra config tree's package (``conf/config.yaml``, ``conf/data.yaml``, ``conf/sweep.yaml``).
CONF_PACKAGE = "fedhead.conf"
#: ``config_path`` for ``hydra.main``.
HYDRA_CONFIG_PATH = f"pkg://{CONF_PACKAGE}"


def conf_dir():
    """The Hydra config tree, the package ``fedhead.conf`` (a folder, installed or not)."""
    return resources.files(CONF_PACKAGE)


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with ``overrides`` outside a Hydra app (tests, ``flwr run``)."""
    if GlobalHydra.instance().is_initialized():
        return compose(config_name=config_name, overrides=list(overrides))
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


def run_app(
    config_name: str,
    task: Callable[[DictConfig], None],
    argv: Sequence[str],
    task_name: str,
    before_run: Callable[[Path], None] | None = None,
) -> None:
    """Run ``task`` as a Hydra app on ``conf/<config_name>.yaml`` with the command line ``argv``:
    the run's one composition (``hydra.main`` composes twice, once to find the run mode), then
    Hydra's job as ``hydra.main`` runs it (run folder, ``.hydra/``, logging). A command line with
    Hydra's own flags (``--help``, ``--cfg``, ``-m`` ...) goes to ``hydra.main`` as it is. A config
    that does not compose raises Hydra's exception (the entry points report it in one line).
    ``before_run`` receives the run folder (absolute, resolved once and pinned in the config)
    before Hydra creates or writes anything in it."""
    import hydra
    from hydra import version
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict, read_write

    if any(a.startswith("-") for a in argv):
        hydra.main(config_path=HYDRA_CONFIG_PATH, config_name=config_name, version_base=None)(task)()
        return
    version.setbase(None)
    GlobalHydra.instance().clear()
    app = Hydra.create_main_hydra2(task_name=task_name, config_search_path=create_config_search_path(HYDRA_CONFIG_PATH))
    try:
        cfg = app.compose_config(config_name=config_name, overrides=list(argv), run_mode=RunMode.RUN)
        if before_run is not None:
            HydraConfig.instance().set_config(cfg)  # ${hydra:...} in the folder's name
            run_dir = os.path.abspath(str(OmegaConf.select(cfg, "hydra.run.dir")))
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.run.dir = run_dir  # ${now:...} resolved once: Hydra creates this very folder
            before_run(Path(run_dir))
        callbacks = Callbacks(cfg)
        context = HydraContext(config_loader=app.config_loader, callbacks=callbacks)
        job = run_job(task, cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context)
        _ = job.return_value  # the task's exception, raised again
    finally:
        GlobalHydra.instance().clear()


def _conf_file(group: str, name: str):
    return conf_dir().joinpath(group, f"{name}.yaml")


def procedure_names() -> tuple[str, ...]:
    """The procedures a run knows: the files ``conf/procedure/<name>.yaml``, sorted by name.

    A procedure is one declaration, its yaml file (a
    [`ProcedureConfig`][fedhead.settings.procedure.ProcedureConfig] whose switches say what the
    clients and the server do); nothing else lists the names.
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
    proc = build_section(OmegaConf.create(path.read_text()), f"procedure {name}", ProcedureConfig)
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
    declared = float(plain_mapping(OmegaConf.create(path.read_text()), str(path)).get("rho", 0.0))
    if declared == 0.0:
        raise ConfigError(
            f"procedure {proc.name} has no proximal term (rho = 0 in conf/procedure/{proc.name}.yaml); "
            f"procedure.rho={proc.rho:g} would make it another procedure: choose one with a proximal term "
            f"(e.g. procedure=proximal or corrected_proximal)"
        )


def plain_mapping(node: Any, where: str) -> dict[str, Any]:
    """A config node (or a plain dict) as a resolved ``dict`` with string keys; anything else is
    one [`ConfigError`][fedhead.analysis.constraints.ConfigError] naming ``where``."""
    values = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    if not isinstance(values, dict):
        raise ConfigError(f"{where} must be a mapping, got {values!r}")
    return {str(k): v for k, v in values.items()}


def build_section(node: Any, where: str, expected: type, default: type | None = None) -> Any:
    """Every typed section of a run is built here: the class its ``_target_`` names (else
    ``default``), called with the section's resolved keys. An unknown key, a class that is not an
    ``expected``, or the class's own check is one
    [`ConfigError`][fedhead.analysis.constraints.ConfigError] naming the section (``where``; empty:
    the top-level keys)."""
    values = {k: v for k, v in plain_mapping(node, where).items() if k not in ("_target_", "_convert_")}
    target = node.get("_target_") if hasattr(node, "get") else None
    try:
        cls = get_class(target) if target else default
    except Exception as exc:
        raise ConfigError(f"{where}: _target_ {target!r} names no class ({exc})") from exc
    if not (isinstance(cls, type) and issubclass(cls, expected)):
        raise ConfigError(f"{where}: _target_ must build a {expected.__name__}, got {target!r}")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; expected some of {sorted(names)}")
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:  # the class's own check: its message says it all
        if isinstance(exc, ConfigError) and (not where or str(exc).startswith(f"{where}.")):
            raise  # the message already names the key as users type it
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from exc


def load_config(cfg: DictConfig) -> FedheadConfig:
    """Turn the composed Hydra ``DictConfig`` into typed objects and validate them.

    Parameters
    ----------
    cfg : omegaconf.DictConfig
        Hydra's composition of ``conf/config.yaml`` with the groups and the user's overrides.

    Returns
    -------
    FedheadConfig
        Procedures: the one selected with ``procedure=NAME``, else the experiment's list. The
        data set's files are checked here ([`DatasetConfig.preflight`][fedhead.data.config.DatasetConfig.preflight]).
    """
    # the torch layers' config classes: imported here, not at start-up (fedhead-run's own import)
    from fedhead.data.config import DatasetConfig
    from fedhead.models.config import FreeFeatureConfig, ModelConfig
    from fedhead.train.config import TrainConfig

    _check_sections(cfg)
    dataset = build_section(cfg.dataset, "dataset", DatasetConfig).preflight()
    model = build_section(cfg.model, "model", ModelConfig)
    experiment = build_section(cfg.get("experiment") or {}, "experiment", ExperimentConfig, ExperimentConfig)
    settings = build_section(_top_level_keys(cfg, dataset.num_clients), "", RunSettings, RunSettings)
    procedures = _procedures(cfg, experiment)
    if isinstance(model, FreeFeatureConfig) and any(p.full_model for p in procedures):
        raise ConfigError(
            "procedure full_model cannot average free-feature backbones (one private feature per "
            "sample: their shapes differ between clients); pick another model= or procedure="
        )
    failure = build_section(cfg.get("failure") or {}, "failure", FailurePolicy, FailurePolicy)
    failure.check(settings.num_clients)
    trust = build_section(cfg.get("trust") or {}, "trust", TrustPolicy, TrustPolicy)
    trust.check(settings.num_clients)
    privacy = build_section(cfg.get("privacy") or {}, "privacy", PrivacyPolicy, PrivacyPolicy)
    privacy.check_sites(settings.num_clients)
    privacy.check_trust(trust)
    _check_secure(privacy, procedures, settings, resume=cfg.get("resume") not in (None, ""))
    train = build_section(cfg.train, "train", TrainConfig)
    resources = build_section(cfg.resources, "resources", ResourcesConfig)
    privacy.check_dp_sgd(train.dp_noise, resources.evaluate_mse, procedures)
    return FedheadConfig(
        settings=settings,
        dataset=dataset,
        model=model,
        train=train,
        procedures=procedures,
        experiment=experiment,
        resources=resources,
        output=build_section(cfg.output, "output", OutputConfig),
        resolved=freeze(plain_mapping(cfg, "the composed config")),
        timeouts=build_section(cfg.get("timeouts") or {}, "timeouts", Timeouts, Timeouts),
        failure=failure,
        trust=trust,
        privacy=privacy,
        resume=None if cfg.get("resume") in (None, "") else str(cfg.get("resume")),
    )


def _check_secure(privacy: PrivacyPolicy, procedures, settings: RunSettings, *, resume: bool) -> None:
    """Refuse what secure mode cannot do: procedures and measurements that send per-site values in the clear,
    and (with differential privacy) a resume, which would release the exchange again with fresh noise."""
    if not privacy.secure:
        return
    full = [p.name for p in procedures if p.full_model]
    if full:
        raise ConfigError(
            f"privacy.mode=secure sums only the heads: procedure(s) {full} average the backbones in the clear; "
            "choose others with procedure="
        )
    if settings.measure_mismatch:
        raise ConfigError(
            "privacy.mode=secure: measure_mismatch=true needs each site's objectives in the clear; "
            "set measure_mismatch=false"
        )
    if resume and privacy.dp_noise > 0:
        raise ConfigError(
            "privacy.dp_noise > 0 cannot resume: the exchange would be released again with fresh noise (more "
            "epsilon) and its moments would differ from the checkpoint's; start the run again instead"
        )


def _check_sections(cfg: DictConfig) -> None:
    """Refuse a composed config without its sections, and run settings put under ``train:``."""
    for key in ("dataset", "model", "train", "resources", "output"):
        if cfg.get(key) is None:
            raise ConfigError(f"the composed config has no '{key}' section (check conf/config.yaml)")
    misplaced = [k for k in _NOT_TRAIN_KEYS if k in cfg.train]
    if misplaced:
        key = misplaced[0]
        raise ConfigError(
            f"train.{key} is not a train setting (train: is the local recipe); set {_NOT_TRAIN_KEYS[key]}"
        )


def _top_level_keys(cfg: DictConfig, dataset_clients: int | None) -> dict[str, Any]:
    """The keys of [`RunSettings`][fedhead.settings.job.RunSettings] (``num_clients`` null: the data set's)."""
    values = {f.name: cfg.get(f.name) for f in dataclasses.fields(RunSettings) if f.name in cfg}
    if values.get("num_clients") is None:
        values["num_clients"] = dataset_clients
    return values


def _procedures(cfg: DictConfig, experiment: ExperimentConfig) -> tuple[ProcedureConfig, ...]:
    """The procedure selected with ``procedure=NAME``, else the experiment's list (distinct, known)."""
    unknown = [p for p in experiment.procedures if not _conf_file("procedure", p).is_file()]
    if unknown:
        raise ConfigError(
            f"experiment {experiment.name!r}: unknown procedures {unknown}; choose from {procedure_names()}"
        )
    if cfg.get("procedure") is not None:
        procedure = build_section(cfg.procedure, "procedure", ProcedureConfig)
        _check_proximal_term(procedure)
        return (procedure,)
    if not experiment.procedures:
        raise ConfigError(
            f"no procedure selected: pass procedure=NAME or use an experiment with a procedure list "
            f"(experiment {experiment.name!r} has none)"
        )
    procedures = tuple(load_procedure(p) for p in experiment.procedures)
    names = [p.name for p in procedures]
    if len(set(names)) != len(names):
        raise ConfigError(f"procedures must be distinct, got {names}")
    return procedures


# ------------------------------------------------------------------------------ flwr run .
#: Run-config keys of a deployment (``[tool.flwr.app.config]``).
RUN_CONFIG_OVERRIDES = "overrides"
RUN_CONFIG_PROCEDURE_INDEX = "procedure-index"
RUN_CONFIG_OUTPUT_DIR = "output-dir"
#: ``true``: continue the run whose ``<output-dir>/<procedure>/checkpoint.npz`` is there
RUN_CONFIG_RESUME = "resume"


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
    ``output-dir``). ``context`` is the `flwr.app.Context` of the ServerApp or
    ClientApp; each call builds the job (the ClientApp caches it: [`fedhead.clients.cache`][fedhead.clients.cache]).
    """
    rc = context.run_config
    overrides = str(rc.get(RUN_CONFIG_OVERRIDES, ""))
    out = str(rc.get(RUN_CONFIG_OUTPUT_DIR, "outputs/flwr"))
    idx = int(rc.get(RUN_CONFIG_PROCEDURE_INDEX, 0))
    resume = run_config_flag(rc.get(RUN_CONFIG_RESUME, False), RUN_CONFIG_RESUME)
    jobs = load_config(compose_config(overrides.split())).jobs(out)
    if not 0 <= idx < len(jobs):
        raise ValueError(f"procedure-index {idx} outside 0..{len(jobs) - 1} ({[j.name for j in jobs]})")
    job = jobs[idx]
    if resume and job.privacy.dp_noise > 0:
        _check_secure(job.privacy, (), job.settings, resume=True)
    return dataclasses.replace(job, resume=True) if resume and not job.resume else job
