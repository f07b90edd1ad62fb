"""MuJoCo loaders: jat-dataset parquet shards (fixtures with the published columns) and the
offline gymnasium generator."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.data import DataError, MissingDataError, client_margins, load_federated
from fedhead.data.mujoco import JAT_URL, TASKS, MujocoConfig, generate, load, load_parquet


@pytest.fixture
def hopper_shards(tmp_path, write_jat_parquet):
    folder = tmp_path / "jat" / "mujoco-hopper"
    o1, a1 = write_jat_parquet(folder / "train-00000-of-00002-abc.parquet", [50, 70, 30], 11, 3, 0)
    o2, a2 = write_jat_parquet(folder / "train-00001-of-00002-def.parquet", [80, 40], 11, 3, 1)
    write_jat_parquet(folder / "test-00000-of-00001-xyz.parquet", [25], 11, 3, 2)
    return tmp_path / "jat", np.concatenate(o1 + o2), np.concatenate(a1 + a2)


def test_parquet_first_transitions_in_order(hopper_shards):
    root, obs, act = hopper_shards
    o, a, src = load_parquet(root, TASKS["hopper"], 200)
    np.testing.assert_array_equal(o, obs[:200].astype(np.float64))  # crosses both shards
    np.testing.assert_array_equal(a, act[:200].astype(np.float64))
    assert "train-00000-of-00002-abc.parquet" in src and "train-00001" in src
    o2, _, src2 = load_parquet(root / "mujoco-hopper", TASKS["hopper"], 100)  # folder itself
    np.testing.assert_array_equal(o2, obs[:100])
    assert "train-00001" not in src2  # the first shard was enough
    ot, _, _ = load_parquet(root, TASKS["hopper"], 25, split="test")
    assert ot.shape == (25, 11)


def test_parquet_through_loader_and_pipeline(hopper_shards):
    root, obs, act = hopper_shards
    cfg = MujocoConfig(name="hopper", root=str(root), n_train=240)
    raw = load(cfg)
    np.testing.assert_array_equal(raw.y, act[:240])
    x_ref = (obs[:240] - obs[:240].mean(0)) / obs[:240].std(0)
    np.testing.assert_allclose(raw.x, x_ref, rtol=1e-5, atol=1e-5)
    assert not raw.standardize
    raw_nostd = load(MujocoConfig(name="hopper", root=str(root), n_train=240, standardize_inputs=False))
    np.testing.assert_array_equal(raw_nostd.x, obs[:240])
    fed = load_federated(cfg)
    assert [c.n_train for c in fed.clients] == [60] * 4
    y = np.concatenate([c.y_train.numpy() for c in fed.clients])
    np.testing.assert_array_equal(np.sort(y, axis=0), np.sort(act[:240], axis=0))  # stored scale


def test_parquet_errors(tmp_path, hopper_shards, write_jat_parquet):
    root, _, _ = hopper_shards
    with pytest.raises(MissingDataError) as err:
        load_parquet(tmp_path / "empty", TASKS["walker2d"], 10)
    msg = str(err.value)
    assert "mujoco-walker/train-*.parquet" in msg and JAT_URL in msg and "empty" in msg
    with pytest.raises(DataError, match="only 270 transitions.*n_train=500"):
        load_parquet(root, TASKS["hopper"], 500)
    # a shard of another task: wrong observation length
    with pytest.raises(DataError, match="length 11; expected 17"):
        load_parquet(root / "mujoco-hopper", TASKS["halfcheetah"], 10)
    # wrong columns
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad" / "mujoco-swimmer"
    bad.mkdir(parents=True)
    pq.write_table(pa.table({"observations": [[1.0]], "rewards": [[0.0]]}), bad / "train-00000-of-00001-q.parquet")
    with pytest.raises(DataError, match=r"missing column\(s\).*continuous_observations"):
        load_parquet(bad.parent, TASKS["swimmer"], 1)
    (bad / "train-00000-of-00001-q.parquet").write_bytes(b"PAR1 broken")
    with pytest.raises(DataError, match="not a readable parquet"):
        load_parquet(bad.parent, TASKS["swimmer"], 1)
    # observation and action episodes of different lengths
    f32 = pa.float32()
    mism = tmp_path / "mism" / "mujoco-swimmer"
    mism.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "continuous_observations": pa.array([[[0.0] * 8] * 3], type=pa.list_(pa.list_(f32))),
                "continuous_actions": pa.array([[[0.0] * 2] * 2], type=pa.list_(pa.list_(f32))),
                "rewards": pa.array([[0.0] * 3], type=pa.list_(f32)),
            }
        ),
        mism / "train-00000-of-00001-q.parquet",
    )
    with pytest.raises(DataError, match="different numbers of observations and actions"):
        load_parquet(mism.parent, TASKS["swimmer"], 2)


@pytest.mark.parametrize("task", ["swimmer", "hopper"])
def test_generator_shapes_determinism_ranges(task):
    t = TASKS[task]
    o1, a1 = generate(task, 300, seed=0, pilot_steps=100, episode_steps=80)
    o2, a2 = generate(task, 300, seed=0, pilot_steps=100, episode_steps=80)
    o3, a3 = generate(task, 300, seed=1, pilot_steps=100, episode_steps=80)
    assert o1.shape == (300, t.obs_dim) and a1.shape == (300, t.act_dim)
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(a1, a3)
    assert np.all(np.abs(a1) < 1.0) and np.all(np.isfinite(o1))
    assert np.all(a1.std(0) > 0.1)  # actions vary in every coordinate
    # actions depend on the observation: a linear fit of the pre-tanh action explains a lot
    pre = np.arctanh(np.clip(a1, -0.999999, 0.999999))
    xo = np.column_stack([o1, np.ones(len(o1))])
    resid = pre - xo @ np.linalg.lstsq(xo, pre, rcond=None)[0]
    assert np.all(resid.var(0) < 0.8 * pre.var(0))


def test_generator_config_errors():
    with pytest.raises(DataError, match="unknown MuJoCo task 'ant'"):
        load(MujocoConfig(name="ant"))
    with pytest.raises(DataError, match="n_test=0"):
        load(MujocoConfig(name="hopper", n_test=10))


@pytest.mark.parametrize(
    "task",
    [
        "hopper",  # the default run's data set stays in the fast suite (under a second)
        pytest.param("swimmer", marks=[pytest.mark.slow, pytest.mark.timeout(1200)]),
        pytest.param("halfcheetah", marks=[pytest.mark.slow, pytest.mark.timeout(1200)]),
        pytest.param("walker2d", marks=[pytest.mark.slow, pytest.mark.timeout(1200)]),
    ],
)
def test_default_generated_clients_fully_active_and_distinct(task):
    """The docs/theory.md §10 default size (4,000 transitions, 4 clients), lambda_H = lambda_W = 0.01."""
    fed = load_federated(MujocoConfig(name=task))
    assert [c.n_train for c in fed.clients] == [1000] * 4
    rep = client_margins(fed, 0.01, 0.01)
    assert rep.ok and np.all(rep.min_eigs > 1e-3)  # an order of magnitude above 1e-4
    mom = fed.moments()
    d = np.linalg.norm(mom.means[:, None] - mom.means[None], axis=-1)
    assert np.all(d[~np.eye(4, dtype=bool)] > 0.2)  # clearly different means
    rel = np.array(
        [[np.linalg.norm(mom.covs[a] - mom.covs[b]) / np.linalg.norm(mom.covs[a]) for b in range(4)] for a in range(4)]
    )
    off = ~np.eye(4, dtype=bool)
    # different covariances: every pair differs, the outer clients strongly (measured: min
    # 0.08 (swimmer) .. 0.47, max 0.46 .. 2.5 over the four tasks with seed 0)
    assert rel[off].min() > 0.05 and rel[off].max() > 0.3
