"""A client's trained model as files that load with plain torch: ``model.pt2`` + ``model.json``.

At the end of a run each client saves its final model ([`fedhead.clients.export`][fedhead.clients.export] decides
when and where): its private backbone, the final shared head ``(W, b)``, the federation's input
and target offsets and scales, as one [`PredictionModule`][fedhead.models.export.PredictionModule] written with
`torch.export.save` (``model.pt2``), plus ``model.json`` (the feature and target names,
the offsets and scales, the input shape and dtype, the data set, the procedure, the round, the
versions, and ``program_sha256``, the SHA-256 of ``model.pt2``;
[`FORMAT_VERSION`][fedhead.models.export.FORMAT_VERSION]). ``fedhead-predict``
([`fedhead.cli.predict`][fedhead.cli.predict]) runs it.

A model folder is code: ``torch.export.load`` unpickles parts of ``model.pt2``, so loading a
crafted one runs whatever it holds. [`load_model`][fedhead.models.export.load_model] loads only the
file ``model.json`` names inside the folder (a plain file name) and only when its SHA-256 is the
one ``model.json`` records, checked on the bytes it then hands to torch. That catches a program file
changed or swapped after the export, not someone who can rewrite both files: load only model
folders from trusted sources.

Loading needs torch only (no fedhead code, no training code)::

    import json, torch
    meta = json.load(open("model/model.json"))
    model = torch.export.load("model/model.pt2").module()
    y = model(torch.as_tensor(x, dtype=torch.float64))   # x (N, F) in the file's units -> y (N, C)

The module maps inputs in the units of the client's file to predictions in the original target
units (float64): ``x' = (x - input_offset) / input_scale`` (tabular inputs, when the run
standardised them; images: uint8 -> ``[0, 1]``), ``h = backbone(x')`` (float32, eval mode:
BatchNorm uses its running statistics), ``y_std = W h + b`` (+ the client's own target mean
when its procedure centres targets), ``y = target_offset + target_scale * y_std``.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedhead.analysis.standardization import float32_overflow
from fedhead.data.base import batch_to_float
from fedhead.models.backbones import ModelError
from fedhead.results.io import write_bytes_atomic, write_json_atomic

log = logging.getLogger(__name__)

#: Version of the folder's layout and of ``model.json``'s keys (bumped when either changes meaning;
#: 2: ``program_sha256``, and ``inputs.standardization`` taken from the module).
FORMAT_VERSION = 2
FORMAT_NAME = "fedhead-model"
PROGRAM_FILE = "model.pt2"
META_FILE = "model.json"
#: ``model.json``'s key for the SHA-256 (hex) of the program file.
PROGRAM_SHA256 = "program_sha256"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ModelFileError(ValueError):
    """A model folder cannot be used: the message names the folder or file and the cause."""


class PredictionModule(nn.Module):
    """Inputs in the file's units -> predictions ``(N, C)`` float64 in the original target units.

    Parameters
    ----------
    backbone : nn.Module
        The client's backbone (copied to the CPU and put in eval mode; the caller's is untouched).
    weight, bias : ndarray
        The shared head ``W`` ``(C, P)`` and ``b`` ``(C,)`` (standardised target units).
    target_offset, target_scale : ndarray (C,)
        ``y = target_offset + target_scale * y_std``.
    input_offset, input_scale : ndarray (F,), optional
        ``x' = (x - input_offset) / input_scale`` for tabular inputs (None: used as they are).
    image : bool
        Image inputs ``(N, ch, H, W)``: uint8 become ``[0, 1]``, float32 pass through
        ([`fedhead.data.base.batch_to_float`][fedhead.data.batch_to_float], as in training).
    """

    # registered buffers (float64), declared for type checkers
    head_weight: torch.Tensor
    head_bias: torch.Tensor
    target_offset: torch.Tensor
    target_scale: torch.Tensor
    input_offset: torch.Tensor
    input_scale: torch.Tensor

    def __init__(
        self,
        backbone: nn.Module,
        weight: np.ndarray,
        bias: np.ndarray,
        target_offset: np.ndarray,
        target_scale: np.ndarray,
        input_offset: np.ndarray | None = None,
        input_scale: np.ndarray | None = None,
        *,
        image: bool = False,
    ):
        super().__init__()
        w = torch.as_tensor(np.asarray(weight, dtype=np.float64))
        b = torch.as_tensor(np.asarray(bias, dtype=np.float64))
        c = w.shape[0]
        if w.ndim != 2 or b.shape != (c,):
            raise ModelError(f"head weight must be (C, P) and bias (C,), got {tuple(w.shape)} and {tuple(b.shape)}")
        t_off = torch.as_tensor(np.asarray(target_offset, dtype=np.float64))
        t_scale = torch.as_tensor(np.asarray(target_scale, dtype=np.float64))
        if t_off.shape != (c,) or t_scale.shape != (c,):
            raise ModelError(
                f"target offset and scale must be ({c},), got {tuple(t_off.shape)}, {tuple(t_scale.shape)}"
            )
        self.backbone = copy.deepcopy(backbone).cpu().eval()
        self.image = bool(image)
        self.standardize_inputs = input_offset is not None and np.asarray(input_offset).size > 0
        self.register_buffer("head_weight", w)
        self.register_buffer("head_bias", b)
        self.register_buffer("target_offset", t_off)
        self.register_buffer("target_scale", t_scale)
        if self.standardize_inputs:  # no empty buffers: torch.export.save refuses them
            i_off = torch.as_tensor(np.asarray(input_offset, dtype=np.float64))
            i_scale = torch.as_tensor(np.asarray(input_scale, dtype=np.float64))
            if i_off.ndim != 1 or i_scale.shape != i_off.shape:
                raise ModelError(
                    f"input offset and scale must be (F,), got {tuple(i_off.shape)}, {tuple(i_scale.shape)}"
                )
            self.register_buffer("input_offset", i_off)
            self.register_buffer("input_scale", i_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.image:
            xf = batch_to_float(x)
        elif self.standardize_inputs:
            xf = ((x.to(torch.float64) - self.input_offset) / self.input_scale).to(torch.float32)
        else:
            xf = x.to(torch.float32)
        h = self.backbone(xf).to(torch.float64)
        return self.target_offset + self.target_scale * (h @ self.head_weight.T + self.head_bias)


def export_model(folder: str | os.PathLike, module: PredictionModule, example: torch.Tensor, meta: dict) -> Path:
    """Write ``module`` as ``folder/model.pt2`` (`torch.export.export`, dynamic batch size)
    and ``meta`` plus the format keys as ``folder/model.json``, each file atomically (the JSON
    last: a folder with ``model.json`` is complete).

    ``example`` is a batch ``(B, ...)`` of inputs with the dtype the module will be called with.
    ``model.json`` gets the program's SHA-256 and, as ``inputs.standardization``'s ``offset`` and
    ``scale``, the module's own (empty when it takes inputs as they are; ``mode`` is ``meta``'s,
    else ``"none"``). Returns the folder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    module.eval()
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        program = torch.export.export(module, (example,), dynamic_shapes={"x": {0: batch}})
    buf = io.BytesIO()
    torch.export.save(program, buf)
    data = buf.getvalue()
    write_bytes_atomic(folder / PROGRAM_FILE, data)
    inputs = dict(meta.get("inputs") or {})
    given = inputs.get("standardization") or {}
    on = module.standardize_inputs
    inputs["standardization"] = {
        "mode": given.get("mode", "none"),
        "offset": module.input_offset.tolist() if on else [],
        "scale": module.input_scale.tolist() if on else [],
    }
    payload = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "program": PROGRAM_FILE,
        PROGRAM_SHA256: hashlib.sha256(data).hexdigest(),
        **meta,
        "inputs": inputs,
    }
    write_json_atomic(folder / META_FILE, payload)
    log.info("saved the trained model to %s", folder)
    return folder


