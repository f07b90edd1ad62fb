"""``dataset=table``: a user's own files, one client per file, per site value or by the eigen split.

Files are read by their suffix: ``.csv`` (header row; ``NA``, ``NaN`` and empty cells are
missing), ``.parquet`` (both through pyarrow) or ``.npz`` (arrays ``x`` ``(N, F)`` or images
``(N, C, H, W)`` and ``y`` ``(N,)`` or ``(N, C)``; further 1-d arrays of length ``N`` serve as
the site or test column). Clients:

* ``dataset.files=[a.csv, b.parquet, ...]``: one client per file, in the given order;
* one file and ``dataset.site_column=NAME``: one client per distinct value, in sorted order;
* one file and ``dataset.partition=eigen dataset.num_clients=K``: the leading-eigenvector split
  of the pooled standardised targets (:func:`fedhead.data.partition.eigen_partition`).

``dataset.targets`` names the target columns (required for tables; for ``.npz`` optional names of
``y``'s columns); ``dataset.features`` the inputs (default: every other numeric column but the site
and test columns). A held-out test split comes from ``dataset.test_column`` (truthy rows are test
rows) or ``dataset.test_fraction`` (that fraction of every site's rows, chosen by ``seed``).
Targets (``standardize_targets=pooled|none``) and tabular inputs (``standardize_inputs=pooled|
site|none``) are standardised with the pooled training statistics (docs/theory.md §10). With one
file per client and every row (:meth:`TableConfig.site_local`) a federation never pools rows:
each client reads only its own file (:mod:`fedhead.data.site`; a deployed SuperNode's node
config ``data-path``, then ``dataset.files=[] dataset.num_clients=M``) and the pooled
statistics come from the exchanged moments (:mod:`fedhead.analysis.standardization`);
:func:`load` gives the same numbers on one machine (the simulation's checks before Ray).
``n_train=null`` keeps every training row.

Every problem with the files is a :class:`TableError` (a data and a configuration error: one
line naming the file and column, exit status 2 in ``fedhead-run``), raised before training.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedhead.analysis.standardization import INPUT_MODES, TARGET_MODES
from fedhead.data.base import RawDataset
from fedhead.data.config import DatasetConfig
from fedhead.data.site import (
    file_key,
    finite_rows,
    run_columns,
    site_arrays,
    split_index,
    standardize_per_site,
    standardize_pooled,
    test_rows,
)
from fedhead.data.tables import (
    SUFFIXES,
    SitePart,
    SiteTable,
    TableError,
    check_same_columns,
    file_label,
    read_file,
    site_values,
)

__all__ = ["TableConfig", "TableError", "SiteTable", "read_file", "load", "SUFFIXES"]

log = logging.getLogger(__name__)

_PARTITIONS = ("natural", "eigen")
_MISSING = ("refuse", "drop")


def _str_list(value, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not all(isinstance(v, str) and v for v in value):
        raise TableError(f"dataset.{key} must be a list of names, got {value!r}")
    return tuple(value)


@dataclass
class TableConfig(DatasetConfig):
    """Options of ``dataset=table`` (see the module docstring).

    Attributes
    ----------
    files : list of str
        One file per client (natural partition), or one file split by ``site_column`` or by the
        eigen partition. Relative paths are taken from the working directory.
    targets : list of str
        Target columns (required for CSV/Parquet; for ``.npz`` names of ``y``'s columns).
    features : list of str or None
        Input columns; None: every numeric column that is not a target, the site or the test column.
    site_column : str or None
        One file: one client per distinct value of this column (sorted).
    partition : str
        ``natural`` (per file or per site value) or ``eigen`` (needs ``num_clients``).
    test_column : str or None
        Rows where this column is truthy (non-zero, ``true``/``yes``) are held out for testing.
    test_fraction : float
        Hold out this fraction of every site's rows (chosen by ``seed``); 0: no test split.
    missing : str
        ``refuse`` (NaN/Inf in a used column is an error) or ``drop`` (drop those rows, logged).
    standardize_targets : str
        ``pooled`` (the pooled training mean and std, from the exchanged moments in a federation)
        or ``none`` (the stored units).
    standardize_inputs : str
        Tabular inputs: ``pooled`` (pooled training mean and std), ``site`` (each client its own)
        or ``none``.
    n_train : int or None
        None keeps every training row; an integer keeps that many, chosen by ``seed``.
    num_clients : int or None
        Derived from the files or the site column; required for ``partition=eigen``.
    preset_n_train : None
        What an experiment preset's data size resolves to for this data set
        (``conf/experiment/quickstart.yaml`` reads it with ``oc.select``): always null, so that a
        preset never resizes a user's own rows. Not an option.
    """

    name: str = "table"
    files: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None
    features: tuple[str, ...] | None = None
    site_column: str | None = None
    partition: str = "natural"
    test_column: str | None = None
    test_fraction: float = 0.0
    missing: str = "refuse"
    standardize_targets: str = "pooled"
    standardize_inputs: str = "pooled"
    n_train: int | None = None
    n_test: int = 0
    num_clients: int | None = None
    preset_n_train: None = None
    fingerprint: str = field(default="", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.files is None or isinstance(self.files, (str, bytes)):
            raise TableError(f"dataset.files must be a list of files, got {self.files!r}")
        self.files = tuple(str(f) for f in self.files)
        if self.standardize_targets not in TARGET_MODES:
            raise TableError(
                f"dataset.standardize_targets must be one of {TARGET_MODES}, got {self.standardize_targets!r}"
            )
        if self.standardize_inputs not in INPUT_MODES:
            raise TableError(
                f"dataset.standardize_inputs must be one of {INPUT_MODES}, got {self.standardize_inputs!r}"
            )
        if not self.files and self.num_clients is None:
            raise TableError(
                "dataset=table needs dataset.files=[FILE, ...] (one file per client, or one file), or, in a "
                "deployment whose SuperNodes name their own file (node config data-path), dataset.num_clients=M"
            )
        self.targets = _str_list(self.targets, "targets")
        self.features = _str_list(self.features, "features")
        if self.partition not in _PARTITIONS:
            raise TableError(f"dataset.partition must be one of {_PARTITIONS}, got {self.partition!r}")
        if self.missing not in _MISSING:
            raise TableError(f"dataset.missing must be one of {_MISSING}, got {self.missing!r}")
        if isinstance(self.test_fraction, bool) or not (
            isinstance(self.test_fraction, (int, float)) and 0 <= self.test_fraction < 1
        ):
            raise TableError(f"dataset.test_fraction must be a number in [0, 1), got {self.test_fraction!r}")
        if self.test_fraction and self.test_column is not None:
            raise TableError("set dataset.test_column or dataset.test_fraction, not both")
        if self.n_train is not None and (isinstance(self.n_train, bool) or not isinstance(self.n_train, int)):
            raise TableError(f"dataset.n_train must be null (every row) or an integer, got {self.n_train!r}")
        if self.n_train is not None and self.n_train < 1:
            raise TableError(f"dataset.n_train must be null (every row) or >= 1, got {self.n_train}")
        if self.preset_n_train is not None:
            raise TableError("dataset.preset_n_train is not an option (it must stay null); set dataset.n_train")
        if self.source not in ("auto", "files"):
            raise TableError(
                f"dataset=table reads files only: dataset.source must be auto or files, got {self.source!r}"
            )
        if not self.files:  # the sites' files are on the SuperNodes (data-path): one client per node
            self._check_node_files()
            return
        paths = [Path(f).expanduser() for f in self.files]
        seen: dict[Path, str] = {}
        for f, p in zip(self.files, paths):
            if p.suffix.lower() not in SUFFIXES:
                raise TableError(f"{f}: unknown file type {p.suffix!r}; expected one of {', '.join(SUFFIXES)}")
            if not p.is_file():
                raise TableError(f"{f}: no such file (dataset.files; relative paths start at {Path.cwd()})")
            real = p.resolve()
            if real in seen:
                raise TableError(f"{f}: the same file is given twice in dataset.files (also as {seen[real]})")
            seen[real] = f
        kinds = {p.suffix.lower() == ".npz" for p in paths}
        if len(kinds) > 1:
            raise TableError("dataset.files mixes .npz files with tables (CSV/Parquet); use one kind")
        if True not in kinds and not self.targets:
            raise TableError(f"{self.files[0]}: dataset.targets=[COLUMN, ...] is required for CSV and Parquet files")
        self.files = tuple(str(p.resolve()) for p in paths)
        st = [p.stat() for p in paths]
        self.fingerprint = ";".join(f"{s.st_size}:{s.st_mtime_ns}" for s in st)
        self._set_clients()

    def _set_clients(self) -> None:
        given = self.num_clients
        if given is not None and (isinstance(given, bool) or not isinstance(given, int) or given < 1):
            raise TableError(f"dataset.num_clients must be a positive integer, got {given!r}")
        if self.partition == "eigen":
            if len(self.files) != 1 or self.site_column is not None:
                raise TableError("dataset.partition=eigen splits one file: give one file and no dataset.site_column")
            if given is None:
                raise TableError("dataset.partition=eigen needs dataset.num_clients=K")
            return
        if self.site_column is not None:
            if len(self.files) != 1:
                raise TableError(
                    f"dataset.site_column={self.site_column} splits one file, got {len(self.files)} files "
                    "(several files are already one client each)"
                )
            n = len(site_values(read_file(self.files[0], self), self.site_column, self.files[0]))
        elif len(self.files) == 1:
            raise TableError(
                f"{self.files[0]}: one file is one client; give one file per client, or "
                "dataset.site_column=NAME, or dataset.partition=eigen dataset.num_clients=K"
            )
        else:
            n = len(self.files)
        if given is not None and given != n:
            raise TableError(f"dataset.num_clients={given} but the files give {n} clients; leave it unset")
        self.num_clients = n

    def _check_node_files(self) -> None:
        if self.partition != "natural" or self.site_column is not None:
            raise TableError(
                "dataset.files=[] (each SuperNode's data-path) is one client per file: no site_column, eigen"
            )
        if isinstance(self.num_clients, bool) or not isinstance(self.num_clients, int) or self.num_clients < 1:
            raise TableError(f"dataset.num_clients must be a positive integer, got {self.num_clients!r}")
        if self.n_train is not None:
            raise TableError("dataset.n_train subsamples the pooled rows; with data-path files leave it null")

    def use_files(self) -> bool:
        return True

    def site_local(self) -> bool:
        """Whether each client reads only its own file (one file per client, every row) and the
        federation standardises from the exchanged moments (:mod:`fedhead.data.site`); otherwise
        (one file split by site or eigen, ``n_train``) the pooled rows are loaded together."""
        return self.partition == "natural" and self.site_column is None and self.n_train is None


# --------------------------------------------------------------------------- reading
def load(cfg: TableConfig) -> RawDataset:
    """Read, check and assemble the user's files (see the module docstring)."""
    if not cfg.files:
        raise TableError(
            "dataset.files=[]: the sites' files are on the SuperNodes (node config data-path); "
            "only a deployment can read them"
        )
    sites = [read_file(f, cfg) for f in cfg.files]
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
        for site in sites:
            x, y = site_arrays(cfg, site, targets, features)
            index = split_index(file_key(site.path))  # as a site read alone (fedhead.data.site)
            parts.append(SitePart(file_label(site.path), x, y, test_rows(cfg, site, y.shape[0], index)))
    names = tuple(targets) + tuple(features)
    for p in parts:
        keep = finite_rows(cfg, p.label, p.x, p.y, names)
        p.x, p.y, p.test = p.x[keep], p.y[keep], p.test[keep]
    return _assemble(cfg, parts, tuple(targets), features, is_image=first.x is not None and first.x.ndim == 4)


def _assemble(cfg: TableConfig, parts: list[SitePart], targets, features, *, is_image: bool) -> RawDataset:
    c = len(targets)
    need = c + 1
    eigen = cfg.partition == "eigen"
    has_test = cfg.test_column is not None or cfg.test_fraction > 0
    x = np.concatenate([p.x[~p.test] for p in parts])
    y = np.concatenate([p.y[~p.test] for p in parts])
    groups = np.concatenate([np.full(int((~p.test).sum()), i, dtype=np.int64) for i, p in enumerate(parts)])
    if cfg.n_train is not None:
        if cfg.n_train > y.shape[0]:
            raise TableError(
                f"dataset.n_train={cfg.n_train} but the files have {y.shape[0]} training rows; "
                "leave it null to keep every row"
            )
        keep = np.sort(np.random.default_rng(int(cfg.seed)).choice(y.shape[0], cfg.n_train, replace=False))
        x, y, groups = x[keep], y[keep], groups[keep]
    counts = np.bincount(groups, minlength=len(parts))
    if eigen:
        if y.shape[0] < need * cfg.num_clients:
            raise TableError(
                f"{parts[0].label}: {y.shape[0]} training rows cannot give {cfg.num_clients} clients "
                f"{need} rows each (C + 1 = {need}: a client's target covariance must be full rank)"
            )
    else:
        for p, n in zip(parts, counts):
            if n < need:
                raise TableError(
                    f"{p.label}: {int(n)} training row(s), but a client needs at least C + 1 = {need} "
                    f"({c} target(s): its target covariance must be full rank)"
                )
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
        x = x.astype(np.float32)
        x_test = None if x_test is None else x_test.astype(np.float32)
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
