"""``dataset=table``: a user's own files, one client per file, per site value or by the eigen split.

Files are read by their suffix: ``.csv`` (header row; ``NA``, ``NaN`` and empty cells are
missing), ``.parquet`` (both through pyarrow) or ``.npz`` (arrays ``x`` ``(N, F)`` or images
``(N, C, H, W)`` and ``y`` ``(N,)`` or ``(N, C)``; further 1-d arrays of length ``N`` serve as
the site or test column). Clients:

* ``dataset.files=[a.csv, b.parquet, ...]``: one client per file, in the given order;
* one file and ``dataset.site_column=NAME``: one client per distinct value, in sorted order;
* one file and ``dataset.partition=eigen dataset.num_clients=K``: the leading-eigenvector split
  of the pooled standardised targets ([`fedhead.data.partition.eigen_partition`][fedhead.data.eigen_partition]).

``dataset.targets`` names the target columns (required for tables; for ``.npz`` optional names of ``y``'s
columns); ``dataset.features`` the inputs (default: every other numeric column but the site and test
columns). A held-out test split comes from ``dataset.test_column`` (truthy rows are test rows) or
``dataset.test_fraction`` (that fraction of every site's rows, chosen by ``seed``). Targets
(``standardize_targets=pooled|none``) and tabular inputs (``standardize_inputs=pooled|site|none``) are
standardised with the pooled training statistics (docs/theory.md §10). With one file per client and every
row ([`TableConfig.site_local`][fedhead.data.table_config.TableConfig.site_local]) a federation never
pools rows: each client reads only its own file ([`fedhead.data.site`][fedhead.data.site]; a deployed
SuperNode's node config ``data-path``, then ``dataset.files=[] dataset.num_clients=M``) and the pooled
statistics come from the exchanged moments
([`fedhead.analysis.standardization`][fedhead.analysis.standardization]);
[`load`][fedhead.data.table.load] gives the same numbers on one machine (the simulation's checks before
Ray). ``n_train=null`` keeps every training row.

Every problem with the files is a [`TableError`][fedhead.data.table_files.TableError] (a data and a configuration error:
one line naming the file and column, exit status 2 in ``fedhead-run``), raised before training.
"""

from __future__ import annotations

import logging

import numpy as np

from fedhead.data.base import DataError, RawDataset
from fedhead.data.pipeline import standardize_targets
from fedhead.data.site import (
    finite_rows,
    refuse_nonfinite_statistics,
    refuse_overflow,
    row_statistics,
    run_columns,
    site_arrays,
    split_index,
    standardize_per_site,
    standardize_pooled,
    test_rows,
    too_few_for_covariance,
)
from fedhead.data.table_config import TableConfig
from fedhead.data.table_files import (
    SUFFIXES,
    SitePart,
    SiteTable,
    TableError,
    check_distinct_keys,
    check_same_columns,
    file_key,
    file_label,
    read_file,
    site_values,
)