def input_overflow(x: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """Mask ``(N, F)`` of the tabular inputs ``x`` the module cannot take.

    The module standardises in float64 and casts to float32 for the backbone
    ([`PredictionModule`][fedhead.models.export.PredictionModule]); an input whose
    ``(x - offset) / scale`` (``model.json``'s ``inputs.standardization``; ``x`` itself when it has
    none) is not finite or beyond float32's range would reach the backbone as inf or NaN.
    """
    std = meta["inputs"]["standardization"]
    xf = np.asarray(x, dtype=np.float64)
    if std["offset"]:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            xf = (xf - np.asarray(std["offset"], dtype=np.float64)) / np.asarray(std["scale"], dtype=np.float64)
    return float32_overflow(xf)


@dataclass
class SavedModel:
    """A loaded model folder: ``meta`` (``model.json``) and ``module`` (``x -> y (N, C)`` float64)."""

    folder: Path
    meta: dict[str, Any]
    module: nn.Module

    @property
    def target_names(self) -> list[str]:
        return list(self.meta["targets"]["names"])

    @property
    def inputs(self) -> dict[str, Any]:
        return self.meta["inputs"]

    def predict(self, x: np.ndarray, *, batch_size: int = 4096) -> np.ndarray:
        """Predictions ``(N, C)`` float64 in the original target units of inputs ``x`` (file units:
        ``(N, F)`` tabular or ``(N, ch, H, W)`` images of the dtype ``model.json`` names)."""
        dtype = getattr(torch, self.inputs["dtype"])
        out = []
        with torch.no_grad():
            for s in range(0, x.shape[0], batch_size):
                xb = torch.as_tensor(np.ascontiguousarray(x[s : s + batch_size])).to(dtype)
                out.append(self.module(xb).detach().numpy())
        return np.concatenate(out) if out else np.zeros((0, len(self.target_names)))


_REQUIRED = {"inputs": ("kind", "shape", "dtype", "standardization"), "targets": ("names",)}
_DTYPES = ("float64", "float32", "uint8")
_REEXPORT = "re-export the model (rerun its training with this fedhead)"


def _is_file_name(name: object) -> bool:
    """Whether ``name`` is a plain file name: no folder part, not absolute, not ``.``/``..``."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in ("/", "\\", "\0"))
        and Path(name).name == name
    )


def _check_inputs(meta: dict[str, Any], path: Path) -> None:
    """``inputs.shape``, ``inputs.dtype`` and ``inputs.standardization`` make sense together."""
    inputs = meta["inputs"]
    if inputs["kind"] not in ("table", "image"):
        raise ModelFileError(f"{path}: inputs.kind must be 'table' or 'image', got {inputs['kind']!r}")
    shape = inputs["shape"]
    if not isinstance(shape, list) or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ModelFileError(f"{path}: inputs.shape must be a list of positive integers, got {shape!r}")
    features = inputs.get("features") or []
    if not isinstance(features, list) or (features and [len(features)] != shape):
        raise ModelFileError(f"{path}: inputs.features must name the {shape} inputs' columns, got {features!r}")
    if inputs["dtype"] not in _DTYPES:
        raise ModelFileError(f"{path}: inputs.dtype must be one of {', '.join(_DTYPES)}, got {inputs['dtype']!r}")
    std = inputs["standardization"]
    off, scale = (std.get(k) if isinstance(std, dict) else None for k in ("offset", "scale"))
    if not isinstance(off, list) or not isinstance(scale, list):
        raise ModelFileError(f"{path}: inputs.standardization must have 'offset' and 'scale' lists")
    sizes = (0, shape[0]) if inputs["kind"] == "table" and len(shape) == 1 else (0,)
    ok = len(off) == len(scale) and len(off) in sizes
    if ok and off:
        ok = all(isinstance(v, (int, float)) and np.isfinite(v) for v in off + scale) and 0 not in scale
    if not ok:
        raise ModelFileError(
            f"{path}: inputs.standardization's offset and scale must be empty or {sizes[-1]} finite numbers "
            f"each (scale nonzero), got {len(off)} and {len(scale)}"
        )


def read_meta(folder: str | os.PathLike) -> dict[str, Any]:
    """``model.json`` of a model folder, checked ([`ModelFileError`][fedhead.models.export.ModelFileError] naming the
    file): its format and version, the keys predictions need, ``program`` (a file name inside the
    folder) and ``program_sha256``. Reads no other file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: no such model folder")
    path = folder / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file (a model folder holds {META_FILE} and {PROGRAM_FILE})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: cannot read it as JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelFileError(f"{path}: not a {FORMAT_NAME} file (its 'format' is {found!r})")
    if meta.get("format_version") == 1:
        raise ModelFileError(
            f"{path}: format_version 1 records no {PROGRAM_SHA256}, so its program cannot be checked before torch "
            f"loads it (a model folder is code); {_REEXPORT}"
        )
    if meta.get("format_version") != FORMAT_VERSION:
        raise ModelFileError(
            f"{path}: format_version {meta.get('format_version')!r}, this fedhead reads version {FORMAT_VERSION}"
        )
    for section, keys in _REQUIRED.items():
        missing = [k for k in keys if not isinstance(meta.get(section), dict) or k not in meta[section]]
        if missing:
            raise ModelFileError(f"{path}: lacks {section}.{missing[0]}")
    _check_inputs(meta, path)
    if not _is_file_name(meta.get("program")):
        raise ModelFileError(
            f"{path}: 'program' must be a file name inside the model folder, got {meta.get('program')!r}"
        )
    digest = meta.get(PROGRAM_SHA256)
    if digest is None:
        raise ModelFileError(
            f"{path}: lacks {PROGRAM_SHA256}, so its program cannot be checked before torch loads it; {_REEXPORT}"
        )
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise ModelFileError(f"{path}: {PROGRAM_SHA256} must be 64 lowercase hex digits, got {digest!r}")
    return meta


def read_program(folder: str | os.PathLike, meta: dict[str, Any]) -> bytes:
    """The bytes of ``meta``'s program file, checked against ``meta["program_sha256"]``
    ([`ModelFileError`][fedhead.models.export.ModelFileError] when the file is missing, resolves
    outside ``folder`` (a link) or has another hash). Read once: the bytes checked are those loaded."""
    folder = Path(folder)
    path = folder / meta["program"]
    real = path.resolve()
    if real.parent != folder.resolve():
        raise ModelFileError(f"{path}: links to {real}, outside the model folder; not loaded")
    if not real.is_file():
        raise ModelFileError(f"{path}: no such file")
    try:
        data = real.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read it ({type(exc).__name__}: {exc})") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta[PROGRAM_SHA256]:
        raise ModelFileError(
            f"{path}: its sha256 is {digest}, not {META_FILE}'s {PROGRAM_SHA256} {meta[PROGRAM_SHA256]} "
            "(the file changed after the export); not loaded"
        )
    return data


def load_model(folder: str | os.PathLike) -> SavedModel:
    """Load a model folder written by [`export_model`][fedhead.models.export.export_model]
    ([`ModelFileError`][fedhead.models.export.ModelFileError] naming the file). Torch sees the
    program only after [`read_meta`][fedhead.models.export.read_meta] and
    [`read_program`][fedhead.models.export.read_program] accepted it."""
    folder = Path(folder)
    meta = read_meta(folder)
    data = read_program(folder, meta)
    try:
        program = torch.export.load(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a damaged archive
        path = folder / meta["program"]
        raise ModelFileError(f"{path}: cannot load it with torch.export.load ({type(exc).__name__}: {exc})") from None
    return SavedModel(folder=folder, meta=meta, module=program.module())
