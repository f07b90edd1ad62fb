"""``fedhead-sweep sweep=all``: every preset at one scale into one folder, then one report.

[`run_all`][fedhead.sweep.reproduce.run_all] runs the presets of [`ALL`][fedhead.sweep.reproduce.ALL]
(or those named) one after the other, each into ``<out>/<preset>`` (its own manifest), and writes
the report of all of them into ``<out>/report``:

* **Restart.** Each preset's manifest skips its finished runs, and a run whose config equals a
  finished run of another preset of the folder (main's ordinary runs in centering, alignment,
  prediction and architectures, ...) is copied from it (``reused_from`` in the manifest): a
  restarted ``sweep=all`` recomputes nothing that finished, whichever preset ran it.
* **Progress.** Before anything runs, one line per preset with its runs (to run, to copy,
  finished) and the estimated time; after each run its console line ends with the time left of the
  preset and of all. A run's expected wall time is the median wall time of this folder's finished
  runs of the same preset and data-set kind (tabular, image) in the manifests, else the scale's
  per-preset estimate ([`PresetSize.seconds`][fedhead.sweep.scales.PresetSize]), else unknown.
* **Data.** A file-only setting (Beijing, MPIIGaze, 300W-LP) runs when ``data_roots`` names its
  folder; otherwise its runs are ``skipped`` with the file they need, and the report lists them.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedhead.analysis.constraints import ConfigError
from fedhead.driver.logs import SWEEP
from fedhead.progress import progress
from fedhead.sweep.presets import PRESETS, plan
from fedhead.sweep.runner import SweepConfig, SweepResult, build_job, finished, reuse_index, run_sweep
from fedhead.sweep.scales import SCALES
from fedhead.sweep.specs import FILE_ONLY, IMAGE, RunSpec

log = logging.getLogger(SWEEP)

#: the presets of ``sweep=all`` in the order they run: main first (the others copy its runs), then
#: the presets that add few runs, the fixed-E presets (hours at scale=cpu) last
ALL = (
    "main",
    "centering",
    "alignment",
    "prediction",
    "architectures",
    "mismatch",
    "data_size",
    "full_model",
    "epochs",
    "fixed_e",
    "rho",
)
#: the report's folder under ``out``
REPORT = "report"


def kind(spec: RunSpec) -> str:
    """``image`` or ``tabular``: the data-set kind of a run (what its wall time depends on most)."""
    return "image" if spec.dataset in IMAGE else "tabular"


@dataclass
class PresetPlan:
    """One preset of ``sweep=all``: its runs, which of them are finished, to be copied, to run, and
    those of a file-only data set without its ``data_roots`` folder (they will be ``skipped``)."""

    name: str
    specs: list[RunSpec]
    finished: set[str] = field(default_factory=set)
    copied: set[str] = field(default_factory=set)
    todo: list[RunSpec] = field(default_factory=list)
    no_files: set[str] = field(default_factory=set)
    skip_reason: str | None = None


class Eta:
    """The time left: per preset and data-set kind, the median wall time of the runs finished in
    the folder (the manifests), else the scale's estimate; updated as runs end."""

    def __init__(self, root: Path, scale: str, plans: Sequence[PresetPlan]):
        self.scale = SCALES[scale]
        self.left = {p.name: {s.id: kind(s) for s in p.todo} for p in plans}
        self.walls: dict[tuple[str, str], list[float]] = {}
        for p in plans:
            walls = _manifest_walls(root / p.name)
            for s in p.specs:
                wall = walls.get(s.id)
                if wall is not None:
                    self.walls.setdefault((p.name, kind(s)), []).append(wall)

    def run_seconds(self, preset: str, kind_: str) -> tuple[float | None, bool]:
        """``(seconds, measured here)`` of one run of ``preset`` on a ``kind_`` data set."""
        seen = self.walls.get((preset, kind_))
        if seen:
            return float(statistics.median(seen)), True
        return self.scale.size(preset).seconds.get(kind_), False

    def preset_left(self, preset: str) -> tuple[float, int]:
        """``(seconds left, runs whose time is unknown)`` of the runs of ``preset`` still to run."""
        total, unknown = 0.0, 0
        for k in self.left.get(preset, {}).values():
            sec, _ = self.run_seconds(preset, k)
            if sec is None:
                unknown += 1
            else:
                total += sec
        return total, unknown

    def all_left(self) -> tuple[float, int]:
        parts = [self.preset_left(p) for p in self.left]
        return sum(t for t, _ in parts), sum(u for _, u in parts)

    def done(self, preset: str, spec: RunSpec, wall: float | None) -> None:
        self.left.get(preset, {}).pop(spec.id, None)
        if wall is not None:
            self.walls.setdefault((preset, kind(spec)), []).append(wall)

    def text(self, preset: str) -> str:
        """``time left: preset ~12 min, all ~3.4 h``."""
        p, pu = self.preset_left(preset)
        a, au = self.all_left()
        return f"time left: {preset} {_left(p, pu)}, all {_left(a, au)}"