__all__ = ["TableConfig", "TableError", "SiteTable", "read_file", "load", "SUFFIXES"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- reading
def load(cfg: TableConfig) -> RawDataset:
    """Read, check and assemble the user's files (see the module docstring)."""
    if not cfg.files:
        raise TableError(
            "dataset.files=[]: the sites' files are on the SuperNodes (node config data-path); "
            "only a deployment can read them"
        )
    cfg = cfg.preflight()
    sites = [read_file(f) for f in cfg.files]
    keys = [file_key(s.path) for s in sites]
    check_distinct_keys([s.path for s in sites], keys)
    check_same_columns(sites)
    first = sites[0]
    targets, features = run_columns(cfg, first)
    parts: list[SitePart] = []
    if cfg.site_column is not None:
        site = sites[0]
        x, y = site_arrays(cfg, site, targets, features)
        test = test_rows(cfg, site, y.shape[0], 0) if cfg.test_column else None
        raw_v = site.columns[cfg.site_column]
        values = site_values(site, cfg.site_column, site.path)
        key = raw_v if cfg.site_column in site.numeric else np.asarray([str(s) for s in raw_v], dtype=object)
        for i, v in enumerate(values):
            rows = np.flatnonzero(key == v)
            label = f"{file_label(site.path)} [{cfg.site_column}={v}]"
            t = test[rows] if test is not None else test_rows(cfg, site, rows.size, i)
            parts.append(SitePart(label, x[rows], y[rows], t))
    else:
        for site, key in zip(sites, keys):
            x, y = site_arrays(cfg, site, targets, features)
            index = split_index(key)  # as a site read alone (fedhead.data.site)
            parts.append(SitePart(file_label(site.path), x, y, test_rows(cfg, site, y.shape[0], index)))
    names = tuple(targets) + tuple(features)
    is_image = first.x is not None and first.x.ndim == 4
    for p in parts:
        keep = finite_rows(cfg, p.label, p.x, p.y, names)
        p.x, p.y, p.test = p.x[keep], p.y[keep], p.test[keep]
        stats = row_statistics(p.x[~p.test], p.y[~p.test], is_image=is_image)  # what the site would report
        refuse_nonfinite_statistics(p.label, stats, tuple(targets), tuple(features))
    return _assemble(cfg, parts, tuple(targets), tuple(features), is_image=is_image)


def _assemble(cfg: TableConfig, parts: list[SitePart], targets, features, *, is_image: bool) -> RawDataset:
    c = len(targets)
    need = c + 1
    eigen = cfg.partition == "eigen"
    has_test = cfg.test_column is not None or cfg.test_fraction > 0
    x = np.concatenate([p.x[~p.test] for p in parts])
    y = np.concatenate([p.y[~p.test] for p in parts])
    groups = np.concatenate([np.full(int((~p.test).sum()), i, dtype=np.int64) for i, p in enumerate(parts)])
    if (n_train := cfg.n_train) is not None:
        if n_train > y.shape[0]:
            raise TableError(
                f"dataset.n_train={n_train} but the files have {y.shape[0]} training rows; "
                "leave it null to keep every row"
            )
        keep = np.sort(np.random.default_rng(int(cfg.seed)).choice(y.shape[0], n_train, replace=False))
        x, y, groups = x[keep], y[keep], groups[keep]
    counts = np.bincount(groups, minlength=len(parts))
    if eigen:
        clients = cfg.num_clients
        assert clients is not None  # TableConfig's rule: partition=eigen needs num_clients
        if y.shape[0] < need * clients:
            raise TableError(
                f"{parts[0].label}: {y.shape[0]} training rows cannot give {clients} clients "
                f"{need} rows each (C + 1 = {need}: a client's target covariance must be full rank)"
            )
    else:
        for p, n in zip(parts, counts):
            if n < need:
                raise too_few_for_covariance(p.label, int(n), c)
            if has_test and not p.test.any():
                raise TableError(f"{p.label}: no test rows (dataset.test_column / dataset.test_fraction)")
    x_test = y_test = groups_test = None
    if has_test:
        x_test = np.concatenate([p.x[p.test] for p in parts])
        y_test = np.concatenate([p.y[p.test] for p in parts])
        groups_test = np.concatenate([np.full(int(p.test.sum()), i, dtype=np.int64) for i, p in enumerate(parts)])
        if y_test.shape[0] == 0:
            raise TableError(f"{parts[0].label}: the test split is empty (dataset.test_column / dataset.test_fraction)")
    if is_image:
        if x.dtype != np.uint8:
            x = x.astype(np.float32)
            x_test = None if x_test is None else x_test.astype(np.float32)
    else:
        x = x.reshape(x.shape[0], -1).astype(np.float64)
        x_test = None if x_test is None else x_test.reshape(x_test.shape[0], -1).astype(np.float64)
        if cfg.standardize_inputs == "pooled":
            x, x_test = standardize_pooled(x, x_test)
        elif cfg.standardize_inputs == "site":
            x, x_test = standardize_per_site(x, x_test, None if eigen else groups, groups_test)
        _refuse_overflow(parts, features, "input", x, x_test, groups, groups_test)
        x = x.astype(np.float32)
        x_test = None if x_test is None else x_test.astype(np.float32)
    try:  # the targets as the pipeline standardises them (fedhead.data.pipeline.build_federated)
        st = standardize_targets(y, y_test, enabled=cfg.standardize_targets == "pooled", names=targets)
    except DataError as exc:
        raise TableError(f"{', '.join(p.label for p in parts)}: {exc}") from None
    _refuse_overflow(parts, targets, "target", st.y, st.y_test, groups, groups_test)
    label = f"{parts[0].label}" if len(parts) == 1 else f"{parts[0].label} ... ({len(parts)} sites)"
    return RawDataset(
        name=cfg.name,
        x=x,
        y=np.ascontiguousarray(y, dtype=np.float64),
        target_names=tuple(targets),
        x_test=x_test,
        y_test=None if y_test is None else np.ascontiguousarray(y_test, dtype=np.float64),
        groups=None if eigen else groups,
        groups_test=None if eigen else groups_test,
        standardize=cfg.standardize_targets == "pooled",
        source=f"table {label}; inputs {list(features) if features else 'x'}",
    )


def _refuse_overflow(parts: list[SitePart], names, what: str, z, z_test, groups, groups_test) -> None:
    """[`refuse_overflow`][fedhead.data.site.refuse_overflow] of the standardised training and test
    rows, naming the file of the first row that overflows."""
    labels = [p.label for p in parts]
    refuse_overflow(z, tuple(names), labels, groups, what)
    if z_test is not None:
        refuse_overflow(z_test, tuple(names), labels, groups_test, what)
