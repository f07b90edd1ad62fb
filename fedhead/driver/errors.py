"""One clear line per error from the console entry points (``fedhead-run``, ``fedhead-data``,
``fedhead-ufm``).

[`report`][fedhead.driver.errors.report] turns an exception into ``<prog>: error: <what and where>``
on stderr and an exit code: 2 for usage/configuration errors
([`fedhead.analysis.constraints.ConfigError`][fedhead.analysis.constraints.ConfigError], Hydra/OmegaConf
config errors, a deployment whose SuperNodes do not match, a ``resume=`` that does not match its
run folder: [`fedhead.federation.checkpoint.ResumeError`][fedhead.federation.checkpoint.ResumeError]),
130 for an interrupt, 1 for everything else (data, regime, federation, engine failures). With
``FEDHEAD_DEBUG=1`` (or ``debug=true`` for the Hydra CLIs) the exception propagates with its
traceback instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.checkpoint import ResumeError
from fedhead.federation.deploy_checks import FederationMismatch

#: Exit status of a usage or configuration error.
EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_INTERRUPT = 130


def debug_enabled(flag: object = None) -> bool:
    """Tracebacks wanted: ``FEDHEAD_DEBUG`` set to 1/true/yes, or ``flag`` true."""
    if flag is not None and bool(flag):
        return True
    return os.environ.get("FEDHEAD_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _usage_types() -> tuple[type, ...]:
    types: list[type] = [ConfigError, FederationMismatch, ResumeError]
    try:
        from omegaconf.errors import OmegaConfBaseException

        types.append(OmegaConfBaseException)
    except ImportError:  # pragma: no cover
        pass
    try:
        from hydra.errors import HydraException

        types.append(HydraException)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def exit_code(exc: BaseException) -> int:
    """2 for usage/configuration errors, 130 for an interrupt, else 1."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPT
    return EXIT_USAGE if isinstance(exc, _usage_types()) else EXIT_FAILURE


def _is_hydra_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] == "hydra"


def root_cause(exc: BaseException) -> BaseException:
    """The innermost explicit cause, skipping flwr's generic wrappers ("An error was
    encountered. Ending simulation.", "Simulation Runtime crashed.")."""
    seen = set()
    cur = exc
    while cur.__cause__ is not None and id(cur) not in seen:
        seen.add(id(cur))
        cur = cur.__cause__
    return cur


#: Messages of flwr's generic wrapper exceptions around a simulation engine crash.
FLWR_WRAPPERS = ("An error was encountered. Ending simulation.", "Simulation Runtime crashed.")


def is_flwr_wrapper(exc: BaseException) -> bool:
    """True for flwr's generic "simulation crashed" exceptions (the cause says what happened)."""
    return str(exc) in FLWR_WRAPPERS


def one_line(exc: BaseException, limit: int = 800, *, local: bool = False) -> str:
    """``Type: message`` of the exception that says what went wrong, on one line.

    ``local=True`` (the console of this process's user, never results.json): an exception with a
    ``local_text()`` (a [`fedhead.data.table_files.TableError`][fedhead.data.table_files.TableError]
    of the user's own files) adds its detail, e.g. the offending value and its row."""
    target = root_cause(exc) if is_flwr_wrapper(exc) else exc
    local_text = getattr(target, "local_text", None) if local else None
    text = " ".join(str(local_text() if callable(local_text) else target).split()) or type(target).__name__
    if _is_hydra_error(target):  # "Could not override 'x'." + its OmegaConf cause, first lines only
        text = " ".join(" ".join(str(e).split("\n")[0].split()) for e in (target, target.__cause__) if e is not None)
    if isinstance(target, KeyboardInterrupt):
        text = "interrupted"
    elif not isinstance(target, _usage_types()) and type(target).__module__.split(".")[0] != "fedhead":
        text = f"{type(target).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: What each run folder held before this process's Hydra run (``note_run_dir``): the relative
#: paths of its files and folders, or None when the run creates the folder.
_BEFORE_RUN: dict[Path, frozenset[Path] | None] = {}
#: For a run folder the run creates: its nearest ancestor that existed (the folders in between,
#: e.g. Hydra's ``outputs/<date>``, are the run's too).
_EXISTING_ANCESTOR: dict[Path, Path] = {}


