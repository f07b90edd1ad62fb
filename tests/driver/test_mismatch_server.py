"""The cost of mismatched coordinates (docs/theory.md §13): the numpy math on hand-made inputs
and the round-1 measurement of an in-process federation (real ClientApp, no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from app_helpers import InProcessGrid

from fedhead.analysis.mismatch_cost import (
    MISMATCH_KEYS,
    MismatchInputError,
    MismatchWarning,
    mismatch_averages,
    mismatch_cost,
    procrustes_rotation,
    removed_fraction,
)
from fedhead.clients import make_client_app
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.settings.config import compose_config, load_config


def _orthogonal(p: int, rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((p, p)))
    return q * np.sign(np.diag(r))


def _objective(h, y, w, b, lh=0.01, lw=0.01):
    """L_m of docs/theory.md §2 for features h (N, P) (rows are samples)."""
    n = y.shape[0]
    return 0.5 * (np.sum((h @ w.T + b - y) ** 2) + lh * np.sum(h**2)) / n + 0.5 * lw * np.sum(w**2)


def test_aligned_average_recovers_a_head_whose_copies_are_rotated():
    rng = np.random.default_rng(0)
    c, p, m = 3, 7, 4
    w0 = rng.standard_normal((c, p))
    rots = [_orthogonal(p, rng) for _ in range(m)]
    heads = np.stack([w0 @ r for r in rots])
    counts = np.array([50, 120, 80, 200])
    avg = mismatch_averages(heads, rng.standard_normal((m, c)), counts, w0)
    np.testing.assert_allclose(avg.aligned_weight, w0, atol=1e-12)
    for w_m, q in zip(heads, avg.rotations):
        np.testing.assert_allclose(q.T @ q, np.eye(p), atol=1e-12)
        np.testing.assert_allclose(w_m @ q, w0, atol=1e-12)
    np.testing.assert_allclose(avg.weights, counts / counts.sum())
    np.testing.assert_allclose(avg.trained_weight, np.einsum("m,mcp->cp", avg.weights, heads))
    assert np.linalg.norm(avg.trained_weight - w0) > 0.5 * np.linalg.norm(w0)  # rotated copies cancel


def test_removed_fraction_is_one_when_the_local_models_are_rotations_of_each_other():
    """Client m's local model is (H0 R_m, W0 R_m, b0): features h -> R_m^T h of one model. The
    aligned average with the aligned backbones is that model again: no excess is left."""
    rng = np.random.default_rng(1)
    c, p, m, n = 2, 5, 3, 40
    h0 = rng.standard_normal((n, p))
    w0, b0 = rng.standard_normal((c, p)), rng.standard_normal(c)
    ys = [h0 @ w0.T + b0 + 0.3 * rng.standard_normal((n, c)) for _ in range(m)]
    rots = [_orthogonal(p, rng) for _ in range(m)]
    feats, heads = [h0 @ r for r in rots], np.stack([w0 @ r for r in rots])
    counts = np.array([40, 40, 40])
    avg = mismatch_averages(heads, np.tile(b0, (m, 1)), counts, w0)
    local = [_objective(h, y, w, b0) for h, y, w in zip(feats, ys, heads)]
    trained = [_objective(h, y, avg.trained_weight, avg.bias) for h, y in zip(feats, ys)]
    aligned = [
        _objective(h @ q, y, avg.aligned_weight, avg.bias)  # rows h^T Q = (Q^T h)^T
        for h, y, q in zip(feats, ys, avg.rotations)
    ]
    cost = mismatch_cost(local, trained, aligned, counts)
    assert cost.trained > cost.local + 0.1
    assert cost.aligned == pytest.approx(cost.local, rel=1e-12)
    assert cost.removed == pytest.approx(1.0, abs=1e-10)
    assert set(cost.to_extra()) == set(MISMATCH_KEYS)
    assert "removes 1.000" in cost.line()


def test_mismatch_cost_weights_and_undefined_fraction():
    cost = mismatch_cost([1.0, 3.0], [2.0, 5.0], [1.5, 4.0], [1, 3])
    assert (cost.local, cost.trained, cost.aligned) == (2.5, 4.25, 3.375)
    assert cost.removed == pytest.approx((4.25 - 3.375) / (4.25 - 2.5))
    assert removed_fraction(1.0, 2.0, 3.0) == -1.0  # alignment made it worse
    with pytest.warns(MismatchWarning, match="undefined"):
        same = mismatch_cost([1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [5, 5])
    assert same.removed is None and same.to_extra()["mismatch_removed"] is None
    assert "undefined" in same.line()


@pytest.mark.parametrize(
    "bad",
    [
        dict(heads=np.ones((2, 3))),
        dict(biases=np.ones((2, 4))),
        dict(broadcast=np.ones((3, 5))),
        dict(counts=[1, 0]),
        dict(counts=[1, 2, 3]),
        dict(heads=np.full((2, 3, 4), np.nan)),
    ],
)
def test_mismatch_averages_rejects_bad_input(bad):
    args = dict(heads=np.ones((2, 3, 4)), biases=np.ones((2, 3)), counts=[1, 2], broadcast=np.ones((3, 4)))
    with pytest.raises(MismatchInputError):
        mismatch_averages(**{**args, **bad})
    with pytest.raises(MismatchInputError, match="finite"):
        mismatch_cost([1.0, np.inf], [1.0, 2.0], [1.0, 2.0], [1, 1])


def test_procrustes_is_the_alignment_of_the_aligned_procedure():
    from fedhead.train import procrustes_rotation as train_procrustes

    rng = np.random.default_rng(3)
    w, t = rng.standard_normal((3, 9)), rng.standard_normal((3, 9))
    np.testing.assert_array_equal(procrustes_rotation(w, t), train_procrustes(w, t))


# ------------------------------------------------------------------------------ in-process runs
TINY = [
    "model=resmlp_small",
    "model.width=16",
    "model.feature_dim=8",
    "local_epochs=30",
    "rounds=2",
    "experiment=single",
    "procedure=ordinary",
    "train.lr=3e-3",
]


def _serve(tmp_path, name: str, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "dataset.n_train=240",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "num_clients=3",
                "output.tensorboard=false",
                "output.figures=false",
                *TINY,
                *overrides,
            ]
        )
    )
    job = cfg.jobs(tmp_path / name)[0]
    grid = InProcessGrid(make_client_app(job), job.settings.num_clients, run_id=11)
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    return job, recorder.finish("completed").to_dict(), grid  # the JSON object results.json holds


@pytest.mark.parametrize("evaluate", [True, False])
def test_round_one_measurement_is_recorded_and_changes_nothing(tmp_path, task_identity, evaluate):
    flag = f"resources.evaluate_mse={str(evaluate).lower()}"
    job, res, grid = _serve(tmp_path, "measured", "measure_mismatch=true", "init=independent", flag)
    _, plain, _ = _serve(tmp_path, "plain", "init=independent", flag)
    on_disk = json.loads((job.output_dir / "results.json").read_text())
    r1 = on_disk["rounds"][1]
    assert set(MISMATCH_KEYS) <= set(r1)
    assert not set(MISMATCH_KEYS) & (set(on_disk["rounds"][0]) | set(on_disk["rounds"][2]))  # round 1 only
    loc, tr, al = (r1[k] for k in MISMATCH_KEYS[:3])
    assert loc <= tr * (1 + 1e-9) and loc <= al * (1 + 1e-9)
    if r1["mismatch_removed"] is not None:
        assert r1["mismatch_removed"] == pytest.approx((tr - al) / (tr - loc))
    # the broadcast of round 2 and every Gram are those of the same run without the measurement
    for a, b in zip(res["rounds"], plain["rounds"], strict=True):
        np.testing.assert_array_equal(a["gram"], b["gram"])
    queries = [m for m in grid.sent if m.metadata.message_type == "query"]
    stages = [m.content.config_records["config"]["stage"] for m in queries]
    assert stages == ["moments"] * 3 + ["mismatch"] * 3
    assert on_disk["seeds"]["init"] == "independent" and len(set(on_disk["seeds"]["backbone_seeds"])) == 3


def test_measurement_skipped_for_aligned_procedures(tmp_path, task_identity):
    job, res, grid = _serve(tmp_path, "aligned", "measure_mismatch=true", "procedure=aligned", "rounds=1")
    assert not set(MISMATCH_KEYS) & set(res["rounds"][1])
    assert [m.content.config_records["config"]["stage"] for m in grid.sent if m.metadata.message_type == "query"] == [
        "moments"
    ] * 3


def test_invalid_mismatch_replies_are_refused(tmp_path, task_identity, monkeypatch):
    """A client whose objectives are not finite is dropped by the failure policy (here: the run stops)."""
    from fedhead.clients import app as client_module
    from fedhead.strategies.failures import TooFewReplies

    real = client_module.handle_mismatch

    def broken(job, msg, context):
        reply = real(job, msg, context)
        reply.content.metric_records["metrics"]["mismatch_aligned"] = float("nan")
        return reply

    monkeypatch.setattr(client_module, "handle_mismatch", broken)
    with pytest.raises(TooFewReplies, match="mismatch measurement.*mismatch_aligned"):
        _serve(tmp_path, "broken", "measure_mismatch=true", "rounds=1")


@pytest.mark.parametrize("init", ["common", "independent"])
def test_clients_initial_backbones_follow_init(tmp_path, init):
    from fedhead.clients.state import federated_data, initial_backbone_seed
    from fedhead.models import build_backbone

    cfg = load_config(
        compose_config(
            ["dataset.n_train=240", f"dataset.cache_dir={tmp_path / 'cache'}", "num_clients=3", *TINY, f"init={init}"]
        )
    )
    job = cfg.jobs(tmp_path / "out")[0]
    data = federated_data(job)
    states = [
        build_backbone(job.model, data.input_shape, data.clients[m].n_train, initial_backbone_seed(job, m)).state_dict()
        for m in range(3)
    ]
    same = [all(np.array_equal(states[0][k], s[k]) for k in s) for s in states[1:]]
    assert same == ([True, True] if init == "common" else [False, False])
    assert RunRecorder(job, show_progress=False).results.seeds["init"] == init


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("init=shared", "init must be one of"),
        ("measure_mismatch=yes", "measure_mismatch must be true or false"),
    ],
)
def test_init_and_measure_mismatch_are_validated(tmp_path, override, message):
    from fedhead.settings.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        load_config(compose_config([override]))
    settings = load_config(compose_config([])).settings
    assert (settings.init, settings.measure_mismatch) == ("common", False)
