"""The client's local state, used by the handlers of [`fedhead.clients.app`][fedhead.clients.app]: its partition,
its data and target moments (kept in the process's [`ClientCache`][fedhead.clients.cache.ClientCache])
and its private backbone ([`BackboneStore`][fedhead.clients.store.BackboneStore] on local disk).
Nothing here leaves the client but what a handler puts in its reply.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Context, Message

from fedhead.analysis.seeds import backbone_seed
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.clients.messages import ClientError
from fedhead.clients.store import BackboneStore
from fedhead.data.base import ClientData, FederatedData
from fedhead.data.registry import load_federated
from fedhead.federation import protocol
from fedhead.federation.checkpoint import state_key
from fedhead.settings.job import JobConfig

if TYPE_CHECKING:  # torch, the models and the trainer only where a model is touched (not in a query or a SecAgg step)
    import torch

log = logging.getLogger(__name__)

PARTITION_ID_KEY = "partition-id"
NUM_PARTITIONS_KEY = "num-partitions"
STATE_DIR_KEY = "state-dir"
DATA_PATH_KEY = "data-path"  # Flower's node config key of a SuperNode's own data (dataset=table)


# -------------------------------------------------------------------------------- helpers
def partition_of(context: Context, job: JobConfig, msg: Message | None = None) -> int:
    """The client's partition id, checked against M: the server's number in the message's config
    (SuperNodes known by their ``data-path``,
    [`fedhead.strategies.statistics`][fedhead.strategies.statistics]), else the node config's
    ``partition-id``."""
    cfg = None if msg is None else msg.content.config_records.get(protocol.CONFIG)
    if cfg is not None and protocol.PARTITION_ID in cfg:
        pid = protocol.record_int(cfg[protocol.PARTITION_ID])
        if not 0 <= pid < job.settings.num_clients:
            raise ClientError(f"the server numbered this node {pid}, outside 0..{job.settings.num_clients - 1}")
        return pid
    if PARTITION_ID_KEY not in context.node_config:
        raise ClientError(f"node config lacks '{PARTITION_ID_KEY}' (got {dict(context.node_config)})")
    pid = int(context.node_config[PARTITION_ID_KEY])
    if not 0 <= pid < job.settings.num_clients:
        raise ClientError(f"partition-id {pid} outside 0..{job.settings.num_clients - 1}")
    n_parts = context.node_config.get(NUM_PARTITIONS_KEY)
    if n_parts is not None and int(n_parts) != job.settings.num_clients:
        raise ClientError(
            f"node config num-partitions={n_parts} but the run has num_clients={job.settings.num_clients} "
            f"(start one SuperNode per partition with matching num-partitions, or set num_clients=)"
        )
    return pid


def federated_data(job: JobConfig) -> FederatedData:
    """The job's partitioned data set, loaded once per process (the data layer caches on disk)."""
    key = (repr(job.dataset), job.settings.num_clients)
    return CLIENT_CACHE.dataset(key, lambda: load_federated(job.dataset, num_clients=job.settings.num_clients))


def client_data(job: JobConfig, pid: int) -> tuple[FederatedData, ClientData]:
    """The job's data set and partition ``pid``'s share of it."""
    data = federated_data(job)
    if len(data.clients) != job.settings.num_clients:
        raise ClientError(f"data set {data.name} has {len(data.clients)} clients, expected {job.settings.num_clients}")
    return data, data.clients[pid]


def client_moments(job: JobConfig, pid: int, y_train: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y (N_m, C) float64, mu_m (C,), Sigma_m (C, C))`` of the client's training targets ``y_train``
    (float32, as its tensors hold them), computed once per process and partition."""
    key = (repr(job.dataset), job.settings.num_clients, pid)

    def compute() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from fedhead.train.client_math import target_moments

        y64 = np.asarray(y_train).astype(np.float64)
        return (y64, *target_moments(y64))

    return CLIENT_CACHE.remember(CLIENT_CACHE.moments, key, compute)


def is_free(job: JobConfig) -> bool:
    """Whether the backbone is the free-feature one (its inputs are sample indices)."""
    from fedhead.models.config import FreeFeatureConfig

    return isinstance(job.model, FreeFeatureConfig)


def train_inputs(job: JobConfig, cd: ClientData) -> torch.Tensor:
    """Training inputs: the stored tensor, or sample indices for the free-feature backbone."""
    import torch

    return torch.arange(cd.n_train) if is_free(job) else cd.x_train


def limit_threads(job: JobConfig) -> None:
    """Torch's intra-op threads: the client's CPU share (``resources.client_cpus``)."""
    import torch

    n = max(1, int(job.resources.client_cpus))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


#: Under a job's state folder: one empty file per Ray node that trained a client of the run
#: (a simulation's record of where its clients ran; ``provenance.ray_nodes`` of results.json).
RAY_NODES = "ray_nodes"


def record_ray_node(job: JobConfig) -> None:
    """In a Ray simulation's worker: note this node (``<IP>_<Ray node id prefix>``) under the job's state folder, which
    every node of a cluster shares ([`fedhead.driver.cluster`][fedhead.driver.cluster]); nothing
    outside Ray (a deployed ClientApp)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    folder = job.state_dir / RAY_NODES
    folder.mkdir(parents=True, exist_ok=True)
    node = ray.get_runtime_context().get_node_id()
    (folder / f"{ray.util.get_node_ip_address()}_{node[:12]}").touch()  # raylets on one host share the IP


