"""The data sample grid of ``fedhead-data``: target values in their units, clean numbers, the source named."""

from __future__ import annotations

import numpy as np
from figure_helpers import (
    drawn,
)


def test_sample_grid_units_and_clean_values():
    from fedhead.cli.data import sample_grid
    from fedhead.data.base import RawDataset
    from fedhead.data.pipeline import build_federated
    from fedhead.data.units import format_target, target_units

    assert format_target(9.17e-09, "image widths") == "0 image widths"
    assert format_target(30.456, "°") == "30.5°"
    assert target_units("300w_lp", ("head_pitch", "head_yaw", "head_roll")) == ["°", "°", "°"]
    assert target_units("cifar_geo", ("shift_x", "shift_y", "log_zoom"))[0] == "px"
    rng = np.random.default_rng(0)
    y = rng.uniform(0, 1, size=(40, 3))
    y[0, 0] = 9.17e-09
    raw = RawDataset(
        name="dsprites",
        x=rng.integers(0, 256, size=(40, 1, 16, 16), dtype=np.uint8),
        y=y,
        target_names=("pos_x", "pos_y", "scale"),
    )
    fig = drawn(sample_grid(build_federated(raw, 4), 8))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 8
    assert all("image widths" in s and "relative size" in s and "e-0" not in s for s in titles)
    assert "16 x 16 pixels" in fig._suptitle.get_text()


def test_cifar_geo_grid_names_its_source():
    from fedhead.cli.data import sample_grid
    from fedhead.data.base import RawDataset
    from fedhead.data.pipeline import build_federated

    rng = np.random.default_rng(1)
    raw = RawDataset(
        name="cifar_geo",
        x=rng.integers(0, 256, size=(16, 3, 40, 40), dtype=np.uint8),
        y=rng.normal(size=(16, 3)),
        target_names=("shift_x", "shift_y", "log_zoom"),
        source="fashion_mnist images from /x, shift/zoom construction (seed 0)",
    )
    fig = drawn(sample_grid(build_federated(raw, 4), 4))
    assert "Fashion-MNIST" in fig._suptitle.get_text() and "40 x 40 pixels" in fig._suptitle.get_text()
    assert all(" px" in ax.get_title() for ax in fig.axes if ax.get_title())
