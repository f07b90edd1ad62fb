"""``dataset=table`` (fedhead/data/table.py): the user's own CSV, Parquet and .npz files."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from fedhead.analysis.constraints import ConfigError
from fedhead.data.partition import eigen_partition
from fedhead.data.pipeline import standardize_targets
from fedhead.data.registry import load_federated, load_raw
from fedhead.data.table_config import TableConfig, TableError
from fedhead.driver.errors import EXIT_USAGE, exit_code, one_line

COLS = ("f1", "f2", "f3", "t1", "t2", "is_test", "site")


def _rows(n: int, seed: int, shift: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([[1.0, 0.5], [-0.3, 2.0], [0.2, 0.1]]) + 0.3 * rng.normal(size=(n, 2)) + shift
    return {
        "f1": x[:, 0],
        "f2": x[:, 1] * 100.0,
        "f3": x[:, 2],
        "t1": y[:, 0],
        "t2": y[:, 1],
        "is_test": (np.arange(n) % 5 == 0).astype(float),
        "site": np.array([f"s{i % 3}" for i in range(n)], dtype=object),
    }


def write_csv(path: Path, cols: dict[str, np.ndarray]) -> Path:
    names = list(cols)
    lines = [",".join(names)]
    for i in range(len(cols[names[0]])):
        lines.append(",".join(str(cols[c][i]) if cols[c].dtype == object else repr(float(cols[c][i])) for c in names))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path, cols: dict[str, np.ndarray]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({k: pa.array(v.tolist()) for k, v in cols.items()}), path)
    return path


def _three_sites(tmp_path: Path, sizes=(30, 35, 40)) -> list[Path]:
    return [write_csv(tmp_path / f"site_{i}.csv", _rows(n, i, shift=float(i))) for i, n in enumerate(sizes)]


def _cfg(files, **kw) -> TableConfig:
    return TableConfig(files=[str(f) for f in files], targets=kw.pop("targets", ["t1", "t2"]), **kw)


def test_one_client_per_file_in_order_with_pooled_standardisation(tmp_path):
    files = _three_sites(tmp_path)
    cfg = _cfg(files, test_column="is_test")
    assert cfg.num_clients == 3 and cfg.n_train is None
    fed = load_federated(cfg)
    cols = [_rows(n, i, shift=float(i)) for i, n in enumerate((30, 35, 40))]
    train = [~c["is_test"].astype(bool) for c in cols]
    assert [c.n_train for c in fed.clients] == [int(t.sum()) for t in train]
    assert [c.y_test.shape[0] for c in fed.clients] == [int((~t).sum()) for t in train]
    y = np.concatenate([np.stack([c["t1"], c["t2"]], 1)[t] for c, t in zip(cols, train)])
    st = standardize_targets(y)
    np.testing.assert_allclose(np.concatenate([c.y_train.numpy() for c in fed.clients]), st.y, atol=1e-6)
    np.testing.assert_allclose(fed.target_offset, y.mean(0))
    assert fed.input_shape == (3,) and fed.target_names == ("t1", "t2")  # is_test and the string column left out
    x = np.concatenate([c.x_train.numpy() for c in fed.clients])
    np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(x.std(0), 1, atol=1e-5)


def test_parquet_site_column_sorted_and_test_fraction(tmp_path):
    cols = _rows(90, 7)
    f = write_parquet(tmp_path / "all.parquet", cols)
    cfg = _cfg([f], site_column="site", features=["f1", "f3"], test_fraction=0.2, seed=3)
    assert cfg.num_clients is None and cfg.fingerprint == ""  # no file access while the config is built
    cfg = cfg.preflight()  # the data layer's check of the files: the site values give the clients
    assert cfg.num_clients == 3 and cfg.fingerprint
    raw = load_raw(cfg, use_cache=False)
    assert raw.x.shape[1] == 2 and raw.y_test.shape[0] == 3 * 6  # round(0.2 * 30) per site
    fed = load_federated(cfg)
    assert [c.n_train for c in fed.clients] == [24, 24, 24] and [c.y_test.shape[0] for c in fed.clients] == [6] * 3
    again = load_raw(cfg, use_cache=False)
    np.testing.assert_array_equal(again.y_test, raw.y_test)  # deterministic by seed
    other = load_raw(_cfg([f], site_column="site", features=["f1", "f3"], test_fraction=0.2, seed=4), use_cache=False)
    assert not np.array_equal(other.y_test, raw.y_test)


def test_csv_and_parquet_files_together_and_eigen_split(tmp_path):
    a = write_csv(tmp_path / "a.csv", _rows(40, 1))
    b = write_parquet(tmp_path / "b.parquet", _rows(50, 2))
    assert load_federated(_cfg([a, b])).n_clients == 2
    cfg = _cfg([a], partition="eigen", num_clients=4)
    fed = load_federated(cfg)
    y = np.stack([_rows(40, 1)["t1"], _rows(40, 1)["t2"]], 1)
    part = eigen_partition(standardize_targets(y).y, 4)
    assert [c.n_train for c in fed.clients] == [int((part.train == m).sum()) for m in range(4)]


def test_npz_tabular_and_images(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(2):
        np.savez(tmp_path / f"t{i}.npz", x=rng.normal(size=(20, 5)), y=rng.normal(size=(20, 2)))
        np.savez(tmp_path / f"im{i}.npz", x=rng.integers(0, 255, (12, 1, 8, 8), dtype=np.uint8), y=rng.normal(size=12))
    fed = load_federated(TableConfig(files=[str(tmp_path / "t0.npz"), str(tmp_path / "t1.npz")]))
    assert fed.input_shape == (5,) and fed.target_names == ("y0", "y1") and fed.n_clients == 2
    cfg = TableConfig(files=[str(tmp_path / "im0.npz"), str(tmp_path / "im1.npz")], targets=["angle"])
    fed = load_federated(cfg)
    assert fed.is_image and fed.input_shape == (1, 8, 8) and fed.clients[0].x_train.dtype.is_floating_point is False


def test_quickstart_preset_keeps_the_rows_of_a_table(tmp_path):
    from fedhead.settings.config import compose_config, load_config

    files = _three_sites(tmp_path)
    cfg = load_config(
        compose_config(["dataset=table", f"dataset.files=[{','.join(map(str, files))}]", "dataset.targets=[t1,t2]"])
    )
    assert cfg.dataset.n_train is None and cfg.settings.num_clients == 3
    assert sum(c.n_train for c in load_federated(cfg.dataset).clients) == 105
    assert load_config(compose_config([])).dataset.n_train == 400  # built-in data sets: the preset's size
    assert load_config(compose_config(["dataset.n_train=300"])).dataset.n_train == 300


def _bad(tmp_path: Path, case: str):
    """(config kwargs, text the one-line error must contain) of every refused input."""
    good = _three_sites(tmp_path)
    if case == "missing file":
        return {"files": [good[0], tmp_path / "nope.csv"]}, "nope.csv: no such file"
    if case == "unreadable":
        (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
        return {"files": [good[0], tmp_path / "bad.parquet"]}, "bad.parquet: cannot read it as PARQUET"
    if case == "empty":
        (tmp_path / "empty.csv").write_text("")
        return {"files": [good[0], tmp_path / "empty.csv"]}, "empty.csv: the file is empty"
    if case == "header only":
        (tmp_path / "head.csv").write_text(",".join(COLS) + "\n")
        return {"files": [good[0], tmp_path / "head.csv"]}, "head.csv: the file has a header but no rows"
    if case == "target missing":
        return {"files": good, "targets": ["t1", "t9"]}, "site_0.csv: no column 't9' (dataset.targets)"
    if case == "feature missing":
        return {"files": good, "features": ["f1", "zz"]}, "site_0.csv: no column 'zz' (dataset.features)"
    if case == "target not numeric":
        return {"files": good, "targets": ["t1", "site"]}, "site_0.csv: column 'site' (dataset.targets) is not numeric"
    if case == "nan":
        cols = _rows(30, 9)
        cols["t2"][[3, 8]] = np.nan
        cols["f1"][5] = np.inf
        f = write_csv(tmp_path / "holes.csv", cols)
        return {"files": [good[0], f]}, (
            "holes.csv: rows have NaN or Inf in used column(s) ['t2', 'f1']; clean the file or set "
            "dataset.missing=drop [3 row(s): t2: 2, f1: 1]"
        )
    if case == "columns differ":
        cols = _rows(30, 9)
        cols.pop("f3")
        f = write_csv(tmp_path / "short.csv", cols)
        return {"files": [good[0], f]}, "short.csv: its columns differ from site_0.csv's (missing ['f3'], extra [])"
    if case == "same file twice":
        return {"files": [good[0], good[1], tmp_path / "." / "site_0.csv"]}, "the same file is given twice"
    if case == "byte-identical copy":  # another name, the same bytes: its rows would count twice
        copy = tmp_path / "copy_of_0.csv"
        copy.write_bytes(good[0].read_bytes())
        return {"files": [good[0], good[1], copy]}, "copy_of_0.csv has the same bytes as site_0.csv"
    if case in ("cell of 1e308", "variance overflow", "pooled overflow", "test row overflow"):
        cols = _rows(30, 9)
        if case == "cell of 1e308":  # its file's mean would be inf: every target 0 once standardised
            cols["t1"][4] = 1e308
        elif case == "variance overflow":
            cols["f3"][7] = 1e200
        elif case == "pooled overflow":  # finite in each file, beyond float64 when pooled
            cols["t2"][:] = 1e160 * (1.0 + 1e-10 * np.arange(30))  # its squares overflow once the files pool
        else:  # a held-out row: in no training sum, beyond float32 once standardised
            cols["t2"][0] = 1e300
        f = write_csv(tmp_path / "big.csv", cols)
        if case == "pooled overflow":
            g = write_csv(tmp_path / "big2.csv", {**cols, "t2": -cols["t2"]})
            text = "big.csv, big2.csv: the pooled target mean or standard deviation of column(s) 't2'"
            return {"files": [f, g]}, text
        text = {
            "cell of 1e308": "big.csv: the mean or variance of target column 't1' is not finite",
            "variance overflow": "big.csv: the mean or variance of input column 'f3' is not finite",
            "test row overflow": "big.csv: target column 't2' overflows when standardised",
        }[case]
        return {"files": [good[0], f], **({"test_column": "is_test"} if case == "test row overflow" else {})}, text
    if case == "npz without y":
        np.savez(tmp_path / "a.npz", x=np.zeros((5, 2)), y=np.zeros(5))
        np.savez(tmp_path / "b.npz", x=np.zeros((5, 2)))
        return {
            "files": [tmp_path / "a.npz", tmp_path / "b.npz"],
            "targets": None,
        }, "b.npz: the .npz has no array(s) ['y']"
    if case == "npz lengths":
        np.savez(tmp_path / "a.npz", x=np.zeros((5, 2)), y=np.zeros(5))
        np.savez(tmp_path / "b.npz", x=np.zeros((5, 2)), y=np.zeros(4))
        return {
            "files": [tmp_path / "a.npz", tmp_path / "b.npz"],
            "targets": None,
        }, "b.npz: x and y have different numbers of rows [x 5, y 4]"
    if case == "npz sample shapes":
        np.savez(tmp_path / "a.npz", x=np.zeros((5, 2)), y=np.zeros(5))
        np.savez(tmp_path / "b.npz", x=np.zeros((5, 3)), y=np.zeros(5))
        return {
            "files": [tmp_path / "a.npz", tmp_path / "b.npz"],
            "targets": None,
        }, "b.npz has x of sample shape [3] but a.npz has x of sample shape [2]"
    if case == "site too small":
        f = write_csv(tmp_path / "tiny.csv", _rows(2, 5))
        return {"files": [good[0], f]}, (
            "tiny.csv: fewer training rows than a client needs, C + 1 = 3 (2 target(s): its target covariance "
            "must be full rank) [2 training row(s)]"
        )
    raise AssertionError(case)


CASES = [
    "missing file",
    "unreadable",
    "empty",
    "header only",
    "target missing",
    "feature missing",
    "target not numeric",
    "nan",
    "columns differ",
    "same file twice",
    "byte-identical copy",
    "cell of 1e308",
    "variance overflow",
    "pooled overflow",
    "test row overflow",
    "npz without y",
    "npz lengths",
    "npz sample shapes",
    "site too small",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_naming_the_file(tmp_path, case):
    kw, text = _bad(tmp_path, case)
    files = [str(f) for f in kw.pop("files")]
    targets = kw.pop("targets", ["t1", "t2"])
    with pytest.raises(TableError) as info:
        load_federated(TableConfig(files=files, targets=targets, **kw), use_cache=False)
    msg = one_line(info.value, local=True)  # the user's own files: the console shows the detail
    assert text in msg and "\n" not in str(info.value), msg
    assert "e+3" not in msg and "e+2" not in msg and "1e" not in msg, msg  # never a cell's value
    assert isinstance(info.value, ConfigError) and exit_code(info.value) == EXIT_USAGE


def test_missing_drop_drops_and_logs(tmp_path, caplog):
    good = _three_sites(tmp_path)
    cols = _rows(30, 9)
    cols["t2"][[3, 8]] = np.nan
    f = write_csv(tmp_path / "holes.csv", cols)
    with caplog.at_level(logging.INFO, logger="fedhead.data.table"):
        fed = load_federated(_cfg([good[0], f], missing="drop"), use_cache=False)
    assert [c.n_train for c in fed.clients] == [30, 28]
    assert "holes.csv: dropped 2 row(s) with NaN or Inf" in caplog.text


def test_options_are_checked_at_config_time(tmp_path):
    f = _three_sites(tmp_path)[0]
    with pytest.raises(TableError, match="one file is one client"):
        _cfg([f])
    with pytest.raises(TableError, match="needs dataset.num_clients=K"):
        _cfg([f], partition="eigen")
    with pytest.raises(TableError, match="dataset.targets=.* is required"):
        TableConfig(files=[str(f)], site_column="site")
    with pytest.raises(TableError, match="the files give 3 clients"):  # the file's site values: its preflight
        _cfg([f], site_column="site", num_clients=2).preflight()
    with pytest.raises(TableError, match="dataset.test_column or dataset.test_fraction, not both"):
        _cfg([f], site_column="site", test_column="is_test", test_fraction=0.1)


@pytest.mark.slow
def test_fedhead_run_refuses_a_missing_column_with_exit_2_and_no_folder(tmp_path):
    import subprocess
    import sys

    files = _three_sites(tmp_path)
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedhead.cli.run",
            "dataset=table",
            f"dataset.files=[{','.join(map(str, files))}]",
            "dataset.targets=[t1,t9]",
            f"hydra.run.dir={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fedhead-run: error: site_0.csv: no column 't9' (dataset.targets); it has "
        "['f1', 'f2', 'f3', 'is_test', 'site', 't1', 't2']"
    ]
    assert not out.exists()
