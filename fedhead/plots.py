"""Matplotlib figures shared by the UFM suite and the Flower app (docs/theory.md §11 displays).

Pure plotting on numpy input: no torch, no flwr.  The non-interactive ``Agg`` backend is
selected on import, so figures can be produced on machines without a display.

Public functions
----------------
plot_ellipses
    Gram matrices as ellipses ``{G^{1/2} u : ||u|| = 1}`` (planar, or ellipsoids in 3-D).
plot_error_curves
    Error-vs-round curves: median with interquartile band, or mean with +- 1 sd band.
new_figure, save_figure
    Figure creation with the right axes kinds, and atomic PNG writing.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from fedhead.io import write_bytes_atomic  # noqa: E402

__all__ = [
    "ellipse_points",
    "plot_ellipses",
    "plot_error_curves",
    "new_figure",
    "save_figure",
]


def _as_gram_mapping(
    grams: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
) -> list[tuple[str | None, np.ndarray]]:
    if isinstance(grams, Mapping):
        items = [(str(k), np.asarray(v, dtype=np.float64)) for k, v in grams.items()]
    else:
        arr = [np.asarray(g, dtype=np.float64) for g in grams]
        items = [(None, g) for g in arr]
    for label, g in items:
        if g.ndim != 2 or g.shape[0] != g.shape[1]:
            raise ValueError(f"plot_ellipses: Gram {label!r} must be square (C, C), got {g.shape}")
        if not np.all(np.isfinite(g)):
            raise ValueError(f"plot_ellipses: Gram {label!r} contains NaN or Inf")
    return items


def ellipse_points(gram: np.ndarray, coords: Sequence[int] = (0, 1), n_points: int = 200):
    """Points of the ellipse (ellipsoid) ``{G_S^{1/2} u : ||u|| = 1}`` of a coordinate block.

    The projection of the ellipsoid ``{G^{1/2} u}`` onto the coordinates ``S`` is the ellipsoid
    of the principal block ``G_S = G[S, S]``, so this is also the shadow of the full ellipsoid.

    Parameters
    ----------
    gram : ndarray, shape (C, C)
        Symmetric positive semi-definite Gram matrix.
    coords : sequence of 2 or 3 ints
        Coordinates to keep (default the first two).
    n_points : int
        Points per parametric direction.

    Returns
    -------
    ndarray
        ``(2, n_points)`` for two coordinates, ``(3, n_points, n_points)`` for three.
    """
    g = np.asarray(gram, dtype=np.float64)
    idx = list(coords)
    if len(idx) not in (2, 3):
        raise ValueError(f"ellipse_points: coords must name 2 or 3 coordinates, got {coords}")
    if max(idx) >= g.shape[0]:
        raise ValueError(f"ellipse_points: coords {coords} out of range for a {g.shape} Gram")
    block = g[np.ix_(idx, idx)]
    block = 0.5 * (block + block.T)
    vals, vecs = np.linalg.eigh(block)
    root = (vecs * np.sqrt(np.clip(vals, 0.0, None))) @ vecs.T
    if len(idx) == 2:
        t = np.linspace(0.0, 2.0 * np.pi, n_points)
        return root @ np.stack([np.cos(t), np.sin(t)])
    u = np.linspace(0.0, 2.0 * np.pi, n_points)
    v = np.linspace(0.0, np.pi, n_points)
    sphere = np.stack(
        [np.outer(np.cos(u), np.sin(v)), np.outer(np.sin(u), np.sin(v)), np.outer(np.ones_like(u), np.cos(v))]
    )
    return np.einsum("ij,jkl->ikl", root, sphere)


def plot_ellipses(
    ax: Axes,
    grams: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
    *,
    colors: Sequence[str] | None = None,
    linestyles: Sequence[str] | None = None,
    linewidths: Sequence[float] | float = 1.8,
    coords: Sequence[int] | None = None,
    n_points: int = 200,
    legend: bool = True,
    title: str | None = None,
) -> Axes:
    """Draw Gram matrices as ellipses ``{G^{1/2} u : ||u|| = 1}`` with equal axes.

    On an ordinary (2-D) axes the first two coordinates are drawn (the ellipse of the leading
    2 x 2 block, i.e. the shadow of the full ellipsoid on that plane).  On a 3-D axes
    (``new_figure(..., projection="3d")``) the first three coordinates are drawn as wireframe
    ellipsoids, as docs/theory.md §11 asks for 6-d targets.  Axis limits are symmetric and equal
    in every direction, so a circle looks like a circle.

    Parameters
    ----------
    ax : matplotlib Axes (2-D) or Axes3D
        Where to draw.
    grams : mapping label -> (C, C) array, or sequence of (C, C) arrays
        Gram matrices ``G = W W^T``; ``C >= 2`` (``C >= 3`` for a 3-D axes).  With a mapping the
        keys become legend labels.
    colors, linestyles : sequence of str, optional
        One per Gram (cycled); default the matplotlib colour cycle and solid lines.
    linewidths : float or sequence of float
        Line width(s).
    coords : sequence of int, optional
        Coordinates to draw; default ``(0, 1)`` on 2-D axes and ``(0, 1, 2)`` on 3-D axes.
    n_points : int
        Resolution of each curve (2-D) or of the parametric grid (3-D, reduced to 24).
    legend : bool
        Add a legend when labels are known.
    title : str, optional
        Axes title.

    Returns
    -------
    Axes
        The same axes, for chaining.
    """
    items = _as_gram_mapping(grams)
    is3d = getattr(ax, "name", "") == "3d"
    if coords is None:
        coords = (0, 1, 2) if is3d else (0, 1)
    if is3d != (len(coords) == 3):
        raise ValueError("plot_ellipses: use 3 coords on a 3-D axes and 2 coords on a 2-D axes")
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    colors = list(colors) if colors is not None else cycle
    linestyles = list(linestyles) if linestyles is not None else ["-"]
    widths = [float(linewidths)] if np.isscalar(linewidths) else [float(w) for w in linewidths]
    extent = 0.0
    for i, (label, g) in enumerate(items):
        color = colors[i % len(colors)]
        style = linestyles[i % len(linestyles)]
        width = widths[i % len(widths)]
        if is3d:
            pts = ellipse_points(g, coords, n_points=min(n_points, 24))
            ax.plot_wireframe(pts[0], pts[1], pts[2], color=color, linewidth=0.6 * width,
                              linestyle=style, alpha=0.7, label=label)
        else:
            pts = ellipse_points(g, coords, n_points=n_points)
            ax.plot(pts[0], pts[1], color=color, linestyle=style, linewidth=width, label=label)
        extent = max(extent, float(np.max(np.abs(pts))))
    extent = 1.08 * extent if extent > 0 else 1.0
    names = [f"coordinate {c + 1}" for c in coords]
    if is3d:
        ax.set_xlim(-extent, extent)
        ax.set_ylim(-extent, extent)
        ax.set_zlim(-extent, extent)
        ax.set_box_aspect((1, 1, 1))
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])
        ax.set_zlabel(names[2])
    else:
        ax.set_xlim(-extent, extent)
        ax.set_ylim(-extent, extent)
        ax.set_aspect("equal", adjustable="box")
        ax.axhline(0.0, color="0.85", linewidth=0.6, zorder=0)
        ax.axvline(0.0, color="0.85", linewidth=0.6, zorder=0)
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])
    if title:
        ax.set_title(title)
    if legend and any(label is not None for label, _ in items):
        ax.legend(fontsize="small", loc="best")
    return ax


def plot_error_curves(
    ax: Axes,
    x: np.ndarray | Sequence[float],
    curves: Mapping[str, np.ndarray],
    *,
    center: Literal["median", "mean"] = "median",
    band: Literal["iqr", "sd", "none"] = "iqr",
    colors: Sequence[str] | None = None,
    linestyles: Sequence[str] | None = None,
    markers: Sequence[str | None] | None = None,
    logx: bool = False,
    logy: bool = True,
    floor: float = 1e-17,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    legend: bool = True,
) -> Axes:
    """Draw error curves over runs: a centre line with a shaded band per curve.

    Parameters
    ----------
    ax : matplotlib Axes
        Where to draw.
    x : array, shape (T,)
        Abscissa (rounds, step sizes, ...).
    curves : mapping label -> array of shape (R, T) or (T,)
        One row per run (instance or seed); a 1-D array is a single run (no band).
    center : {"median", "mean"}
        Centre line: median over runs (with ``band="iqr"``) or mean (with ``band="sd"``).
    band : {"iqr", "sd", "none"}
        Interquartile range (25th-75th percentile), mean +- 1 standard deviation, or nothing.
    colors, linestyles, markers : sequences, optional
        Cycled per curve.
    logx, logy : bool
        Logarithmic axes; on a log axis values are clipped below at ``floor`` so exact zeros
        (e.g. an error of 0.0) stay drawable.
    floor : float
        Smallest value drawn on a log y axis.
    xlabel, ylabel, title : str, optional
        Labels.
    legend : bool
        Add a legend.

    Returns
    -------
    Axes
        The same axes.
    """
    if center not in ("median", "mean"):
        raise ValueError(f"plot_error_curves: center must be 'median' or 'mean', got {center!r}")
    if band not in ("iqr", "sd", "none"):
        raise ValueError(f"plot_error_curves: band must be 'iqr', 'sd' or 'none', got {band!r}")
    xs = np.asarray(x, dtype=np.float64)
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    colors = list(colors) if colors is not None else cycle
    linestyles = list(linestyles) if linestyles is not None else ["-"]
    markers = list(markers) if markers is not None else [None]
    for i, (label, values) in enumerate(curves.items()):
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != xs.shape[0]:
            raise ValueError(
                f"plot_error_curves: curve {label!r} has shape {np.shape(values)}, expected (R, {xs.shape[0]})"
            )
        if center == "median":
            mid = np.nanmedian(arr, axis=0)
        else:
            mid = np.nanmean(arr, axis=0)
        lo = hi = None
        if band == "iqr" and arr.shape[0] > 1:
            lo, hi = np.nanpercentile(arr, [25.0, 75.0], axis=0)
        elif band == "sd" and arr.shape[0] > 1:
            sd = np.nanstd(arr, axis=0, ddof=1)
            lo, hi = mid - sd, mid + sd
        if logy:
            mid = np.maximum(mid, floor)
            if lo is not None:
                lo, hi = np.maximum(lo, floor), np.maximum(hi, floor)
        color = colors[i % len(colors)]
        ax.plot(xs, mid, color=color, linestyle=linestyles[i % len(linestyles)],
                marker=markers[i % len(markers)], markersize=4, linewidth=1.6, label=label)
        if lo is not None:
            ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    if legend and curves:
        ax.legend(fontsize="small", loc="best")
    return ax


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
    fig = plt.figure(figsize=(panel_size[0] * ncols, panel_size[1] * nrows))
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
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return write_bytes_atomic(path, buf.getvalue())
