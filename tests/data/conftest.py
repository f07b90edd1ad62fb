"""Shared fixtures of the data-layer tests: an isolated cache folder and writers of small files in
the exact published formats (UCI PRSA CSV, jat-dataset parquet)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedhead.data.pipeline import clear_memo

REPO = Path(__file__).resolve().parents[2]

BEIJING_HEADER = "No,year,month,day,hour,PM2.5,PM10,SO2,NO2,CO,O3,TEMP,PRES,DEWP,RAIN,wd,WSPM,station"


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own cache folder ($FEDHEAD_CACHE) and an empty in-process memo."""
    cache = tmp_path_factory.mktemp("fedhead-cache")
    monkeypatch.setenv("FEDHEAD_CACHE", str(cache))
    clear_memo()
    yield cache
    clear_memo()


def _fmt(v: float) -> str:
    return "NA" if np.isnan(v) else repr(float(v))


@pytest.fixture
def write_beijing_csv():
    """``write(folder, station, n_rows, seed, na_every=0) -> (path, rows)``.

    Writes ``PRSA_Data_<station>_20130301-20170228.csv`` with the UCI header, hourly rows from
    2013-03-01, a string wind direction, the station name, and ``NA`` in a rotating column of every
    ``na_every``-th row. ``rows`` is a dict column -> float array (NaN where NA was written).
    """

    def write(folder: Path, station: str, n_rows: int, seed: int, na_every: int = 0):
        rng = np.random.default_rng(seed)
        folder.mkdir(parents=True, exist_ok=True)
        hours = np.arange(n_rows) * 73  # rows 73 h apart so that month and hour both vary
        days = hours // 24
        cols = {
            "No": np.arange(n_rows) + 1.0,
            "year": 2013.0 + (days + 59) // 365,
            "month": 1.0 + ((2 + days // 30) % 12),
            "day": 1.0 + days % 28,
            "hour": (hours % 24).astype(float),
            "PM2.5": np.round(rng.gamma(2.0, 40.0, n_rows), 1),
            "PM10": np.round(rng.gamma(2.0, 50.0, n_rows), 1),
            "SO2": np.round(rng.gamma(2.0, 8.0, n_rows), 1),
            "NO2": np.round(rng.gamma(3.0, 15.0, n_rows), 1),
            "CO": np.round(rng.gamma(2.0, 600.0, n_rows), 0),
            "O3": np.round(rng.gamma(2.0, 30.0, n_rows), 1),
            "TEMP": np.round(rng.normal(13.0, 11.0, n_rows), 1),
            "PRES": np.round(rng.normal(1010.0, 10.0, n_rows), 1),
            "DEWP": np.round(rng.normal(3.0, 13.0, n_rows), 1),
            "RAIN": np.round(rng.exponential(0.1, n_rows) * (rng.random(n_rows) < 0.1), 1),
            "WSPM": np.round(rng.gamma(2.0, 0.9, n_rows), 1),
        }
        numeric_in_use = ["PM2.5", "PM10", "NO2", "TEMP", "PRES", "DEWP", "RAIN", "WSPM", "SO2"]
        if na_every:
            for k, i in enumerate(range(0, n_rows, na_every)):
                cols[numeric_in_use[k % len(numeric_in_use)]][i] = np.nan
        wd = rng.choice(["N", "NNE", "NE", "E", "SE", "S", "SW", "W", "NW"], n_rows)
        path = folder / f"PRSA_Data_{station}_20130301-20170228.csv"
        lines = [BEIJING_HEADER]
        for i in range(n_rows):
            vals = [str(int(cols[c][i])) for c in ("No", "year", "month", "day", "hour")]
            vals += [
                _fmt(cols[c][i]) for c in ("PM2.5", "PM10", "SO2", "NO2", "CO", "O3", "TEMP", "PRES", "DEWP", "RAIN")
            ]
            vals += [str(wd[i]) if i % 97 != 5 else "NA", _fmt(cols["WSPM"][i]), station]
            lines.append(",".join(vals))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path, cols

    return write


@pytest.fixture
def write_jat_parquet():
    """``write(path, episodes, obs_dim, act_dim, seed) -> (obs_list, act_list)``.

    Writes one jat-dataset shard: one row per episode with ``continuous_observations``
    (list<list<float32>>), ``continuous_actions`` (list<list<float32>>) and ``rewards``
    (list<float32>), the published schema. ``episodes`` is a list of episode lengths.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path: Path, episodes, obs_dim: int, act_dim: int, seed: int):
        rng = np.random.default_rng(seed)
        obs = [rng.normal(size=(t, obs_dim)).astype(np.float32) for t in episodes]
        act = [np.tanh(rng.normal(size=(t, act_dim))).astype(np.float32) for t in episodes]
        rew = [rng.normal(size=t).astype(np.float32) for t in episodes]
        f32 = pa.float32()
        table = pa.table(
            {
                "continuous_observations": pa.array([o.tolist() for o in obs], type=pa.list_(pa.list_(f32))),
                "continuous_actions": pa.array([a.tolist() for a in act], type=pa.list_(pa.list_(f32))),
                "rewards": pa.array([r.tolist() for r in rew], type=pa.list_(f32)),
            }
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=2)
        return obs, act

    return write
