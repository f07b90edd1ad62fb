"""Beijing Multi-Site Air Quality loader on CSV fixtures with the real UCI header."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from fedhead.data import DataError, MissingDataError, load_federated
from fedhead.data.beijing import INPUTS, TARGETS, UCI_URL, BeijingConfig, load, read_station_csv

from .conftest import BEIJING_HEADER


def _complete_rows_by_csv_module(path):
    """Independent reference parser (stdlib csv): the 10 used columns, rows without NA."""
    out = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            vals = [row[c] for c in INPUTS + TARGETS]
            if "NA" not in vals:
                out.append([float(v) for v in vals])
    return np.array(out)


@pytest.fixture
def beijing_root(tmp_path, write_beijing_csv):
    root = tmp_path / "PRSA2017_Data_20130301-20170228" / "PRSA_Data_20130301-20170228"
    paths = [
        write_beijing_csv(root, st, 120, seed=i, na_every=7)[0]
        for i, st in enumerate(["Dongsi", "Aotizhongxin", "Huairou"])
    ]
    return tmp_path, root, paths


def test_header_fixture_is_the_published_one(beijing_root):
    _, _, paths = beijing_root
    assert paths[0].read_text().splitlines()[0] == BEIJING_HEADER


def test_read_station_drops_rows_with_na_in_used_columns_only(beijing_root):
    _, _, paths = beijing_root
    ref = _complete_rows_by_csv_module(paths[0])
    got = read_station_csv(paths[0])
    np.testing.assert_array_equal(got, ref)
    assert got.shape[1] == 10 and 90 < got.shape[0] < 120  # NA in SO2 / wd rows are kept


def test_load_selects_deterministic_subset_and_standardises_inputs(beijing_root):
    top, root, paths = beijing_root
    cfg = BeijingConfig(root=str(top), n_train=200, seed=0)  # found in the nested UCI folders
    raw = load(cfg)
    pooled = np.concatenate([_complete_rows_by_csv_module(p) for p in sorted(paths)])
    idx = np.sort(np.random.default_rng(0).choice(pooled.shape[0], 200, replace=False))
    np.testing.assert_array_equal(raw.y, pooled[idx, 8:])
    x_ref = pooled[idx, :8]
    x_ref = (x_ref - x_ref.mean(0)) / x_ref.std(0)
    np.testing.assert_allclose(raw.x, x_ref, rtol=1e-5, atol=1e-5)
    assert raw.x.dtype == np.float32 and raw.x.shape == (200, 8)
    assert raw.target_names == ("PM2.5", "NO2") and raw.standardize and raw.x_test is None
    assert np.array_equal(load(cfg).y, raw.y)  # deterministic
    assert not np.array_equal(load(BeijingConfig(root=str(top), n_train=200, seed=1)).y, raw.y)
    sub = load(BeijingConfig(root=str(root), n_train=50, stations=["Huairou"]))
    assert "Huairou" in sub.source and "Dongsi" not in sub.source


def test_federated_beijing(beijing_root):
    top, _, _ = beijing_root
    fed = load_federated(BeijingConfig(root=str(top), n_train=200))
    assert [c.n_train for c in fed.clients] == [50] * 4 and fed.input_shape == (8,)
    y = np.concatenate([c.y_train.numpy() for c in fed.clients]).astype(np.float64)
    np.testing.assert_allclose(y.mean(0), 0.0, atol=1e-6)
    np.testing.assert_allclose(y.std(0), 1.0, atol=1e-6)


def test_missing_files_name_file_place_and_source(tmp_path):
    with pytest.raises(MissingDataError) as err:
        load(BeijingConfig(root=str(tmp_path)))
    msg = str(err.value)
    assert "PRSA_Data_<station>_20130301-20170228.csv" in msg and str(tmp_path) in msg
    assert UCI_URL in msg
    with pytest.raises(MissingDataError, match="PRSA_Data_Gucheng_20130301-20170228.csv"):
        load(BeijingConfig(root=str(tmp_path), stations=["Gucheng"]))
    with pytest.raises(MissingDataError, match="dataset.root is not set"):
        load(BeijingConfig())
    with pytest.raises(MissingDataError, match="does not exist"):
        load(BeijingConfig(root=str(tmp_path / "nope")))


def test_corrupt_files(tmp_path, write_beijing_csv):
    path, _ = write_beijing_csv(tmp_path, "Dongsi", 30, seed=0)
    text = path.read_text().splitlines()
    path.write_text("\n".join([text[0].replace("PM2.5", "PM25")] + text[1:]))
    with pytest.raises(DataError, match=r"Dongsi.*lacks column\(s\) \['PM2.5'\]"):
        load(BeijingConfig(root=str(tmp_path), n_train=10))
    bad = text[2].split(",")
    bad[6] = "lots"  # PM10
    path.write_text("\n".join(text[:2] + [",".join(bad)] + text[3:]))
    with pytest.raises(DataError, match="could not parse"):
        load(BeijingConfig(root=str(tmp_path), n_train=10))
    path.write_text("\n".join(text))
    with pytest.raises(DataError, match="only 30 complete rows.*n_train=100"):
        load(BeijingConfig(root=str(tmp_path), n_train=100))
