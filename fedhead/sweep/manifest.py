"""The manifest of a sweep: every run, its config hash, status, wall time and folder.

[`Manifest`][fedhead.sweep.manifest.Manifest] rewrites ``<out>/manifest.json`` atomically after
every run, so an interrupted sweep leaves a manifest that says what finished; ``fedhead-report``
reads it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import threading
from pathlib import Path
from typing import Any

from fedhead.analysis.constraints import ConfigError
from fedhead.results.io import write_json_atomic
from fedhead.sweep.specs import RunSpec

SCHEMA_VERSION = 1
STATUSES = ("pending", "completed", "failed", "skipped")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def run_dir(spec: RunSpec) -> str:
    """A run's folder relative to the sweep folder."""
    return f"runs/{spec.id}"


class Manifest:
    """The manifest of one sweep folder, updated in place and written atomically (thread-safe).

    ``<out>/manifest.json``::

        {"schema_version": 1, "sweep": "main", "scale": "smoke", "created": "...", "updated": "...",
         "git_revision": "...", "data_roots": {...},
         "runs": [{"id": "main/hopper/proximal/s0", "sweep": "main", "setting": "hopper",
                   "dataset": "hopper", "model": "resmlp_small", "procedure": "proximal", "seed": 0,
                   "params": {...}, "overrides": [...], "status": "completed", "config_hash": "...",
                   "wall_seconds": 12.3, "dir": "runs/main/hopper/proximal/s0", "error": null,
                   "needs": null, "nodes": ["10.0.0.1_4f2a9c1b0e7d", "10.0.0.2_91c0d2e4a6b3"]}, ...]}

    ``status``: ``pending`` (not run yet), ``completed``, ``failed`` (``error`` says why; rerun on
    the next start), ``skipped`` (its data files are missing: ``needs`` names them). ``nodes``: the
    Ray nodes (``<IP>_<node id prefix>``) the run's clients trained on (several on a cluster).
    """

    def __init__(self, root: str | Path, sweep: str, scale: str, *, extra: dict[str, Any] | None = None):
        self.root = Path(root)
        self.path = self.root / "manifest.json"
        self._lock = threading.Lock()
        old = self._read()
        self.data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "sweep": sweep,
            "scale": scale,
            "created": old.get("created", _now()),
            "updated": _now(),
            **(extra or {}),
            "runs": [],
        }
        self._old = {r["id"]: r for r in old.get("runs", []) if isinstance(r, dict) and "id" in r}
        if old and (old.get("sweep"), old.get("scale")) != (sweep, scale):
            raise ConfigError(
                f"{self.path} belongs to sweep={old.get('sweep')} scale={old.get('scale')}, not "
                f"sweep={sweep} scale={scale}: use another out= folder"
            )

    def _read(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"{self.path}: unreadable manifest ({exc}); move it away to start the sweep afresh"
            ) from exc
        return data if isinstance(data, dict) else {}

    def previous(self, run_id: str) -> dict[str, Any] | None:
        """The entry of ``run_id`` in the manifest found on disk when the sweep started."""
        return self._old.get(run_id)

    def add(self, spec: RunSpec, config_hash: str) -> dict[str, Any]:
        """Register a run as ``pending`` (keeping nothing of an earlier entry but its history)."""
        entry = {
            **dataclasses.asdict(spec),
            "overrides": list(spec.overrides),
            "status": "pending",
            "config_hash": config_hash,
            "wall_seconds": None,
            "dir": run_dir(spec),
            "error": None,
            "needs": None,
            "reused_from": None,
        }
        with self._lock:
            self.data["runs"].append(entry)
        return entry

    def entry(self, run_id: str) -> dict[str, Any]:
        for e in self.data["runs"]:
            if e["id"] == run_id:
                return e
        raise KeyError(run_id)

    def update(self, run_id: str, **fields: Any) -> None:
        """Set fields of a run's entry and write the manifest."""
        bad = fields.get("status")
        if bad is not None and bad not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {bad!r}")
        with self._lock:
            self.entry(run_id).update(fields)
        self.write()

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for e in self.data["runs"]:
            out[e["status"]] += 1
        return out

    def write(self) -> None:
        with self._lock:
            self.data["updated"] = _now()
            self.data["counts"] = self.counts()
            write_json_atomic(self.path, self.data)
