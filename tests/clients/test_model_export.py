"""The trained model is the client's (clients/export.py, fedhead/models/export.py, fedhead-predict).

A site-local ``dataset=table`` run in process (real ClientApps, :class:`app_helpers.InProcessGrid`,
no Ray): at the last round's evaluate every client saves its model; ``fedhead-predict`` on the
client's own file gives the in-memory model's outputs (its stored backbone with the final shared
head the server sent, mapped to the original units by results.json's standardisation), and their
MSE in standardised units, weighted by N_m, is the run's reported final train MSE.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from app_helpers import InProcessGrid

from fedhead.cli.predict import main as predict_main
from fedhead.clients import make_client_app
from fedhead.clients.store import BackboneStore
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.federation import protocol
from fedhead.models import build_backbone
from fedhead.settings.config import compose_config, load_config

SIZES = (40, 55)
ROUNDS = 2


def _site_file(path: Path, n: int, seed: int) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)) * np.array([1.0, 50.0, 0.2]) + 3.0 * seed
    y = x @ np.array([[1.0, 0.5], [-0.01, 0.02], [2.0, 0.1]]) + rng.normal(size=(n, 2)) + np.array([7.0, -5.0])
    cols = {"t2": y[:, 1], "f2": x[:, 1], "id": np.arange(n), "f1": x[:, 0], "t1": y[:, 0], "f3": x[:, 2]}
    lines = [",".join(cols)] + [",".join(repr(float(cols[c][i])) for c in cols) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path, x, y


def _run(tmp_path: Path, procedure: str, node_config=None):
    sites = [_site_file(tmp_path / f"site_{i}.csv", n, i) for i, n in enumerate(SIZES)]
    listed = ",".join(f'"{s[0]}"' for s in sites)
    overrides = ["dataset=table", f"dataset.files=[{listed}]", "dataset.targets=[t1,t2]", "dataset.features=[f1,f2,f3]"]
    overrides += ["model=resmlp_small", "model.width=16", "model.depth=1", "model.feature_dim=8"]
    overrides += [f"procedure={procedure}", f"rounds={ROUNDS}", "local_epochs=3", "output.tensorboard=false"]
    overrides += ["output.figures=false", "output.keep_client_state=true"]
    job = load_config(compose_config(overrides)).jobs(tmp_path / "out")[0]
    grid = InProcessGrid(make_client_app(job), len(SIZES))
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    return job, grid, recorder.finish("completed"), sites


@pytest.mark.slow
@pytest.mark.parametrize("procedure", ["proximal", "centered"])
def test_predictions_of_the_saved_model_are_the_run_s_model(tmp_path, task_identity, procedure):
    job, grid, res, sites = _run(tmp_path, procedure)
    final = [
        m
        for m in grid.sent
        if m.metadata.message_type == "evaluate" and m.content.config_records["config"].get(protocol.FINAL_ROUND)
    ]
    assert len(final) == len(SIZES)  # only the last round's evaluate says final-round
    w, b = protocol.read_head(final[0].content.array_records[protocol.HEAD])
    st = res.standardization
    t_off, t_scale = np.asarray(st["targets"]["offset"]), np.asarray(st["targets"]["scale"])
    i_off, i_scale = np.asarray(st["inputs"]["offset"]), np.asarray(st["inputs"]["scale"])
    store = BackboneStore(job.state_dir / next(p.name for p in job.state_dir.iterdir()))
    weighted, n_total = 0.0, 0
    for pid, (path, x, y) in enumerate(sites):
        folder = job.output_dir / "models" / f"partition_{pid}"
        meta = json.loads((folder / "model.json").read_text())
        assert (meta["round"], meta["partition"], meta["procedure"]) == (ROUNDS, pid, procedure)
        assert meta["targets"]["names"] == ["t1", "t2"] and meta["inputs"]["features"] == ["f1", "f2", "f3"]
        out = tmp_path / f"pred_{pid}.csv"
        assert predict_main([str(folder), str(path), "--out", str(out)]) == 0
        assert out.read_text().splitlines()[0] == "t1,t2"
        pred = np.loadtxt(out, delimiter=",", skiprows=1)
        # the in-memory model: the stored backbone of the last round with the broadcast final head
        rnd, state = store.load(pid)
        assert rnd == ROUNDS
        backbone = build_backbone(job.model, (3,), x.shape[0], 0)
        backbone.load_state_dict(state)
        backbone.eval()
        with torch.no_grad():
            h = backbone(torch.as_tensor(((x - i_off) / i_scale).astype(np.float32))).double().numpy()
        y_std = h @ w.T + b
        z = (y - t_off) / t_scale
        if procedure == "centered":  # the client predicts with its own target mean added
            y_std = y_std + z.mean(axis=0)
        np.testing.assert_allclose(pred, t_off + t_scale * y_std, rtol=1e-5, atol=1e-5 * np.abs(t_scale).max())
        weighted += x.shape[0] * float(np.mean(((pred - y) / t_scale) ** 2))
        n_total += x.shape[0]
    reported = res.rounds[-1].train_mse
    assert reported is not None and reported > 1e-3  # a real fit, not a constant
    assert weighted / n_total == pytest.approx(reported, rel=1e-5)


def _job(tmp_path: Path, *overrides: str):
    for i, name in enumerate(("a.csv", "b.csv")):
        if not (tmp_path / name).exists():
            _site_file(tmp_path / name, 20, i)
    base = ["dataset=table", f'dataset.files=["{tmp_path / "a.csv"}","{tmp_path / "b.csv"}"]', "dataset.targets=[t1]"]
    base += ["model=resmlp_small", "output.tensorboard=false", "output.figures=false"]
    return load_config(compose_config([*base, *overrides])).jobs(tmp_path / "out")[0]


def test_the_model_folder_is_the_node_s_state_dir_or_the_run_folder(tmp_path):
    from flwr.app import Context, RecordDict

    from fedhead.clients.export import exportable, model_folder
    from fedhead.clients.state import store_of

    job = _job(tmp_path, "procedure=proximal")
    node = {"state-dir": str(tmp_path / "node"), "data-path": "/srv/site-a/visits.csv"}
    deployed = Context(run_id=5, node_id=1, node_config=node, state=RecordDict(), run_config={})
    folder = model_folder(job, deployed, 1)
    assert folder == store_of(job, deployed).root / "models" / "partition_1"
    assert folder.is_relative_to(tmp_path / "node" / "proximal") and folder.parent.parent.name.startswith("site_")
    simulated = Context(run_id=5, node_id=1, node_config={"partition-id": 1}, state=RecordDict(), run_config={})
    assert model_folder(job, simulated, 1) == tmp_path / "out" / "proximal" / "models" / "partition_1"
    assert exportable(job) is None
    assert exportable(_job(tmp_path, "procedure=exact")) == "the exact procedure has no backbone"
    assert exportable(_job(tmp_path, "model=free")).startswith("free features")
    assert exportable(_job(tmp_path, "output.export_model=false")) == "output.export_model=false"
    pooled = _job(tmp_path, "dataset.n_train=10")
    assert exportable(pooled).startswith("only site-local dataset=table runs")
