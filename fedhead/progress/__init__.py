"""Progress of long steps: a tqdm bar on a terminal, one plain log line anywhere else.

Every progress bar of fedhead is made by [`progress`][fedhead.progress.progress]. When stderr is a
terminal (or a notebook) it is a tqdm bar; when the output goes to a file or a pipe (CI, a batch
scheduler, ``> log.txt``) it is a [`PlainProgress`][fedhead.progress.PlainProgress], which draws
nothing and logs one line when the step ends, so no carriage-return frames reach the log.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TextIO

from tqdm.auto import tqdm

__all__ = ["PROGRESS", "PlainProgress", "on_terminal", "progress"]

#: Logger of the lines that replace the bars off a terminal (INFO).
PROGRESS = "fedhead.progress"
log = logging.getLogger(PROGRESS)


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether bars can be drawn: ``stream`` (default ``sys.stderr``) is a terminal, or this is a notebook."""
    stream = sys.stderr if stream is None else stream
    if stream is None:  # no standard error at all (pythonw, some services)
        return False
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
    return "ipykernel" in sys.modules  # tqdm.auto draws a widget there


class PlainProgress:
    """The off-terminal stand-in of a tqdm bar: counts, and logs one line when closed.

    Supports what the call sites use of tqdm: iteration, ``update``, ``set_postfix``,
    ``close`` and ``with``. The line reads ``<desc>: <n>[/<total>] <unit> in <seconds> s``
    followed by the last postfix; with ``summary=False`` nothing is logged (steps that have
    their own line, such as rounds, or that are too short to report).
    """

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        desc: str = "",
        total: int | None = None,
        unit: str = "it",
        summary: bool = True,
    ) -> None:
        self.iterable = iterable
        self.desc = desc
        self.unit = unit
        self.summary = summary
        if total is None and isinstance(iterable, Sized):
            total = len(iterable)
        self.total = total
        self.n = 0
        self.postfix = ""
        self.closed = False
        self.start = time.perf_counter()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("PlainProgress made without an iterable")
        try:
            for item in self.iterable:
                yield item
                self.n += 1
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def line(self) -> str:
        """The one line logged at [`close`][fedhead.progress.PlainProgress.close]."""
        count = f"{self.n}" if self.total is None or self.n == self.total else f"{self.n}/{self.total}"
        text = f"{self.desc}: {count} {self.unit} in {time.perf_counter() - self.start:.1f} s"
        return f"{text} ({self.postfix})" if self.postfix else text

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.summary:
            log.info("%s", self.line())

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    iterable: Iterable[Any] | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    leave: bool = False,
    disable: bool = False,
    summary: bool = True,
    **options: Any,
) -> Any:
    """A progress bar over ``iterable`` (or updated by hand up to ``total``), fit for where output goes.

    Parameters
    ----------
    iterable : iterable, optional
        What to iterate over; None: the caller calls ``update``.
    desc, total, unit, leave
        As tqdm's.
    disable : bool
        No display at all (neither bar nor line).
    summary : bool
        Off a terminal, log one line when the step ends (False: stay silent).
    **options
        Further tqdm options, used on a terminal only.

    Returns
    -------
    tqdm or PlainProgress
        A tqdm bar on ``sys.stderr`` when [`on_terminal`][fedhead.progress.on_terminal], else a
        [`PlainProgress`][fedhead.progress.PlainProgress].
    """
    if not disable and on_terminal():
        return tqdm(iterable, desc=desc, total=total, unit=unit, leave=leave, file=sys.stderr, **options)
    return PlainProgress(iterable, desc=desc, total=total, unit=unit, summary=summary and not disable)
