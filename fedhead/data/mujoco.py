"""MuJoCo Swimmer / Hopper / HalfCheetah / Walker2d: observation -> continuous action (docs/theory.md §10).

Two sources, chosen by [`DatasetConfig.use_files`][fedhead.data.DatasetConfig.use_files]:

* **files** (``dataset.root`` set): the parquet shards of the public multi-task agent dataset
  "jat-project/jat-dataset" (https://huggingface.co/datasets/jat-project/jat-dataset), configs
  ``mujoco-swimmer``, ``mujoco-hopper``, ``mujoco-halfcheetah`` and ``mujoco-walker`` (Walker2d).
  Each row is one episode with the columns (as published in the dataset card)

  - ``continuous_observations``: list (steps) of float32 lists of length obs_dim,
  - ``continuous_actions``: list (steps) of float32 lists of length act_dim,
  - ``rewards``: list (steps) of float32 (not used).

  Files are ``<root>/mujoco-<task>/<split>-XXXXX-of-YYYYY-<hash>.parquet`` (``root`` may also be
  the ``mujoco-<task>`` folder itself). Shards are read in file-name order, episodes in row order,
  steps in time order, and the first ``n_train`` transitions ``(o_t, a_t)`` are kept. Assumed from
  the dataset card and the JAT loading example (``dataset[0]['continuous_observations'][0]`` is the
  first observation): ``o_t`` and ``a_t`` of one step share the same index in their lists.

* **generate** (default, offline): gymnasium's MuJoCo v5 environments (``Swimmer-v5``,
  ``Hopper-v5``, ``HalfCheetah-v5``, ``Walker2d-v5``) driven by a fixed seeded policy whose action
  depends on the observation,

      a = tanh(g (K o~ + b) + s eps),    eps ~ N(0, I),   o~ = (o - m_o) / s_o,

  with ``K`` ``(act_dim, obs_dim)`` entries ``N(0, 1/obs_dim)``, ``b ~ N(0, 0.5^2)`` drawn once from
  the seed, and ``m_o, s_o`` the observation mean and standard deviation of a short pilot rollout
  with a noise-only policy. Hopper and Walker2d run with ``terminate_when_unhealthy=False``;
  every environment is reset (with a seed drawn from the same generator) every
  ``episode_steps`` steps, which keeps upright, falling and fallen states in the data. The
  actions lie in ``(-1, 1)``, the action bounds of all four tasks.

Targets are the actions at stored scale (``standardize=False``); observations are standardised
with pooled training statistics unless ``standardize_inputs=False``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhead.data._common import standardize_columns
from fedhead.data.base import DataError, MissingDataError, RawDataset
from fedhead.data.config import DatasetConfig

__all__ = ["MujocoConfig", "TASKS", "MujocoTask", "load", "load_parquet", "generate"]

log = logging.getLogger(__name__)

JAT_URL = "https://huggingface.co/datasets/jat-project/jat-dataset"


@dataclass(frozen=True)
class MujocoTask:
    env_id: str
    jat_config: str
    obs_dim: int
    act_dim: int
    action_names: tuple[str, ...]
    env_kwargs: tuple[tuple[str, Any], ...] = ()  # keyword arguments of gymnasium.make


TASKS: dict[str, MujocoTask] = {
    "swimmer": MujocoTask("Swimmer-v5", "mujoco-swimmer", 8, 2, ("motor1_rot", "motor2_rot")),
    "hopper": MujocoTask(
        "Hopper-v5",
        "mujoco-hopper",
        11,
        3,
        ("thigh_joint", "leg_joint", "foot_joint"),
        (("terminate_when_unhealthy", False),),
    ),
    "halfcheetah": MujocoTask(
        "HalfCheetah-v5",
        "mujoco-halfcheetah",
        17,
        6,
        ("bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot"),
    ),
    "walker2d": MujocoTask(
        "Walker2d-v5",
        "mujoco-walker",
        17,
        6,
        ("thigh_joint", "leg_joint", "foot_joint", "thigh_left_joint", "leg_left_joint", "foot_left_joint"),
        (("terminate_when_unhealthy", False),),
    ),
}


@dataclass(frozen=True)
class MujocoConfig(DatasetConfig):
    """MuJoCo data set options (``name`` is the task: swimmer, hopper, halfcheetah, walker2d).

    Attributes
    ----------
    split : str
        Parquet split read from the files (``train``).
    policy_gain : float
        ``g`` of the generator policy.
    noise_std : float
        ``s``: standard deviation of the pre-``tanh`` action noise.
    episode_steps : int
        Steps between resets of the generator.
    pilot_steps : int
        Steps of the pilot rollout that fixes the observation normalisation of the policy.
    standardize_inputs : bool
        Standardise observations with pooled training statistics.
    """

    name: str = "hopper"
    n_train: int = 4000
    n_test: int = 0
    num_clients: int = 4
    split: str = "train"
    policy_gain: float = 1.0
    noise_std: float = 0.3
    episode_steps: int = 200
    pilot_steps: int = 1000
    standardize_inputs: bool = True


def _task(cfg: MujocoConfig) -> MujocoTask:
    try:
        return TASKS[cfg.name]
    except KeyError:
        raise DataError(f"unknown MuJoCo task {cfg.name!r}; expected one of {sorted(TASKS)}") from None


def load(cfg: MujocoConfig) -> RawDataset:
    """Files when ``cfg.use_files()`` else the generator; see the module docstring."""
    task = _task(cfg)
    if cfg.n_train < 1:
        raise DataError(f"dataset.n_train must be positive, got {cfg.n_train}")
    if cfg.n_test:
        raise DataError(f"{cfg.name} has no test split in this protocol; set dataset.n_test=0")
    if cfg.use_files():
        obs, act, source = load_parquet(cfg.root, task, cfg.n_train, split=cfg.split)
    else:
        obs, act = generate(
            task,
            cfg.n_train,
            seed=cfg.seed,
            policy_gain=cfg.policy_gain,
            noise_std=cfg.noise_std,
            episode_steps=cfg.episode_steps,
            pilot_steps=cfg.pilot_steps,
        )
        source = (
            f"gymnasium {task.env_id} generator (seed={cfg.seed}, gain={cfg.policy_gain}, "
            f"noise={cfg.noise_std}, episode_steps={cfg.episode_steps})"
        )
    x = standardize_columns(obs) if cfg.standardize_inputs else obs.astype(np.float64)
    return RawDataset(
        name=cfg.name,
        x=x.astype(np.float32),
        y=act.astype(np.float64),
        target_names=task.action_names,
        standardize=False,
        source=source,
    )


# --------------------------------------------------------------------------- parquet files
def _find_shards(root: str | Path | None, task: MujocoTask, split: str) -> list[Path]:
    wanted = f"{task.jat_config}/{split}-*.parquet"
    published_at = f"{JAT_URL} (config {task.jat_config}, folder {task.jat_config}/)"
    if root is None:  # dataset.source=files without dataset.root
        raise MissingDataError(wanted, "dataset.root (not set)", published_at)
    root = Path(root).expanduser()
    candidates = [root / task.jat_config, root]
    for folder in candidates:
        shards = sorted(folder.glob(f"{split}-*.parquet"))
        if shards:
            return shards
    raise MissingDataError(wanted, " and ".join(str(c) for c in candidates), published_at)


def _episodes_to_array(col, path: Path, column: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``list<list<float>>`` arrow column -> (steps per episode (E,), values (sum steps, dim))."""
    # optional dependency: only this data set needs it
    import pyarrow as pa

    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or not (
        pa.types.is_list(col.type.value_type)
        or pa.types.is_large_list(col.type.value_type)
        or pa.types.is_fixed_size_list(col.type.value_type)
    ):
        raise DataError(
            f"{path}: column {column!r} has type {col.type}; expected a list (steps) of float lists of length {dim}"
        )
    if col.null_count:
        raise DataError(f"{path}: column {column!r} has {col.null_count} null episodes")
    steps = np.asarray(col.value_lengths(), dtype=np.int64)
    inner = col.flatten()
    lens = (
        np.asarray(inner.value_lengths(), dtype=np.int64)
        if hasattr(inner, "value_lengths")
        else np.full(len(inner), inner.type.list_size)
    )
    if lens.size and not np.all(lens == dim):
        bad = int(lens[lens != dim][0])
        raise DataError(
            f"{path}: column {column!r} holds vectors of length {bad}; expected {dim} (is this the right MuJoCo task?)"
        )
    values = np.asarray(inner.flatten().to_numpy(zero_copy_only=False), dtype=np.float64)
    return steps, values.reshape(-1, dim)


