"""Logging of a ``fedhead-run``: a short console, everything else in ``<run dir>/run.log``.

The console shows the start line, the diagnosis (once), one line per round per procedure, the
lines that replace progress bars off a terminal ([`progress`][fedhead.progress.progress]),
fedhead's warnings, anyone's errors, and the final table. ``run.log`` gets every record at INFO
and above, the libraries' included. [`configure_run_logging`][fedhead.driver.logs.configure_run_logging]
sets this up; [`simulation_logging`][fedhead.driver.logs.simulation_logging] quiets flwr and Ray.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

import fedhead
from fedhead.progress import PROGRESS

CONSOLE = "fedhead.console"
#: Records of this logger (INFO and above) go to the console and to run.log.
console = logging.getLogger(CONSOLE)

#: Loggers of this project: their warnings are meant for the user (console).
OWN = ("fedhead",)
#: The advice to train longer when a round's clients end short of their local optima (once per run
#: on a run's console; a sweep's console leaves it to run.log: each run's line gives its local gap)
LOCAL_GAP = "fedhead.local_gap"
#: The lines of ``fedhead-sweep`` (one per run, the plan, the time left)
SWEEP = CONSOLE + ".sweep"
FILE_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] %(message)s"
_MARK = "_fedhead_run_logging"


def _own_dirs() -> tuple[str, ...]:
    """Source folders of the project's packages (to tell its Python warnings from others')."""
    root = Path(fedhead.__file__).resolve().parent.parent
    return tuple(str(root / name) for name in OWN)


class ConsoleFilter(logging.Filter):
    """Lets through [`console`][fedhead.driver.logs.console] records, the progress lines, WARNING+ of the project (its
    loggers and its Python warnings), and ERROR+ of anyone but flwr (whose engine errors the driver reports itself)."""

    def __init__(self) -> None:
        super().__init__()
        self.dirs = _own_dirs()

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name in (CONSOLE, PROGRESS) or name.startswith(CONSOLE + "."):
            return True
        if record.levelno >= logging.ERROR:  # flwr's engine errors: the driver reports them in one line
            return not (name == "flwr" or name.startswith("flwr."))
        if record.levelno < logging.WARNING:
            return False
        if name == "py.warnings":  # logging.captureWarnings: "<file>:<line>: <Category>: ..."
            args = record.args  # a tuple here: warnings logs ``"%s", text``
            return str(args[0] if isinstance(args, tuple) and args else record.msg).startswith(self.dirs)
        return name.split(".")[0] in OWN


def sweep_console(record: logging.LogRecord) -> bool:
    """What a sweep's console shows besides run.log: its own lines and warnings, not the runs' advice
    to train longer ([`LOCAL_GAP`][fedhead.driver.logs.LOCAL_GAP]: each run's line gives its local gap)."""
    return record.name == SWEEP or (record.levelno >= logging.WARNING and record.name != LOCAL_GAP)


class ConsoleFormatter(logging.Formatter):
    """Console records as they are; warnings and errors prefixed with their level."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.name == "py.warnings":
            text = text.strip().splitlines()[0]  # path:line: Category: message (no source line)
        elif record.levelno >= logging.WARNING and not record.name.startswith(CONSOLE):
            text = f"{record.levelname}: {text}"
        if record.exc_info and record.levelno >= logging.ERROR:
            text += "\n" + self.formatException(record.exc_info)
        return text


class TqdmHandler(logging.StreamHandler):
    """Writes records with ``tqdm.write``: bars are cleared, the line printed, bars redrawn."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


def _marked(handler: logging.Handler) -> logging.Handler:
    setattr(handler, _MARK, True)
    return handler


def remove_run_logging() -> None:
    """Remove the handlers [`configure_run_logging`][fedhead.driver.logs.configure_run_logging] installed
    (idempotent)."""
    root = logging.getLogger()
    marked = [h for h in root.handlers if getattr(h, _MARK, False)]
    for h in marked:
        root.removeHandler(h)
        h.close()
    if marked:
        logging.captureWarnings(False)


def configure_run_logging(run_dir: str | Path, *, verbose: bool = False, stream: Any = None) -> Path:
    """Console + ``<run_dir>/run.log`` logging of a run (see the module docstring).

    Parameters
    ----------
    run_dir : path
        The run folder; ``run.log`` is appended to.
    verbose : bool
        Show every INFO record on the console too (third-party included).
    stream : file, optional
        The console stream (default ``sys.stdout``).

    Returns
    -------
    Path
        The log file.
    """
    path = Path(run_dir) / "run.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_run_logging()
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    fh = _marked(logging.FileHandler(path, encoding="utf-8"))
    fh.setFormatter(logging.Formatter(FILE_FORMAT))
    fh.setLevel(logging.INFO)
    root.addHandler(fh)
    ch = _marked(TqdmHandler(stream if stream is not None else sys.stdout))
    ch.setLevel(logging.INFO)
    ch.setFormatter(ConsoleFormatter())
    if not verbose:
        ch.addFilter(ConsoleFilter())
    root.addHandler(ch)
    for name in (CONSOLE, *OWN):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.disabled = False  # a dictConfig(disable_existing_loggers=True) elsewhere turns them off
        logger.propagate = True  # to the root's handlers (server_app.deployment_logging turns it off)
    logging.captureWarnings(True)
    _quiet_flwr(verbose)
    logging.getLogger("alembic").setLevel(logging.NOTSET)  # library-mode quieting undone: run.log
    if "ray" in sys.modules and not verbose:
        _route_ray()
    return path


def run_logging_active() -> bool:
    """Whether [`configure_run_logging`][fedhead.driver.logs.configure_run_logging] handlers are installed."""
    return any(getattr(h, _MARK, False) for h in logging.getLogger().handlers)


def _quiet_flwr(verbose: bool) -> None:
    """flwr prints through its own console handler (and labels the server's head measurements
    "ClientApp-side metrics"): off the console, into run.log via the root logger."""
    flwr = logging.getLogger("flwr")
    if not verbose:
        # flwr's logger: only when a run configures its logging
        from flwr.common.logger import ConsoleHandler

        for h in [h for h in flwr.handlers if isinstance(h, ConsoleHandler)]:
            flwr.removeHandler(h)
    flwr.setLevel(logging.INFO)
    flwr.propagate = True


def simulation_logging(init_args: dict[str, Any], *, verbose: bool = False) -> None:
    """Before a Ray simulation: Ray's and flwr's console output off unless ``verbose``.

    With [`configure_run_logging`][fedhead.driver.logs.configure_run_logging] active, flwr and Ray driver records (INFO
    and above) go to ``run.log``; without it (library use, tests) flwr is set to WARNING and Ray to ERROR. The workers'
    own output stays in Ray's session logs (``log_to_driver=False``).
    """
    if verbose:
        return
    init_args.setdefault("log_to_driver", False)
    if not run_logging_active():
        for name in ("flwr", "alembic"):  # flwr's in-memory link state logs its migrations
            logging.getLogger(name).setLevel(logging.WARNING)
        init_args.setdefault("logging_level", logging.ERROR)
        return
    _quiet_flwr(False)
    import ray  # noqa: F401 - Ray installs its stderr handler on import; route it to run.log

    _route_ray()
    init_args.setdefault("logging_level", logging.INFO)


def _route_ray() -> None:
    """Ray's driver logger: off its own stderr handler, into the root's (run.log)."""
    ray_logger = logging.getLogger("ray")
    for h in [
        h
        for h in ray_logger.handlers
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
    ]:
        ray_logger.removeHandler(h)
    ray_logger.propagate = True
    ray_logger.setLevel(logging.INFO)
