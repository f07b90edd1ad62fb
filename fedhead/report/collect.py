"""Collect the runs of ``fedhead-sweep`` output folders (manifest.json + per-run results.json).

[`collect`][fedhead.report.collect.collect] reads every manifest under the given folders (the
format is `fedhead.sweep.manifest.Manifest`'s) and returns the counted runs (completed, with a
readable, completed results.json) and the others with the reason they do not count. Pure
reading, no figures or tables.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedhead.results import schema
from fedhead.results.schema import Results, SchemaError, Timing

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
#: the per-client metrics of the last round the report reads (the C5/C8 comparison of fixed_e.py)
SLIM_CLIENT_METRICS = ("distance_to_broadcast",)


class ReportInputError(ValueError):
    """Bad input to the report: no manifest, unreadable or malformed manifest JSON."""


@dataclass(frozen=True, order=True)
class RunRef:
    """Where one run lives: its sweep folder and the run folder relative to it."""

    sweep_dir: str
    run_dir: str

    @property
    def path(self) -> Path:
        """The run folder (``sweep_dir / run_dir``)."""
        return Path(self.sweep_dir) / self.run_dir


@dataclass(frozen=True, eq=False)
class RunEntry:
    """One run of a manifest, with its results.json content when it counts.

    Attributes
    ----------
    ref : RunRef
        Sweep folder and run folder.
    sweep, scale : str
        The sweep's name (``main``, ``rho``, ...) and scale (``smoke``/``paper``).
    id, setting, dataset, model, procedure : str
        As in the manifest.
    seed : int
    params : dict
        The swept knobs of this run.
    status : str
        The manifest status; ``"unreadable"`` when a completed run's results.json is missing,
        not JSON or not completed.
    reason : str or None
        Why a run does not count (the manifest's ``error``/``needs``, or the results problem).
    results : Results or None
        The run's results.json read through [`fedhead.results.schema.read`][fedhead.results.schema.read] (counted runs
        only), without the entries the report never reads (see [`slim`][fedhead.report.collect.slim]).
    wall_seconds : float or None
        The manifest's wall time of the run.
    """

    ref: RunRef
    sweep: str
    scale: str
    id: str
    setting: str
    dataset: str
    model: str
    procedure: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    status: str = "completed"
    reason: str | None = None
    results: Results | None = None
    wall_seconds: float | None = None

    @property
    def counted(self) -> bool:
        """True for a completed run with a readable, completed results.json."""
        return self.status == "completed" and self.results is not None

    @property
    def counted_results(self) -> Results:
        """The results of a counted run (the tables and figures see only those)."""
        if self.results is None:
            raise ValueError(f"run {self.id} ({self.status}) has no results: it is not counted")
        return self.results


@dataclass(frozen=True)
class SweepInfo:
    """One manifest: where it is, its name and scale, and how many runs end in each status."""

    sweep_dir: str
    sweep: str
    scale: str
    created: str
    counts: dict[str, int]
    wall_seconds: float = 0.0


@dataclass(frozen=True)
class Collection:
    """Everything [`collect`][fedhead.report.collect.collect] found: the sweeps, the counted runs and the others."""

    sweeps: list[SweepInfo]
    runs: list[RunEntry]
    excluded: list[RunEntry]

    def of_sweep(self, *names: str) -> list[RunEntry]:
        """The counted runs of the sweeps named ``names``."""
        return [r for r in self.runs if r.sweep in names]


def find_manifests(dirs: Iterable[str | Path]) -> list[Path]:
    """Every ``manifest.json`` in ``dirs`` (a sweep folder) or below them (a parent folder).

    Raises
    ------
    ReportInputError
        When a folder does not exist or no manifest is found at all.
    """
    found: list[Path] = []
    for d in dirs:
        root = Path(d)
        if not root.is_dir():
            raise ReportInputError(f"{root}: no such folder")
        direct = root / MANIFEST
        hits = [direct] if direct.is_file() else sorted(root.rglob(MANIFEST))
        if not hits:
            raise ReportInputError(f"{root}: no {MANIFEST} in this folder or below it (is it a fedhead-sweep output?)")
        found.extend(h.resolve() for h in hits)
    return sorted(dict.fromkeys(found))


def read_json(path: Path) -> Any:
    """The JSON content of ``path``; [`ReportInputError`][fedhead.report.ReportInputError] naming the file when
    unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportInputError(f"{path}: unreadable JSON ({exc})") from exc


