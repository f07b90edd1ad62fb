"""One run of a sweep: [`RunSpec`][fedhead.sweep.specs.RunSpec], the settings (data sets) a preset
runs on, and the Hydra overrides every run starts from ([`spec`][fedhead.sweep.specs.spec]); the
presets of [`fedhead.sweep.presets`][fedhead.sweep.presets] are lists of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fedhead.sweep.scales import Scale

TABULAR = ("beijing", "swimmer", "hopper", "halfcheetah", "walker2d")
IMAGE = ("mpiigaze", "300w_lp", "dsprites", "shapes3d", "cifar_geo")
SETTINGS = TABULAR + IMAGE
#: data sets with no offline generator: they run only with their files (``data_roots``)
FILE_ONLY = ("beijing", "mpiigaze", "300w_lp")


@dataclass(frozen=True)
class RunSpec:
    """One federation of a sweep.

    ``id`` is unique in the sweep and is also its folder (``runs/<id>``); ``setting`` is the data
    set name, with a suffix for a variant of it (``shapes3d-large``); ``params`` are the knobs the
    sweep varies (what the report groups by); ``overrides`` compose the run's config.
    """

    id: str
    sweep: str
    setting: str
    dataset: str
    model: str
    procedure: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()


def _kind(setting: str) -> str:
    return "image" if setting in IMAGE else "tabular"


def _paper_model(setting: str) -> str:
    return "resnet18" if setting in IMAGE else "resmlp"


def _base(
    scale: Scale,
    setting: str,
    procedure: str,
    seed: int,
    *,
    rounds: int | None = None,
    epochs: int | None = None,
    tol: bool = True,
    model_overrides: Sequence[str] | None = None,
) -> list[str]:
    """The overrides every run starts from: data set, scale, procedure, seed, rounds, E.

    ``model_overrides`` replaces the scale's ``model=`` / ``model.*`` overrides (other models)."""
    model_ov = scale.image if _kind(setting) == "image" else scale.tabular
    if model_overrides is not None:
        keep = ("model.feature_dim=",)  # what every model has; the rest belongs to the scale's model
        model_ov = tuple(o for o in model_ov if not o.startswith("model") or o.startswith(keep)) + tuple(
            model_overrides
        )
    out = [
        f"dataset={setting}",
        "experiment=single",
        f"procedure={procedure}",
        f"seed={seed}",
        f"rounds={rounds or scale.rounds}",
        f"local_epochs={epochs or scale.local_epochs}",
        *model_ov,
        *scale.extra,
    ]
    if tol and scale.local_tol is not None:
        out.append(f"local_tol={scale.local_tol}")
    return out


def spec(
    sweep: str,
    scale: Scale,
    setting: str,
    procedure: str,
    seed: int,
    params: dict[str, Any] | None = None,
    extra: Sequence[str] = (),
    *,
    variant: str = "",
    dataset: str | None = None,
    model: str | None = None,
    **base_kw: Any,
) -> RunSpec:
    """The run of ``procedure`` on ``setting`` with ``seed`` in sweep ``sweep``: its id (sweep,
    setting, ``variant``, procedure, seed), the knobs ``params`` and the overrides of
    [`_base`][fedhead.sweep.specs._base] (``base_kw``) followed by ``extra``."""
    params = dict(params or {})
    base = _base(scale, dataset or setting, procedure, seed, **base_kw)
    overrides = tuple(base) + tuple(extra)
    model_name = model or next(
        (o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("model=")), _paper_model(setting)
    )
    parts = [sweep, setting] + ([variant] if variant else []) + [procedure, f"s{seed}"]
    return RunSpec(
        id="/".join(parts),
        sweep=sweep,
        setting=setting,
        dataset=dataset or setting,
        model=model_name,
        procedure=procedure,
        seed=seed,
        params=params,
        overrides=overrides,
    )


def preset_settings(name: str, scale: Scale, paper: Sequence[str]) -> Sequence[str]:
    """The settings of preset ``name`` at ``scale``: its size's (in the paper's order), else all."""
    chosen = scale.size(name).settings
    if chosen is None:
        return paper
    return [s for s in paper if s in chosen] or list(chosen)
