"""The client process's one cache (clients/cache.py) and the boundary of the library steps."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import torch
from flwr.app import Context, RecordDict

import fedhead.clients.step as step_module
from fedhead.clients.cache import CLIENT_CACHE, ClientCache, job_in_state
from fedhead.clients.store import BackboneStore
from fedhead.data.config import DatasetConfig


def test_remember_builds_once_per_key_and_keeps_the_newest():
    cache = ClientCache()
    built = []

    def build(key):
        built.append(key)
        return f"value {key}"

    for key in (1, 2, 1, 3, 1):
        assert cache.remember(cache.sites, key, lambda k=key: build(k), keep=2) == f"value {key}"
    assert built == [1, 2, 3, 1]  # 1 was dropped once 3 came (the oldest first)
    assert list(cache.sites) == [3, 1]


def test_datasets_keep_the_most_recently_used():
    cache = ClientCache()
    loads = []
    for key in ("a", "b", "a", "c", "a"):
        cache.dataset(key, lambda k=key: loads.append(k) or k)
    assert loads == ["a", "b", "c"]  # "a" was used again before "c" came, so "b" went
    assert list(cache.datasets) == ["c", "a"]


def test_job_is_built_once_per_run_config():
    cache = ClientCache()
    built = []

    def build(context):
        built.append(dict(context.run_config))
        return object()

    first = SimpleNamespace(run_config={"overrides": "rounds=2", "procedure-index": 0})
    same = SimpleNamespace(run_config={"procedure-index": 0, "overrides": "rounds=2"})
    other = SimpleNamespace(run_config={"overrides": "rounds=3", "procedure-index": 0})
    assert cache.job(first, build) is cache.job(same, build)
    assert cache.job(other, build) is not cache.job(first, build)
    assert len(built) == 2


def test_trained_modules_of_one_store_root_only():
    cache = ClientCache()
    state: dict = {"w": torch.zeros(1)}
    module = torch.nn.Linear(1, 1)
    cache.keep_module("run_a", 0, (3, state), module)
    assert cache.trained_module("run_a", 0, (3, state)) is module
    assert cache.trained_module("run_a", 0, (3, dict(state))) is None  # another state object
    assert cache.trained_module("run_a", 0, (4, state)) is None  # a newer round was stored
    cache.keep_module("run_b", 1, (1, state), module)
    assert list(cache.backbones) == [("run_b", 1)]  # one job at a time
    cache.forget_module("run_b", 1)
    assert not cache.backbones


def test_a_worker_serving_every_client_keeps_only_the_newest_states_and_modules(tmp_path):
    """A worker that trains every client in turn (clients moving between a cluster's workers)
    keeps at most STATES_KEPT states and modules; an older client's state is read from its file."""
    CLIENT_CACHE.clear()
    store = BackboneStore(tmp_path, sync=False)
    root = str(tmp_path.resolve())
    kept = ClientCache.STATES_KEPT
    for pid in range(kept + 3):
        store.save(pid, 1, {"w": torch.full((2,), float(pid))})
        CLIENT_CACHE.keep_module(root, pid, store.cached(pid), torch.nn.Linear(1, 1))
    assert [k[1] for k in CLIENT_CACHE.stored_states] == list(range(3, kept + 3))
    assert [k[1] for k in CLIENT_CACHE.backbones] == list(range(3, kept + 3))
    assert store.cached(0) is None
    rnd, state = store.load(0)  # evicted: from its file, and now the newest again
    assert rnd == 1 and torch.equal(state["w"], torch.zeros(2)) and store.cached(0) is not None
    assert len(CLIENT_CACHE.stored_states) == kept and (root, 3) not in CLIENT_CACHE.stored_states
    CLIENT_CACHE.clear()


def test_backbone_store_reads_through_the_process_cache(tmp_path):
    CLIENT_CACHE.clear()
    store = BackboneStore(tmp_path, sync=False)
    store.save(2, 1, {"w": torch.ones(2)})
    assert store.cached(2) is CLIENT_CACHE.stored_states[(str(tmp_path.resolve()), 2)]
    CLIENT_CACHE.clear()  # a new process: the state comes from the file
    assert store.cached(2) is None
    rnd, state = store.load(2)
    assert rnd == 1 and torch.equal(state["w"], torch.ones(2))


def test_library_steps_do_not_import_the_process_state():
    tree = ast.parse(Path(step_module.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "fedhead.clients.messages" in imported
    assert not imported & {"fedhead.clients.state", "fedhead.clients.cache", "fedhead.clients.app"}


def test_every_data_set_declares_site_local_and_files():
    plain = DatasetConfig(name="plain")
    assert plain.site_local() is False and plain.files == ()


def test_the_job_kept_in_the_nodes_state_is_built_once_per_run_config():
    built = []

    def build(context):
        built.append(dict(context.run_config))
        return {"job": len(built)}

    state = RecordDict()
    first = Context(run_id=1, node_id=2, node_config={}, state=state, run_config={"overrides": "rounds=2"})
    assert job_in_state(first, build) == {"job": 1}
    later = Context(run_id=1, node_id=2, node_config={}, state=state, run_config={"overrides": "rounds=2"})
    assert job_in_state(later, build) == {"job": 1} and len(built) == 1  # from the state, not built again
    changed = Context(run_id=1, node_id=2, node_config={}, state=state, run_config={"overrides": "rounds=3"})
    assert job_in_state(changed, build) == {"job": 2} and len(built) == 2
