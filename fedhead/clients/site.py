"""A site-local ``dataset=table`` client: it reads only its own file (the SuperNode's
``data-path``, else ``dataset.files[partition-id]``), reports the file's raw statistics in the
statistics exchange ([`handle_statistics`][fedhead.clients.site.handle_statistics], no rows) and
standardises its rows with the pooled offsets and scales every later message carries
([`local_data`][fedhead.clients.site.local_data]).
"""

from __future__ import annotations

import hashlib

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, MetricRecordValues, RecordDict

from fedhead.analysis.standardization import Standardization
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.clients.ledger import SiteLedger, run_scope
from fedhead.clients.messages import ClientError, site_data_error
from fedhead.clients.policy import site_policy
from fedhead.clients.state import DATA_PATH_KEY, PARTITION_ID_KEY, client_data, job_key, partition_of
from fedhead.data import site as data_site
from fedhead.data import site_range as data_site_range
from fedhead.data import site_rows as data_site_rows
from fedhead.data.base import ClientData, FederatedData
from fedhead.data.table_config import TableConfig
from fedhead.data.table_files import TableError
from fedhead.federation import protocol
from fedhead.settings.job import JobConfig


def site_local(job: JobConfig) -> bool:
    """Whether the job's clients read only their own file
    ([`site_local`][fedhead.data.config.DatasetConfig.site_local])."""
    return job.dataset.site_local()


def site_table_config(job: JobConfig) -> TableConfig:
    """The job's ``dataset=table`` config: only a table is read from a site's own file."""
    if not isinstance(job.dataset, TableConfig):
        raise ClientError(f"dataset={job.dataset.name} is not read from site files (dataset=table is)")
    return job.dataset


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


def row_minimum(job: JobConfig, context: Context) -> data_site.RowMinimum:
    """The fewest training rows this site takes part with: its own policy's, else the run's ``privacy.min_rows``
    ([`SitePolicy.row_minimum`][fedhead.clients.policy.SitePolicy.row_minimum])."""
    try:
        rows, setting = site_policy(context).row_minimum(job.privacy.min_rows)
    except ClientError as exc:
        raise ClientError(f"node {context.node_id}: {exc}") from None
    return data_site.RowMinimum(rows, setting)


def own_site(job: JobConfig, context: Context) -> data_site.Site:
    """The node's site, read once per process (only its own file is opened). A site below its
    [`row_minimum`][fedhead.clients.site.row_minimum] refuses here, before any statistic of its
    rows is computed; every problem with its file leaves the node as
    [`site_data_error`][fedhead.clients.messages.site_data_error] (no value, no row, no count)."""
    path = _file_of(job, context)
    minimum = row_minimum(job, context)
    key = (repr(job.dataset), path, minimum)

    def read() -> data_site.Site:
        try:
            site = data_site.read_site(site_table_config(job), path, minimum)
            data_site_range.refuse_out_of_range(site)  # the same answer for every run: no server-chosen number in it
            return site
        except Exception as exc:  # noqa: BLE001 - whatever the file holds, only its kind leaves the node
            raise site_data_error(exc, f"node {context.node_id}") from None

    return CLIENT_CACHE.remember(CLIENT_CACHE.sites, key, read)


def standardization_of(msg: Message, job: JobConfig, where: str) -> Standardization:
    """The federation's offsets and scales a message carries (after the statistics exchange)."""
    rec = msg.content.array_records.get(protocol.STANDARDIZATION)
    if rec is None:
        raise ClientError(
            f"{where}: the message carries no '{protocol.STANDARDIZATION}' record (statistics exchange first)"
        )
    arr = {k: rec[k].numpy().astype(np.float64) for k in rec}
    ds = site_table_config(job)
    return Standardization(
        ds.standardize_targets,
        ds.standardize_inputs,
        arr[protocol.TARGET_OFFSET],
        arr[protocol.TARGET_SCALE],
        arr[protocol.INPUT_OFFSET],
        arr[protocol.INPUT_SCALE],
    )


