"""Shared fixtures of the Flower-app tests: hand-made federations and flwr task identity."""

from __future__ import annotations

import numpy as np
import pytest
from app_helpers import rotation, targets_with_moments


@pytest.fixture
def fig2_targets() -> list[np.ndarray]:
    """theory.md §12 'fig2' instance (C = 2, M = 3), with unequal sample counts."""
    covs = [
        rotation(-40) @ np.diag([3.0, 0.11]) @ rotation(-40).T,
        rotation(10) @ np.diag([1.1, 0.45]) @ rotation(10).T,
        rotation(55) @ np.diag([2.4, 0.13]) @ rotation(55).T,
    ]
    means = [np.array([0.0, -2.2]), np.zeros(2), np.array([0.0, 2.2])]
    counts = [256, 200, 300]
    return [targets_with_moments(n, mu, s, seed=i) for i, (n, mu, s) in enumerate(zip(counts, means, covs))]


@pytest.fixture
def task_identity():
    """flwr needs a task identity to create instruction messages outside a run."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved
