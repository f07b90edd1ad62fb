"""The one in-memory cache of a ClientApp process ([`ClientCache`][fedhead.clients.cache.ClientCache]):
what the client keeps between messages, keyed by what each entry is computed from, and for how long.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, TypeVar

from flwr.app import ConfigRecord

if TYPE_CHECKING:
    import numpy as np
    import torch
    from flwr.app import Context
    from flwr.clientapp import ClientApp

    from fedhead.data.base import FederatedData
    from fedhead.data.site import Site
    from fedhead.data.site_rows import SiteRows
    from fedhead.settings.job import JobConfig

V = TypeVar("V")

#: ``(round, state)`` of a stored private backbone
# ([`fedhead.clients.store.BackboneStore`][fedhead.clients.BackboneStore]).
StoredState = tuple[int, dict[str, Any]]


class ClientCache:
    """What one ClientApp process keeps in memory between messages.

    A ClientApp process outlives a run: a deployed SuperNode's ClientApp serves run after run,
    and a simulation reuses its Ray actors for every procedure (and, in a sweep, every data set).
    So each table is keyed by everything its entries are computed from (never by a run id alone)
    and is small or bounded. Every table is filled on the first message that needs an entry:

    * ``jobs``: run config -> ``JobConfig`` (a deployment's ClientApp; [`job`][fedhead.clients.cache.ClientCache.job]).
      Kept: one per run config.
    * ``apps``: digest of the pickled jobs -> ``ClientApp`` (a simulation's
      [`JobsClientApp`][fedhead.clients.app.JobsClientApp]). Kept: one per simulation.
    * ``datasets``: (data set config, client count) -> ``FederatedData``. The
      ``DATASETS_KEPT`` most recently used are kept (a sweep moves from data set to data set).
    * ``moments``: (data set config, client count, partition) -> ``(y, mu_m, Sigma_m)``. Kept.
    * ``sites``: (data set config, file) -> ``Site`` (a site-local table's own file). Kept.
    * ``local_data``: (data set config, site key, partition, standardisation) -> the site's
      standardised rows (numpy, [`standardized_rows`][fedhead.data.site_rows.standardized_rows]). The
      ``LOCAL_DATA_KEPT`` newest are kept (a worker serves several sites).
    * ``backbones``: (store root, partition) -> ``(round, stored state, module)``: the module a
      CPU client trained last, reused when the store's newest state is still that one. Only the
      current store root is kept (one job at a time), and of it the ``STATES_KEPT`` partitions
      used last: a worker that serves every client in turn (a cluster's clients move between
      workers) would otherwise hold every client's model.
    * ``stored_states``: (store root, partition) -> ``(round, state)``: the newest state a
      [`BackboneStore`][fedhead.clients.store.BackboneStore] wrote or read (checked against the
      file names on every load). The ``STATES_KEPT`` used last are kept; an older one is read
      from its file again.

    [`clear`][fedhead.clients.cache.ClientCache.clear] empties every table (a new process starts empty).
    """

    DATASETS_KEPT = 2
    LOCAL_DATA_KEPT = 16
    STATES_KEPT = 4

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.jobs: dict[Hashable, JobConfig] = {}
        self.apps: dict[str, ClientApp] = {}
        self.datasets: dict[Hashable, FederatedData] = {}
        self.moments: dict[Hashable, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.sites: dict[Hashable, Site] = {}
        self.local_data: dict[Hashable, SiteRows] = {}
        self.backbones: dict[tuple[str, int], tuple[int, dict[str, Any], torch.nn.Module]] = {}
        self.stored_states: dict[tuple[str, int], StoredState] = {}

    def remember(self, table: dict[Any, V], key: Hashable, build: Callable[[], V], *, keep: int | None = None) -> V:
        """``table[key]``, built by ``build()`` on a miss (outside the lock); with ``keep``, the
        table holds at most ``keep`` entries (the oldest dropped first)."""
        with self.lock:
            if key in table:
                return table[key]
        value = build()
        with self.lock:
            table[key] = value
            while keep is not None and len(table) > keep:
                table.pop(next(iter(table)))
        return value

    def dataset(self, key: Hashable, load: Callable[[], FederatedData]) -> FederatedData:
        """The data set of ``key``, loaded by ``load()`` once (under the lock: one load at a time);
        the ``DATASETS_KEPT`` most recently used are kept."""
        with self.lock:
            data = self.datasets.pop(key, None)
            if data is None:
                data = load()
            self.datasets[key] = data  # most recent last
            while len(self.datasets) > self.DATASETS_KEPT:
                self.datasets.pop(next(iter(self.datasets)))
        return data

    def job(self, context: Context, build: Callable[[Context], JobConfig]) -> JobConfig:
        """The job of ``context``'s run config, built by ``build(context)`` once per run config."""
        return self.remember(self.jobs, run_config_key(context), lambda: build(context))

    def stored_state(self, key: tuple[str, int]) -> StoredState | None:
        """The stored state kept for ``key`` (store root, partition), now the most recently used; or None."""
        with self.lock:
            entry = self.stored_states.pop(key, None)
            if entry is not None:
                self.stored_states[key] = entry
            return entry

    def keep_stored_state(self, key: tuple[str, int], entry: StoredState) -> None:
        """Keep ``entry`` as the newest state of ``key``; at most ``STATES_KEPT`` are kept (the
        least recently used dropped first)."""
        with self.lock:
            self.stored_states.pop(key, None)
            self.stored_states[key] = entry
            while len(self.stored_states) > self.STATES_KEPT:
                self.stored_states.pop(next(iter(self.stored_states)))

    def trained_module(self, root: str, partition: int, stored: StoredState) -> torch.nn.Module | None:
        """The module this process trained last for ``partition`` under ``root``, when ``stored`` (the
        store's newest state) is the very state it saved; else None."""
        with self.lock:
            hit = self.backbones.get((root, partition))
        if hit is not None and hit[0] == stored[0] and hit[1] is stored[1]:
            return hit[2]
        return None

    def keep_module(self, root: str, partition: int, stored: StoredState, module: torch.nn.Module) -> None:
        """Keep ``module`` as the one trained into ``stored``; the modules of other store roots are
        dropped (one job at a time)."""
        with self.lock:
            for key in [k for k in self.backbones if k[0] != root]:
                del self.backbones[key]
            self.backbones.pop((root, partition), None)
            self.backbones[(root, partition)] = (stored[0], stored[1], module)
            while len(self.backbones) > self.STATES_KEPT:
                self.backbones.pop(next(iter(self.backbones)))

    def forget_module(self, root: str, partition: int) -> None:
        """Drop the module kept for ``partition`` under ``root`` (it is no longer the stored state)."""
        with self.lock:
            self.backbones.pop((root, partition), None)

    def clear(self) -> None:
        """Empty every table."""
        with self.lock:
            for table in (
                self.jobs,
                self.apps,
                self.datasets,
                self.moments,
                self.sites,
                self.local_data,
                self.backbones,
                self.stored_states,
            ):
                table.clear()


#: The cache of this process (the ClientApp's handlers, the backbone store).
CLIENT_CACHE = ClientCache()


#: The record of a node's ``context.state`` that keeps its run's job between messages
#: ([`job_in_state`][fedhead.clients.cache.job_in_state]).
JOB_STATE = "fedhead.job"


def run_config_key(context: Context) -> str:
    """A digest of ``context``'s run config (its items in any order)."""
    items = sorted((str(k), str(v)) for k, v in context.run_config.items())
    return hashlib.sha256(repr(items).encode()).hexdigest()


def job_in_state(context: Context, build: Callable[[Context], JobConfig]) -> JobConfig:
    """The job of ``context``'s run config, kept (pickled) in the node's ``context.state``, which flwr hands to
    every message of the run at this node: a deployed message starts a fresh process, and then builds no job
    from the run config (Hydra, imported for that, is most of a light message's own import time). Built by
    ``build(context)`` and kept at the run's first message at the node, or when its run config changed. The
    state is the node's own: the server neither reads nor writes it."""
    key = run_config_key(context)
    kept = context.state.config_records.get(JOB_STATE)
    if kept is not None and kept.get("key") == key and isinstance(blob := kept.get("job"), bytes):
        return pickle.loads(blob)  # written by this node's own ClientApp, below
    job = build(context)
    context.state[JOB_STATE] = ConfigRecord({"key": key, "job": pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)})
    return job
