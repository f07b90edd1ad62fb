"""Atomic result writing and run provenance (no torch, no flwr)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np


def to_jsonable(obj: Any) -> Any:
    """Convert numpy arrays/scalars, dataclasses' dicts, tuples and paths into JSON values."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None if np.isnan(obj) else (1e308 if obj > 0 else -1e308)
    return obj


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, *, sync: bool = True, private: bool = False, overwrite: bool = True
) -> Iterator[BinaryIO]:
    """Open a binary file handle whose content replaces ``path`` only when the block succeeds.

    The data go to a temporary file in the same folder, which is flushed, synced (``fsync``,
    unless ``sync=False``: still atomic for other processes and for a crash of this one, but
    not durable across a power loss), given the permissions of a normal file (umask applied;
    ``private=True`` keeps ``mkstemp``'s 0600 from the first byte on) and moved over ``path`` with
    ``os.replace`` (``overwrite=False``: linked to ``path``, which raises ``FileExistsError`` when
    ``path`` exists and leaves it as it was). An interrupted or failing write leaves the previous
    file (if any) intact and removes the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        if not private:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes_atomic(
    path: str | os.PathLike, data: bytes, *, sync: bool = True, private: bool = False, overwrite: bool = True
) -> Path:
    """Write ``data`` to ``path`` atomically (see [`atomic_open`][fedhead.results.io.atomic_open])."""
    with atomic_open(path, sync=sync, private=private, overwrite=overwrite) as fh:
        fh.write(data)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, payload: Any, *, indent: int = 2) -> Path:
    """Serialise ``payload`` (numpy allowed) as JSON and write it atomically."""
    text = json.dumps(to_jsonable(payload), indent=indent, allow_nan=False)
    return write_bytes_atomic(path, (text + "\n").encode("utf-8"))


def git_revision(start: str | os.PathLike | None = None) -> str:
    """Return the git commit of the source tree (``+dirty`` if modified), or ``"unknown"``."""
    here = Path(start) if start is not None else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(seeds: Mapping[str, int | list[int]] | None = None) -> dict[str, Any]:
    """Git revision, versions and seeds (a seed or a list of them per name) to store beside every result."""
    return {
        "git_revision": git_revision(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "argv": list(sys.argv),
        "seeds": dict(seeds or {}),
    }
