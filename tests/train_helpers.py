"""Shared set-up of the training tests (tests/train): a small client with exactly prescribed moments,
the recipe and problem from one set of keywords, and small models."""

import dataclasses

import numpy as np
import torch

from fedhead.models import FreeFeatureConfig, ResMLPConfig, build_backbone, build_head
from fedhead.train import LocalProblem, TrainConfig, train_local

LAM = 0.1
N, C, P = 16, 2, 4
SIGMA_M = np.array([[1.5, 0.3], [0.3, 0.6]])
MU_M = np.array([0.5, -1.0])
SIGMA_CEN = np.array([[0.8, -0.4], [-0.4, 2.0]])


# The literal theory.md §10 recipe: trained bias, no warm start of the last layer, no finishing step, no warm-up.
LITERAL = dict(optimal_bias=False, solve_last_layer=False, finish_features=False, warmup_steps=0)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


PROBLEM_FIELDS = {f.name for f in dataclasses.fields(LocalProblem)}


def setup(**kw) -> tuple[TrainConfig, LocalProblem]:
    """The recipe and the problem of ``train_local`` from one set of keywords (defaults elsewhere)."""
    problem = {k: v for k, v in kw.items() if k in PROBLEM_FIELDS}
    return TrainConfig(**{k: v for k, v in kw.items() if k not in PROBLEM_FIELDS}), LocalProblem(**problem)


def ufm_config(**kw) -> tuple[TrainConfig, LocalProblem]:
    """Full-batch Adam long enough to reach the UFM optimum (a larger lr than the paper recipe)."""
    base = dict(epochs=1000, batch_size=N, lr=1e-2, lr_min=1e-5, lambda_h=LAM, lambda_w=LAM, clip_norm=None)
    base.update(kw)
    return setup(**base)


def free_model(seed=0, head_seed=1):
    return build_backbone(FreeFeatureConfig(feature_dim=P), (), N, seed), build_head(P, C, head_seed)


def tabular_client(seed=0, n=40, f=5, c=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g), torch.randn(n, c, generator=g)


def train_resmlp(seed, x, y):
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=8), (x.shape[1],), x.shape[0], seed=3)
    head = build_head(8, y.shape[1], seed=4)
    res = train_local(bb, head, x, y, *setup(epochs=3, batch_size=16, lr=1e-2), device="cpu", seed=seed)
    return res, bb
