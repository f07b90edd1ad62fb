"""How a sweep is sized: [`Scale`][fedhead.sweep.scales.Scale] and the named scales ``paper``, ``cpu`` and ``smoke``
(``scale=``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CPU", "PAPER", "SCALES", "SMOKE", "Scale"]


@dataclass(frozen=True)
class Scale:
    """How a sweep is sized: the model per data-set kind, data sizes, rounds, E and seeds.

    ``local_epochs`` is E (the cap when ``local_tol`` is set); ``epochs`` maps a paper E (E-sweep,
    data-size and full-model presets) to this scale's E.
    """

    name: str
    rounds: int
    local_epochs: int
    local_tol: float | None
    seeds: tuple[int, ...]
    sweep_seeds: tuple[int, ...]
    tabular: tuple[str, ...]
    image: tuple[str, ...]
    extra: tuple[str, ...] = ()
    epochs: Callable[[int], int] = lambda e: e
    large_factor: int = 4
    #: E of a one-round preset (mismatch: the first-round local models must be near their optima)
    one_round_epochs: int | None = None
    #: every setting of a preset (False: the smoke subset, ``presets._SMOKE_SETTINGS``)
    all_settings: bool = True
    #: the width overrides of the other image models (architectures preset)
    image_widths: tuple[str, ...] = ()
    #: training samples of the enlarged data-size settings, before ``large_factor``
    large_n_train: int = 12000


PAPER = Scale(
    name="paper",
    rounds=8,
    local_epochs=4000,
    local_tol=None,
    seeds=(0, 1, 2, 3, 4),
    sweep_seeds=(0, 1, 2),
    tabular=("model=resmlp",),
    image=("model=resnet18",),
)

# Sized for 2 CPU cores: 50 training samples per tabular client and 32 per image client (images
# resampled to 16 x 16), the CPU-sized ResMLP, P = 64 features, 3 rounds, full-batch local
# training stopped once a client is within 2e-3 of its local optimum (E = 400 caps it), one seed.
# Images use the residual CNN (the ResNet-18 layout with GroupNorm and a stride-1 stem) of width
# 8: a width-8 BatchNorm ResNet-18 on 16 x 16 images stops 0.2-0.4 above its local optimum after
# 500 steps, the residual CNN within 3e-3 (dSprites, measured). Same code path as the paper scale.
_SMOKE_COMMON = ("model.feature_dim=64", "train.lr=3.0e-3")
#: 32 images per client (16 x 16) and the width-8 residual CNN: the smoke and cpu scales' image runs
_SMALL_IMAGES = (
    "model=rescnn",
    "model.width=8",
    "model.groups=4",
    "dataset.image_size=16",
    "dataset.n_train=256",
    "dataset.n_test=64",
) + _SMOKE_COMMON
SMOKE = Scale(
    name="smoke",
    rounds=3,
    local_epochs=400,
    local_tol=2e-3,
    seeds=(0,),
    sweep_seeds=(0,),
    tabular=("model=resmlp_small", "dataset.n_train=200") + _SMOKE_COMMON,
    image=_SMALL_IMAGES,
    epochs=lambda e: max(2, e // 20),
    large_factor=2,
    one_round_epochs=1200,  # the three rounds' budget in one round: round 1 starts from a random backbone
    all_settings=False,
    image_widths=("model.width=8", "model.groups=4"),
    large_n_train=256,
)

# The paper's protocol (8 rounds, rho = 1e-3, the same lambdas, every setting) sized so that every
# client reaches its local optimum on 2 CPU cores: 100 samples per tabular client (the quickstart's
# size) with the CPU ResMLP, 32 per image client (64 for CIFAR-geo's four) with the width-8
# residual CNN on 16 x 16 images, P = 64, full-batch training stopped at a relative gap of 1e-3
# (E = 2000 caps it). The layer before the features has at least as many units as a client has
# samples (256 and 64 against 100, 32 and 64), so the closing head and last-layer solves of local
# training end every client at its exact local optimum (fedhead.train.trainer); the tolerance
# decides how long the rest of the network trains. Measured (2 busy cores): Hopper proximal,
# rho = 1e-3, 8 rounds: endpoint e_F 3.1e-4, delta_last 4.7e-3 (the paper: 2.9e-4, 4.5e-3).
CPU = Scale(
    name="cpu",
    rounds=8,
    local_epochs=2000,
    local_tol=1e-3,
    seeds=(0, 1, 2),
    sweep_seeds=(0, 1, 2),
    tabular=("model=resmlp_small", "dataset.n_train=400") + _SMOKE_COMMON,
    image=_SMALL_IMAGES,
    extra=("train.check_every=10",),  # a converged client stops within 10 epochs of a warm-started round
    epochs=lambda e: max(2, e // 2),
    large_factor=2,
    one_round_epochs=2000,
    image_widths=("model.width=8", "model.groups=4"),
    large_n_train=256,
)
SCALES = {"smoke": SMOKE, "cpu": CPU, "paper": PAPER}
