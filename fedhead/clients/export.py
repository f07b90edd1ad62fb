"""The client's final model, saved where the client runs ([`fedhead.models.export`][fedhead.models.export]): on the
run's last evaluate message (``final-round``) a site-local ``dataset=table`` client writes its
backbone, the final shared head and the federation's offsets and scales into
[`model_folder`][fedhead.clients.export.model_folder]; [`exportable`][fedhead.clients.export.exportable]
says why other runs save none. Nothing of it travels in a message.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from flwr.app import Context, Message

import fedhead
from fedhead.clients.site import own_site, site_local, standardization_of
from fedhead.clients.state import STATE_DIR_KEY, is_free, store_of
from fedhead.data.base import ClientData
from fedhead.data.site import input_offset_scale
from fedhead.federation import protocol
from fedhead.models.export import PredictionModule, export_model
from fedhead.settings.job import JobConfig

log = logging.getLogger(__name__)

MODELS_DIR = "models"


def model_folder(job: JobConfig, context: Context, pid: int) -> Path:
    """Where partition ``pid`` saves its model: ``<store>/models/partition_<pid>`` under the node's
    ``state-dir`` (a deployment: [`fedhead.clients.state.store_of`][fedhead.clients.state.store_of], on
    the client's machine), else ``<run folder>/<procedure>/models/partition_<pid>`` (a simulation; kept
    after the run, unlike ``client_state/``)."""
    if context.node_config.get(STATE_DIR_KEY):
        return store_of(job, context).root / MODELS_DIR / f"partition_{pid}"
    return job.output_dir / MODELS_DIR / f"partition_{pid}"


def is_final(msg: Message) -> bool:
    """Whether an evaluate message is the run's last (``config["final-round"]``)."""
    cfg = msg.content.config_records.get(protocol.CONFIG)
    return bool(cfg is not None and cfg.get(protocol.FINAL_ROUND, False))


def exportable(job: JobConfig) -> str | None:
    """None when the job's clients save their final model, else why not (one phrase)."""
    if not job.output.export_model:
        return "output.export_model=false"
    if job.procedure.exact:
        return "the exact procedure has no backbone"
    if is_free(job):
        return "free features take training-row indices, not inputs"
    if not site_local(job):
        return "only site-local dataset=table runs know their inputs' standardisation on the client"
    return None


def save_final_model(
    job: JobConfig,
    context: Context,
    msg: Message,
    pid: int,
    cd: ClientData,
    backbone: torch.nn.Module,
    head: tuple[np.ndarray, np.ndarray],
    centered_mean: np.ndarray | None,
    round_: int,
) -> Path | None:
    """Save partition ``pid``'s final model (see the module docstring); returns its folder, or
    None when the job's models are not saved (logged once per call at debug level).

    Parameters
    ----------
    cd : ClientData
        The client's standardised data (its input shape and dtype).
    backbone : nn.Module
        The client's backbone after the last round (copied; not changed).
    head : (ndarray (C, P), ndarray (C,))
        The final shared head ``(W, b)``.
    centered_mean : ndarray (C,), optional
        The client's standardised training-target mean when its procedure centres targets
        (added to ``b``, as its evaluation does), else None.
    """
    why = exportable(job)
    if why is not None:
        log.debug("partition %d: no model saved (%s)", pid, why)
        return None
    site = own_site(job, context)
    st = standardization_of(msg, job, f"node {context.node_id}")
    weight, bias = (np.asarray(a, dtype=np.float64) for a in head)
    if centered_mean is not None:
        bias = bias + np.asarray(centered_mean, dtype=np.float64)
    i_off = i_scale = None
    if not site.is_image and st.input_mode == "pooled" and st.input_offset.size:
        i_off, i_scale = st.input_offset, st.input_scale
    elif not site.is_image and st.input_mode == "site":
        i_off, i_scale = input_offset_scale(site.x)
    module = PredictionModule(
        backbone, weight, bias, st.target_offset, st.target_scale, i_off, i_scale, image=site.is_image
    )
    shape = [int(s) for s in cd.x_train.shape[1:]]
    dtype = str(cd.x_train.dtype).removeprefix("torch.") if site.is_image else "float64"
    example = torch.zeros((2, *shape), dtype=getattr(torch, dtype))
    meta = {
        "inputs": {
            "kind": "image" if site.is_image else "table",
            "features": list(site.features),
            "shape": shape,
            "dtype": dtype,
            # its offset and scale: the module's (export_model)
            "standardization": {"mode": "none" if site.is_image else st.input_mode},
        },
        "targets": {
            "names": list(site.target_names),
            "mode": st.target_mode,
            "offset": np.asarray(st.target_offset, dtype=float).tolist(),
            "scale": np.asarray(st.target_scale, dtype=float).tolist(),
            "centered_mean": None if centered_mean is None else np.asarray(centered_mean, dtype=float).tolist(),
        },
        "head": {"targets": int(weight.shape[0]), "feature_dim": int(weight.shape[1])},
        "dataset": job.dataset.name,
        "data_file": site.label,
        "model": job.model.name,
        "procedure": job.name,
        "round": int(round_),
        "partition": int(pid),
        "run": job.config_hash[:16] if job.config_hash else str(context.run_id),
        "fedhead_version": fedhead.__version__,
        "torch_version": torch.__version__,
    }
    return export_model(model_folder(job, context, pid), module, example, meta)
