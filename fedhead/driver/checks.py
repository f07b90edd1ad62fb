"""Checks and sizes of a simulation that need no engine: the device, the data and the regime.

[`preflight`][fedhead.driver.checks.preflight] refuses impossible resources before anything starts;
[`prepare_data`][fedhead.driver.checks.prepare_data] (once per data set and penalties in a process:
[`check_data_once`][fedhead.driver.checks.check_data_once]) loads the data and refuses a federation outside the fully
active regime; [`message_window`][fedhead.driver.checks.message_window] sizes the messages in flight.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from fedhead.analysis.regime import ensure_fully_active
from fedhead.data.registry import data_record, load_federated
from fedhead.data.site import warn_shared_inputs
from fedhead.driver.cluster import cluster_address
from fedhead.models.user import check_user_model
from fedhead.settings.config import ConfigError, JobConfig

__all__ = ["preflight", "uses_cuda", "prepare_data", "data_key", "check_data_once", "message_window"]


def preflight(jobs: list[JobConfig]) -> None:
    """Checks that need no data and no engine: refuse ``device=cuda`` (or a GPU share) on a
    machine without a CUDA GPU before anything starts
    ([`fedhead.settings.config.ConfigError`][fedhead.analysis.constraints.ConfigError])."""
    if not jobs:
        return
    job = jobs[0]
    address = cluster_address(job.resources.ray_address)
    if address:  # a joined cluster decides its resources: checked once joined (driver/cluster.py)
        if job.resources.ray_num_cpus is not None or job.resources.ray_num_gpus is not None:
            raise ConfigError(
                f"resources.ray_num_cpus and ray_num_gpus must be null when joining the Ray cluster at {address} "
                "(RAY_ADDRESS or resources.ray_address): the cluster decides its resources"
            )
        return
    wants_gpu = (
        job.settings.device == "cuda" or (job.resources.client_gpus or 0) > 0 or (job.resources.ray_num_gpus or 0) > 0
    )
    cpus = job.resources.ray_num_cpus or os.cpu_count() or 1
    if job.resources.client_cpus > cpus:
        raise ConfigError(
            f"resources.client_cpus={job.resources.client_cpus:g} exceeds the {cpus} CPU(s) Ray gets "
            f"(resources.ray_num_cpus or this machine's CPUs): no client could ever run"
        )
    if wants_gpu and not torch.cuda.is_available():
        raise ConfigError(
            f"device={job.settings.device} resources.client_gpus={job.resources.client_gpus} "
            f"resources.ray_num_gpus={job.resources.ray_num_gpus} asks for a GPU, but no CUDA GPU is "
            f"available on this machine (torch.cuda.is_available() is False): use device=cpu or device=auto"
        )


def uses_cuda(job: JobConfig) -> bool:
    """Whether the job's clients train on CUDA (``device=cuda``, or ``auto`` with a GPU present)."""
    if job.settings.device == "cuda":
        return True
    return job.settings.device == "auto" and torch.cuda.is_available()


def prepare_data(job: JobConfig):
    """Load (or generate) the job's data once in the driver: validates it, warms the cache the
    Ray workers read, and refuses a federation outside the fully active regime (theory.md §3) before
    any worker starts, unless ``dataset.allow_outside_regime=true`` or ``diagnose_only=true``
    (the server repeats the check on the exchanged moments, which is what deployments use). Warns,
    naming the client's file, when a client's training rows share their inputs but not their
    targets ([`fedhead.data.site.warn_shared_inputs`][fedhead.data.site.warn_shared_inputs]; a deployed client warns in
    its own log)."""
    data = load_federated(job.dataset, num_clients=job.settings.num_clients)
    check_user_model(job.model, data.input_shape)  # model=torch: its shape once, before Ray starts
    if data.n_clients != job.settings.num_clients:
        raise ValueError(f"data set {data.name} gave {data.n_clients} clients, expected {job.settings.num_clients}")
    if job.model.name != "free":  # free features ignore the inputs
        files = job.dataset.files
        for i, c in enumerate(data.clients):
            if c.x_train.ndim == 2 and c.x_train.dtype.is_floating_point:
                label = Path(files[i]).name if len(files) == data.n_clients else f"{data.name} client {i}"
                warn_shared_inputs(label, c.x_train.numpy(), c.y_train.numpy())
    if not job.settings.diagnose_only and not job.dataset.allow_outside_regime:
        # (when allowed, the server reports the regime once, after the exchange)
        ensure_fully_active(data, job.settings.lambda_h, job.settings.lambda_w)
    return data


def data_key(job: JobConfig) -> tuple[str, int, float, float, bool]:
    """What [`prepare_data`][fedhead.driver.checks.prepare_data]'s verdict depends on: the data set, the client count,
    the penalties (the regime check) and ``diagnose_only``."""
    st = job.settings
    return repr(job.dataset), st.num_clients, st.lambda_h, st.lambda_w, st.diagnose_only


#: [`data_key`][fedhead.driver.checks.data_key] of every data check that passed in this process, with the
#: data's record ([`fedhead.data.data_record`][fedhead.data.data_record])
_DATA_CHECKED: dict[tuple[str, int, float, float, bool], dict[str, Any]] = {}


def check_data_once(job: JobConfig) -> dict[str, Any]:
    """[`prepare_data`][fedhead.driver.checks.prepare_data] unless the same check already passed in this process (a
    sweep checks every data set before Ray starts, then runs several simulations over them).
    Returns the data's record, which checkpoints keep and a resume compares
    ([`fedhead.federation.checkpoint.check_data`][fedhead.federation.checkpoint.check_data])."""
    key = data_key(job)
    if key not in _DATA_CHECKED:
        _DATA_CHECKED[key] = data_record(job.dataset, prepare_data(job))
    return _DATA_CHECKED[key]


def client_slots(job: JobConfig) -> int:
    """Clients a simulation runs at once: the CPUs Ray gets (a joined cluster's, all of its nodes)
    over ``resources.client_cpus``."""
    cpus = job.resources.ray_num_cpus or os.cpu_count() or 1
    if cluster_address(job.resources.ray_address):
        import ray

        if ray.is_initialized():
            cpus = int(ray.cluster_resources().get("CPU", cpus))
    return max(1, math.floor(cpus / job.resources.client_cpus)) if job.resources.client_cpus > 0 else 1


def message_window(job: JobConfig) -> int:
    """Messages in flight in a simulation phase
    ([`fedhead.federation.progress_grid.ProgressGrid`][fedhead.federation.progress_grid.ProgressGrid]):
    twice the clients Ray runs at once (so a free actor always finds a queued message), at
    least 8."""
    return max(8, 2 * client_slots(job))
