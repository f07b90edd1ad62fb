"""Shared pieces of the GPU check: the sizes (paper / tiny), the training case, results files.

Every step is a separate process (``python scripts/gpucheck/step_*.py --out DIR --sizes S ...``)
started by ``run_all.py`` with its own timeout; each writes ``DIR/<step>.json`` itself as soon
as it has measured something, so a step cut by its timeout leaves what it had.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the project travels as a plain folder (no pip install there)
    sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Case:
    """One client's local training as the paper runs it (docs/theory.md §10)."""

    name: str
    dataset: str
    model: str  # "resmlp" or "resnet18"
    width: int  # ResMLP hidden width / ResNet first-stage channels
    feature_dim: int  # P
    epochs: int  # E (the cap with local_tol)
    batch_size: int = 256
    local_tol: float | None = None
    data_overrides: tuple[tuple[str, object], ...] = ()
    rho: float = 1e-3


@dataclass(frozen=True)
class Sizes:
    """The sizes of one check: ``paper`` on the GPU, ``tiny`` for the CPU dry run."""

    name: str
    device: str
    hopper: Case
    hopper_tol: Case
    dsprites: Case
    train_budget_s: float  # wall budget of one timed training call (E is cut to fit, then projected)
    conc_epochs: int  # epochs per client in the concurrency step
    conc_processes: tuple[int, ...]  # K clients at once, as K processes
    conc_streams: tuple[int, ...]  # K clients at once, as K threads with a CUDA stream each
    deploy_epochs: int  # E per round in the deployment
    deploy_rounds: int
    deploy_clients: int
    deploy_width: int
    deploy_feature_dim: int
    deploy_evaluate: bool  # the evaluation phase of each round (resources.evaluate_mse)


def _hopper(name: str, width: int, p: int, epochs: int, tol: float | None) -> Case:
    return Case(name, "hopper", "resmlp", width, p, epochs, local_tol=tol)


PAPER = Sizes(
    name="paper",
    device="cuda",
    hopper=_hopper("hopper_resmlp", 1024, 512, 4000, None),
    hopper_tol=_hopper("hopper_resmlp_tol", 1024, 512, 4000, 1e-4),
    dsprites=Case("dsprites_resnet18", "dsprites", "resnet18", 64, 512, 4000),
    train_budget_s=45.0,
    conc_epochs=150,
    conc_processes=(1, 2, 4, 8),
    conc_streams=(1, 2, 4, 8),
    deploy_epochs=200,
    deploy_rounds=2,
    deploy_clients=4,
    deploy_width=1024,
    deploy_feature_dim=512,
    deploy_evaluate=True,
)

TINY = Sizes(
    name="tiny",
    device="cpu",
    hopper=_hopper("hopper_resmlp", 32, 16, 6, None),
    hopper_tol=_hopper("hopper_resmlp_tol", 32, 16, 6, 1e-1),
    dsprites=Case(
        "dsprites_resnet18",
        "dsprites",
        "resnet18",
        4,
        16,
        1,
        batch_size=64,
        data_overrides=(("n_train", 256), ("n_test", 64), ("image_size", 16)),
    ),
    train_budget_s=4.0,
    conc_epochs=3,
    conc_processes=(2,),  # the baseline K = 1 comes from streams (each process start costs seconds here)
    conc_streams=(1, 2),
    deploy_epochs=2,
    deploy_rounds=1,  # each round starts a Python process per ClientApp: slow on 2 shared cores
    deploy_clients=2,
    deploy_width=32,
    deploy_feature_dim=16,
    deploy_evaluate=False,
)

SIZES = {"paper": PAPER, "tiny": TINY}


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` atomically (a step may be killed at any time)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_default, allow_nan=True))
    os.replace(tmp, path)


def _default(o):
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    if isinstance(o, Path):
        return str(o)
    return repr(o)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def now() -> float:
    """Wall-clock seconds (comparable across processes: the GPU monitor's and the steps' timestamps)."""
    return time.time()


def finite_or_none(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def load_client(case: Case, client: int = 0):
    """(x, y, input_shape) of one client of ``case``'s data set, from fedhead's cache ($FEDHEAD_CACHE).

    The Hopper transitions must already be in the cache (gymnasium is not on the GPU machine):
    a miss is an error here, not a generation.
    """
    from fedhead.data.pipeline import cache_file
    from fedhead.data.registry import load_federated, make_config

    cfg = make_config(case.dataset, **dict(case.data_overrides))
    if case.dataset in ("hopper", "swimmer", "halfcheetah", "walker2d") and not cache_file(cfg).exists():
        raise FileNotFoundError(
            f"{case.dataset}: {cache_file(cfg)} is missing; run scripts/gpu_prepare.sh here and carry .gpu-data"
        )
    data = load_federated(cfg)
    cd = data.clients[client]
    return cd.x_train, cd.y_train, tuple(data.input_shape)


def build_model(case: Case, input_shape: tuple[int, ...], n: int, seed: int = 0):
    """The seeded backbone of ``case`` and a head ``Linear(P, C)`` with a seeded small init."""
    import torch

    from fedhead.models import ResMLPConfig, ResNetConfig, build_backbone

    if case.model == "resmlp":
        mcfg = ResMLPConfig(width=case.width, depth=3, feature_dim=case.feature_dim)
    elif case.model == "resnet18":
        mcfg = ResNetConfig(depth=18, width=case.width, feature_dim=case.feature_dim)
    else:
        raise ValueError(f"unknown model {case.model!r}")
    backbone = build_backbone(mcfg, input_shape, n, seed)
    return backbone, torch.nn.Linear(case.feature_dim, 3)


def head_init(c: int, p: int, seed: int = 0):
    """A seeded broadcast head ``(C, P)`` (what the server sends in round 1)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.normal(scale=1.0 / math.sqrt(p), size=(c, p)), np.zeros(c)


def train_once(case: Case, x, y, input_shape, device: str, epochs: int, seed: int = 0) -> dict:
    """One :func:`fedhead.train.train_local` call of ``case`` for ``epochs`` epochs; its timings."""
    import torch

    from fedhead.train import LocalProblem, TrainConfig, train_local

    backbone, head = build_model(case, input_shape, int(y.shape[0]), seed)
    w_t, b_t = head_init(int(y.shape[1]), case.feature_dim, seed)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(w_t, dtype=torch.float32))
        head.bias.copy_(torch.as_tensor(b_t, dtype=torch.float32))
    cfg = TrainConfig(batch_size=case.batch_size, local_tol=case.local_tol, warmup_steps=100)
    problem = LocalProblem(epochs=int(epochs), rho=case.rho)
    t0 = time.perf_counter()
    res = train_local(backbone, head, x, y, cfg, problem, broadcast_weight=w_t, device=device, seed=seed)
    if device.startswith("cuda"):
        torch.cuda.current_stream().synchronize()  # this client's stream only (threads share the GPU)
    wall = time.perf_counter() - t0
    m = res.metrics
    return {
        "epochs_asked": int(epochs),
        "epochs_run": int(m.epochs),
        "steps": int(m.n_steps),
        "loop_s": float(m.seconds),
        "wall_s": float(wall),
        "overhead_s": float(wall - m.seconds),  # set-up, last-layer solve, checks' share is in loop_s
        "s_per_step": float(m.seconds / max(m.n_steps, 1)),
        "trained_gap": finite_or_none(m.trained_gap),
        "converged": m.converged,
        "n_samples": int(m.n_samples),
        "device": m.device,
    }
