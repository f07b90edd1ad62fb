"""A site-local table's own range, and whether a standardisation the server sends can overflow at it,
decided from the statistics the site itself releases, never from its rows.

A site standardises its rows with the pooled offsets ``o`` and scales ``s`` the server sends; a value
beyond float32 once standardised could not be trained on. Checking the rows themselves against
``(o, s)`` would answer, for offsets and scales the server chooses, whether ``max |y - o| / s`` leaves
float32's range: bisecting that finds a column's minimum and maximum. Instead:

* when it reads its file, a site refuses a column with a row farther than ``RANGE_RADIUS (|mu| + sigma)``
  from its training mean ``mu`` (``sigma`` its training standard deviation;
  [`refuse_out_of_range`][fedhead.data.site_range.refuse_out_of_range]). That answer depends on the
  site's data alone, the same for every run;
* a standardisation then fits ([`standardization_fits`][fedhead.data.site_range.standardization_fits])
  when ``(|mu - o| + RANGE_RADIUS (|mu| + sigma)) / s`` is within float32 for every column: a bound on
  every row's standardised value that uses only ``mu`` and ``sigma``. An honest server's pooled scale is
  at least ``sigma sqrt(N_m / N)`` and ``|mu - o| sqrt(N_m / N)``, so its standardisation fits unless a
  column's ``|mu|`` is beyond about ``1e32`` times its pooled scale.
"""

from __future__ import annotations

import numpy as np

from fedhead.analysis.standardization import FLOAT32_MAX, Standardization
from fedhead.data.site import Site, site_statistics
from fedhead.data.table_files import TableError

__all__ = ["RANGE_RADIUS", "refuse_out_of_range", "standardization_fits"]

#: How far from its training mean a site's row may lie, in units of the column's ``|mu| + sigma``.
RANGE_RADIUS = 2.0**20


def _radius(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``RANGE_RADIUS (|mu| + sigma)`` per column."""
    with np.errstate(over="ignore", invalid="ignore"):
        return RANGE_RADIUS * (np.abs(mean) + np.sqrt(np.maximum(var, 0.0)))


def _columns(site: Site) -> list[tuple[str, tuple[str, ...], list[np.ndarray], np.ndarray, np.ndarray]]:
    """``(kind, names, row blocks (N, K), mean (K,), variance (K,))`` of the targets and the tabular inputs."""
    stats = site_statistics(site)
    out = [
        ("target", site.target_names, [site.y, site.y_test], stats["y_mean"], np.diagonal(stats["y_cov"]).copy()),
    ]
    if not site.is_image:
        out.append(("input", site.features, [site.x, site.x_test], stats["x_mean"], stats["x_var"]))
    return out


def refuse_out_of_range(site: Site) -> None:
    """Refuse a site with a row (training or test) farther than ``RANGE_RADIUS (|mu| + sigma)`` from its
    column's training mean: one line naming the file and the column, never a value."""
    for kind, names, blocks, mean, var in _columns(site):
        radius = _radius(mean, var)
        for rows in blocks:
            if rows is None or rows.size == 0:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                far = ~(np.abs(np.asarray(rows, dtype=np.float64).reshape(rows.shape[0], -1) - mean) <= radius)
            if far.any():
                col = int(np.nonzero(far.any(axis=0))[0][0])
                name = repr(names[col]) if col < len(names) else f"x[{col}]"
                raise TableError(
                    f"{site.label}: {kind} column {name} has a row farther from its training mean than 2^20 times "
                    "(|mean| + standard deviation); check the column's values",
                    detail=f"{int(far.any(axis=1).sum())} such row(s)",
                )


def standardization_fits(site: Site, st: Standardization) -> bool:
    """Whether every row of ``site`` (within its range) stays within float32 once standardised with ``st``:
    finite offsets, positive scales and ``(|mu - o| + RANGE_RADIUS (|mu| + sigma)) / s <= FLOAT32_MAX`` for the
    targets and, pooled, the tabular inputs. It reads only the site's statistics."""
    checks = []
    for kind, _, _, mean, var in _columns(site):
        if kind == "target":
            checks.append((mean, var, st.target_offset, st.target_scale))
        elif st.input_mode == "pooled" and np.asarray(st.input_offset).size:
            checks.append((mean, var, st.input_offset, st.input_scale))
    for mean, var, offset, scale in checks:
        o, s = np.asarray(offset, dtype=np.float64), np.asarray(scale, dtype=np.float64)
        if o.shape != mean.shape or s.shape != mean.shape:
            return False
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            bound = (np.abs(mean - o) + _radius(mean, var)) / s
        if not (np.all(np.isfinite(o)) and np.all(s > 0) and np.all(bound <= FLOAT32_MAX)):
            return False
    return True
