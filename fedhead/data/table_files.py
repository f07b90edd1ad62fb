"""Reading a user's files for ``dataset=table``: CSV and Parquet tables (through pyarrow) and
``.npz`` arrays, by suffix, into [`SiteTable`][fedhead.data.table_files.SiteTable]; column checks
that name the file and column. The lowest module of ``dataset=table``: it knows no config.

Every problem is a [`TableError`][fedhead.data.table_files.TableError] (one line, exit status 2 in ``fedhead-run``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhead.analysis.constraints import ConfigError
from fedhead.data.base import DataError

#: File suffixes read by [`read_file`][fedhead.data.table_files.read_file].
SUFFIXES = (".csv", ".parquet", ".npz")
_TRUE = ("true", "yes", "1", "t", "y")
_FALSE = ("false", "no", "0", "f", "n", "")


class TableError(DataError, ConfigError):
    """A problem with the user's files or their options (exit status 2: nothing has started).

    Its text (``str()``) is what may leave a site: the file's name, the column and the kind of
    problem, never a cell value, a row number or a count of rows. ``detail`` holds those (the
    offending value and its row, the counts): the node's own log shows it
    ([`fedhead.clients.messages.site_data_error`][fedhead.clients.messages.site_data_error]), and
    so does the local console of ``fedhead-run`` and ``fedhead-data``
    ([`fedhead.driver.errors.report`][fedhead.driver.errors.report]); results.json does not.
    """

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail

    def local_text(self) -> str:
        """The text and its ``detail``, for the console of the user whose files these are."""
        return f"{self} [{self.detail}]" if self.detail else str(self)


@dataclass
class SiteTable:
    """One file's contents: 1-d ``columns`` (name -> array; strings stay object arrays) and, for
    ``.npz``, ``x`` and ``y``."""

    path: str
    columns: dict[str, np.ndarray]
    numeric: set[str]
    x: np.ndarray | None = None
    y: np.ndarray | None = None

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(x, y)`` of an ``.npz`` file, None for a CSV or Parquet table."""
        return None if self.x is None or self.y is None else (self.x, self.y)

    @property
    def n_rows(self) -> int:
        if self.y is not None:
            return int(self.y.shape[0])
        return int(next(iter(self.columns.values())).shape[0]) if self.columns else 0


def file_label(path: str | os.PathLike) -> str:
    return Path(path).name


