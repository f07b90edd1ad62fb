"""One site of ``dataset=table``: reading one client's file alone, its exchanged statistics and
its local standardisation (and the row helpers [`fedhead.data.table`][fedhead.data.table] shares).

In a run where every client reads only its own file
([`fedhead.data.table_config.TableConfig.site_local`][fedhead.data.table_config.TableConfig.site_local]; a deployed
SuperNode's ``data-path``), the client reads its file with [`read_site`][fedhead.data.site.read_site], reports
[`site_statistics`][fedhead.data.site.site_statistics] (raw target moments, per-feature count/mean/variance, its column
signature: no rows), and standardises locally with the federation's pooled offsets and scales
([`standardized_rows`][fedhead.data.site_rows.standardized_rows],
[`fedhead.analysis.standardization.Standardization`][fedhead.analysis.standardization.Standardization]).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from fedhead.analysis.standardization import float32_overflow, nonfinite_columns
from fedhead.data.base import RawDataset
from fedhead.data.pipeline import resize_images
from fedhead.data.table_config import TableConfig
from fedhead.data.table_files import (
    SitePart,
    SiteTable,
    TableError,
    file_key,
    file_label,
    numeric,
    read_file,
    truthy,
)

log = logging.getLogger("fedhead.data.table")  # the logger of dataset=table's messages


def run_columns(cfg: TableConfig, site: SiteTable) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The target and input names of the run, as one file gives them."""
    if site.y is not None:
        c = site.y.shape[1]
        targets = cfg.targets or tuple(f"y{i}" for i in range(c))
        if len(targets) != c:
            raise TableError(f"{file_label(site.path)}: dataset.targets names {len(targets)} columns but y has {c}")
        if cfg.features is not None:
            raise TableError(
                f"{file_label(site.path)}: dataset.features applies to CSV/Parquet tables, not .npz (x is used)"
            )
        return tuple(targets), ()
    if not cfg.targets:
        raise TableError(
            f"{file_label(site.path)}: dataset.targets=[COLUMN, ...] is required for CSV and Parquet files"
        )
    return tuple(cfg.targets), feature_names(cfg, site, tuple(cfg.targets))


def column_signature(site: SiteTable) -> tuple[str, ...]:
    """What must agree between the sites: the sorted column names (and ``.npz`` shapes)."""
    cols = sorted(site.columns)
    if (arrays := site.arrays) is not None:
        x, y = arrays
        cols += [f"x{list(x.shape[1:])}", f"y[{y.shape[1]}]"]
    return tuple(cols)


@dataclass
class Site:
    """One client's rows in the stored units (float64 tabular inputs), split into train and test."""

    label: str
    key: str  # sha256 of the file's bytes (16 hex digits): the site's identity, stable across restarts
    columns: tuple[str, ...]
    target_names: tuple[str, ...]
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    is_image: bool
    features: tuple[str, ...] = ()  # the input columns in order (CSV/Parquet; empty for .npz)

    @property
    def n_train(self) -> int:
        return int(self.y.shape[0])


def split_index(key: str) -> int:
    """The index a file's ``test_fraction`` split is drawn with, ``(seed, index)``: from its key
    (its bytes), so that a site splits alike wherever it is read and whatever its client number."""
    return int(key[:8], 16)


@dataclass(frozen=True)
class RowMinimum:
    """The fewest training rows a site takes part with (``rows``) and the setting that asks for
    it (``setting``, as users type it; the clients build it from
    [`fedhead.settings.privacy.PrivacyPolicy`][fedhead.settings.privacy.PrivacyPolicy])."""

    rows: int
    setting: str = "privacy.min_rows"


class TooFewRows(TableError):
    """A site below its [`RowMinimum`][fedhead.data.site.RowMinimum] refuses: the text names the
    minimum, never the site's count (that is the ``detail``, for the node's own log)."""


