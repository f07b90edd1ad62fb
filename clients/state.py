"""The client's local state: its partition, its data (cached per process), its target moments
and its private backbone (:class:`fedhead.clients.store.BackboneStore` on local disk, the last trained
module kept in memory), used by the handlers of :mod:`fedhead.clients.app`.

Nothing here leaves the client but what a handler puts in its reply.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from fedhead.analysis.seeds import backbone_seed
from fedhead.clients.store import BackboneStore
from fedhead.data.base import ClientData, FederatedData
from fedhead.data.registry import load_federated
from fedhead.federation import protocol as P
from fedhead.federation.checkpoint import state_key
from fedhead.federation.job import JobConfig
from fedhead.models import FreeFeatureConfig, build_backbone
from fedhead.train import target_moments

log = logging.getLogger(__name__)

PARTITION_ID_KEY = "partition-id"
NUM_PARTITIONS_KEY = "num-partitions"
STATE_DIR_KEY = "state-dir"
DATA_PATH_KEY = "data-path"  # Flower's node config key of a SuperNode's own data (dataset=table)

_DATA: dict[tuple[str, int], FederatedData] = {}
#: data sets kept in memory per process (least recently used dropped; the disk cache stays)
_DATA_KEEP = 2
_DATA_LOCK = threading.Lock()
_MOMENTS: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
#: Trained backbones kept in memory between rounds: (store root, partition) -> (round, stored
#: state object, module). Only the current store root is kept (one job at a time).
_BACKBONES: dict[tuple[str, int], tuple[int, dict, torch.nn.Module]] = {}


class ClientError(RuntimeError):
    """A client could not serve a message; the text names the partition and the cause."""


# -------------------------------------------------------------------------------- helpers
def partition_of(context: Context, job: JobConfig, msg: Message | None = None) -> int:
    """The client's partition id, checked against M: the server's number in the message's config
    (SuperNodes known by their ``data-path``, :mod:`fedhead.strategies.statistics`), else the
    node config's ``partition-id``."""
    cfg = None if msg is None else msg.content.config_records.get(P.CONFIG)
    if cfg is not None and P.PARTITION_ID in cfg:
        pid = int(cfg[P.PARTITION_ID])
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
    with _DATA_LOCK:
        data = _DATA.pop(key, None)
        if data is None:
            data = load_federated(job.dataset, num_clients=job.settings.num_clients)
        _DATA[key] = data  # most recent last
        while len(_DATA) > _DATA_KEEP:  # a sweep's simulation moves from data set to data set
            _DATA.pop(next(iter(_DATA)))
    return data


def client_data(job: JobConfig, pid: int) -> tuple[FederatedData, ClientData]:
    """The job's data set and partition ``pid``'s share of it."""
    data = federated_data(job)
    if len(data.clients) != job.settings.num_clients:
        raise ClientError(f"data set {data.name} has {len(data.clients)} clients, expected {job.settings.num_clients}")
    return data, data.clients[pid]


