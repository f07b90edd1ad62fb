"""Site-local ``dataset=table`` runs (clients/site.py, strategies/statistics.py): every client reads
only its own file, the federation standardises from the exchanged statistics.

In process (real ClientApps, :class:`app_helpers.InProcessGrid`, no Ray): the diagnosis's
``G_cen`` equals the one of the pooled standardised rows; SuperNodes known only by their
``data-path`` open nothing but their file and reach the same Grams; a node without ``data-path``
or with other columns is refused with one line naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, instruction, pooled_g_cen
from flwr.app import ConfigRecord, RecordDict

from fedhead.clients import make_client_app
from fedhead.data import site as data_site
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.settings.config import compose_config, load_config
from fedhead.strategies.failures import TooFewReplies

SIZES = (30, 45, 38)


def _rows(n: int, seed: int, extra: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) * np.array([1.0, 100.0, 0.2]) + seed
    mix = np.array([[1.0, 0.5], [-0.003, 0.02], [2.0, 0.1]])
    y = x @ mix + rng.normal(size=(n, 2)) * np.array([0.5, 3.0]) + np.array([10.0 * seed, -5.0])
    cols = {"f1": x[:, 0], "f2": x[:, 1], "f3": x[:, 2], "t1": y[:, 0], "t2": y[:, 1]}
    if extra:
        cols["extra"] = rng.normal(size=n)
    return cols


def _write(path: Path, cols: dict[str, np.ndarray]) -> Path:
    names = list(cols)
    lines = [",".join(names)] + [",".join(repr(float(cols[c][i])) for c in names) for i in range(len(cols[names[0]]))]
    path.write_text("\n".join(lines) + "\n")
    return path


def _sites(tmp_path: Path, extra_at: int | None = None) -> list[Path]:
    return [_write(tmp_path / f"site_{i}.csv", _rows(n, i, extra=i == extra_at)) for i, n in enumerate(SIZES)]


def _job(tmp_path: Path, files: list[Path] | None, *overrides: str):
    listed = ",".join(f'"{f}"' for f in files or [])
    data = [f"dataset.files=[{listed}]"] + ([] if files else [f"dataset.num_clients={len(SIZES)}"])
    cfg = load_config(
        compose_config(
            [
                "dataset=table",
                *data,
                "dataset.targets=[t1,t2]",
                "model=free",
                "rounds=1",
                "output.tensorboard=false",
                "output.figures=false",
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


def _serve(job, grid):
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    return recorder


def _pooled_g_cen(job) -> tuple[np.ndarray, np.ndarray]:
    """G_cen of the pooled rows standardised directly (no federation), and those rows."""
    ys = [np.stack([_rows(n, i)["t1"], _rows(n, i)["t2"]], 1) for i, n in enumerate(SIZES)]
    return pooled_g_cen(ys, job.settings.lambda_h, job.settings.lambda_w), np.concatenate(ys)


def test_table_run_g_cen_equals_the_pooled_standardised_rows(tmp_path, task_identity):
    files = _sites(tmp_path)
    job = _job(tmp_path, files, "procedure=exact")
    rec = _serve(job, InProcessGrid(make_client_app(job), 3))
    res = rec.finish("completed")
    g_cen, y = _pooled_g_cen(job)
    np.testing.assert_allclose(np.asarray(res.targets["g_cen"]), g_cen, rtol=0, atol=1e-10)
    assert res.dataset.counts == list(SIZES)  # N_m from the exchange, partition (file) order
    st = res.standardization
    assert st["targets"]["mode"] == "pooled" and st["inputs"]["mode"] == "pooled"
    np.testing.assert_allclose(st["targets"]["offset"], y.mean(0), rtol=1e-12)
    np.testing.assert_allclose(st["targets"]["scale"], y.std(0), rtol=1e-12)
    assert len(st["inputs"]["offset"]) == 3


def test_data_path_nodes_open_only_their_file_and_match_the_simulation(tmp_path, task_identity, monkeypatch):
    files = _sites(tmp_path)
    sim = _job(tmp_path / "sim", files, "procedure=proximal", "local_epochs=2", "measure_mismatch=true")
    sim_res = _serve(sim, InProcessGrid(make_client_app(sim), 3)).finish("completed")

    job = _job(tmp_path / "dep", None, "procedure=proximal", "local_epochs=2", "measure_mismatch=true")
    assert job.dataset.files == () and job.settings.num_clients == 3
    opened: list[str] = []
    real = data_site.read_file
    monkeypatch.setattr(data_site, "read_file", lambda path, **kw: opened.append(str(path)) or real(path, **kw))
    grid = InProcessGrid(make_client_app(job), 3)
    order = [2, 0, 1]  # node 1000 + k reads site order[k]: the server numbers them by site key
    for k, node in enumerate(sorted(grid.contexts)):
        grid.contexts[node].node_config = {"data-path": str(files[order[k]]), "state-dir": str(tmp_path / "nodes")}
    for k, node in enumerate(sorted(grid.contexts)):  # the statistics query: each node opens its file only
        before = len(opened)
        stats = RecordDict({"config": ConfigRecord({"stage": "statistics"})})
        reply = grid.handlers[node](instruction(node, "query", stats))
        assert not reply.has_error() and opened[before:] == [str(files[order[k]])]
        assert reply.content.metric_records["metrics"]["num-examples"] == SIZES[order[k]]
        assert "partition-id" not in reply.content.metric_records["metrics"]
    res = _serve(job, grid).finish("completed")
    assert sorted(opened) == sorted(str(f) for f in files)  # nothing else, each read once per process
    assert res.status == "completed" and [r.round for r in res.rounds] == [0, 1]
    assert sorted(res.dataset.counts) == sorted(SIZES)
    for key in ("g_cen", "g_star", "g_within"):
        np.testing.assert_allclose(np.asarray(res.targets[key]), np.asarray(sim_res.targets[key]), rtol=0, atol=1e-10)
    for part in ("targets", "inputs"):  # the same pooled statistics (summed in another client order)
        for key in ("offset", "scale"):
            got, want = res.standardization[part][key], sim_res.standardization[part][key]
            np.testing.assert_allclose(got, want, rtol=1e-13)
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert {int(m.content.config_records["config"]["partition-id"]) for m in sent} == {0, 1, 2}
    assert all("standardization" in m.content.array_records for m in sent)
    mismatch = [m for m in grid.sent if m.content.config_records["config"].get("stage") == "mismatch"]
    assert len(mismatch) == 3 and all("partition-id" in m.content.config_records["config"] for m in mismatch)
    assert res.rounds[1].extra["mismatch_objective_local"] is not None  # the round-1 measurement ran
    assert len(list((tmp_path / "nodes").rglob("site_*"))) == 3  # private state keyed by the node's data-path


@pytest.mark.parametrize("fault", ["no data-path", "other columns"])
def test_a_node_without_data_path_or_with_other_columns_is_refused(tmp_path, task_identity, fault):
    files = _sites(tmp_path, extra_at=1 if fault == "other columns" else None)
    job = _job(tmp_path, None, "procedure=exact")
    grid = InProcessGrid(make_client_app(job), 3)
    for k, node in enumerate(sorted(grid.contexts)):
        grid.contexts[node].node_config = {"data-path": str(files[k])}
    if fault == "no data-path":
        grid.contexts[1001].node_config = {}
    with pytest.raises(TooFewReplies) as err:
        _serve(job, grid)
    text = str(err.value)
    assert "\n" not in text and "node 1001" in text and "node 1000" not in text and "node 1002" not in text
    if fault == "no data-path":
        assert "node config lacks 'data-path'" in text
    else:
        assert "its columns differ from the run's (missing [], extra ['extra'])" in text
    assert [m.metadata.message_type for m in grid.sent] == ["query"] * 3  # refused before any training


def test_a_built_in_data_set_records_its_target_standardisation(tmp_path, task_identity):
    from fedhead.data.registry import load_federated

    cfg = load_config(
        compose_config(
            ["dataset.n_train=240", f"dataset.cache_dir={tmp_path / 'cache'}", "num_clients=3", "model=free"]
            + ["procedure=exact", "rounds=1", "output.tensorboard=false", "output.figures=false"]
        )
    )
    job = cfg.jobs(tmp_path / "out")[0]
    res = _serve(job, InProcessGrid(make_client_app(job), 3)).finish("completed")
    data = load_federated(job.dataset, num_clients=3)
    stored_scale = not data.target_offset.any() and np.all(data.target_scale == 1.0)  # MuJoCo keeps its units
    assert res.standardization["targets"]["mode"] == ("none" if stored_scale else "pooled")
    assert res.standardization["inputs"]["mode"] == "loader"
    np.testing.assert_allclose(res.standardization["targets"]["offset"], data.target_offset, rtol=1e-15)
    np.testing.assert_allclose(res.standardization["targets"]["scale"], data.target_scale, rtol=1e-15)
    exchanged = np.asarray(res.moments["covs"])  # the built-in path is the moment query, unchanged
    for m, c in enumerate(data.clients):
        y = c.y_train.double().numpy()
        np.testing.assert_allclose(exchanged[m], np.cov(y.T, bias=True), rtol=0, atol=1e-12)


class _Crash(RuntimeError):
    pass


class _CrashingGrid(InProcessGrid):
    """Raises when the server sends the evaluate messages of round 2 (the clients stored round 2)."""

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            cfg = m.content.config_records.get("config")
            if m.metadata.message_type == "evaluate" and int(cfg["server-round"]) == 2:
                raise _Crash("killed in round 2")
        return super().push_messages(messages)


def test_a_data_path_deployment_refuses_to_resume_on_edited_site_files(tmp_path, task_identity):
    """The server of a site-local deployment records the sites' keys, the pooled standardisation and
    each site's input statistics from the statistics exchange; a resume after a site's feature
    column changed is refused with one line naming what differs, and nothing of the run is removed."""
    from fedhead import client_app, server_app
    from fedhead.clients.cache import CLIENT_CACHE
    from fedhead.federation.checkpoint import ResumeError, checkpoint_path, read_checkpoint

    files = _sites(tmp_path)
    overrides = "dataset=table dataset.files=[] dataset.num_clients=3 dataset.targets=[t1,t2] model=free "
    overrides += "procedure=proximal rounds=3 local_epochs=2 output.tensorboard=false output.figures=false"

    def grid(cls, resume: bool):
        run_config = {"overrides": overrides, "output-dir": str(tmp_path / "out"), "resume": resume}
        g = cls(client_app.app, 3, run_id=41 + resume, run_config=run_config)
        for node, site in zip(sorted(g.contexts), range(3)):
            g.contexts[node].node_config = {"data-path": str(files[site]), "state-dir": str(tmp_path / f"site{site}")}
        return g

    with pytest.raises(_Crash):
        crashed = grid(_CrashingGrid, False)
        server_app.app(crashed, next(iter(crashed.contexts.values())))
    run_dir = tmp_path / "out" / "proximal"
    ckpt = read_checkpoint(checkpoint_path(run_dir))
    assert ckpt.data is not None and len(ckpt.data["site_keys"]) == 3
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file() and "site_1" not in p.name)
    cols = _rows(SIZES[1], 1)
    cols["f2"] = 2.0 * cols["f2"]  # an edited feature column, same targets
    _write(files[1], cols)
    CLIENT_CACHE.clear()
    with pytest.raises(ResumeError) as err:
        resumed = grid(InProcessGrid, True)
        server_app.app(resumed, next(iter(resumed.contexts.values())))
    message = str(err.value)
    assert "\n" not in message and "the data differ from the checkpointed run's" in message, message
    assert "site keys:" in message and "input statistics" in message, message
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file() and "site_1" not in p.name)
    assert set(before) <= set(after)  # nothing of the run removed
    assert read_checkpoint(checkpoint_path(run_dir)).round == ckpt.round


def test_a_data_path_deployment_resumes_with_its_sites_on_other_node_ids(tmp_path, task_identity):
    """The ServerApp and ClientApp of ``flwr run .``: a run killed in round 2 resumes
    (``resume=true``) with every site behind another node id; the server numbers the sites as
    before (by their files) and each finds its private backbone (keyed by its data-path)."""
    from fedhead import client_app, server_app
    from fedhead.clients.cache import CLIENT_CACHE

    files = _sites(tmp_path)
    overrides = "dataset=table dataset.files=[] dataset.num_clients=3 dataset.targets=[t1,t2] model=free "
    overrides += "procedure=proximal rounds=3 local_epochs=2 output.tensorboard=false output.figures=false"

    def grid(cls, resume: bool, order):
        run_config = {"overrides": overrides, "output-dir": str(tmp_path / "out"), "resume": resume}
        g = cls(client_app.app, 3, run_id=31 + resume, run_config=run_config)
        for node, site in zip(sorted(g.contexts), order):  # a site keeps its file and state-dir
            g.contexts[node].node_config = {"data-path": str(files[site]), "state-dir": str(tmp_path / f"site{site}")}
        return g

    with pytest.raises(_Crash):
        crashed = grid(_CrashingGrid, False, [0, 1, 2])
        server_app.app(crashed, next(iter(crashed.contexts.values())))
    CLIENT_CACHE.clear()  # new processes
    resumed = grid(InProcessGrid, True, [2, 0, 1])
    server_app.app(resumed, next(iter(resumed.contexts.values())))
    from fedhead.results import schema

    res = schema.read(tmp_path / "out" / "proximal" / "results.json")
    assert res.status == "completed" and res.resumed_after_round == 1 and [r.round for r in res.rounds] == [0, 1, 2, 3]
    parts = {m.metadata.dst_node_id: m.content.config_records["config"]["partition-id"] for m in resumed.sent[3:6]}
    before = {m.metadata.dst_node_id: m.content.config_records["config"]["partition-id"] for m in crashed.sent[3:6]}
    site_of = {n: s for n, s in zip(sorted(resumed.contexts), [2, 0, 1])}
    site_before = {n: s for n, s in zip(sorted(crashed.contexts), [0, 1, 2])}
    assert {site_of[n]: p for n, p in parts.items()} == {site_before[n]: p for n, p in before.items()}