def refuse_few_rows(label: str, n_train: int, minimum: RowMinimum | None) -> None:
    """Raise [`TooFewRows`][fedhead.data.site.TooFewRows] when a site (``label``) has fewer than
    ``minimum.rows`` training rows (None: no minimum)."""
    if minimum is not None and n_train < minimum.rows:
        raise TooFewRows(
            f"{label}: fewer training rows than the site's minimum ({minimum.setting}={minimum.rows})",
            detail=f"{n_train} training row(s)",
        )


def too_few_for_covariance(label: str, n_train: int, n_targets: int) -> TableError:
    """The error of a client with fewer than ``C + 1`` training rows (its count: the detail)."""
    need = n_targets + 1
    return TableError(
        f"{label}: fewer training rows than a client needs, C + 1 = {need} "
        f"({n_targets} target(s): its target covariance must be full rank)",
        detail=f"{n_train} training row(s)",
    )


def read_site(cfg: TableConfig, path, minimum: RowMinimum | None = None) -> Site:
    """One client's file alone: the run's columns, rows with NaN/Inf refused or dropped
    (``dataset.missing``), the test split (``test_column``, or ``test_fraction`` drawn from
    ``(seed, split_index)`` as the pooled loader does), at least ``minimum.rows``
    ([`refuse_few_rows`][fedhead.data.site.refuse_few_rows], checked before any statistic of the
    rows is computed) and at least ``C + 1`` training rows."""
    table = read_file(path)
    key = file_key(path)
    index = split_index(key)
    targets, features = run_columns(cfg, table)
    x, y = site_arrays(cfg, table, targets, features)
    label = file_label(table.path)
    part = SitePart(label, x, y, test_rows(cfg, table, y.shape[0], index))
    keep = finite_rows(cfg, label, part.x, part.y, targets + features)
    x, y, test = part.x[keep], part.y[keep], part.test[keep]
    is_image = x.ndim == 4
    if not is_image:
        x = x.reshape(x.shape[0], -1).astype(np.float64)
    n_train = int((~test).sum())
    refuse_few_rows(label, n_train, minimum)
    if n_train < len(targets) + 1:
        raise too_few_for_covariance(label, n_train, len(targets))
    has_test = cfg.test_column is not None or cfg.test_fraction > 0
    if has_test and not test.any():
        raise TableError(f"{label}: no test rows (dataset.test_column / dataset.test_fraction)")
    x_train, x_test = x[~test], x[test] if has_test else None
    refuse_nonfinite_statistics(label, row_statistics(x_train, y[~test], is_image=is_image), targets, features)
    warn_shared_inputs(label, x_train, y[~test])
    if is_image and cfg.image_size is not None:  # dataset.image_size, as the pooled loader resamples
        raw = RawDataset(cfg.name, x_train, y[~test], targets, x_test, y[test] if has_test else None)
        raw = resize_images(raw, cfg.image_size)
        x_train, x_test = raw.x, raw.x_test
    return Site(
        label=label,
        key=key,
        columns=column_signature(table),
        target_names=targets,
        x=x_train,
        y=np.ascontiguousarray(y[~test], dtype=np.float64),
        x_test=x_test,
        y_test=np.ascontiguousarray(y[test], dtype=np.float64) if has_test else None,
        is_image=is_image,
        features=tuple(features),
    )


def site_statistics(site: Site) -> dict[str, np.ndarray]:
    """What the site reports (no rows): ``y_mean (C,)``, ``y_cov (C, C)`` (population) of its
    training targets and ``x_mean``, ``x_var`` ``(F,)`` of its tabular inputs (empty for images)."""
    return row_statistics(site.x, site.y, is_image=site.is_image)


