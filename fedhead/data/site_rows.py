"""A site-local table's rows standardised with the federation's
[`Standardization`][fedhead.analysis.standardization.Standardization]: as numpy arrays
([`standardized_rows`][fedhead.data.site_rows.standardized_rows], no torch: a site's moments and its
regime check need none) and as the client's tensors of the same memory
([`client_data`][fedhead.data.site_rows.client_data], for a model).
"""

from __future__ import annotations

import numpy as np

from fedhead.analysis.standardization import Standardization
from fedhead.data.base import ClientData
from fedhead.data.site import Site, refuse_overflow, standardize_pooled
from fedhead.data.table_files import TableError

__all__ = ["SiteRows", "client_data", "standardized_rows"]

#: A site's standardised rows ``(x, y, x_test, y_test)`` (numpy; the test pair None without test rows).
SiteRows = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def standardized_rows(site: Site, st: Standardization) -> SiteRows:
    """The site's rows standardised locally with the federation's ``st`` (float32 targets; tabular
    inputs float32, images as stored), a value beyond float32 refused; numpy, no torch (a site's
    moments and regime check need none)."""

    def targets(y):
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, naming the column
            return np.ascontiguousarray((y - st.target_offset) / st.target_scale, dtype=np.float32)

    def inputs(x):
        if site.is_image:
            return np.ascontiguousarray(x if x.dtype == np.uint8 else x.astype(np.float32))
        pooled = st.input_mode == "pooled" and st.input_offset.size
        if pooled and st.input_offset.shape != (x.shape[1],):
            n = st.input_offset.size
            raise TableError(f"{site.label}: {x.shape[1]} inputs but the federation standardises {n}")
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, naming the column
            if pooled:
                x = (x - st.input_offset) / st.input_scale
            return np.ascontiguousarray(x, dtype=np.float32)

    if not site.is_image and st.input_mode == "site":
        x, xt = standardize_pooled(site.x, site.x_test)  # this site's own mean and std
        site = Site(**{**site.__dict__, "x": x, "x_test": xt})
    x, y = inputs(site.x), targets(site.y)
    x_test, y_test = (None, None) if site.y_test is None else (inputs(site.x_test), targets(site.y_test))
    for t in (y, y_test):
        if t is not None:
            refuse_overflow(t, site.target_names, [site.label], None, "target")
    if not site.is_image:
        for t in (x, x_test):
            if t is not None:
                refuse_overflow(t, site.features, [site.label], None, "input")
    return x, y, x_test, y_test


def client_data(rows: SiteRows) -> ClientData:
    """The client's tensors of its [`standardized_rows`][fedhead.data.site_rows.standardized_rows] (the same memory)."""
    import torch  # here only: a site's statistics, moments and regime check need none (see fedhead.data.base)

    x, y, x_test, y_test = rows
    cd = ClientData(x_train=torch.from_numpy(x), y_train=torch.from_numpy(y))
    if x_test is not None and y_test is not None:
        cd.x_test, cd.y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)
    return cd