def load_parquet(
    root: str | Path | None, task: MujocoTask, n: int, *, split: str = "train"
) -> tuple[np.ndarray, np.ndarray, str]:
    """First ``n`` transitions ``(obs (n, obs_dim), actions (n, act_dim), source)`` of the shards."""
    # optional dependency: only this data set needs it
    import pyarrow.parquet as pq

    shards = _find_shards(root, task, split)
    need = ("continuous_observations", "continuous_actions")
    obs_parts, act_parts, used, total = [], [], [], 0
    for path in shards:
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises ArrowInvalid / OSError on corrupt files
            raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
        names = pf.schema_arrow.names
        missing = [c for c in need if c not in names]
        if missing:
            raise DataError(
                f"{path}: missing column(s) {missing}; expected the jat-dataset columns "
                f"continuous_observations, continuous_actions, rewards (found {names})"
            )
        used.append(path.name)
        for batch in pf.iter_batches(batch_size=8, columns=list(need)):
            s_o, o = _episodes_to_array(batch.column(0), path, need[0], task.obs_dim)
            s_a, a = _episodes_to_array(batch.column(1), path, need[1], task.act_dim)
            if not np.array_equal(s_o, s_a):
                raise DataError(f"{path}: episodes have different numbers of observations and actions")
            obs_parts.append(o)
            act_parts.append(a)
            total += o.shape[0]
            if total >= n:
                break
        if total >= n:
            break
    if total < n:
        raise DataError(f"{', '.join(str(s) for s in shards)}: only {total} transitions, but n_train={n} are needed")
    obs = np.concatenate(obs_parts)[:n]
    act = np.concatenate(act_parts)[:n]
    if not (np.all(np.isfinite(obs)) and np.all(np.isfinite(act))):
        raise DataError(f"{used}: non-finite observations or actions in the first {n} transitions")
    folder = shards[0].parent
    return obs, act, f"{folder} ({', '.join(used)}), first {n} transitions"