def load_manifest(path: Path) -> tuple[SweepInfo, list[RunEntry]]:
    """Read one manifest and the results.json of each of its completed runs."""
    data = read_json(path)
    if not isinstance(data, Mapping) or not isinstance(data.get("runs"), list):
        raise ReportInputError(f"{path}: not a fedhead-sweep manifest (no 'runs' list)")
    sweep_dir = str(path.parent)
    entries = [_entry(path, sweep_dir, data, i, run) for i, run in enumerate(data["runs"])]
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.status] = counts.get(e.status, 0) + 1
    info = SweepInfo(
        sweep_dir=sweep_dir,
        sweep=str(data.get("sweep", "")),
        scale=str(data.get("scale", "")),
        created=str(data.get("created", "")),
        counts=counts,
        wall_seconds=float(sum(e.wall_seconds or 0.0 for e in entries)),
    )
    return info, entries


def _entry(path: Path, sweep_dir: str, manifest: Mapping[str, Any], i: int, run: Any) -> RunEntry:
    """The [`RunEntry`][fedhead.report.RunEntry] of the ``i``-th manifest run (results.json read when completed)."""
    if not isinstance(run, Mapping) or "id" not in run:
        raise ReportInputError(f"{path}: run #{i} is not an object with an 'id'")
    rel = str(run.get("dir") or f"runs/{run['id']}")
    status = str(run.get("status", "pending"))
    reason = run.get("error") or (f"needs {run['needs']}" if run.get("needs") else None)
    results = None
    if status == "completed":
        results, problem = _read_results(Path(sweep_dir) / rel / schema.FILE_NAME)
        if problem:
            status, reason = "unreadable", problem
            log.warning("%s: %s", run["id"], problem)
    return RunEntry(
        ref=RunRef(sweep_dir, rel),
        sweep=str(run.get("sweep") or manifest.get("sweep", "")),
        scale=str(manifest.get("scale", "")),
        id=str(run["id"]),
        setting=str(run.get("setting", "")),
        dataset=str(run.get("dataset", "")),
        model=str(run.get("model", "")),
        procedure=str(run.get("procedure", "")),
        seed=int(run.get("seed", 0) or 0),
        params=dict(run.get("params") or {}),
        status=status,
        reason=None if reason is None else str(reason),
        results=results,
        wall_seconds=run.get("wall_seconds") if isinstance(run.get("wall_seconds"), (int, float)) else None,
    )


def _read_results(path: Path) -> tuple[Results | None, str | None]:
    """``(results, None)``, or ``(None, why)`` when results.json is missing, bad or not completed."""
    if not path.is_file():
        return None, f"marked completed but {path} is missing"
    try:
        results = schema.read(path)
    except (OSError, SchemaError) as exc:
        return None, f"unreadable {path} ({exc})"
    if not results.rounds:
        return None, f"{path} has no rounds"
    if results.status != "completed":
        return None, f"{path} has status {results.status!r}"
    return slim(results), None


def slim(results: Results) -> Results:
    """``results`` without what the report never reads (a paper-scale sweep has thousands of
    runs): per-round client metrics (but the last round's
    [`SLIM_CLIENT_METRICS`][fedhead.report.collect.SLIM_CLIENT_METRICS]), recursion and predicted
    Grams, biases and the Grams of all but the last round are ``None``/empty, and so are
    ``moments``, ``provenance`` and ``timing``."""
    last = len(results.rounds) - 1
    rounds = [
        replace(
            r,
            client_metrics=[{k: m[k] for k in SLIM_CLIENT_METRICS if k in m} for m in r.client_metrics]
            if i == last
            else [],
            recursion_gram=None,
            predicted_gram=None,
            bias=None,
            gram=r.gram if i == last else None,
        )
        for i, r in enumerate(results.rounds)
    ]
    return replace(results, rounds=rounds, moments=None, provenance={}, timing=Timing())


def collect(dirs: Iterable[str | Path]) -> Collection:
    """Read every manifest in or below ``dirs``; split its runs into counted and excluded ones.

    Parameters
    ----------
    dirs : iterable of path-like
        Sweep folders (holding ``manifest.json``) or parent folders of several.

    Returns
    -------
    Collection
        ``runs``: completed runs with a readable, completed results.json, in manifest order;
        ``excluded``: every other run with its status and reason.

    Raises
    ------
    ReportInputError
        No manifest found, or a manifest that is not readable JSON of the expected shape.
    """
    sweeps, runs, excluded = [], [], []
    for path in find_manifests(dirs):
        info, entries = load_manifest(path)
        sweeps.append(info)
        for e in entries:
            (runs if e.counted else excluded).append(e)
        log.info(
            "%s: sweep %s (%s), %s",
            info.sweep_dir,
            info.sweep,
            info.scale,
            ", ".join(f"{n} {s}" for s, n in sorted(info.counts.items())),
        )
    return Collection(sweeps=sweeps, runs=runs, excluded=excluded)
