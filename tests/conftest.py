"""Fixtures shared across test folders (``tests/`` mirrors the source tree: ``tests/<layer>/``).

The helpers of the Flower-facing tests (``app_helpers``, ``report_helpers``) sit beside this
file and are importable from every folder (pytest's ``pythonpath``, pyproject.toml).
"""

from __future__ import annotations

import numpy as np
import pytest
from app_helpers import rotation, targets_with_moments

#: The longest test files (a real smoke sweep, the report's sweep, the Ray federations), started
#: first so that the two pytest-xdist workers (``-n 2 --dist loadfile``) finish together.
LONGEST_FIRST = (
    "tests/sweep/test_sweep_run.py",
    "tests/report/test_report_sweeps.py",
    "tests/report/test_report.py",
    "tests/driver/test_simulation.py",
    "tests/data/test_shapes3d.py",
    "tests/train/test_train_optimum.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        return next((i for i, f in enumerate(LONGEST_FIRST) if item.nodeid.startswith(f)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the order within a file and among the rest is unchanged


@pytest.fixture
def one_torch_thread():
    """Run the test with one torch thread (fast and deterministic on 2 shared cores)."""
    import torch  # here, so that the pure-math tests never import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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


@pytest.fixture(scope="session")
def ray_session():
    """One Ray session for every Ray simulation of the test session (started by the first one).

    Inside it a simulation leaves Ray running (``fedhead.driver.ray_session.shared_ray_session``,
    re-entrant, so a sweep's own session reuses it): Ray's ~5-10 s start on 2 cores is paid once.
    """
    from fedhead.driver.ray_session import shared_ray_session

    with shared_ray_session({}, start=False):
        yield
