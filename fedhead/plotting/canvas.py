"""Figure creation with the right axes kinds, and atomic PNG writing."""

from __future__ import annotations

import io
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from fedhead.results.io import write_bytes_atomic

#: Held while a figure is built and drawn by code that may run in several threads (the jobs a
#: sweep serves at once): matplotlib's text layout (its mathtext parser) is not thread-safe.
FIGURE_LOCK = threading.RLock()


def blank_figure(**kwargs) -> Figure:
    """A `Figure` with its own Agg canvas, outside pyplot's global
    figure manager: safe to build from several threads at once (the jobs of a sweep that run
    concurrently write their figures in parallel)."""
    # the Agg canvas: only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def new_figure(
    n_panels: int = 1,
    *,
    ncols: int | None = None,
    panel_size: tuple[float, float] = (4.2, 3.6),
    projection: str | Sequence[str | None] | None = None,
) -> tuple[Figure, list[Axes]]:
    """Create a figure with ``n_panels`` axes on a grid.

    Parameters
    ----------
    n_panels : int
        Number of axes.
    ncols : int, optional
        Columns of the grid (default ``min(n_panels, 3)``).
    panel_size : (width, height)
        Inches per panel.
    projection : str or sequence, optional
        ``"3d"`` for ellipsoid panels; a sequence gives one projection per panel.

    Returns
    -------
    (Figure, list of Axes)
    """
    if n_panels < 1:
        raise ValueError(f"new_figure: n_panels must be >= 1, got {n_panels}")
    ncols = ncols or min(n_panels, 3)
    nrows = int(np.ceil(n_panels / ncols))
    fig = blank_figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows))
    if projection is None or isinstance(projection, str):
        projs = [projection] * n_panels
    else:
        projs = list(projection)
    axes = [fig.add_subplot(nrows, ncols, i + 1, projection=projs[i]) for i in range(n_panels)]
    return fig, axes


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int = 130) -> Path:
    """Write ``fig`` as a PNG atomically (temp file + ``os.replace``) and close it.

    Parameters
    ----------
    fig : Figure
        The figure.
    path : path-like
        Target ``.png`` file; folders are created.
    dpi : int
        Resolution.

    Returns
    -------
    Path
        The written file.
    """
    buf = io.BytesIO()
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return write_bytes_atomic(path, buf.getvalue())


class Drawer:
    """The process's one figure thread (matplotlib is not thread-safe: every figure of a
    background recorder is drawn there, in submission order). A daemon thread: it never keeps
    the process alive; [`fedhead.driver.recorder.RunRecorder.wait`][fedhead.driver.recorder.RunRecorder.wait] is what
    makes sure the work is done."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="fedhead-figures", daemon=True)
                self._thread.start()
            self._jobs.put((fut, fn, args))
        return fut

    def _loop(self) -> None:
        while True:
            fut, fn, args = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                fut.set_exception(exc)


#: The process's figure thread ([`fedhead.driver.recorder.RunRecorder`][fedhead.driver.recorder.RunRecorder] with
# ``background=True``).
DRAWER = Drawer()