def note_run_dir(path: str | Path) -> None:
    """Remember what ``path`` holds before a run writes there (``run_app``'s ``before_run``), so
    that [`remove_unused_dir`][fedhead.driver.errors.remove_unused_dir] removes only what the run created."""
    root = Path(path).absolute()
    _BEFORE_RUN[root] = frozenset(p.relative_to(root) for p in root.rglob("*")) if root.exists() else None
    if not root.exists():
        _EXISTING_ANCESTOR[root] = next(a for a in root.parents if a.exists())


def _bookkeeping(rel: Path) -> bool:
    """Hydra's bookkeeping in a run folder: ``.hydra/`` and a top-level ``*.log``."""
    return rel.parts[0] == ".hydra" or (len(rel.parts) == 1 and rel.suffix == ".log")


def remove_unused_dir(path: str | Path | None) -> bool:
    """Undo a run that never started: remove what it created in its run folder when that is only
    Hydra's bookkeeping (``.hydra/``, ``*.log``), and the folder itself when the run created it,
    with the empty folders the run created on the way to it.
    Nothing that existed before the run ([`note_run_dir`][fedhead.driver.errors.note_run_dir]) is
    removed; a folder the run did not note is left alone. Returns whether anything was removed."""
    if not path:
        return False
    root = Path(path).absolute()
    if not root.is_dir() or root not in _BEFORE_RUN:
        return False
    before = _BEFORE_RUN[root]
    created = [p for p in root.rglob("*") if before is None or p.relative_to(root) not in before]
    if any(not p.is_dir() and not _bookkeeping(p.relative_to(root)) for p in created):
        return False  # the run wrote outputs: it started
    if before is None:
        shutil.rmtree(root, ignore_errors=True)
        anchor = _EXISTING_ANCESTOR.get(root)
        for parent in root.parents:  # the empty folders created on the way to it
            if anchor is None or parent == anchor or not parent.is_relative_to(anchor):
                break
            try:
                parent.rmdir()
            except OSError:
                break  # not empty: something else lives there
        return True
    for p in sorted(created, key=lambda q: len(q.parts), reverse=True):  # files, then their folders
        if p.is_dir() and not p.is_symlink():
            with contextlib.suppress(OSError):
                p.rmdir()  # empty: everything in it was created and removed
        else:
            p.unlink(missing_ok=True)
    return bool(created)


def report(prog: str, exc: BaseException, *, unused_dir: str | Path | None = None) -> int:
    """Print ``prog: error: ...`` to stderr (with the detail of an error of the user's own files:
    [`one_line`][fedhead.driver.errors.one_line] ``local=True``), undo ``unused_dir`` when the run never started
    ([`remove_unused_dir`][fedhead.driver.errors.remove_unused_dir]), return the code."""
    remove_unused_dir(unused_dir)
    print(f"{prog}: error: {one_line(exc, local=True)}", file=sys.stderr, flush=True)
    return exit_code(exc)


def _debug_requested(args: list[str]) -> bool:
    """``FEDHEAD_DEBUG=1`` or ``debug=true`` among the command line's overrides."""
    return debug_enabled() or any(
        a.split("=", 1)[0].lstrip("+~") == "debug" and a.split("=", 1)[-1].lower() in ("true", "1") for a in args
    )


def run_hydra_app(prog: str, config_name: str, task: Callable[[Any], None], argv: list[str] | None = None) -> None:
    """Run a Hydra entry point on its one composition
    ([`run_app`][fedhead.settings.config.run_app]): a command line Hydra cannot compose (a
    mistyped key or value) ends with one ``<prog>: error: ...`` line and exit status 2, where
    Hydra prints several lines and exits with 1. Debug runs (``FEDHEAD_DEBUG=1``, ``debug=true``)
    get the traceback."""
    from fedhead.settings.config import run_app  # Hydra: imported when the command runs

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        run_app(config_name, task, args, task_name=prog.removeprefix("fedhead-"), before_run=note_run_dir)
    except Exception as exc:
        if _debug_requested(args):
            raise
        sys.exit(report(prog, exc))