def ray_nodes(job: JobConfig) -> list[str]:
    """The nodes that trained a client of the job's simulation
    ([`record_ray_node`][fedhead.clients.state.record_ray_node]; empty when none was noted)."""
    folder = job.state_dir / RAY_NODES
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def simulation_state_dir(job: JobConfig, run_id: int) -> Path:
    """``<output>/<procedure>/client_state/run_<key>`` of a simulation (single machine): the key
    is [`fedhead.federation.checkpoint.state_key`][fedhead.federation.checkpoint.state_key] of the config
    hash, so a resumed run (a new flwr run id) finds the interrupted run's backbones; flwr's run id when
    the job has no hash."""
    key = state_key(job.config_hash) if job.config_hash else str(run_id)
    return job.state_dir / f"run_{key}"


def deployment_run_key(job: JobConfig, run_id: int) -> str:
    """The run key of a deployed client's node-local store: from the config hash and the run's
    output folder (what a resumed ``flwr run`` repeats, unlike flwr's run id); the run id when
    the job has no hash."""
    if not job.config_hash:
        return str(run_id)
    return state_key(hashlib.sha256(f"{job.config_hash}|{job.output_dir}".encode()).hexdigest())


def job_key(job: JobConfig) -> str:
    """The job's key within one flwr run (a simulation may serve several jobs in one run): a hash of its
    config hash, output folder and name."""
    return hashlib.sha256(f"{job.config_hash}|{job.output_dir}|{job.name}".encode()).hexdigest()[:16]


def store_of(job: JobConfig, context: Context) -> BackboneStore:
    """The private backbone store of this client: ``<state-dir>/<procedure>/run_<key>``
    ([`deployment_run_key`][fedhead.clients.state.deployment_run_key]) when the SuperNode's node config
    names a ``state-dir`` (deployments: a folder local to the client), else
    [`simulation_state_dir`][fedhead.clients.state.simulation_state_dir] (simulation, single machine)."""
    node_dir = context.node_config.get(STATE_DIR_KEY)
    site = context.node_config.get(DATA_PATH_KEY)  # a node known by its file: its state under its own key
    site_dir = f"site_{hashlib.sha256(str(site).encode()).hexdigest()[:12]}" if site else ""
    if node_dir:
        root = Path(str(node_dir)) / job.name / f"run_{deployment_run_key(job, context.run_id)}"
        return BackboneStore(root / site_dir)
    # the simulation's temporary state folder: atomic files, no fsync (a per-round cost per client)
    return BackboneStore(simulation_state_dir(job, context.run_id) / site_dir, sync=False)


def load_backbone(
    job: JobConfig,
    context: Context,
    pid: int,
    data: FederatedData,
    cd: ClientData,
    *,
    required: bool,
    expected_round: int | None = None,
):
    """The client's private backbone: the stored one, or the seeded initial backbone
    ([`initial_backbone_seed`][fedhead.clients.state.initial_backbone_seed]: common to all clients unless
    ``init=independent``).

    ``expected_round`` is the round whose state should be the newest (the previous round when
    training, the current one when evaluating; 0 means nothing can be stored yet). A CPU
    backbone this process trained and stored is reused as it is (same state) instead of being
    rebuilt and reloaded; full-model averaging always rebuilds (the broadcast changes it).
    """
    store = store_of(job, context)
    stored = None if expected_round == 0 else store.load(pid, expected_round=expected_round)
    if stored is None and required:
        raise ClientError(f"partition {pid}: no stored private backbone (evaluate before any training?)")
    if expected_round is not None and expected_round >= 1 and (stored is None or stored[0] != expected_round):
        found = "none" if stored is None else f"round {stored[0]}"
        raise ClientError(
            f"partition {pid}: the private backbone of round {expected_round} is not under "
            f"{store.root} (found {found}); a resumed run needs the interrupted run's client state"
        )
    if stored is not None and not job.procedure.full_model:
        trained = CLIENT_CACHE.trained_module(str(store.root), pid, stored)
        if trained is not None:
            return trained
    from fedhead.models import build_backbone

    backbone = build_backbone(job.model, data.input_shape, cd.n_train, initial_backbone_seed(job, pid))
    if stored is not None:
        backbone.load_state_dict(stored[1])
    return backbone


def initial_backbone_seed(job: JobConfig, pid: int) -> int:
    """Seed of partition ``pid``'s initial backbone: the run seed (``init=common``) or its own
    (``init=independent``), [`fedhead.analysis.seeds.backbone_seed`][fedhead.analysis.seeds.backbone_seed]."""
    return backbone_seed(job.settings.seed, pid, job.settings.init)


def save_backbone(job: JobConfig, context: Context, pid: int, rnd: int, backbone: torch.nn.Module) -> None:
    """Store the trained backbone after round ``rnd`` and keep the (CPU) module for the next use."""
    store = store_of(job, context)
    store.save(pid, rnd, backbone.state_dict())
    entry = store.cached(pid)
    on_cpu = all(p.device.type == "cpu" for p in backbone.parameters())
    if entry is None or job.procedure.full_model or not on_cpu:
        CLIENT_CACHE.forget_module(str(store.root), pid)
    else:
        CLIENT_CACHE.keep_module(str(store.root), pid, entry, backbone)