def row_statistics(x: np.ndarray, y: np.ndarray, *, is_image: bool) -> dict[str, np.ndarray]:
    """[`site_statistics`][fedhead.data.site.site_statistics] of training rows ``x``, ``y`` (an
    overflow gives inf or NaN: [`refuse_nonfinite_statistics`][fedhead.data.site.refuse_nonfinite_statistics])."""
    with np.errstate(over="ignore", invalid="ignore"):
        mu = y.mean(axis=0)
        d = y - mu
        out = {"y_mean": mu, "y_cov": d.T @ d / y.shape[0]}
        if is_image:
            out["x_mean"] = out["x_var"] = np.zeros(0)
        else:
            x = x.reshape(x.shape[0], -1).astype(np.float64, copy=False)
            out["x_mean"], out["x_var"] = x.mean(axis=0), x.var(axis=0)
    return out


def refuse_nonfinite_statistics(
    label: str, stats: dict[str, np.ndarray], targets: tuple[str, ...], features: tuple[str, ...]
) -> None:
    """Refuse a site whose count/mean/variance sums are not finite in float64 (a value, a sum or
    a sum of squares beyond float64): one line naming its file and the column, never a value
    (what it would report could not be standardised)."""
    sets = (
        (nonfinite_columns(stats["y_mean"], np.diagonal(stats["y_cov"])), targets, "target"),
        (nonfinite_columns(stats["x_mean"], stats["x_var"]), features, "input"),
    )
    for bad, names, what in sets:
        if bad:
            name = repr(names[bad[0]]) if bad[0] < len(names) else f"x[{bad[0]}]"
            raise TableError(
                f"{label}: the mean or variance of {what} column {name} is not finite (values or their squares "
                "beyond float64): it cannot be standardised; check the column's values"
            )


def refuse_overflow(
    z: np.ndarray, names: tuple[str, ...], labels: list[str], groups: np.ndarray | None, what: str
) -> None:
    """Refuse standardised values ``z`` ``(N, K)`` (rows of the sites ``labels[groups[row]]``)
    that are not finite in float32, what the clients train on: one line naming the first such
    site's file and column, never a value."""
    if z.size == 0:
        return
    bad = float32_overflow(np.asarray(z).reshape(z.shape[0], -1))
    if not bad.any():
        return
    row, col = (int(i[0]) for i in np.nonzero(bad))
    label = labels[int(groups[row])] if groups is not None else labels[0]
    name = repr(names[col]) if col < len(names) else f"x[{col}]"
    raise TableError(
        f"{label}: {what} column {name} overflows when standardised ((value - offset) / scale beyond "
        "float32); check the column's values"
    )


# --------------------------------------------------------------------------- row helpers
def feature_names(cfg: TableConfig, site: SiteTable, targets: tuple[str, ...]) -> tuple[str, ...]:
    if cfg.features is not None:
        return cfg.features
    skip = set(targets) | {cfg.site_column, cfg.test_column}
    names = tuple(c for c in site.columns if c in site.numeric and c not in skip)
    if not names:
        raise TableError(f"{file_label(site.path)}: no numeric column is left for the inputs (dataset.features)")
    return names


def site_arrays(cfg: TableConfig, site: SiteTable, targets, features) -> tuple[np.ndarray, np.ndarray]:
    if (arrays := site.arrays) is not None:
        return arrays
    for t in targets:
        if t in features:
            raise TableError(f"{file_label(site.path)}: column {t!r} is both a target and a feature")
    y = np.stack([numeric(site, t, "targets") for t in targets], axis=1)
    x = np.stack([numeric(site, f, "features") for f in features], axis=1)
    return x, y


