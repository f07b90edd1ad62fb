"""Beijing Multi-Site Air Quality (UCI data set 501): 8 weather/pollution inputs -> PM2.5, NO2.

Published at https://archive.ics.uci.edu/dataset/501/beijing+multi+site+air+quality+data as
twelve CSV files ``PRSA_Data_<station>_20130301-20170228.csv`` (one per monitoring station, hourly
rows) with the header

    No,year,month,day,hour,PM2.5,PM10,SO2,NO2,CO,O3,TEMP,PRES,DEWP,RAIN,wd,WSPM,station

and ``NA`` for missing values. ``dataset.root`` is the folder holding the CSV files (or any folder
above it: the UCI zip nests them in ``PRSA2017_Data_20130301-20170228/PRSA_Data_20130301-20170228``).

Preparation (docs/theory.md §10): inputs PM10, TEMP, PRES, DEWP, RAIN, WSPM, month, hour; targets PM2.5,
NO2; rows with a missing value in any of these ten columns are dropped; the station files are
pooled in station-name order (rows in file order) and ``n_train`` = 9,000 rows are chosen
deterministically (uniformly without replacement by ``numpy.random.default_rng(seed)``, then
kept in pooled order). Inputs are standardised with the statistics of the chosen rows; targets
are left in original units (the pipeline standardises them). There is no offline generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhead.data._common import standardize_columns
from fedhead.data.base import DataError, MissingDataError, RawDataset
from fedhead.data.config import DatasetConfig

__all__ = ["BeijingConfig", "load", "read_station_csv", "HEADER", "INPUTS", "TARGETS", "STATIONS"]

UCI_URL = "https://archive.ics.uci.edu/dataset/501/beijing+multi+site+air+quality+data"
HEADER = (
    "No",
    "year",
    "month",
    "day",
    "hour",
    "PM2.5",
    "PM10",
    "SO2",
    "NO2",
    "CO",
    "O3",
    "TEMP",
    "PRES",
    "DEWP",
    "RAIN",
    "wd",
    "WSPM",
    "station",
)
INPUTS = ("PM10", "TEMP", "PRES", "DEWP", "RAIN", "WSPM", "month", "hour")
TARGETS = ("PM2.5", "NO2")
STATIONS = (
    "Aotizhongxin",
    "Changping",
    "Dingling",
    "Dongsi",
    "Guanyuan",
    "Gucheng",
    "Huairou",
    "Nongzhanguan",
    "Shunyi",
    "Tiantan",
    "Wanliu",
    "Wanshouxigong",
)
_PATTERN = "PRSA_Data_{station}_20130301-20170228.csv"


@dataclass(frozen=True)
class BeijingConfig(DatasetConfig):
    """Beijing options. ``stations``: station names to use (None: every station file found)."""

    name: str = "beijing"
    n_train: int = 9000
    n_test: int = 0
    num_clients: int = 4
    stations: list[str] | None = None


def _find_files(root: Path, stations: list[str] | None) -> list[Path]:
    if stations is None:
        files = sorted(root.glob(_PATTERN.format(station="*")))
        if not files:
            files = sorted(root.rglob(_PATTERN.format(station="*")))
        if not files:
            raise MissingDataError(_PATTERN.format(station="<station>"), f"{root} (and its subfolders)", UCI_URL)
        return files
    files = []
    for st in stations:
        name = _PATTERN.format(station=st)
        hits = [root / name] if (root / name).is_file() else sorted(root.rglob(name))
        if not hits:
            raise MissingDataError(name, f"{root} (and its subfolders)", UCI_URL)
        files.append(hits[0])
    return files


def read_station_csv(path: str | Path) -> np.ndarray:
    """Read one station file; returns ``(rows, 10)`` float64 = INPUTS + TARGETS, NA rows dropped."""
    # optional dependency: only this data set needs it
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            first = fh.readline().strip().lstrip("\ufeff")
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc})") from exc
    header = tuple(h.strip().strip('"') for h in first.split(","))
    missing = [c for c in INPUTS + TARGETS if c not in header]
    if missing:
        raise DataError(
            f"{path}: header lacks column(s) {missing}; expected the UCI header "
            f"{','.join(HEADER)} (found {first[:200]!r})"
        )
    cols = list(INPUTS + TARGETS)
    try:
        table = pacsv.read_csv(
            path,
            convert_options=pacsv.ConvertOptions(
                include_columns=cols,
                column_types={c: pa.float64() for c in cols},
                null_values=["NA", "", "nan", "NaN"],
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(
            f"{path}: could not parse the columns {cols} as numbers ({exc}); expected the UCI "
            "PRSA CSV format with 'NA' for missing values"
        ) from exc
    data = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in cols])
    data = data.astype(np.float64)
    keep = np.all(np.isfinite(data), axis=1)
    return data[keep]


def load(cfg: BeijingConfig) -> RawDataset:
    """Read, pool, clean and subsample the station files (see the module docstring)."""
    if not cfg.use_files() or cfg.root is None:
        raise MissingDataError(
            _PATTERN.format(station="<station>"),
            "nowhere: dataset.root is not set (Beijing has no offline generator)",
            UCI_URL,
        )
    if cfg.n_test:
        raise DataError("beijing has no test split in this protocol; set dataset.n_test=0")
    root = Path(cfg.root).expanduser()
    if not root.is_dir():
        raise MissingDataError(_PATTERN.format(station="<station>"), f"{root} (folder does not exist)", UCI_URL)
    files = _find_files(root, list(cfg.stations) if cfg.stations is not None else None)
    parts = [read_station_csv(f) for f in files]
    data = np.concatenate(parts) if parts else np.zeros((0, 10))
    if data.shape[0] < cfg.n_train:
        raise DataError(
            f"{root}: only {data.shape[0]} complete rows in {len(files)} station file(s), "
            f"but n_train={cfg.n_train} are needed"
        )
    rng = np.random.default_rng(cfg.seed)
    idx = np.sort(rng.choice(data.shape[0], size=cfg.n_train, replace=False))
    chosen = data[idx]
    x = standardize_columns(chosen[:, : len(INPUTS)])
    return RawDataset(
        name=cfg.name,
        x=x.astype(np.float32),
        y=chosen[:, len(INPUTS) :],
        target_names=TARGETS,
        standardize=True,
        source=f"{root}: {len(files)} station file(s) "
        f"({', '.join(f.name for f in files)}); {cfg.n_train} of {data.shape[0]} complete rows "
        f"(seed {cfg.seed})",
    )
