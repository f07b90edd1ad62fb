"""The ClientApp handlers and the ServerApp body, run in-process with a real ClientApp (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from app_helpers import InProcessGrid, instruction, stored_round

from fedhead import ufm
from fedhead.clients import BackboneStore, make_client_app
from fedhead.clients.state import federated_data, simulation_state_dir
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.results.rounds import CLIENT_METRIC_KEYS
from fedhead.settings.config import ConfigError, compose_config, load_config


def _job(tmp_path: Path, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "dataset.n_train=240",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "num_clients=3",
                "output.tensorboard=false",
                "output.figures=false",
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


def _serve(job, run_id: int = 11):
    grid = InProcessGrid(make_client_app(job), job.settings.num_clients, run_id=run_id)
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    return recorder.finish("completed").to_dict(), grid  # the JSON object results.json holds


TINY = ["model=resmlp_small", "model.width=16", "model.feature_dim=8", "local_epochs=3", "rounds=2"]


def test_query_handler_reports_exact_moments(tmp_path, task_identity):
    job = _job(tmp_path, "procedure=exact", "model=free")
    grid = InProcessGrid(make_client_app(job), 3)
    data = federated_data(job)
    for node, ctx in grid.contexts.items():
        reply = grid.handlers[node](instruction(node, "query"))
        pid = ctx.node_config["partition-id"]
        y = data.clients[pid].y_train.double().numpy()
        mom = reply.content.array_records["moments"]
        np.testing.assert_allclose(mom["mean"].numpy(), y.mean(0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(mom["cov"].numpy(), np.cov(y.T, bias=True), rtol=0, atol=1e-12)
        assert reply.content.metric_records["metrics"]["num-examples"] == y.shape[0]


def test_exact_procedure_in_process_follows_recursion(tmp_path, task_identity):
    job = _job(tmp_path, "procedure=exact", "model=free", "rounds=4")
    res, _ = _serve(job)
    on_disk = json.loads((job.output_dir / "results.json").read_text())
    assert on_disk["status"] == "completed" and len(on_disk["rounds"]) == 5
    g = np.array([r["gram"] for r in res["rounds"]])
    rec = ufm.gram_recursion(g[0], np.array(res["targets"]["client_grams"]), np.array(res["targets"]["weights"]), 4)
    np.testing.assert_allclose(g, rec, rtol=0, atol=1e-10 * np.abs(rec).max())
    assert max(r["delta"] for r in res["rounds"][1:]) < 1e-9
    assert all(abs(r["objective_gaps"][0]) < 1e-5 for r in res["rounds"][1:])  # exact heads are optimal


@pytest.mark.parametrize("procedure", ["proximal", "corrected_proximal", "aligned", "centered", "full_model"])
def test_trained_procedures_complete_and_keep_backbones_private(tmp_path, task_identity, procedure):
    job = _job(tmp_path, f"procedure={procedure}", *TINY)
    res, grid = _serve(job)
    assert [r["round"] for r in res["rounds"]] == [0, 1, 2]
    last = res["rounds"][-1]
    assert np.isfinite(last["train_mse"]) and len(last["objective_gaps"]) == 3 and last["delta"] > 0
    assert res["reference"] == {"corrected_proximal": "cen", "centered": "within"}.get(procedure, "star")
    store = BackboneStore(simulation_state_dir(job, 11))
    for pid in range(3):
        assert stored_round(store, pid) == 2
        if procedure != "exact":  # the newest state and the previous one (what resume= needs)
            assert sorted(p.name for p in store.root.glob(f"partition_{pid}.*")) == [
                f"partition_{pid}.r1.pt",
                f"partition_{pid}.r2.pt",
            ]
    kinds = [m.metadata.message_type for m in grid.sent]
    assert kinds.count("query") == 3 and kinds.count("train") == 6 and kinds.count("evaluate") == 6
    train_msgs = [m for m in grid.sent if m.metadata.message_type == "train"]
    has_backbone = ["backbone" in m.content.array_records for m in train_msgs]
    # the backbone travels only under full-model averaging, and only after round 1
    assert has_backbone == ([False] * 3 + [True] * 3 if procedure == "full_model" else [False] * 6)
    has_sigma = {"sigma_cen" in m.content.array_records for m in train_msgs}
    assert has_sigma == {procedure == "corrected_proximal"}
    if procedure == "aligned":
        assert last["alignment_gram_error"] < 1e-5
    # the clients' own distance data agree with the server's selection distance
    cm = last["client_metrics"]
    assert set().union(*cm) <= {k.name for k in CLIENT_METRIC_KEYS}  # every per-client metric is declared
    p = np.asarray(res["moments"]["weights"])
    assert last["delta"] == pytest.approx(sum(w * c["distance_to_selection"] for w, c in zip(p, cm)), rel=1e-5)


def test_clients_start_from_one_common_backbone(tmp_path, task_identity):
    from fedhead.models import build_backbone

    job = _job(tmp_path, "procedure=ordinary", *TINY)
    data = federated_data(job)
    a = build_backbone(job.model, data.input_shape, data.clients[0].n_train, job.settings.seed)
    b = build_backbone(job.model, data.input_shape, data.clients[1].n_train, job.settings.seed)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_backbone_store_is_atomic_and_detects_newer_states(tmp_path):
    store = BackboneStore(tmp_path / "s")
    assert store.load(0) is None
    store.save(0, 1, {"w": torch.ones(2)})
    store.save(0, 2, {"w": 2 * torch.ones(2)})
    store.save(0, 3, {"w": 3 * torch.ones(2)})
    # the newest state and the previous one (a resumed run restarts the interrupted round)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["partition_0.r2.pt", "partition_0.r3.pt"]
    assert torch.equal(store.load(0, expected_round=2)[1]["w"], 2 * torch.ones(2))
    (tmp_path / "s" / "partition_0.r3.pt").unlink()
    rnd, state = store.load(0)
    assert rnd == 2 and torch.equal(state["w"], 2 * torch.ones(2))
    # another process wrote round 3: the cached round-2 copy must not be served
    other = {"round": 3, "state": {"w": 3 * torch.ones(2)}}
    torch.save(other, tmp_path / "s" / "partition_0.r3.pt")
    rnd, state = store.load(0)
    assert rnd == 3 and torch.equal(state["w"], 3 * torch.ones(2))
    (tmp_path / "s" / "partition_0.r4.pt").write_bytes(b"garbage")
    with pytest.raises(Exception, match="partition 0"):
        store.load(0)


def test_flwr_run_apps_resolve_the_job_from_the_run_config(tmp_path, task_identity):
    """The ServerApp / ClientApp of fedhead.server_app / fedhead.client_app serve ``flwr run .`` from the run config."""
    from fedhead import client_app, server_app

    run_config = {
        "overrides": f"procedure=exact model=free rounds=2 num_clients=3 dataset.n_train=240 "
        f"dataset.cache_dir={tmp_path / 'cache'} output.tensorboard=false output.figures=false",
        "procedure-index": 0,
        "output-dir": str(tmp_path / "flwr"),
    }
    grid = InProcessGrid(client_app.app, 3, run_config=run_config)
    ctx = next(iter(grid.contexts.values()))
    server_app.app(grid, ctx)
    res = json.loads((tmp_path / "flwr" / "exact" / "results.json").read_text())
    assert res["status"] == "completed" and len(res["rounds"]) == 3


def test_config_validation_errors(tmp_path):
    with pytest.raises(ConfigError, match="full_model cannot average free-feature"):
        _job(tmp_path, "procedure=full_model", "model=free")
    with pytest.raises(ConfigError, match="rounds must be an integer >= 1"):
        _job(tmp_path, "procedure=exact", "rounds=0")
    with pytest.raises(ConfigError, match="device must be one of"):
        _job(tmp_path, "procedure=exact", "device=tpu")
    with pytest.raises(ConfigError, match="no procedure selected"):
        _job(tmp_path, "experiment=single", "experiment.procedures=[]")
    with pytest.raises(ConfigError, match="centered cannot be combined with the moment correction"):
        _job(tmp_path, "procedure=centered", "+procedure.gamma=1.0")


def test_diagnose_only_exchanges_moments_and_trains_nothing(tmp_path, task_identity):
    job = _job(tmp_path, "procedure=proximal", "diagnose_only=true", *TINY)
    grid = InProcessGrid(make_client_app(job), 3)
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    res = recorder.finish("diagnosed").to_dict()
    assert {m.metadata.message_type for m in grid.sent} == {"query"}
    assert res["rounds"] == [] and res["diagnosis"]["fully_active"]
    d = res["diagnosis"]
    assert d["share_m_mu"] + d["share_m_sigma"] + d["share_m_a"] == pytest.approx(1.0, abs=1e-12)
    assert np.asarray(res["targets"]["g_star"]).shape == (3, 3)


def test_node_config_state_dir_and_partition_count(tmp_path, task_identity):
    """Deployments: `state-dir` in the node config keeps the private backbone there (never in
    the output folder), and a `num-partitions` that disagrees with num_clients is refused."""
    job = _job(tmp_path, "procedure=proximal", "model=free", "local_epochs=2", "rounds=1")
    grid = InProcessGrid(make_client_app(job), 3, run_id=5)
    for n, ctx in grid.contexts.items():
        ctx.node_config["state-dir"] = str(tmp_path / f"node{n}")
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    assert recorder.finish("completed").status == "completed"
    from fedhead.clients.state import deployment_run_key

    key = deployment_run_key(job, 5)  # not flwr's run id: a resumed deployment repeats the key
    assert key != "5" and key == deployment_run_key(job, 6)
    for pid, n in enumerate(grid.contexts):
        assert stored_round(BackboneStore(tmp_path / f"node{n}" / "proximal" / f"run_{key}"), pid) == 1
    assert not job.state_dir.exists()
    bad = InProcessGrid(make_client_app(job), 3)
    for ctx in bad.contexts.values():
        ctx.node_config["num-partitions"] = 4
    node = next(iter(bad.contexts))
    with pytest.raises(Exception, match="num-partitions=4 but the run has num_clients=3"):
        bad.handlers[node](instruction(node, "query"))


def test_client_app_pickles_as_its_jobs_and_is_rebuilt_once_per_process(tmp_path):
    """flwr's Ray simulation pickles the ClientApp with every message: it travels as the jobs'
    pickle and unpickles into one cached app (the same handlers, the same jobs)."""
    import pickle

    import cloudpickle

    from fedhead.clients import app as client_module

    job = _job(tmp_path, "procedure=exact", "model=free")
    app = make_client_app([job])
    assert isinstance(app, client_module.JobsClientApp)
    first = pickle.loads(cloudpickle.dumps(app))
    second = pickle.loads(cloudpickle.dumps(app))
    assert first is second and first is not app
    assert set(first._registered_funcs) == set(app._registered_funcs)
    assert len(cloudpickle.dumps(app)) < len(pickle.dumps([job])) + 1024  # the jobs, not the handlers' code


def test_background_recorder_writes_the_same_outputs_after_wait(tmp_path, task_identity):
    """RunRecorder(background=True) draws the figures on its thread; after wait() results.json,
    TensorBoard events and the PNGs are what a foreground recorder writes."""
    outputs = {}
    for background in (False, True):
        job = _job(
            tmp_path / str(background),
            "procedure=exact",
            "model=free",
            "rounds=2",
            "output.tensorboard=true",
            "output.figures=true",
        )
        recorder = RunRecorder(job, show_progress=False, background=background)
        serve(
            InProcessGrid(make_client_app(job), job.settings.num_clients, run_id=11), job, recorder, show_progress=False
        )
        recorder.finish("completed")
        recorder.wait()
        res = json.loads((Path(job.output_dir) / "results.json").read_text())
        pngs = sorted(p.name for p in Path(job.output_dir).glob("*.png"))
        events = list((Path(job.output_dir) / "tensorboard").glob("events.out.tfevents.*"))
        outputs[background] = (
            res["status"],
            res["figures"],
            [r["gram"] for r in res["rounds"]],
            pngs,
            len(events),
            sum(p.stat().st_size for p in events) > 0,
        )
    assert outputs[True] == outputs[False]
    assert outputs[True][1] == ["error_curves.png", "ellipses.png"]


def test_a_message_window_gives_the_same_run(tmp_path, task_identity):
    """ProgressGrid(window=1): one message in flight at a time, pushed in order as replies come;
    the run is the one with every message pushed at once."""
    rounds = {}
    for window in (None, 1):
        job = _job(tmp_path / str(window), "procedure=exact", "model=free", "rounds=2")
        grid = InProcessGrid(make_client_app(job), job.settings.num_clients, run_id=11)
        recorder = RunRecorder(job, show_progress=False)
        pgrid = serve(grid, job, recorder, show_progress=False, window=window)
        res = recorder.finish("completed").to_dict()
        assert [kind for kind, _, _ in pgrid.phases].count("train") == 2
        rounds[window] = [{k: v for k, v in r.items() if k != "client_metrics"} for r in res["rounds"]]
    assert rounds[1] == rounds[None]


def test_the_window_widens_when_half_of_it_is_answered_within_one_engine_tick():
    """Fast replies (evaluation) would otherwise wait for flwr's 0.1 s hand-over a window at a time."""
    from fedhead.federation.progress_grid import ENGINE_TICK, ProgressGrid

    now = 10.0
    fast = [now - ENGINE_TICK / 2] * 4  # 4 of a window of 8 answered within the last tick
    assert ProgressGrid._tick_bound([1.0, 2.0, *fast], 8, now)
    assert not ProgressGrid._tick_bound([1.0, 2.0, *fast[:3]], 8, now)
    assert not ProgressGrid._tick_bound([now - 3 * ENGINE_TICK + 0.01 * i for i in range(8)], 8, now)
