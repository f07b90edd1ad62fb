"""The network experiments of docs/theory.md §10 as named sweeps (``fedhead-sweep sweep=NAME``).

A preset is a pure function ``(scale, seeds) -> list[RunSpec]``: one
[`RunSpec`][fedhead.sweep.specs.RunSpec] per federation (one procedure of one setting and
seed), written as the Hydra overrides ``fedhead-run`` would take; [`plan`][fedhead.sweep.presets.plan]
picks the preset by name and the scale (`fedhead.sweep.scales`) sizes it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Sequence

from fedhead.analysis.constraints import ConfigError
from fedhead.sweep.scales import SCALES, Scale
from fedhead.sweep.specs import IMAGE, SETTINGS, TABULAR, RunSpec, preset_settings, spec

MAIN_PROCEDURES = ("ordinary", "proximal", "corrected", "corrected_proximal")


# ------------------------------------------------------------------------------ presets
def main_grid(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Ten settings x ordinary, proximal, corrected, corrected_proximal x seeds (rho = 1e-3)."""
    return [
        spec("main", scale, s, p, seed, {"rho": _rho(p)})
        for s in preset_settings("main", scale, SETTINGS)
        for seed in seeds
        for p in MAIN_PROCEDURES
    ]


def fixed_e(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Main's four procedures once more with the paper's fixed E: E epochs in every round, no
    tolerance stop (``local_epochs`` the scale's E; the rest as main). The variable of the open
    findings C5 and C8 (README, scale=cpu): with the tolerance stop, warm-started ordinary clients
    stop after tens of epochs near the broadcast. At the paper scale these are main's runs."""
    return [
        spec("fixed_e", scale, s, p, seed, {"rho": _rho(p), "local_epochs": scale.local_epochs}, tol=False)
        for s in preset_settings("fixed_e", scale, SETTINGS)
        for seed in seeds
        for p in MAIN_PROCEDURES
    ]


def _rho(procedure: str) -> float:
    return 1e-3 if procedure in ("proximal", "corrected_proximal") else 0.0


def centering(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Ordinary training with and without client-wise target centring (reference G_within)."""
    return [
        spec("centering", scale, s, p, seed)
        for s in preset_settings("centering", scale, SETTINGS)
        for seed in seeds
        for p in ("ordinary", "centered")
    ]


PAPER_EPOCHS = (50, 100, 200, 400, 1000, 2000, 4000)
RHOS = (0.0, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


#: local training as the paper's recipe has it: no closing head and last-layer solves. They end
#: every client at its optimum whatever E (fedhead.train.loop), so a finite budget would not show
#: (the measurement: the epochs preset's size in fedhead.sweep.scales)
LITERAL = ("train.solve_last_layer=false",)


def epochs(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """E in {50, ..., 4000} (mapped by the scale) for ordinary and proximal training: E epochs in
    every round (no early stop) of the literal local training (`LITERAL`): E is the variable, so
    nothing that ends a client at its optimum whatever E runs."""
    out = []
    for s in preset_settings("epochs", scale, SETTINGS):
        for e_paper in PAPER_EPOCHS:
            e = scale.epochs(e_paper)
            for p in ("ordinary", "proximal"):
                for seed in seeds:
                    out.append(
                        spec(
                            "epochs",
                            scale,
                            s,
                            p,
                            seed,
                            {"local_epochs": e, "paper_local_epochs": e_paper},
                            LITERAL,
                            variant=f"E{e}",
                            epochs=e,
                            tol=False,
                        )
                    )
    return out


def rho(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Proximal training with rho in {0, 1e-5, ..., 1}, E local epochs in every round (no early
    stop, as the paper's recipe). What rho does is what it does during training, so nothing that
    would select the head for it runs: the finishing rotation is off
    (``train.finish_rotation=false``; it selects the closest head for any rho > 0), and a
    tolerance stop would end warm-started rounds after a few tens of epochs, before rho has moved
    the head along its orbit."""
    return [
        spec(
            "rho",
            scale,
            s,
            "proximal",
            seed,
            {"rho": r},
            (f"rho={r:g}", "train.finish_rotation=false"),
            variant=f"rho{r:g}",
            tol=False,
        )
        for s in preset_settings("rho", scale, SETTINGS)
        for r in RHOS
        for seed in seeds
    ]


ALIGN_SETTINGS = ("beijing", "swimmer", "hopper", "halfcheetah", "shapes3d", "cifar_geo")


def alignment(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Aligned vs proximal vs ordinary (seeds 0-4), and the same with correction (seeds 0-2)."""
    plain = [
        spec("alignment", scale, s, p, seed, {"rho": _rho(p), "correction": False})
        for s in preset_settings("alignment", scale, ALIGN_SETTINGS)
        for seed in seeds
        for p in ("ordinary", "proximal", "aligned")
    ]
    corr_seeds = [s for s in seeds if s in scale.sweep_seeds] or list(seeds)[:1]
    corrected = [
        spec("alignment", scale, s, p, seed, {"rho": _rho(p), "correction": True})
        for s in preset_settings("alignment", scale, ALIGN_SETTINGS)
        for seed in corr_seeds
        for p in ("corrected", "corrected_proximal", "aligned_corrected")
    ]
    return plain + corrected


def mismatch(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """The cost of mismatched coordinates: one round of plain head averaging (no proximal term,
    no alignment), the same local models averaged as trained and after alignment, with common and
    with independent backbones. Targets are centred per client (``procedure=centered``): with
    uncentred targets the averaged bias misses every client's own target mean, and that excess
    (measured: 97-99 % of it on smoke Hopper and dSprites) hides the cost of the coordinates."""
    return [
        spec(
            "mismatch",
            scale,
            s,
            "centered",
            seed,
            {"init": init},
            (f"init={init}", "measure_mismatch=true"),
            variant=init,
            rounds=1,
            epochs=scale.one_round_epochs,
        )
        for s in preset_settings("mismatch", scale, SETTINGS)
        for init in ("common", "independent")
        for seed in seeds
    ]


def architectures(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Image settings: residual CNN (GroupNorm), residual CNN + correction, ResNet-34."""
    widths = scale.image_widths
    models = {
        "rescnn": ("model=rescnn", *widths),
        "resnet34": ("model=resnet34", *(o for o in widths if not o.startswith("model.groups="))),
    }
    out = []
    for s in preset_settings("architectures", scale, IMAGE):
        for model, proc in (("rescnn", "ordinary"), ("rescnn", "corrected"), ("resnet34", "ordinary")):
            for seed in seeds:
                out.append(
                    spec(
                        "architectures",
                        scale,
                        s,
                        proc,
                        seed,
                        {"model": model},
                        variant=model,
                        model=model,
                        model_overrides=models[model],
                    )
                )
    return out


def data_size(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """3D Shapes and CIFAR-geo enlarged (more samples per client), E = 1000 (with a tolerance
    stop: the scale's E as its cap, the clients stop at their optima)."""
    e = 1000 if scale.local_tol is None else scale.local_epochs
    out = []
    for s in preset_settings("data_size", scale, ("shapes3d", "cifar_geo")):
        n = scale.large_n_train * scale.large_factor
        for p in ("ordinary", "corrected"):
            for seed in seeds:
                out.append(
                    spec(
                        "data_size",
                        scale,
                        f"{s}-large",
                        p,
                        seed,
                        {"n_train": n, "local_epochs": e, "paper_local_epochs": 1000},
                        (f"dataset.n_train={n}",),
                        dataset=s,
                        epochs=e,
                    )
                )
    return out


def full_model(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Full-model averaging on the tabular settings: E = 400, E = 4000, E = 4000 with correction
    (E mapped by the scale, E epochs in every round). E = 400 is the finite budget (the paper: far
    from both references) and runs the literal local training (`LITERAL`); the E = 4000 rows keep
    the closing solves, which end each client at its optimum as the paper's E = 4000 is meant to."""
    out = []
    for s in preset_settings("full_model", scale, TABULAR):
        for e_paper, gamma in ((400, 0.0), (4000, 0.0), (4000, 1.0)):
            e = scale.epochs(e_paper)
            tag = f"E{e}" + ("-corrected" if gamma else "")
            for seed in seeds:
                out.append(
                    spec(
                        "full_model",
                        scale,
                        s,
                        "full_model",
                        seed,
                        {"local_epochs": e, "paper_local_epochs": e_paper, "gamma": gamma},
                        (f"procedure.gamma={gamma:g}",) + (LITERAL if e_paper < 4000 else ()),
                        variant=tag,
                        epochs=e,
                        tol=False,
                    )
                )
    return out


def prediction(scale: Scale, seeds: Sequence[int]) -> list[RunSpec]:
    """Train and test MSE of ordinary, proximal and corrected proximal training on the image settings."""
    return [
        spec("prediction", scale, s, p, seed, {"rho": _rho(p)}, ("resources.evaluate_mse=true",))
        for s in preset_settings("prediction", scale, IMAGE)
        for seed in seeds
        for p in ("ordinary", "proximal", "corrected_proximal")
    ]


#: preset name -> (builder, uses the main grid's seeds 0-4 rather than the sweeps' 0-2)
PRESETS: dict[str, tuple[Callable[[Scale, Sequence[int]], list[RunSpec]], bool]] = {
    "main": (main_grid, True),
    "fixed_e": (fixed_e, True),
    "centering": (centering, False),
    "epochs": (epochs, False),
    "rho": (rho, False),
    "alignment": (alignment, True),
    "mismatch": (mismatch, False),
    "architectures": (architectures, False),
    "data_size": (data_size, False),
    "full_model": (full_model, False),
    "prediction": (prediction, False),
}


def plan(
    name: str,
    scale: str,
    *,
    seeds: Sequence[int] | None = None,
    settings: Sequence[str] | None = None,
    runs: Sequence[str] | None = None,
) -> list[RunSpec]:
    """The runs of preset ``name`` at ``scale`` (``"smoke"``, ``"cpu"`` or ``"paper"``).

    ``seeds`` replaces the preset's seeds; ``settings`` keeps only runs of those settings (data
    set names; a ``-large`` variant counts as its data set), chosen from every setting of the
    preset, also those the scale leaves out by default (its `PresetSize`); ``runs`` keeps only the runs whose
    id matches one of its shell patterns (``epochs/hopper/E12/*``: one variant, to measure it).
    """
    if name not in PRESETS:
        raise ConfigError(f"sweep={name!r} is not a preset; choose from {sorted(PRESETS)}")
    if scale not in SCALES:
        raise ConfigError(f"scale={scale!r}: choose one of {sorted(SCALES)}")
    sc = SCALES[scale]
    builder, main_seeds = PRESETS[name]
    size = sc.size(name)
    if seeds is not None:
        seeds = [int(s) for s in seeds]
        if not seeds or any(s < 0 for s in seeds):
            raise ConfigError(f"seeds must be a non-empty list of non-negative integers, got {seeds}")
    default_seeds = size.seeds or (sc.seeds if main_seeds else sc.sweep_seeds)
    chosen = list(seeds) if seeds is not None else list(default_seeds)
    if settings is not None:  # picked from every setting of the preset, not only the scale's default
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"settings: unknown data sets {unknown}; choose from {list(SETTINGS)}")
        every = {k: dataclasses.replace(v, settings=None) for k, v in sc.presets.items()}
        sc = dataclasses.replace(sc, default_settings=None, presets=every)
    specs = builder(sc, chosen)
    if size.procedures is not None:
        specs = [r for r in specs if r.procedure in size.procedures]
    if settings is not None:
        specs = [r for r in specs if r.dataset in settings]
        if not specs:
            raise ConfigError(f"sweep {name!r} at scale {scale!r} has no run on settings {list(settings)}")
    if runs is not None:
        specs = [r for r in specs if any(fnmatch.fnmatchcase(r.id, p) for p in runs)]
        if not specs:
            raise ConfigError(f"sweep {name!r} at scale {scale!r}: no run id matches runs={list(runs)}")
    ids = [r.id for r in specs]
    if len(set(ids)) != len(ids):  # pragma: no cover - a preset bug
        raise RuntimeError(f"sweep {name}: duplicate run ids")
    return specs
