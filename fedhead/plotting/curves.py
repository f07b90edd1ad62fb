"""Error-vs-round curves: a centre line with a shaded band per curve (docs/theory.md §11).

Median with interquartile band, or mean with +- 1 sd band; distinct line styles and staggered
markers so that coinciding curves stay visible, integer ticks on round axes, a note when exact
zeros are drawn at the log floor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator
from numpy.typing import ArrayLike

from fedhead.plotting.style import _CYCLE_MARKERS, _CYCLE_STYLES

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType


def plot_error_curves(
    ax: Axes,
    x: np.ndarray | Sequence[float],
    curves: Mapping[str, np.ndarray],
    *,
    center: Literal["median", "mean"] = "median",
    band: Literal["iqr", "sd", "none"] = "iqr",
    colors: Sequence[str] | None = None,
    linestyles: Sequence[LineStyleType] | None = None,
    markers: Sequence[str | None] | None = None,
    styles: Mapping[str, Mapping[str, object]] | None = None,
    logx: bool = False,
    logy: bool = True,
    floor: float = 1e-17,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    legend: bool = True,
    integer_x: bool | None = None,
) -> Axes:
    """Draw error curves over runs: a centre line with a shaded band per curve.

    Coinciding curves stay visible: each has its own line style and staggered marker, later curves
    thinner and on top. On a log y axis values below ``floor`` are drawn at ``floor``, with a note.

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
        Cycled per curve (default: the colour cycle, distinct styles and markers).
    styles : mapping label -> dict, optional
        Per-curve keyword overrides (``color``, ``linestyle``, ``marker``, ``linewidth``, ...),
        e.g. ``plots.gram_style("G_star")`` for an error to ``G_star``.
    logx, logy : bool
        Logarithmic axes.
    floor : float
        Smallest value drawn on a log y axis (exact zeros stay drawable).
    xlabel, ylabel, title, legend
        Labels, and whether to add a legend.
    integer_x : bool, optional
        Integer ticks only on the x axis (rounds); default: when ``x`` holds integers and the
        axis is linear.

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
    clipped = _draw_curves(
        ax,
        xs,
        curves,
        center=center,
        band=band,
        colors=colors,
        linestyles=linestyles,
        markers=markers,
        styles=styles,
        logy=logy,
        floor=floor,
    )
    _scale_axes(ax, xs, logx=logx, logy=logy, integer_x=integer_x)
    _annotate_axes(
        ax, clipped=clipped, floor=floor, xlabel=xlabel, ylabel=ylabel, title=title, legend=legend and bool(curves)
    )
    return ax


def _center_and_band(
    label: str,
    values: ArrayLike,
    xs: np.ndarray,
    center: str,
    band: str,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Centre line and band ``(mid, lo, hi)`` of one curve's runs (``lo = hi = None``: no band)."""
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
    return mid, lo, hi


def _curve_style(
    i: int,
    n_curves: int,
    every: int,
    colors: Sequence[str],
    linestyles: Sequence[LineStyleType],
    markers: Sequence[str | None],
) -> dict[str, Any]:
    """Default style of the ``i``-th of ``n_curves`` curves: cycled colour, line style and
    marker, widths decreasing to the last curve, markers staggered every ``every`` points."""
    return {
        "color": colors[i % len(colors)],
        "linestyle": linestyles[i % len(linestyles)],
        "marker": markers[i % len(markers)],
        "linewidth": max(1.0, 2.8 - 1.6 * i / max(n_curves - 1, 1)),
        "markersize": max(3.5, 7.5 - 1.0 * i),
        "markevery": ((i * every) // max(n_curves, 1) % every, every) if every > 1 else None,
        "zorder": 2.0 + 0.1 * i,
    }


def _scale_axes(ax: Axes, xs: np.ndarray, *, logx: bool, logy: bool, integer_x: bool | None) -> None:
    """Log scales, and integer x ticks (default: when ``xs`` holds integers on a linear axis)."""
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if integer_x is None:
        integer_x = (not logx) and xs.size > 0 and bool(np.all(np.isfinite(xs)) and np.all(xs == np.round(xs)))
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_curves(
    ax: Axes,
    xs: np.ndarray,
    curves: Mapping[str, np.ndarray],
    *,
    center: str,
    band: str,
    colors: Sequence[str] | None,
    linestyles: Sequence[LineStyleType] | None,
    markers: Sequence[str | None] | None,
    styles: Mapping[str, Mapping[str, object]] | None,
    logy: bool,
    floor: float,
) -> bool:
    """Draw each curve's centre line and band in order; return whether a value was raised to
    ``floor`` on the log y axis."""
    cycle: list[str] = matplotlib.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    color_seq = list(colors) if colors is not None else cycle
    style_seq = list(linestyles) if linestyles is not None else _CYCLE_STYLES
    marker_seq = list(markers) if markers is not None else _CYCLE_MARKERS
    n_curves = len(curves)
    every = max(xs.shape[0] // 10, 1) if xs.ndim == 1 else 1
    clipped = False
    for i, (label, values) in enumerate(curves.items()):
        mid, lo, hi = _center_and_band(label, values, xs, center, band)
        if logy:
            clipped = clipped or bool(np.any(mid < floor))
            mid = np.maximum(mid, floor)
            if lo is not None and hi is not None:
                lo, hi = np.maximum(lo, floor), np.maximum(hi, floor)
        kw = _curve_style(i, n_curves, every, color_seq, style_seq, marker_seq)
        kw.update((styles or {}).get(label, {}))
        kw.setdefault("markerfacecolor", "none" if i % 2 else kw["color"])
        ax.plot(xs, mid, label=label, **kw)
        if lo is not None and hi is not None:  # both or neither
            ax.fill_between(xs, lo, hi, color=kw["color"], alpha=0.2, linewidth=0)
    return clipped


def _annotate_axes(
    ax: Axes,
    *,
    clipped: bool,
    floor: float,
    xlabel: str | None,
    ylabel: str | None,
    title: str | None,
    legend: bool,
) -> None:
    """The floor note (when values were clipped), labels, title, grid and legend."""
    if clipped:
        ax.set_ylim(bottom=floor / 30.0)
        ax.text(
            0.01,
            0.01,
            f"points at {floor:.0e} are exact zeros",
            transform=ax.transAxes,
            fontsize="x-small",
            color="0.35",
            va="bottom",
            ha="left",
            gid="floor-note",
        )
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    if legend:
        ax.legend(fontsize="small", loc="best", handlelength=3.0)