def client_moments(job: JobConfig, pid: int, cd: ClientData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(y (N_m, C) float64, mu_m (C,), Sigma_m (C, C))`` of the client's training targets,
    computed once per process and partition."""
    key = (repr(job.dataset), job.settings.num_clients, pid)
    with _DATA_LOCK:
        hit = _MOMENTS.get(key)
    if hit is None:
        y64 = cd.y_train.detach().cpu().numpy().astype(np.float64)
        hit = (y64, *target_moments(y64))
        with _DATA_LOCK:
            _MOMENTS[key] = hit
    return hit


def is_free(job: JobConfig) -> bool:
    """Whether the backbone is the free-feature one (its inputs are sample indices)."""
    return isinstance(job.model, FreeFeatureConfig)


def train_inputs(job: JobConfig, cd: ClientData) -> torch.Tensor:
    """Training inputs: the stored tensor, or sample indices for the free-feature backbone."""
    return torch.arange(cd.n_train) if is_free(job) else cd.x_train


def limit_threads(job: JobConfig) -> None:
    """Torch's intra-op threads: the client's CPU share (``resources.client_cpus``)."""
    n = max(1, int(job.resources.client_cpus))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def simulation_state_dir(job: JobConfig, run_id: int) -> Path:
    """``<output>/<procedure>/client_state/run_<key>`` of a simulation (single machine): the key
    is :func:`fedhead.federation.checkpoint.state_key` of the config hash, so a resumed run (a new flwr run
    id) finds the interrupted run's backbones; flwr's run id when the job has no hash."""
    key = state_key(job.config_hash) if job.config_hash else str(run_id)
    return job.state_dir / f"run_{key}"


def deployment_run_key(job: JobConfig, run_id: int) -> str:
    """The run key of a deployed client's node-local store: from the config hash and the run's
    output folder (what a resumed ``flwr run`` repeats, unlike flwr's run id); the run id when
    the job has no hash."""
    if not job.config_hash:
        return str(run_id)
    return state_key(hashlib.sha256(f"{job.config_hash}|{job.output_dir}".encode()).hexdigest())


def store_of(job: JobConfig, context: Context) -> BackboneStore:
    """The private backbone store of this client: ``<state-dir>/<procedure>/run_<key>``
    (:func:`deployment_run_key`) when the SuperNode's node config names a ``state-dir``
    (deployments: a folder local to the client), else :func:`simulation_state_dir`
    (simulation, single machine)."""
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
    (:func:`initial_backbone_seed`: common to all clients unless ``init=independent``).

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
        hit = _BACKBONES.get((str(store.root), pid))
        if hit is not None and hit[0] == stored[0] and hit[1] is stored[1]:
            return hit[2]
    backbone = build_backbone(job.model, data.input_shape, cd.n_train, initial_backbone_seed(job, pid))
    if stored is not None:
        backbone.load_state_dict(stored[1])
    return backbone


def initial_backbone_seed(job: JobConfig, pid: int) -> int:
    """Seed of partition ``pid``'s initial backbone: the run seed (``init=common``) or its own
    (``init=independent``), :func:`fedhead.analysis.seeds.backbone_seed`."""
    return backbone_seed(job.settings.seed, pid, job.settings.init)


def save_backbone(job: JobConfig, context: Context, pid: int, rnd: int, backbone: torch.nn.Module) -> None:
    """Store the trained backbone after round ``rnd`` and keep the (CPU) module for the next use."""
    store = store_of(job, context)
    store.save(pid, rnd, backbone.state_dict())
    root = str(store.root)
    entry = store.cached(pid)
    on_cpu = all(p.device.type == "cpu" for p in backbone.parameters())
    if entry is None or job.procedure.full_model or not on_cpu:
        _BACKBONES.pop((root, pid), None)
        return
    for key in [k for k in _BACKBONES if k[0] != root]:  # one job at a time: drop other runs' modules
        del _BACKBONES[key]
    _BACKBONES[(root, pid)] = (entry[0], entry[1], backbone)


def apply_shared_state(backbone: torch.nn.Module, record: ArrayRecord | None, pid: int) -> None:
    """Load the averaged backbone (full-model averaging), keeping the private BatchNorm stats."""
    if record is None:
        return
    own = backbone.state_dict()
    shared = {k: torch.as_tensor(v.numpy()) for k, v in record.items()}
    unknown = sorted(set(shared) - set(own))
    if unknown:
        raise ClientError(f"partition {pid}: broadcast backbone has unknown entries {unknown[:5]}")
    for k, v in shared.items():
        if P.is_private_state(k):
            continue
        own[k] = v.to(own[k].dtype).reshape(own[k].shape)
    backbone.load_state_dict(own)


def shared_state(backbone: torch.nn.Module) -> ArrayRecord:
    """The backbone's shareable state (BatchNorm running statistics excluded)."""
    return ArrayRecord(
        {
            k: Array(v.detach().cpu().numpy().copy())
            for k, v in backbone.state_dict().items()
            if not P.is_private_state(k)
        }
    )


def sigma_cen_of(content: RecordDict, gamma: float, pid: int) -> np.ndarray | None:
    """The pooled ``Sigma_cen (C, C)`` a correcting procedure (``gamma > 0``) receives in a training
    message's ``content``; None otherwise."""
    if gamma <= 0:
        return None
    if P.SIGMA_CEN not in content.array_records:
        raise ClientError(f"partition {pid}: corrected procedure but the message carries no Sigma_cen")
    return content.array_records[P.SIGMA_CEN][P.SIGMA_CEN_ARRAY].numpy().astype(np.float64)


def round_of(msg: Message | RecordDict) -> int:
    """The server round a message (or its content) names (``config["server-round"]``)."""
    content = msg.content if isinstance(msg, Message) else msg
    cfg = content.config_records.get(P.CONFIG)
    if cfg is None or P.SERVER_ROUND not in cfg:
        raise ClientError(f"message lacks config[{P.SERVER_ROUND!r}]")
    return int(cfg[P.SERVER_ROUND])
