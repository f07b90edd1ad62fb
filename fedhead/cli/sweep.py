"""``fedhead-sweep sweep=NAME scale=smoke|cpu|paper out=DIR`` (Hydra, ``conf/sweep.yaml``).

[`typed_config`][fedhead.cli.sweep.typed_config] turns the composed config into a
[`fedhead.sweep.runner.SweepConfig`][fedhead.sweep.SweepConfig] (the one place its keys are read and checked);
[`main`][fedhead.cli.sweep.main] runs it with a progress bar over runs, the console showing one line per finished run
and ``<out>/run.log`` everything. ``sweep=all`` runs every preset into ``DIR/<preset>``
([`fedhead.sweep.reproduce.run_all`][fedhead.sweep.reproduce.run_all]) and writes their report into ``DIR/report``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from fedhead.analysis.constraints import ConfigError
from fedhead.sweep.presets import PRESETS, plan
from fedhead.sweep.reproduce import ALL, REPORT, run_all
from fedhead.sweep.runner import SweepConfig, run_sweep
from fedhead.sweep.scales import SCALES
from fedhead.sweep.specs import SETTINGS

#: ``sweep=all``: every preset (``presets=`` picks some), then one report
EVERY = "all"

#: ``data_roots`` keys that differ from the data set name (Hydra keys cannot start with a digit)
ROOT_KEYS = {"w300lp": "300w_lp"}


def _str_list(value: Any, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key} must be a list (e.g. {key}=[a,b]) or null, got {value!r}")
    return tuple(str(v) for v in value)


def presets_of(cfg: Any) -> tuple[str, ...] | None:
    """The ``presets=`` list of a ``sweep=all`` config (None: every preset of ``ALL``)."""
    from fedhead.settings.config import plain_mapping

    chosen = _str_list(plain_mapping(cfg, "the sweep config").get("presets"), "presets")
    if chosen is not None:
        unknown = sorted(set(chosen) - set(PRESETS))
        if unknown or not chosen:
            raise ConfigError(f"presets: unknown {unknown or chosen}; choose from {list(ALL)}")
    return chosen


def typed_config(cfg: Any) -> SweepConfig:
    """Validate the composed ``conf/sweep.yaml`` and build the [`SweepConfig`][fedhead.sweep.SweepConfig]."""
    # imported when the command runs, not at start-up (--help stays fast)
    from fedhead.settings.config import plain_mapping

    raw = plain_mapping(cfg, "the sweep config")
    if raw.get("sweep") not in PRESETS and raw.get("sweep") != EVERY:
        raise ConfigError(f"sweep={raw.get('sweep')!r} is not a preset; choose from {sorted(PRESETS)} or {EVERY}")
    if raw.get("scale") not in SCALES:
        raise ConfigError(f"scale={raw.get('scale')!r}: choose one of {sorted(SCALES)}")
    if not raw.get("out"):
        raise ConfigError("out= is required: the sweep folder (restarting with the same out= skips finished runs)")
    roots = raw.get("data_roots") or {}
    if not isinstance(roots, dict):
        raise ConfigError(f"data_roots must be a mapping data set -> folder, got {roots!r}")
    roots = {ROOT_KEYS.get(str(k), str(k)): v for k, v in roots.items()}
    unknown = sorted(set(roots) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"data_roots: unknown data sets {unknown}; choose from {list(SETTINGS)}")
    roots = {k: str(Path(v).expanduser()) for k, v in roots.items() if v not in (None, "")}
    for name, folder in roots.items():
        if not Path(folder).is_dir():
            raise ConfigError(f"data_roots.{name}={folder} is not a folder")
    seeds = raw.get("seeds")
    if seeds is not None and (not isinstance(seeds, list) or not all(isinstance(s, int) and s >= 0 for s in seeds)):
        raise ConfigError(f"seeds must be a list of non-negative integers (seeds=[0,1]) or null, got {seeds!r}")
    cfg = SweepConfig(
        sweep=raw["sweep"],
        scale=raw["scale"],
        out=Path(raw["out"]).expanduser(),
        data_roots=roots,
        run_overrides=_str_list(raw.get("run_overrides"), "run_overrides") or (),
        seeds=None if seeds is None else tuple(seeds),
        settings=_str_list(raw.get("settings"), "settings"),
        runs=_str_list(raw.get("runs"), "runs"),
        show_progress=bool(raw.get("progress", True)),
        parallel_runs=raw.get("parallel_runs", 1),
    )
    if cfg.sweep != EVERY:
        # its errors before any output
        plan(cfg.sweep, cfg.scale, seeds=cfg.seeds, settings=cfg.settings, runs=cfg.runs)
        return cfg
    names = presets_of(raw) or ALL
    errors = []
    for name in names:
        try:
            plan(name, cfg.scale, seeds=cfg.seeds, settings=cfg.settings, runs=cfg.runs)
        except ConfigError as exc:  # a preset without a run on these settings is left out, with a line
            if "has no run" not in str(exc) and "no run id matches" not in str(exc):
                raise
            errors.append(str(exc))
    if len(errors) == len(names):
        raise ConfigError(f"sweep=all: no preset has a run here ({errors[0]})")
    return cfg


def main() -> None:
    """Console entry point ``fedhead-sweep`` (Hydra; see ``conf/sweep.yaml``)."""
    # imported when the command runs, not at start-up (--help stays fast)
    from fedhead.driver.errors import debug_enabled, report, run_hydra_app

    logging.getLogger("alembic").setLevel(logging.WARNING)

    def _app(cfg) -> None:
        try:
            typed = typed_config(cfg)
            _console(typed.out)
            if typed.sweep == EVERY:
                _all(typed, presets_of(cfg), bool(cfg.get("dry_run", False)))
                return
            result = run_sweep(typed)
        except BaseException as exc:  # one line and an exit code (tracebacks with FEDHEAD_DEBUG=1)
            if isinstance(exc, SystemExit) or debug_enabled(cfg.get("debug")):
                raise
            sys.exit(report("fedhead-sweep", exc))
        c = result.counts
        print(
            f"\nsweep {typed.sweep} ({typed.scale}): {c['completed']} completed, {c['failed']} failed, "
            f"{c['skipped']} skipped in {result.wall_seconds:.0f} s\nManifest: {result.manifest.path}\n"
            f"Report: fedhead-report {typed.out} --out {typed.out}/report"
        )
        if c["failed"]:
            sys.exit(1)

    run_hydra_app("fedhead-sweep", "sweep", _app)


def _all(typed: SweepConfig, presets: tuple[str, ...] | None, dry_run: bool = False) -> None:
    """``sweep=all``: every preset, then the report of all of them into ``<out>/report``
    (``dry_run``: the plan and the time left only)."""
    from fedhead.report.build import build_report  # matplotlib: only once the runs are done

    result = run_all(typed, presets, dry_run=dry_run)
    if dry_run:
        return
    rep = build_report([typed.out], typed.out / REPORT)
    c = result.counts
    print(
        f"\nsweep all ({typed.scale}): {len(result.results)} presets, {c['completed']} runs completed "
        f"({len(result.ran)} run now), {c['failed']} failed, {c['skipped']} skipped in {result.wall_seconds:.0f} s\n"
        f"Report: {rep.markdown} ({len(rep.tables)} tables, {len(rep.figures)} figures)"
    )
    if c["failed"]:
        sys.exit(1)


def _console(out: Path) -> None:
    """``<out>/run.log`` gets everything; the console one line per run (and warnings)."""
    # imported when the command runs, not at start-up (--help stays fast)
    from fedhead.driver.logs import configure_run_logging, run_logging_active, sweep_console

    configure_run_logging(out)
    if run_logging_active():
        for h in logging.getLogger().handlers:
            if type(h).__name__ == "TqdmHandler":
                h.addFilter(sweep_console)


if __name__ == "__main__":  # pragma: no cover
    main()
