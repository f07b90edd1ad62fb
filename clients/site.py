"""A site-local ``dataset=table`` client: it reads only its own file and standardises locally.

Which file: the SuperNode's node config ``data-path`` (a deployment: every SuperNode names its
own file, nothing else is opened), else ``dataset.files[partition-id]`` (the simulation, or
SuperNodes sharing a file system). The client reports its raw statistics in the statistics
exchange (:func:`handle_statistics`, no rows) and standardises its rows with the federation's
pooled offsets and scales that every later message carries (:func:`site_data`). Runs whose
rows must be pooled (one file split by site or eigen, ``n_train``) load the data set as before
(:func:`fedhead.clients.state.client_data`).
"""

from __future__ import annotations

import threading

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedhead.analysis.standardization import Standardization
from fedhead.clients.state import DATA_PATH_KEY, PARTITION_ID_KEY, ClientError, client_data, partition_of
from fedhead.data import site as S
from fedhead.data.base import ClientData, FederatedData
from fedhead.federation import protocol as P
from fedhead.federation.job import JobConfig

_SITES: dict[tuple[str, str], S.Site] = {}
_LOCAL: dict[tuple, tuple[FederatedData, ClientData]] = {}
_LOCAL_KEEP = 16
_LOCK = threading.Lock()


def site_local(job: JobConfig) -> bool:
    """Whether the job's clients read only their own file (:meth:`fedhead.data.table.TableConfig.site_local`)."""
    check = getattr(job.dataset, "site_local", None)
    return bool(check is not None and check())


def _file_of(job: JobConfig, context: Context) -> str:
    """The node's file: its ``data-path``, else ``dataset.files[partition-id]``."""
    path = context.node_config.get(DATA_PATH_KEY)
    if path:
        return str(path)
    files = job.dataset.files
    if not files:
        raise ClientError(
            f"node {context.node_id}: node config lacks '{DATA_PATH_KEY}' (dataset=table with dataset.files=[]: "
            f"start each SuperNode with --node-config \"{DATA_PATH_KEY}='<its file>'\")"
        )
    if PARTITION_ID_KEY not in context.node_config:
        raise ClientError(f"node {context.node_id}: node config has neither '{DATA_PATH_KEY}' nor '{PARTITION_ID_KEY}'")
    pid = int(context.node_config[PARTITION_ID_KEY])
    if not 0 <= pid < len(files):
        raise ClientError(f"node {context.node_id}: partition-id {pid} outside 0..{len(files) - 1} (dataset.files)")
    return files[pid]


def own_site(job: JobConfig, context: Context) -> S.Site:
    """The node's site, read once per process (only its own file is opened)."""
    path = _file_of(job, context)
    key = (repr(job.dataset), path)
    with _LOCK:
        hit = _SITES.get(key)
    if hit is None:
        try:
            hit = S.read_site(job.dataset, path)
        except ValueError as exc:  # TableError: one line naming the file
            raise ClientError(f"node {context.node_id}: {exc}") from None
        with _LOCK:
            _SITES[key] = hit
    return hit


def standardization_of(msg: Message, job: JobConfig, where: str) -> Standardization:
    """The federation's offsets and scales a message carries (after the statistics exchange)."""
    rec = msg.content.array_records.get(P.STANDARDIZATION)
    if rec is None:
        raise ClientError(f"{where}: the message carries no '{P.STANDARDIZATION}' record (statistics exchange first)")
    arr = {k: rec[k].numpy().astype(np.float64) for k in rec}
    ds = job.dataset
    return Standardization(
        ds.standardize_targets,
        ds.standardize_inputs,
        arr[P.TARGET_OFFSET],
        arr[P.TARGET_SCALE],
        arr[P.INPUT_OFFSET],
        arr[P.INPUT_SCALE],
    )


def local_data(job: JobConfig, context: Context, msg: Message, pid: int) -> tuple[FederatedData, ClientData]:
    """The client's data: its own file standardised with the message's statistics (site-local
    tables), else partition ``pid`` of the loaded data set."""
    if not site_local(job):
        return client_data(job, pid)
    site = own_site(job, context)
    st = standardization_of(msg, job, f"node {context.node_id}")
    key = (repr(job.dataset), site.key, pid, *(a.tobytes() for a in (st.target_offset, st.target_scale)))
    key += (st.input_offset.tobytes(), st.input_scale.tobytes())
    with _LOCK:
        hit = _LOCAL.get(key)
    if hit is None:
        cd = S.client_data(site, st)
        data = FederatedData(
            name=job.dataset.name,
            clients=[cd],
            input_shape=tuple(int(s) for s in cd.x_train.shape[1:]),
            target_names=site.target_names,
            is_image=site.is_image,
            target_offset=st.target_offset,
            target_scale=st.target_scale,
            source=site.label,
        )
        hit = (data, cd)
        with _LOCK:
            _LOCAL[key] = hit
            while len(_LOCAL) > _LOCAL_KEEP:  # a simulation's worker serves several sites
                _LOCAL.pop(next(iter(_LOCAL)))
    return hit


def handle_statistics(job: JobConfig, msg: Message, context: Context) -> Message:
    """The site's raw statistics (no rows): target moments, input means and variances, its
    column signature and key; its partition id when the node config has one."""
    site = own_site(job, context)
    stats = S.site_statistics(site)
    metrics: dict[str, int] = {P.NUM_EXAMPLES: site.n_train}
    if PARTITION_ID_KEY in context.node_config:
        metrics[P.PARTITION_ID] = partition_of(context, job)
    content = RecordDict(
        {
            P.SITE_STATS: ArrayRecord(
                {
                    P.Y_MEAN: Array(stats["y_mean"]),
                    P.Y_COV: Array(stats["y_cov"]),
                    P.X_MEAN: Array(np.asarray(stats["x_mean"], dtype=np.float64)),
                    P.X_VAR: Array(np.asarray(stats["x_var"], dtype=np.float64)),
                }
            ),
            P.SITE: ConfigRecord({P.COLUMNS: list(site.columns), P.SITE_KEY: site.key}),
            P.METRICS: MetricRecord(metrics),
        }
    )
    return Message(content, reply_to=msg)