def accept_standardization(job: JobConfig, context: Context, site: data_site.Site, st: Standardization) -> None:
    """Take ``st`` only as the run's one standardisation: the first a run sends (refusing the whole run when
    it may not fit the site's range, [`standardization_fits`][fedhead.data.site_range.standardization_fits]),
    then that one again; another is refused. No answer depends on the site's rows."""
    digest = hashlib.sha256(f"{st.target_mode}|{st.input_mode}".encode())
    for a in (st.target_offset, st.target_scale, st.input_offset, st.input_scale):
        arr = np.ascontiguousarray(a, dtype=np.float64)
        digest.update(repr(arr.shape).encode() + arr.tobytes())
    misfit = (
        f"node {context.node_id}: refused: the run's standardisation does not fit this site's range; "
        "it takes no further part in this run"
    )
    SiteLedger(context).accept_standardization(
        run_scope(context, job_key(job)),
        digest.hexdigest(),
        lambda: data_site_range.standardization_fits(site, st),
        misfit,
    )


def local_data(job: JobConfig, context: Context, msg: Message, pid: int) -> tuple[FederatedData, ClientData]:
    """The client's data: its own file standardised with the message's statistics (site-local
    tables, [`site_rows`][fedhead.clients.site.site_rows] as tensors), else partition ``pid`` of the
    loaded data set. Every handler starts here or at [`local_targets`][fedhead.clients.site.local_targets]:
    a site below its [`row_minimum`][fedhead.clients.site.row_minimum] refuses before anything of its
    rows is computed."""
    if not site_local(job):
        data, cd = client_data(job, pid)
        try:
            data_site.refuse_few_rows(f"partition {pid}", cd.n_train, row_minimum(job, context))
        except TableError as exc:
            raise site_data_error(exc, f"node {context.node_id}") from None
        return data, cd
    site, st, rows = site_rows(job, context, msg, pid)
    cd = data_site_rows.client_data(rows)
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
    return data, cd


def local_targets(job: JobConfig, context: Context, msg: Message, pid: int) -> np.ndarray:
    """The client's standardised training targets ``(N_m, C)`` float32, as its tensors hold them, with
    [`local_data`][fedhead.clients.site.local_data]'s checks; a site-local table's without torch."""
    if not site_local(job):
        return local_data(job, context, msg, pid)[1].y_train.detach().cpu().numpy()
    return site_rows(job, context, msg, pid)[2][1]


def site_rows(
    job: JobConfig, context: Context, msg: Message, pid: int
) -> tuple[data_site.Site, Standardization, data_site_rows.SiteRows]:
    """A site-local client's file, the message's standardisation (accepted:
    [`accept_standardization`][fedhead.clients.site.accept_standardization]) and its rows standardised with
    it (numpy, kept in the process's cache)."""
    site = own_site(job, context)
    st = standardization_of(msg, job, f"node {context.node_id}")
    accept_standardization(job, context, site, st)
    key = (repr(job.dataset), site.key, pid, *(a.tobytes() for a in (st.target_offset, st.target_scale)))
    key += (st.input_offset.tobytes(), st.input_scale.tobytes())

    def standardize() -> data_site_rows.SiteRows:
        try:
            return data_site_rows.standardized_rows(site, st)
        except TableError as exc:  # a column that overflows once standardised: named, no value
            raise site_data_error(exc, f"node {context.node_id}") from None

    rows = CLIENT_CACHE.remember(CLIENT_CACHE.local_data, key, standardize, keep=CLIENT_CACHE.LOCAL_DATA_KEPT)
    return site, st, rows


def handle_statistics(job: JobConfig, msg: Message, context: Context) -> Message:
    """The site's raw statistics (no rows): target moments, input means and variances, its
    column signature and key; its partition id when the node config has one."""
    site = own_site(job, context)
    stats = data_site.site_statistics(site)
    metrics: dict[str, MetricRecordValues] = {protocol.NUM_EXAMPLES: site.n_train}
    if PARTITION_ID_KEY in context.node_config:
        metrics[protocol.PARTITION_ID] = partition_of(context, job)
    content = RecordDict(
        {
            protocol.SITE_STATS: ArrayRecord(
                {
                    protocol.Y_MEAN: Array(stats["y_mean"]),
                    protocol.Y_COV: Array(stats["y_cov"]),
                    protocol.X_MEAN: Array(np.asarray(stats["x_mean"], dtype=np.float64)),
                    protocol.X_VAR: Array(np.asarray(stats["x_var"], dtype=np.float64)),
                }
            ),
            protocol.SITE: ConfigRecord({protocol.COLUMNS: list(site.columns), protocol.SITE_KEY: site.key}),
            protocol.METRICS: MetricRecord(metrics),
        }
    )
    return Message(content, reply_to=msg)
