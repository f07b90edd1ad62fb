"""Fixtures shared across test folders."""

import pytest


@pytest.fixture
def one_torch_thread():
    """Run the test with one torch thread (fast and deterministic on 2 shared cores)."""
    import torch  # here, so that the pure-math tests never import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
