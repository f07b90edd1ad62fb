"""One site read alone (fedhead/data/site.py) against the pooled loader of dataset=table."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.analysis.standardization import pooled_standardization
from fedhead.data import site as data_site
from fedhead.data import site_rows
from fedhead.data.registry import load_federated
from fedhead.data.table_config import TableConfig, TableError

from .test_table import _rows, write_csv


def _files(tmp_path, sizes=(30, 41, 36)):
    return [write_csv(tmp_path / f"s{i}.csv", _rows(n, i, shift=2.0 * i)) for i, n in enumerate(sizes)]


def _federated_by_sites(cfg: TableConfig):
    sites = [data_site.read_site(cfg, f) for f in cfg.files]
    stats = [data_site.site_statistics(s) for s in sites]
    st = pooled_standardization(
        [s.n_train for s in sites],
        [t["y_mean"] for t in stats],
        [t["y_cov"] for t in stats],
        [t["x_mean"] for t in stats],
        [t["x_var"] for t in stats],
        target_mode=cfg.standardize_targets,
        input_mode=cfg.standardize_inputs,
    )
    return sites, [site_rows.client_data(site_rows.standardized_rows(s, st)) for s in sites]


@pytest.mark.parametrize("targets, inputs", [("pooled", "pooled"), ("none", "site"), ("pooled", "none")])
def test_sites_read_alone_equal_the_pooled_loader(tmp_path, targets, inputs):
    files = _files(tmp_path)
    cfg = TableConfig(
        files=[str(f) for f in files],
        targets=["t1", "t2"],
        test_fraction=0.2,
        standardize_targets=targets,
        standardize_inputs=inputs,
        seed=5,
    )
    assert cfg.site_local()
    fed = load_federated(cfg, use_cache=False)
    sites, clients = _federated_by_sites(cfg)
    assert [s.columns for s in sites] == [sites[0].columns] * 3
    for a, b in zip(fed.clients, clients):
        assert a.n_train == b.n_train and a.y_test.shape == b.y_test.shape  # the same test rows
        for name in ("x_train", "y_train", "x_test", "y_test"):
            np.testing.assert_allclose(getattr(b, name).numpy(), getattr(a, name).numpy(), rtol=0, atol=2e-6)
    if inputs == "site":
        for c in clients:
            np.testing.assert_allclose(c.x_train.double().numpy().std(0), 1.0, atol=1e-5)
    if targets == "none":
        raw = np.stack([_rows(30, 0)["t1"], _rows(30, 0)["t2"]], 1)
        assert np.isin(np.round(clients[0].y_train.numpy()[:, 0], 3), np.round(raw[:, 0].astype(np.float32), 3)).all()


def test_files_on_the_supernodes_need_num_clients_and_one_client_per_file(tmp_path):
    with pytest.raises(TableError, match="dataset.num_clients=M"):
        TableConfig(files=[], targets=["t1"])
    cfg = TableConfig(files=[], targets=["t1"], num_clients=3)
    assert cfg.site_local() and cfg.num_clients == 3
    with pytest.raises(TableError, match="one client per file"):
        TableConfig(files=[], targets=["t1"], num_clients=3, site_column="site")
    with pytest.raises(TableError, match="only a deployment can read them"):
        load_federated(cfg, use_cache=False)
    with pytest.raises(TableError, match="standardize_inputs must be one of"):
        TableConfig(files=[], targets=["t1"], num_clients=3, standardize_inputs="global")


@pytest.mark.parametrize("image_size", [None, 4])
def test_npz_images_and_tables_read_alone_equal_the_pooled_loader(tmp_path, image_size):
    rng = np.random.default_rng(3)
    for i in range(2):
        n = 14 + 3 * i
        np.savez(tmp_path / f"im{i}.npz", x=rng.integers(0, 255, (n, 1, 8, 8), dtype=np.uint8), y=rng.normal(size=n))
        np.savez(tmp_path / f"t{i}.npz", x=rng.normal(size=(n, 4)) * (i + 1), y=rng.normal(size=(n, 2)))
    for stem, targets in (("im", ["angle"]), ("t", None)):
        cfg = TableConfig(
            files=[str(tmp_path / f"{stem}{i}.npz") for i in range(2)],
            targets=targets,
            test_fraction=0.25,
            image_size=image_size if stem == "im" else None,
        )
        fed = load_federated(cfg, use_cache=False)
        _, clients = _federated_by_sites(cfg)
        for a, b in zip(fed.clients, clients):
            for name in ("x_train", "y_train", "x_test", "y_test"):
                assert (
                    getattr(a, name).dtype == getattr(b, name).dtype
                    and getattr(a, name).shape == getattr(b, name).shape
                )
                np.testing.assert_allclose(getattr(b, name).numpy(), getattr(a, name).numpy(), rtol=0, atol=2e-6)
        if stem == "im":
            assert (
                clients[0].x_train.shape[-1] == (image_size or 8)
                and clients[0].x_train.dtype.is_floating_point is False
            )


def test_site_inputs_of_one_file_split_by_site_after_subsampling(tmp_path):
    f = write_csv(tmp_path / "all.csv", _rows(120, 4))
    cfg = TableConfig(files=[str(f)], targets=["t1", "t2"], site_column="site", n_train=90, standardize_inputs="site")
    assert not cfg.site_local()  # one file split by site: the pooled rows are loaded together
    fed = load_federated(cfg, use_cache=False)
    assert sum(c.n_train for c in fed.clients) == 90
    for c in fed.clients:
        x = c.x_train.double().numpy()
        np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-5)
        np.testing.assert_allclose(x.std(0)[x.std(0) > 0], 1.0, atol=1e-5)
    eigen = TableConfig(
        files=[str(f)], targets=["t1", "t2"], partition="eigen", num_clients=2, standardize_inputs="site"
    )
    with pytest.raises(TableError, match="standardize_inputs=site needs sites"):
        load_federated(eigen, use_cache=False)


def test_shared_input_rows_counts_equal_inputs_with_different_targets():
    x = np.array([[0.0, 1.0], [0.0, 1.0], [2.0, 3.0], [2.0, 3.0], [4.0, 5.0], [0.0, 1.0]])
    y = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0], [3.0, 1.0], [4.0, 0.0], [1.0, 0.0]])
    assert data_site.shared_input_rows(x, y) == 3  # the three rows of inputs (0, 1); (2, 3) share their targets too
    assert data_site.shared_input_rows(x[2:5], y[2:5]) == 0
    assert data_site.shared_input_rows(np.zeros((3, 1, 2, 2)), y[:3]) == 0  # images: not checked


def test_a_site_whose_rows_share_inputs_is_named_in_a_warning(tmp_path, caplog):
    rows = ["f1,f2,t1,t2", "0,1,1.5,2", "0,1,2.5,1", "1,1,0,0", "2,0,1,1", "3,0,2,1"]
    path, other = tmp_path / "ward_7.csv", tmp_path / "ward_8.csv"
    path.write_text("\n".join(rows) + "\n")
    other.write_text("\n".join(rows[:2] + rows[3:]) + "\n")
    cfg = TableConfig(files=(str(path), str(other)), targets=("t1", "t2"))
    with caplog.at_level("WARNING", logger="fedhead.data.table"):
        data_site.read_site(cfg, path)
    assert "ward_7.csv: 2 of 5 training rows share their inputs" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedhead.data.table"):
        data_site.read_site(cfg, other)
    assert "share their inputs" not in caplog.text


@pytest.mark.parametrize("column, value", [("t1", 1e308), ("f2", 1e200)])
def test_a_site_whose_own_sums_overflow_refuses_locally_naming_file_and_column(tmp_path, column, value):
    """One cell of 1e308 (the mean's sum overflows) or 1e200 (the variance's squares do): the site
    refuses before it reports anything, naming its file and the column, never the cell's value."""
    files = _files(tmp_path)
    cols = _rows(30, 7)
    cols[column][4] = value  # a training row (is_test marks every fifth row from 0)
    big = write_csv(tmp_path / "big.csv", cols)
    cfg = TableConfig(files=[str(files[0]), str(big)], targets=["t1", "t2"])
    what = "target" if column.startswith("t") else "input"
    with pytest.raises(TableError) as info:
        data_site.read_site(cfg, big)
    msg = str(info.value)
    assert msg.startswith(f"big.csv: the mean or variance of {what} column {column!r} is not finite"), msg
    assert "\n" not in msg and "e+308" not in msg and "e+200" not in msg and "1e" not in msg
    data_site.read_site(cfg, files[0])  # the honest site reads as before


def test_a_test_row_that_overflows_standardisation_is_refused_by_its_site(tmp_path):
    """A held-out row beyond float32 once standardised (it is in no exchanged sum): the site refuses
    when it standardises, naming its file and column."""
    files = _files(tmp_path)
    cols = _rows(30, 7)
    cols["f1"][0] = 1e300  # row 0 is a test row
    big = write_csv(tmp_path / "big.csv", cols)
    cfg = TableConfig(files=[str(files[0]), str(big)], targets=["t1", "t2"], test_column="is_test")
    site = data_site.read_site(cfg, big)  # its training sums are finite
    st = pooled_standardization(
        [site.n_train],
        [data_site.site_statistics(site)["y_mean"]],
        [data_site.site_statistics(site)["y_cov"]],
        [data_site.site_statistics(site)["x_mean"]],
        [data_site.site_statistics(site)["x_var"]],
    )
    with pytest.raises(TableError, match=r"^big.csv: input column 'f1' overflows when standardised") as info:
        site_rows.standardized_rows(site, st)
    assert "1e" not in str(info.value)