def _manifest_walls(folder: Path) -> dict[str, float]:
    """Run id -> wall seconds of the runs run in ``folder`` (not copied ones)."""
    import json

    try:
        runs = json.loads((folder / "manifest.json").read_text()).get("runs", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {
        str(r["id"]): float(r["wall_seconds"])
        for r in runs
        if isinstance(r, dict)
        and r.get("status") == "completed"
        and not r.get("reused_from")
        and isinstance(r.get("wall_seconds"), (int, float))
    }


def duration(seconds: float) -> str:
    """``45 s``, ``12 min`` or ``3.4 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _left(seconds: float, unknown: int) -> str:
    text = f"~{duration(seconds)}"
    return text + (f" + {unknown} run(s) of unknown time" if unknown else "")


def plan_all(cfg: SweepConfig, presets: Sequence[str]) -> list[PresetPlan]:
    """Every preset's runs and what each needs: finished in its folder, copied from another
    preset's finished run (or from a run an earlier preset of this call will run), or to run.
    A preset without a run on ``cfg.settings`` is kept with its ``skip_reason``."""
    root = Path(cfg.out)
    index = reuse_index([root / name for name in presets])
    planned: set[str] = set()  # config hashes an earlier preset of this call runs
    plans = []
    for name in presets:
        try:
            specs = plan(name, cfg.scale, seeds=cfg.seeds, settings=cfg.settings, runs=cfg.runs)
        except ConfigError as exc:
            if "has no run" not in str(exc) and "no run id matches" not in str(exc):
                raise
            plans.append(PresetPlan(name, [], skip_reason=str(exc)))
            continue
        plans.append(PresetPlan(name, specs))
    # each run's config is composed to know whether it finished or can be copied: ~0.1 s a run
    # (sweep=all at scale=cpu: ~550 runs, about a minute), hence the bar
    total = sum(len(p.specs) for p in plans)
    bar = progress(desc="planning: run configs composed", total=total, unit="runs", disable=not cfg.show_progress)
    with bar:
        for p in plans:
            for spec in p.specs:
                bar.update()
                if spec.dataset in FILE_ONLY and spec.dataset not in cfg.data_roots:
                    p.no_files.add(spec.id)
                    continue
                job = build_job(spec, root / p.name, cfg.data_roots, cfg.run_overrides)
                if finished(job):
                    p.finished.add(spec.id)
                elif job.config_hash in index or job.config_hash in planned:
                    p.copied.add(spec.id)
                else:
                    p.todo.append(spec)
                    planned.add(job.config_hash)
    return plans


@dataclass
class AllResult:
    """What ``sweep=all`` did: each preset's sweep result, the wall time and the presets without a run."""

    results: dict[str, SweepResult]
    wall_seconds: float
    skipped_presets: dict[str, str] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        out = {"pending": 0, "completed": 0, "failed": 0, "skipped": 0}
        for res in self.results.values():
            for k, v in res.counts.items():
                out[k] = out.get(k, 0) + v
        return out

    @property
    def ran(self) -> list[str]:
        return [rid for res in self.results.values() for rid in res.ran]


def run_all(cfg: SweepConfig, presets: Sequence[str] | None = None, *, dry_run: bool = False) -> AllResult:
    """Run every preset of ``presets`` (default [`ALL`][fedhead.sweep.reproduce.ALL]) at ``cfg.scale``
    into ``<cfg.out>/<preset>`` (``fedhead-sweep sweep=all`` then writes the report of all into
    ``<cfg.out>/report``: the report layer sits above this one).

    ``cfg.sweep`` is ignored (``all``); ``cfg.seeds``, ``cfg.settings``, ``cfg.runs``,
    ``cfg.data_roots`` and ``cfg.run_overrides`` apply to every preset. ``dry_run``: the plan and
    the time left only (nothing runs).
    """
    t0 = time.perf_counter()
    names = list(presets or ALL)
    unknown = sorted(set(names) - set(PRESETS))
    if unknown:
        raise ConfigError(f"presets: unknown {unknown}; choose from {list(PRESETS)}")
    root = Path(cfg.out)
    plans = plan_all(cfg, names)
    eta = Eta(root, cfg.scale, plans)
    log.info("sweep all (%s) -> %s: %d presets", cfg.scale, root, len(plans))
    for i, p in enumerate(plans, 1):
        if p.skip_reason:
            log.info("  %2d. %-13s no run here (%s)", i, p.name, p.skip_reason)
            continue
        sec, unknown_runs = eta.preset_left(p.name)
        kinds = sorted({kind(s) for s in p.todo})
        how = ", ".join(
            f"{k} {'measured here' if eta.run_seconds(p.name, k)[1] else 'estimate'}"
            for k in kinds
            if eta.run_seconds(p.name, k)[0] is not None
        )
        log.info(
            "  %2d. %-13s %4d runs: %d to run, %d copied from other presets, %d finished%s; %s%s",
            i,
            p.name,
            len(p.specs),
            len(p.todo),
            len(p.copied),
            len(p.finished),
            f", {len(p.no_files)} without their data files (skipped)" if p.no_files else "",
            _left(sec, unknown_runs),
            f" ({how})" if how else "",
        )
    total, unknown_runs = eta.all_left()
    log.info("  time left: %s", _left(total, unknown_runs))
    results: dict[str, SweepResult] = {}
    skipped = {p.name: p.skip_reason for p in plans if p.skip_reason}
    if dry_run:
        return AllResult(results, time.perf_counter() - t0, skipped)
    folders = tuple(root / name for name in names)
    for i, p in enumerate(plans, 1):
        if p.skip_reason:
            continue
        log.info("[preset %d/%d] %s", i, len(plans), p.name)

        def on_end(spec: RunSpec, status: str, wall: float | None, name: str = p.name) -> str:
            eta.done(name, spec, wall if status == "completed" else None)
            return eta.text(name)

        sub = dataclasses.replace(cfg, sweep=p.name, out=root / p.name, reuse=folders, on_run_end=on_end)
        results[p.name] = run_sweep(sub)
        for spec in p.todo:  # runs that did not run (skipped data, copied after all) leave the estimate
            eta.done(p.name, spec, None)
    return AllResult(results, time.perf_counter() - t0, skipped)