def finite_rows(cfg: TableConfig, label: str, x: np.ndarray, y: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Rows without NaN/Inf in a used column; refuse them unless ``missing=drop``."""
    cols = np.concatenate([y, x.reshape(x.shape[0], -1)], axis=1) if x.dtype.kind == "f" else y
    bad = ~np.isfinite(cols)
    rows = np.asarray(bad.any(axis=1))
    if not rows.any():
        return np.ones(y.shape[0], dtype=bool)
    if cfg.missing == "refuse":
        per_col = bad.sum(axis=0)
        named = [(names[i] if i < len(names) else "x", int(c)) for i, c in enumerate(per_col) if c]
        columns = list(dict.fromkeys(n for n, _ in named))
        raise TableError(
            f"{label}: rows have NaN or Inf in used column(s) {columns}; clean the file or set dataset.missing=drop",
            detail=f"{int(rows.sum())} row(s): " + ", ".join(f"{n}: {c}" for n, c in named),
        )
    log.info("%s: dropped %d row(s) with NaN or Inf in a used column (dataset.missing=drop)", label, int(rows.sum()))
    return ~rows


def shared_input_rows(x: np.ndarray, y: np.ndarray) -> int:
    """Rows whose inputs equal those of another row with different targets.

    A backbone gives such rows the same features, so the local optimum of the unconstrained
    features (docs/theory.md §2), which gives every row features determined by its own targets,
    is out of any backbone's reach: local training stops at a relative gap above zero.

    Parameters
    ----------
    x : ndarray (N, F)
        Tabular inputs (other layouts: 0, not checked).
    y : ndarray (N, C)
        Targets.

    Returns
    -------
    int
        How many of the N rows are in a group of equal inputs with more than one target vector.
    """
    if x.ndim != 2 or x.shape[0] < 2:
        return 0
    _, group, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    if counts.max() < 2:
        return 0
    pairs = np.unique(np.column_stack([group.astype(np.float64), y.reshape(y.shape[0], -1)]), axis=0)
    distinct = np.bincount(pairs[:, 0].astype(np.int64), minlength=counts.size)
    return int(counts[distinct > 1].sum())


def warn_shared_inputs(label: str, x: np.ndarray, y: np.ndarray) -> None:
    """Log a warning naming the site when some of its training rows share their inputs
    ([`shared_input_rows`][fedhead.data.site.shared_input_rows])."""
    n = shared_input_rows(x, y)
    if n:
        log.warning(
            "%s: %d of %d training rows share their inputs with a row whose targets differ; a backbone of the "
            "inputs (any model but model=free) gives them the same features, so this client cannot reach the "
            "local optimum the theory assumes "
            "(their relative gap stays above zero): add input columns that tell the rows apart",
            label,
            n,
            y.shape[0],
        )


def test_rows(cfg: TableConfig, site: SiteTable, n: int, index: int) -> np.ndarray:
    if cfg.test_column is not None:
        return truthy(site, cfg.test_column)
    test = np.zeros(n, dtype=bool)
    if cfg.test_fraction:
        k = int(round(cfg.test_fraction * n))
        rng = np.random.default_rng([int(cfg.seed), index])
        test[rng.choice(n, size=k, replace=False)] = True
    return test


def standardize_per_site(
    x: np.ndarray, x_test: np.ndarray | None, groups: np.ndarray | None, groups_test: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each site's inputs with its own training mean and std (``standardize_inputs=site``);
    ``groups`` (``groups_test``) name every training (test) row's site."""
    if groups is None:
        raise TableError("dataset.standardize_inputs=site needs sites (files or site_column), not partition=eigen")
    xs, xts = np.empty_like(x), None if x_test is None else np.empty_like(x_test)
    for g in np.unique(groups):
        rows = groups == g
        mean, std = input_offset_scale(x[rows])
        xs[rows] = (x[rows] - mean) / std
        if x_test is not None and xts is not None:
            xts[groups_test == g] = (x_test[groups_test == g] - mean) / std
    return xs, xts


def input_offset_scale(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean (F,), std (F,))`` of training inputs ``x`` ``(N, F)``: population std, 1 for a
    constant column (it is only centred)."""
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    return mean, np.where(std > 0, std, 1.0)


def standardize_pooled(x: np.ndarray, x_test: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Pooled training mean and standard deviation (a constant column is only centred)."""
    mean, std = input_offset_scale(x)
    xs = (x - mean) / std
    return xs, None if x_test is None else (x_test - mean) / std
