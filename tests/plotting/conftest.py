"""Figures render with the Agg backend, and every test closes the figures it opened."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest


@pytest.fixture(autouse=True)
def _close_all():
    yield
    plt.close("all")