def file_key(path: str | os.PathLike) -> str:
    """A site's identity: the first 16 hex digits of the sha256 of the file's bytes (stable
    across restarts and renames)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def check_distinct_keys(paths: list[str], keys: list[str]) -> None:
    """Refuse two files with equal [`file_key`][fedhead.data.table_files.file_key]s (a byte-identical
    copy under another name would count its rows twice): one line naming both files."""
    seen: dict[str, str] = {}
    for path, key in zip(paths, keys):
        if key in seen:
            a, b = file_label(seen[key]), file_label(path)
            if a == b:
                a, b = seen[key], path
            raise TableError(
                f"{b} has the same bytes as {a} (site key {key}): a site given twice would count its rows "
                "twice; give each site's file once"
            )
        seen[key] = path


def read_file(path: str | os.PathLike, *, targets: bool = True) -> SiteTable:
    """Read one CSV, Parquet or ``.npz`` file (by suffix) into a [`SiteTable`][fedhead.data.table_files.SiteTable].

    Raises [`TableError`][fedhead.data.table_files.TableError] naming the file when it is missing, unreadable or empty,
    or when an ``.npz`` lacks ``x``/``y`` or their lengths differ. ``targets=False`` (inputs to predict from): an
    ``.npz`` needs ``x`` only (``y``, when present, is read as well).
    """
    p = Path(path)
    name = file_label(p)
    if not p.is_file():
        raise TableError(f"{name}: no such file", detail=str(p))
    if p.stat().st_size == 0:
        raise TableError(f"{name}: the file is empty")
    suffix = p.suffix.lower()
    if suffix == ".npz":
        return _read_npz(p, targets=targets)
    if suffix not in (".csv", ".parquet"):
        raise TableError(f"{name}: unknown file type {p.suffix!r}; expected one of {', '.join(SUFFIXES)}")
    try:
        # opened by Python, not by pyarrow's own file system: every read of a site's file is one
        # ``open`` audit event (sys.addaudithook; tests/driver/test_own_data_tutorial.py checks
        # that a SuperNode's ClientApps open no other site's file)
        with open(p, "rb") as fh:
            if suffix == ".csv":
                import pyarrow.csv as pcsv

                table = pcsv.read_csv(
                    fh, convert_options=pcsv.ConvertOptions(null_values=["", "NA", "NaN", "nan", "N/A", "null"])
                )
            else:
                import pyarrow.parquet as pq

                table = pq.read_table(fh)
    except Exception as exc:  # noqa: BLE001 - the reader's words may quote a line of the file: detail only
        kind = f"{suffix[1:].upper()} ({type(exc).__name__})"
        raise TableError(f"{name}: cannot read it as {kind}", detail=" ".join(str(exc).split())) from None
    if table.num_rows == 0:
        raise TableError(f"{name}: the file has a header but no rows")
    import pyarrow.types as pat

    columns, numeric = {}, set()
    for col, arr in zip(table.column_names, table.columns):
        t = arr.type
        if pat.is_integer(t) or pat.is_floating(t) or pat.is_boolean(t) or pat.is_null(t):
            values = arr.to_numpy(zero_copy_only=False)
            columns[col] = np.asarray(
                [np.nan if v is None else float(v) for v in values] if values.dtype == object else values,
                dtype=np.float64,
            )
            numeric.add(col)
        else:
            columns[col] = np.asarray(arr.to_pylist(), dtype=object)
    return SiteTable(path=str(p), columns=columns, numeric=numeric)


def _read_npz(p: Path, *, targets: bool = True) -> SiteTable:
    name = file_label(p)
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 - its words stay on the node: detail only
        raise TableError(f"{name}: cannot read it as .npz ({type(exc).__name__})", detail=str(exc)) from None
    missing = [k for k in (("x", "y") if targets else ("x",)) if k not in arrays]
    if missing:
        need = "x (N, F) or (N, C, H, W) and y (N, C)" if targets else "x (N, F) or (N, C, H, W)"
        raise TableError(f"{name}: the .npz has no array(s) {missing} (needs {need})")
    x = arrays.pop("x")
    y = arrays.pop("y") if "y" in arrays else np.zeros((x.shape[0] if x.ndim else 0, 0))
    if y.ndim == 1:
        y = y[:, None]
    if x.ndim not in (2, 4) or y.ndim != 2:
        raise TableError(
            f"{name}: x must be (N, F) or images (N, C, H, W) and y (N,) or (N, C); "
            f"got x of {x.ndim} dimension(s), y of {y.ndim}",
            detail=f"x {x.shape}, y {y.shape}",
        )
    if x.shape[0] != y.shape[0]:
        raise TableError(f"{name}: x and y have different numbers of rows", detail=f"x {x.shape[0]}, y {y.shape[0]}")
    if y.shape[0] == 0:
        raise TableError(f"{name}: x and y have no rows")
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool) or not (
        np.issubdtype(x.dtype, np.number) or x.dtype == bool
    ):
        raise TableError(f"{name}: x and y must be numeric, got {x.dtype} and {y.dtype}")
    columns, numeric = {}, set()
    for k, v in arrays.items():
        if v.ndim == 1 and v.shape[0] == y.shape[0]:
            is_num = np.issubdtype(v.dtype, np.number) or v.dtype == bool
            columns[k] = v.astype(np.float64) if is_num else v.astype(object)
            if is_num:
                numeric.add(k)
    return SiteTable(path=str(p), columns=columns, numeric=numeric, x=x, y=y.astype(np.float64))


def _column(site: SiteTable, col: str, key: str) -> np.ndarray:
    if col not in site.columns:
        have = sorted(site.columns)
        raise TableError(f"{file_label(site.path)}: no column {col!r} (dataset.{key}); it has {have}")
    return site.columns[col]


def site_values(site: SiteTable, col: str, path: str) -> list:
    """The sorted distinct values of the site column (numbers, or strings)."""
    v = _column(site, col, "site_column")
    if col in site.numeric:
        if not np.all(np.isfinite(v)):
            raise TableError(f"{file_label(path)}: the site column {col!r} has missing values")
        return sorted(set(v.tolist()))
    if any(s is None for s in v):
        raise TableError(f"{file_label(path)}: the site column {col!r} has missing values")
    return sorted(set(str(s) for s in v))


def truthy(site: SiteTable, col: str) -> np.ndarray:
    v = _column(site, col, "test_column")
    if col in site.numeric:
        if not np.all(np.isfinite(v)):
            raise TableError(f"{file_label(site.path)}: the test column {col!r} has missing values")
        return v != 0
    out = np.empty(v.shape[0], dtype=bool)
    for i, s in enumerate(v):
        t = "" if s is None else str(s).strip().lower()
        if t not in _TRUE + _FALSE:
            raise TableError(
                f"{file_label(site.path)}: the test column {col!r} has a value that is not true/false or 1/0",
                detail=f"{s!r} in data row {i + 1}",
            )
        out[i] = t in _TRUE
    return out


def _is_number(text: object) -> bool:
    try:
        float(str(text))
    except ValueError:
        return False
    return True


def numeric(site: SiteTable, col: str, key: str) -> np.ndarray:
    v = _column(site, col, key)
    if col not in site.numeric:
        row = next((i for i, s in enumerate(v) if s is not None and not _is_number(s)), None)
        raise TableError(
            f"{file_label(site.path)}: column {col!r} (dataset.{key}) is not numeric",
            detail="" if row is None else f"e.g. {v[row]!r} in data row {row + 1}",
        )
    return v


# --------------------------------------------------------------------------- assembling
@dataclass
class SitePart:
    """One client's (or, for the eigen split, the pooled) rows after the checks."""

    label: str
    x: np.ndarray
    y: np.ndarray
    test: np.ndarray  # bool per row


def check_same_columns(sites: list[SiteTable]) -> None:
    first = sites[0]
    ref = set(first.columns)
    for s in sites[1:]:
        cols = set(s.columns)
        if cols != ref:
            missing, extra = sorted(ref - cols), sorted(cols - ref)
            raise TableError(
                f"{file_label(s.path)}: its columns differ from {file_label(first.path)}'s "
                f"(missing {missing}, extra {extra}); every file needs the same columns"
            )
        if _x_layout(s) != _x_layout(first):
            raise TableError(
                f"{file_label(s.path)} has {_x_layout(s)} but {file_label(first.path)} has {_x_layout(first)}; "
                "every file needs the same layout"
            )
        if first.y is not None and s.y is not None and first.y.shape[1] != s.y.shape[1]:
            raise TableError(
                f"{file_label(s.path)}: y has {s.y.shape[1]} columns "
                f"but {file_label(first.path)}'s has {first.y.shape[1]}"
            )


def _x_layout(site: SiteTable) -> str:
    return "no x array" if site.x is None else f"x of sample shape {list(site.x.shape[1:])}"
