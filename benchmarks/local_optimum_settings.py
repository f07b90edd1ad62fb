"""The settings of ``benchmarks/bench_local_optimum.py``: the clients it trains, and their models.

Settings:

1. ``quickstart``: the default ``fedhead-run`` clients (``conf/experiment/quickstart.yaml``:
   simulated Hopper, 4 clients of 100 transitions, ``model=resmlp_small``, lr 3e-3, full batch),
   the first round (head = broadcast = the common initial head, every client's common initial
   backbone, the client's first-round seed), with ``rho = 0`` and with the quickstart's proximal
   ``rho``.
2. ``dsprites``: the offline dSprites renderer shrunk to ``--image-n`` training images split over
   2 clients, a small residual CNN (GroupNorm, global average pooling, ``fc: width -> P``) wrapped
   as :class:`fedhead.models.backbones.ImageBackbone`, ``rho = 0``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fedhead.models import FreeFeatureConfig, build_backbone, build_head
from fedhead.models.backbones import ImageBackbone
from fedhead.train import LocalProblem, TrainConfig, round_seed


# ------------------------------------------------------------------------------------------ models
class _ResBlock(nn.Module):
    """``x -> ReLU(x + GN(conv(ReLU(GN(conv(x))))))``, channels and size preserved."""

    def __init__(self, width: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(groups, width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(groups, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.gn2(self.conv2(torch.relu(self.gn1(self.conv1(x))))))


class SmallResCNN(nn.Module):
    """A CPU-sized residual CNN for 64 x 64 inputs: a 4 x 4 stride-4 stem (16 x 16), a stride-2
    convolution (8 x 8), a residual block, a stride-2 convolution (4 x 4), a residual block, global
    average pooling and ``fc = Linear(width, P)`` (no activation: the features)."""

    def __init__(self, in_channels: int, width: int, feature_dim: int, groups: int = 4):
        super().__init__()
        half = max(groups, width // 2)
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, half, 4, stride=4, bias=False),
            nn.GroupNorm(groups, half),
            nn.ReLU(),
            nn.Conv2d(half, width, 3, stride=2, padding=1, bias=False),
            nn.GroupNorm(groups, width),
            nn.ReLU(),
            _ResBlock(width, groups),
            nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False),
            nn.GroupNorm(groups, width),
            nn.ReLU(),
            _ResBlock(width, groups),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(width, feature_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x))


def small_cnn_backbone(input_shape: tuple[int, int, int], width: int, feature_dim: int, seed: int) -> ImageBackbone:
    """The common initial image backbone, built from ``seed`` without touching the global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = SmallResCNN(input_shape[0], width, feature_dim)
    return ImageBackbone(net, tuple(input_shape), feature_dim)


# ------------------------------------------------------------------------------------------ settings
@dataclass
class Client:
    """One client of a setting: its data, how to build its initial backbone and head, its seed."""

    pid: int
    x: torch.Tensor
    y: torch.Tensor
    make_backbone: Callable[[], nn.Module]
    make_head: Callable[[], nn.Linear]
    seed: int  # the client's first-round seed (as clients/app.py derives it)


@dataclass
class Setting:
    """The clients of one benchmark setting, its recipe and problem, the ``rho`` values and the caps."""

    name: str
    description: str
    clients: list[Client]
    train: TrainConfig  # the base recipe (lr, batch size); tol, check_every and the literal switches set per run
    problem: LocalProblem  # the job's problem (lambdas); rho and the epoch cap set per run
    rhos: list[float]
    cap: int
    literal_cap: int


def quickstart_setting(n_clients: int, cap: int, literal_cap: int, outdir: str) -> Setting:
    from fedhead.data.registry import load_federated
    from fedhead.settings.config import compose_config, load_config

    job = load_config(compose_config([])).jobs(outdir)[0]
    data = load_federated(job.dataset, num_clients=job.settings.num_clients)
    seed, model = job.settings.seed, job.model
    free = isinstance(model, FreeFeatureConfig)
    n_targets = data.n_targets
    clients = []
    for pid, cd in enumerate(data.clients[:n_clients]):
        x = torch.arange(cd.n_train) if free else cd.x_train
        clients.append(
            Client(
                pid,
                x,
                cd.y_train,
                (lambda cd=cd: build_backbone(model, data.input_shape, cd.n_train, seed)),
                (lambda: build_head(model.feature_dim, n_targets, seed)),
                round_seed(seed, 1, pid),
            )
        )
    t, problem = job.train, job.local_problem()
    n_max = max(c.y.shape[0] for c in clients)
    desc = (
        f"{data.name}, {len(clients)} of {data.n_clients} clients x N={[c.y.shape[0] for c in clients]}, "
        f"model={model.name} (width {getattr(model, 'width', '-')}, P={model.feature_dim}), C={n_targets}, "
        f"lr {t.lr:g}, batch {min(t.batch_size, n_max)}{' (full batch)' if t.batch_size >= n_max else ''}, "
        f"lambda_H={problem.lambda_h:g}, lambda_W={problem.lambda_w:g}; round 1 (head = broadcast = initial head)"
    )
    return Setting("quickstart", desc, clients, t, problem, sorted({0.0, float(problem.rho)}), cap, literal_cap)


def dsprites_setting(
    n_images: int,
    n_clients: int,
    width: int,
    feature_dim: int,
    batch_size: int,
    lr: float,
    cap: int,
    literal_cap: int,
    outdir: str,
) -> Setting:
    from fedhead.data.registry import load_federated
    from fedhead.settings.config import compose_config, load_config

    job = load_config(
        compose_config(["dataset=dsprites", f"dataset.n_train={n_images}", "dataset.n_test=0", "num_clients=2"])
    ).jobs(outdir)[0]
    data = load_federated(job.dataset, num_clients=job.settings.num_clients)
    seed, n_targets = job.settings.seed, data.n_targets
    shape = tuple(data.input_shape)
    clients = []
    for pid, cd in enumerate(data.clients[:n_clients]):
        clients.append(
            Client(
                pid,
                cd.x_train,
                cd.y_train,
                (lambda: small_cnn_backbone(shape, width, feature_dim, seed)),
                (lambda: build_head(feature_dim, n_targets, seed)),
                round_seed(seed, 1, pid),
            )
        )
    train = dataclasses.replace(job.train, lr=lr, batch_size=batch_size)
    problem = job.local_problem()
    n_max = max(c.y.shape[0] for c in clients)
    desc = (
        f"{data.name} (offline renderer) {n_images} images over {data.n_clients} clients, {len(clients)} used "
        f"x N={[c.y.shape[0] for c in clients]}, input {shape}, small residual CNN (GroupNorm, width {width}, "
        f"global avg pool, fc {width}->{feature_dim}), C={n_targets}, lr {lr:g}, batch {min(batch_size, n_max)}"
        f"{' (full batch)' if batch_size >= n_max else ''}, lambda_H={problem.lambda_h:g}, "
        f"lambda_W={problem.lambda_w:g}"
    )
    return Setting("dsprites", desc, clients, train, problem, [0.0], cap, literal_cap)
