"""A small synthetic raw data set for the data tests: tabular or uint8 images, with test split and groups."""

from __future__ import annotations

import numpy as np

from fedhead.data import RawDataset


def toy_raw(n=400, c=3, seed=0, image=False, n_test=0, groups=False, standardize=True) -> RawDataset:
    """``n`` samples of ``c`` correlated targets (mean 3, scale 5); input 0 is the sample index."""
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(n, c)) @ rng.normal(size=(c, c)) * 5.0 + 3.0
    if image:
        x = rng.integers(0, 256, size=(n, 1, 4, 4), dtype=np.uint8)
        x[:, 0, 0, 0] = np.arange(n) % 256
    else:
        x = np.column_stack([np.arange(n), rng.normal(size=n)]).astype(np.float32)
    kw = {}
    if n_test:
        kw["y_test"] = rng.normal(size=(n_test, c)) @ np.eye(c) * 5.0 + 3.0
        kw["x_test"] = (
            rng.integers(0, 256, size=(n_test, 1, 4, 4), dtype=np.uint8)
            if image
            else np.arange(n_test, dtype=np.float32)[:, None].repeat(2, 1)
        )
    if groups:
        kw["groups"] = np.arange(n) % 4
        if n_test:
            kw["groups_test"] = np.arange(n_test) % 4
    return RawDataset(
        name="toy",
        x=x,
        y=y,
        target_names=tuple(f"t{i}" for i in range(c)),
        standardize=standardize,
        source="test",
        **kw,
    )