# --------------------------------------------------------------------------- generator
@contextlib.contextmanager
def _mujoco_warnings_to_log():
    """Route MuJoCo's C-level warnings (which would otherwise append to ``MUJOCO_LOG.TXT`` in the
    working directory, e.g. the deprecated ``settotalmass`` of gymnasium's XML) to ``logging``."""
    try:
        import mujoco
    except ImportError:  # pragma: no cover - gymnasium[mujoco] is a dependency
        yield
        return
    # the two hooks are defined by MuJoCo's C extension and missing from its type stubs
    previous = mujoco.get_mju_user_warning()  # pyright: ignore[reportAttributeAccessIssue]
    mujoco.set_mju_user_warning(lambda msg: log.debug("mujoco: %s", msg))  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)  # pyright: ignore[reportAttributeAccessIssue]


def generate(
    task: MujocoTask | str,
    n: int,
    *,
    seed: int = 0,
    policy_gain: float = 1.0,
    noise_std: float = 0.3,
    episode_steps: int = 200,
    pilot_steps: int = 1000,
) -> tuple[np.ndarray, np.ndarray]:
    """Roll out the fixed seeded policy of the module docstring.

    Returns
    -------
    obs : ndarray, shape (n, obs_dim), float64
    actions : ndarray, shape (n, act_dim), float64, in (-1, 1)
    """
    # optional dependency: only this data set needs it
    import gymnasium as gym

    if isinstance(task, str):
        task = TASKS[task]
    if episode_steps < 1 or pilot_steps < 1:
        raise DataError("episode_steps and pilot_steps must be positive")
    with _mujoco_warnings_to_log():
        env = gym.make(task.env_id, **dict(task.env_kwargs))
    try:
        obs_shape, act_shape = env.observation_space.shape, env.action_space.shape
        if obs_shape is None or act_shape is None:
            raise DataError(f"{task.env_id} has no fixed observation or action shape")
        od, ad = obs_shape[0], act_shape[0]
        if (od, ad) != (task.obs_dim, task.act_dim):
            raise DataError(f"{task.env_id} has obs/action dims {(od, ad)}, expected {(task.obs_dim, task.act_dim)}")
        rng = np.random.default_rng(seed)
        k_mat = rng.normal(size=(ad, od)) / np.sqrt(od)
        bias = rng.normal(scale=0.5, size=ad)

        def rollout(steps: int, policy) -> tuple[np.ndarray, np.ndarray]:
            obs_out = np.empty((steps, od))
            act_out = np.empty((steps, ad))
            obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
            t = 0
            for i in range(steps):
                a = policy(obs)
                obs_out[i], act_out[i] = obs, a
                obs, _, terminated, truncated, _ = env.step(a.astype(np.float32))
                t += 1
                if terminated or truncated or t >= episode_steps:
                    obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
                    t = 0
            return obs_out, act_out

        pilot, _ = rollout(pilot_steps, lambda o: np.tanh(rng.normal(size=ad)))
        m_o = pilot.mean(axis=0)
        s_o = pilot.std(axis=0)
        s_o = np.where(s_o > 1e-8, s_o, 1.0)

        def policy(o: np.ndarray) -> np.ndarray:
            pre = policy_gain * (k_mat @ ((o - m_o) / s_o) + bias)
            return np.tanh(pre + noise_std * rng.normal(size=ad))

        obs, act = rollout(n, policy)
    finally:
        env.close()
    if not (np.all(np.isfinite(obs)) and np.all(np.isfinite(act))):
        raise DataError(f"{task.env_id} generator produced non-finite values (seed={seed})")
    return obs, act
