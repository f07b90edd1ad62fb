"""Matplotlib figures shared by the UFM suite and the Flower app (docs/theory.md §11 displays).

Pure plotting on numpy input: no torch, no flwr.  The non-interactive ``Agg`` backend is
selected on import, so figures can be produced on machines without a display.

Public functions
----------------
plot_ellipses
    Gram matrices as ellipses ``{G^{1/2} u : ||u|| = 1}`` (planar, or ellipsoids in 3-D).
plot_error_curves
    Error-vs-round curves: median with interquartile band, or mean with +- 1 sd band; distinct
    line styles and staggered markers so that coinciding curves stay visible, integer ticks on
    round axes, a note when exact zeros are drawn at the log floor.
gram_ellipse_figure
    A figure of named Grams as ellipses, one panel per pair of target coordinates (or 3-d views),
    titled with the procedure and round, with a caption saying what is drawn and projected.
run_error_figure
    One run's errors ``e_F(G_t, .)`` to every reference per round (``results.json`` input).
procedures_figure
    The paper-style summary: error to ``G_star`` and to ``G_cen`` per round for each procedure,
    mean +- 1 sd over seeds, with the diagnosis's predicted gap marked.
new_figure, save_figure
    Figure creation with the right axes kinds, and atomic PNG writing.

Colours: :data:`PALETTE` fixes one colour per Gram (``G_t``, ``G_star``, ``G_cen``,
``G_within``, ``G_0``, the exact recursion) for every figure and TensorBoard image;
:func:`gram_style` and :func:`gram_label` give the matching style and mathtext label.
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
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedhead.io import write_bytes_atomic  # noqa: E402

__all__ = [
    "PALETTE",
    "GRAM_LABELS",
    "PROCEDURE_COLORS",
    "CLIENT_COLORS",
    "ellipse_caption",
    "gram_style",
    "gram_label",
    "tex_number",
    "error_label",
    "coordinate_groups",
    "gram_ellipse_figure",
    "run_error_figure",
    "procedures_figure",
    "ellipse_points",
    "plot_ellipses",
    "plot_error_curves",
    "new_figure",
    "save_figure",
]


#: One colour per Gram, the same in every figure and TensorBoard image.
PALETTE: dict[str, str] = {
    "G_t": "#1f77b4",  # blue: the measured (federated) Gram
    "G_star": "#ff7f0e",  # orange: the Bures-Wasserstein barycenter
    "G_cen": "#d62728",  # red: centralised training
    "G_within": "#2ca02c",  # green: phi(Sigma_within)
    "G_0": "#7f7f7f",  # grey: the initial head
    "recursion": "#9467bd",  # purple: the exact recursion from the run's own G_0
    "G_avg": "#8c564b",  # brown: sum_m p_m G_m
}

#: Line style and marker per Gram (coinciding ellipses and curves stay distinguishable).
_GRAM_LINES: dict[str, tuple[object, str]] = {
    "G_t": ("-", "o"),
    "G_star": ("--", "s"),
    "G_cen": ("-.", "^"),
    "G_within": (":", "D"),
    "G_0": ((0, (1, 2)), "x"),
    "recursion": ((0, (6, 2)), "v"),
    "G_avg": ((0, (3, 1, 1, 1)), "P"),
}

#: Mathtext labels of the Grams.
GRAM_LABELS: dict[str, str] = {
    "G_t": r"$G_t$",
    "G_star": r"$G_\ast$",
    "G_cen": r"$G_{\mathrm{cen}}$",
    "G_within": r"$G_{\mathrm{within}}$",
    "G_0": r"$G_0$",
    "recursion": "exact recursion",
    "G_avg": r"$\sum_m p_m G_m$",
}

#: Colours of the client optima ``G_m`` (distinct from :data:`PALETTE`).
CLIENT_COLORS = ["#17becf", "#bcbd22", "#e377c2", "#8c564b", "#393b79", "#637939", "#843c39", "#7b4173"]

#: One colour per procedure in the multi-procedure figures.
PROCEDURE_COLORS: dict[str, str] = {
    "ordinary": "#7f7f7f",
    "proximal": "#ff7f0e",
    "exact": "#9467bd",
    "aligned": "#8c564b",
    "corrected": "#e377c2",
    "corrected_proximal": "#d62728",
    "aligned_corrected": "#17becf",
    "centered": "#2ca02c",
    "full_model": "#bcbd22",
}

_CYCLE_STYLES = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (8, 3))]
_CYCLE_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def _gram_key(label: str | None) -> str | None:
    """The :data:`PALETTE` key a label names (``"G_3"``/``"G_t"`` -> ``G_t``), or None."""
    if label is None:
        return None
    if label in PALETTE:
        return label
    if label.startswith("G_") and label[2:].isdigit():
        return "G_t"
    return None


def gram_style(key: str) -> dict[str, object]:
    """Colour, line style and marker of a Gram named in :data:`PALETTE` (``G_<digits>`` is ``G_t``)."""
    k = _gram_key(key)
    if k is None:
        raise KeyError(f"gram_style: unknown Gram {key!r}; known: {sorted(PALETTE)}")
    ls, marker = _GRAM_LINES[k]
    return {"color": PALETTE[k], "linestyle": ls, "marker": marker}


def gram_label(key: str) -> str:
    """Mathtext label of a Gram key (``"G_star"`` -> ``$G_\\star$``; ``"G_5"`` -> ``$G_{5}$``)."""
    if key in GRAM_LABELS:
        return GRAM_LABELS[key]
    if key.startswith("G_") and key[2:].isdigit():
        return f"$G_{{{key[2:]}}}$"
    return key


def tex_number(x: float) -> str:
    """A number for use inside mathtext: ``1e-05`` -> ``10^{-5}``, ``2.5e-07`` -> ``2.5 \\times 10^{-7}``,
    ``0.001`` -> ``0.001`` (``:g`` formatting, whose ``e-05`` would read as a subtraction)."""
    s = f"{float(x):g}"
    if "e" not in s:
        return s
    mantissa, exponent = s.split("e")
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa} \times {power}"


def error_label(reference: str, measured: str = "G_t") -> str:
    """``$e_F(G_t, G_\\star)$``-style label of the relative error of ``measured`` to ``reference``."""
    ref = "R_t" if reference == "recursion" else gram_label(reference).strip("$")
    return f"$e_F({gram_label(measured).strip('$')}, {ref})$"


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
    linewidths: Sequence[float] | float | None = None,
    markers: Sequence[str | None] | None = None,
    coords: Sequence[int] | None = None,
    n_points: int = 200,
    legend: bool = True,
    title: str | None = None,
    target_names: Sequence[str] | None = None,
    unit: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Axes:
    """Draw Gram matrices as ellipses ``{G^{1/2} u : ||u|| <= 1}`` with equal axes.

    On an ordinary (2-D) axes two coordinates are drawn (default the first two): the ellipse of
    that 2 x 2 principal block, i.e. the projection (shadow) of the full ellipsoid on that plane.
    On a 3-D axes (``new_figure(..., projection="3d")``) three coordinates are drawn as wireframe
    ellipsoids (docs/theory.md §11).  Axis limits are symmetric and equal in every direction, so
    a circle looks like a circle.

    Styles: a mapping key named in :data:`PALETTE` (``G_star``, ``G_cen``, ``G_within``,
    ``G_0``, ``G_t`` or ``G_<round>``) gets its palette colour, line style and marker and its
    mathtext label, unless ``colors``/``linestyles``/``markers`` are given.  Line widths
    decrease and markers are staggered along the curve, so an ellipse drawn exactly on top of
    another leaves the one below visible.

    Parameters
    ----------
    ax : matplotlib Axes (2-D) or Axes3D
        Where to draw.
    grams : mapping label -> (C, C) array, or sequence of (C, C) arrays
        Gram matrices ``G = W W^T``; ``C >= 2`` (``C >= 3`` for a 3-D axes).  With a mapping the
        keys become legend labels.
    colors, linestyles, markers : sequences, optional
        One per Gram (cycled); default the palette for known keys, else the colour cycle.
    linewidths : float or sequence of float, optional
        Line width(s); default decreasing from 2.6 so later curves lie visibly on earlier ones.
    coords : sequence of int, optional
        Coordinates to draw; default ``(0, 1)`` on 2-D axes and ``(0, 1, 2)`` on 3-D axes.
    n_points : int
        Resolution of each curve (2-D) or of the parametric grid (3-D, reduced to 24).
    legend : bool
        Add a legend when labels are known.
    title : str, optional
        Axes title.
    target_names : sequence of str, optional
        Names of all ``C`` target coordinates, used as axis labels (default
        ``"coordinate k"``).
    unit : str, optional
        Unit appended to every axis label, e.g. ``"standardised"``.
    labels : mapping key -> str, optional
        Legend labels overriding the keys (default: mathtext for known Gram keys).

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
    widths = None if linewidths is None else (
        [float(linewidths)] if np.isscalar(linewidths) else [float(w) for w in linewidths])
    extent = 0.0
    n_items = len(items)
    for i, (key, g) in enumerate(items):
        known = gram_style(key) if _gram_key(key) is not None else None
        color = (colors[i % len(colors)] if colors is not None
                 else known["color"] if known else cycle[i % len(cycle)])
        style = (linestyles[i % len(linestyles)] if linestyles is not None
                 else known["linestyle"] if known else _CYCLE_STYLES[i % len(_CYCLE_STYLES)])
        marker = (markers[i % len(markers)] if markers is not None
                  else known["marker"] if known else _CYCLE_MARKERS[i % len(_CYCLE_MARKERS)])
        width = widths[i % len(widths)] if widths is not None else max(1.0, 2.6 - 1.4 * i / max(n_items - 1, 1))
        label = None if key is None else (labels or {}).get(key, gram_label(key))
        if is3d:
            pts = ellipse_points(g, coords, n_points=min(n_points, 24))
            ax.plot_wireframe(pts[0], pts[1], pts[2], color=color, linewidth=0.6 * width,
                              linestyle=style, alpha=0.7, label=label)
        else:
            pts = ellipse_points(g, coords, n_points=n_points)
            every = max(n_points // 8, 1)
            ax.plot(pts[0], pts[1], color=color, linestyle=style, linewidth=width, label=label,
                    marker=marker, markersize=max(3.5, 7.0 - 0.6 * i), markevery=((i * every) // max(n_items, 1), every),
                    markerfacecolor="none" if i % 2 else color, zorder=2 + 0.1 * i)
        extent = max(extent, float(np.max(np.abs(pts))))
    extent = 1.08 * extent if extent > 0 else 1.0
    names = [_axis_name(c, target_names, unit) for c in coords]
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
        ax.legend(fontsize="small", loc="best", handlelength=3.0)
    return ax


def _axis_name(c: int, target_names: Sequence[str] | None, unit: str | None) -> str:
    name = str(target_names[c]) if target_names is not None and c < len(target_names) else f"coordinate {c + 1}"
    return f"{name} ({unit})" if unit else name


def coordinate_groups(c: int, size: int = 2) -> list[tuple[int, ...]]:
    """Coordinate pairs (``size=2``) or triples (``size=3``) that show every target of ``C``.

    ``C = size``: the one group; ``C = 3`` with pairs: all three pairs; otherwise consecutive
    disjoint groups covering every coordinate (the last one overlaps when ``C`` is not a
    multiple of ``size``), e.g. ``C = 6`` pairs: ``(0, 1), (2, 3), (4, 5)``.
    """
    if size not in (2, 3):
        raise ValueError(f"coordinate_groups: size must be 2 or 3, got {size}")
    if c < size:
        raise ValueError(f"coordinate_groups: need at least {size} coordinates, got {c}")
    if c == 3 and size == 2:
        return [(0, 1), (0, 2), (1, 2)]
    groups = [tuple(range(s, s + size)) for s in range(0, c - size + 1, size)]
    if c % size:
        groups.append(tuple(range(c - size, c)))
    return groups


def ellipse_caption(c: int, view: str = "pairs") -> str:
    """One caption line: what an ellipse is, and what a panel projects when ``C`` exceeds it."""
    text = r"each curve: the ellipse $\{G^{1/2}u : \|u\| \leq 1\}$ of a head Gram $G$"
    per = 2 if view == "pairs" else 3
    if c > per:
        text += (f"; {c} targets: each panel is its projection on {per} of them "
                 f"(the {per}$\\times${per} block of $G$)")
    return text


def gram_ellipse_figure(
    grams: Mapping[str, np.ndarray],
    *,
    target_names: Sequence[str] | None = None,
    unit: str | None = None,
    title: str | None = None,
    procedure: str | None = None,
    round_: int | None = None,
    view: Literal["pairs", "3d"] = "pairs",
    panel_size: tuple[float, float] = (3.8, 3.8),
) -> Figure:
    """Named Grams as ellipses, one panel per coordinate pair (or triple), readable on its own.

    Parameters
    ----------
    grams : mapping key -> (C, C) array
        Keys named in :data:`PALETTE` (``G_t``/``G_<round>``, ``G_star``, ``G_cen``,
        ``G_within``, ``G_0``) get their palette style and mathtext label; ``G_star`` may be
        ``None`` (undefined outside the fully active regime) and is then left out.
    target_names : sequence of str, optional
        Names of the ``C`` targets (axis labels); default ``coordinate k``.
    unit : str, optional
        Unit of the target axes, e.g. ``"standardised"``.
    title : str, optional
        Figure title; default built from ``procedure`` and ``round_``.
    procedure, round_ : optional
        Procedure name and round shown in the default title.
    view : {"pairs", "3d"}
        Planar pairs of coordinates (:func:`coordinate_groups`), or 3-d ellipsoids of triples
        (needs ``C >= 3``).
    panel_size : (width, height)
        Inches per panel.

    Returns
    -------
    Figure
        Constrained layout; a shared legend on the right and a caption line at the bottom saying
        what an ellipse is and, for ``C > 2`` (3 for ``view="3d"``), that panels are projections.
    """
    items = {k: np.asarray(v, dtype=np.float64) for k, v in grams.items() if v is not None}
    if not items:
        raise ValueError("gram_ellipse_figure: no Gram to draw")
    c = next(iter(items.values())).shape[0]
    if view not in ("pairs", "3d"):
        raise ValueError(f"gram_ellipse_figure: view must be 'pairs' or '3d', got {view!r}")
    if view == "3d" and c < 3:
        view = "pairs"
    groups = coordinate_groups(c, 2 if view == "pairs" else 3)
    ncols = min(len(groups), 3)
    nrows = int(np.ceil(len(groups) / ncols))
    fig = plt.figure(figsize=(panel_size[0] * ncols + 1.8, panel_size[1] * nrows + 0.9), layout="constrained")
    proj = "3d" if view == "3d" else None
    axes = [fig.add_subplot(nrows, ncols, i + 1, projection=proj) for i in range(len(groups))]
    for ax, grp in zip(axes, groups):
        plot_ellipses(ax, items, coords=grp, legend=False, target_names=target_names, unit=unit)
    if title is None:
        parts = [p for p in (procedure, None if round_ is None else f"head Gram after round {round_}") if p]
        title = ": ".join(parts) if parts else "head Gram ellipses"
    fig.suptitle(title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", handlelength=3.0)
    fig.supxlabel(ellipse_caption(c, view), fontsize="small")
    return fig


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

    Curves that coincide stay visible: by default each curve gets its own line style and marker,
    line widths decrease from the first curve to the last (later curves lie on top, thinner),
    markers alternate filled/hollow and are staggered along the x axis when there are many
    points.  On a log y axis values below ``floor`` are drawn at ``floor``; when that happens a
    note on the axes says that points at the floor are exact zeros.

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
        Logarithmic axes; on a log axis values are clipped below at ``floor`` so exact zeros
        (e.g. an error of 0.0) stay drawable.
    floor : float
        Smallest value drawn on a log y axis.
    xlabel, ylabel, title : str, optional
        Labels.
    legend : bool
        Add a legend.
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
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    colors = list(colors) if colors is not None else cycle
    linestyles = list(linestyles) if linestyles is not None else _CYCLE_STYLES
    markers = list(markers) if markers is not None else _CYCLE_MARKERS
    n_curves = len(curves)
    every = max(xs.shape[0] // 10, 1) if xs.ndim == 1 else 1
    clipped = False
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
            clipped = clipped or bool(np.any(mid < floor))
            mid = np.maximum(mid, floor)
            if lo is not None:
                lo, hi = np.maximum(lo, floor), np.maximum(hi, floor)
        kw: dict[str, object] = {
            "color": colors[i % len(colors)],
            "linestyle": linestyles[i % len(linestyles)],
            "marker": markers[i % len(markers)],
            "linewidth": max(1.0, 2.8 - 1.6 * i / max(n_curves - 1, 1)),
            "markersize": max(3.5, 7.5 - 1.0 * i),
            "markevery": ((i * every) // max(n_curves, 1) % every, every) if every > 1 else None,
            "zorder": 2.0 + 0.1 * i,
        }
        kw.update((styles or {}).get(label, {}))
        kw.setdefault("markerfacecolor", "none" if i % 2 else kw["color"])
        ax.plot(xs, mid, label=label, **kw)
        if lo is not None:
            ax.fill_between(xs, lo, hi, color=kw["color"], alpha=0.2, linewidth=0)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    if integer_x is None:
        integer_x = (not logx) and xs.size > 0 and bool(np.all(np.isfinite(xs)) and np.all(xs == np.round(xs)))
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if clipped:
        ax.set_ylim(bottom=floor / 30.0)
        ax.text(0.01, 0.01, f"points at {floor:.0e} are exact zeros", transform=ax.transAxes,
                fontsize="x-small", color="0.35", va="bottom", ha="left", gid="floor-note")
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    if legend and curves:
        ax.legend(fontsize="small", loc="best", handlelength=3.0)
    return ax


def _num(v: object) -> float:
    return float("nan") if v is None else float(v)  # type: ignore[arg-type]


_RUN_CURVES = (("star", "e_f_star"), ("cen", "e_f_cen"), ("within", "e_f_within"), ("recursion", "e_f_recursion"))
_REF_KEY = {"star": "G_star", "cen": "G_cen", "within": "G_within", "recursion": "recursion"}
E_F_AXIS = r"relative error $e_F = \|G_t - G'\|_F / \|G'\|_F$ (unitless)"


def _procedure_name(results: Mapping) -> str:
    proc = results.get("procedure")
    if isinstance(proc, Mapping):
        return str(proc.get("name", "run"))
    return str(proc) if proc else "run"


def _predicted_gaps(results: Mapping) -> tuple[float | None, float | None]:
    """``(||G_cen - G_star|| / ||G_cen||, ||G_cen - G_star|| / ||G_star||)`` of one run, or None."""
    diag = results.get("diagnosis") or {}
    rel_cen = diag.get("rel_gap")
    rel_star = None
    tg = results.get("targets") or {}
    if tg.get("g_star") is not None and tg.get("g_cen") is not None:
        gs, gc = np.asarray(tg["g_star"], dtype=float), np.asarray(tg["g_cen"], dtype=float)
        rel_star = float(np.linalg.norm(gc - gs) / np.linalg.norm(gs))
        if rel_cen is None:
            rel_cen = float(np.linalg.norm(gc - gs) / np.linalg.norm(gc))
    return (None if rel_cen is None else float(rel_cen)), rel_star


def run_error_figure(results: Mapping, *, title: str | None = None) -> Figure:
    """One run's head-Gram errors per round, as in ``results.json``.

    Draws ``e_F(G_t, G_star)``, ``e_F(G_t, G_cen)``, ``e_F(G_t, G_within)`` and
    ``e_F(G_t, R_t)`` (``R_t`` the exact recursion from the run's own ``G_0``; not drawn at
    round 0, where it is 0 by construction) in the :data:`PALETTE` colours with distinct styles,
    and the diagnosis's predicted gap ``||G_cen - G_star||_F / ||G_cen||_F`` as a horizontal
    line: an uncorrected run's error to ``G_cen`` levels off there.

    Parameters
    ----------
    results : mapping
        The run's ``results.json`` content: ``rounds`` (list of dicts with ``round``,
        ``e_f_star``, ``e_f_cen``, ``e_f_within``, ``e_f_recursion``; ``None`` = undefined),
        optionally ``procedure`` (``{"name": ...}``), ``reference``, ``diagnosis``
        (``rel_gap``), ``targets``.
    title : str, optional
        Default: ``"<procedure>: head Gram error per round (reference G_<reference>)"``.

    Returns
    -------
    Figure
    """
    rounds = list(results.get("rounds") or [])
    if not rounds:
        raise ValueError("run_error_figure: results has no rounds")
    x = np.array([int(r["round"]) for r in rounds], dtype=float)
    curves: dict[str, np.ndarray] = {}
    styles: dict[str, dict[str, object]] = {}
    for ref, field in _RUN_CURVES:
        vals = np.array([np.nan if (ref == "recursion" and int(r["round"]) == 0) else _num(r.get(field))
                         for r in rounds])
        if np.isfinite(vals).any():
            label = error_label(_REF_KEY[ref])
            curves[label] = vals
            st = gram_style(_REF_KEY[ref])
            styles[label] = st
    fig, (ax,) = new_figure(1, panel_size=(6.4, 4.4))
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
        plot_error_curves(ax, x, curves, band="none", styles=styles, legend=False,
                          xlabel="round $t$", ylabel=E_F_AXIS)
    rel_cen, _ = _predicted_gaps(results)
    if rel_cen is not None and rel_cen > 0:
        ax.axhline(rel_cen, color=PALETTE["G_cen"], linestyle=(0, (1, 1)), linewidth=1.2, zorder=1.5,
                   label=r"predicted gap $\|G_{\mathrm{cen}} - G_\ast\|_F / \|G_{\mathrm{cen}}\|_F$")
    ref = results.get("reference")
    if title is None:
        title = f"{_procedure_name(results)}: head Gram error per round"
        if ref in _REF_KEY:
            title += f" (reference {gram_label(_REF_KEY[ref])})"
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="best", handlelength=3.0)
    return fig


def procedures_figure(results_list: Sequence[Mapping], *, title: str | None = None) -> Figure:
    """Paper-style summary: error to ``G_star`` and to ``G_cen`` per round, per procedure.

    Runs with the same procedure name (several seeds) are drawn as their mean with a band of
    +- 1 standard deviation.  The predicted gap is marked on both panels: on the ``G_cen``
    panel the level ``||G_cen - G_star||_F / ||G_cen||_F`` (the diagnosis's ``rel_gap``) where an
    uncorrected procedure stops, on the ``G_star`` panel ``||G_cen - G_star||_F / ||G_star||_F``
    where a corrected one stops (mean over runs where they differ).

    Parameters
    ----------
    results_list : sequence of mappings
        ``results.json`` contents, one per run (see :func:`run_error_figure`).
    title : str, optional
        Figure title (default names the data set when the runs carry one).

    Returns
    -------
    Figure
        Two panels, a shared legend on the right.
    """
    if not results_list:
        raise ValueError("procedures_figure: no results")
    groups: dict[str, list[Mapping]] = {}
    for res in results_list:
        groups.setdefault(_procedure_name(res), []).append(res)
    all_rounds = sorted({int(r["round"]) for res in results_list for r in res.get("rounds") or []})
    if not all_rounds:
        raise ValueError("procedures_figure: the results have no rounds")
    x = np.asarray(all_rounds, dtype=float)
    pos = {t: i for i, t in enumerate(all_rounds)}
    fig = plt.figure(figsize=(11.0, 4.4), layout="constrained")
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    gaps_cen, gaps_star = [], []
    for res in results_list:
        gc, gs = _predicted_gaps(res)
        if gc is not None:
            gaps_cen.append(gc)
        if gs is not None:
            gaps_star.append(gs)
    import warnings

    for ax, (ref, field) in zip(axes, (("G_star", "e_f_star"), ("G_cen", "e_f_cen"))):
        curves: dict[str, np.ndarray] = {}
        styles: dict[str, dict[str, object]] = {}
        for j, (name, runs) in enumerate(groups.items()):
            arr = np.full((len(runs), len(all_rounds)), np.nan)
            for k, res in enumerate(runs):
                for r in res.get("rounds") or []:
                    arr[k, pos[int(r["round"])]] = _num(r.get(field))
            if not np.isfinite(arr).any():
                continue
            label = name if len(runs) == 1 else f"{name} ({len(runs)} seeds)"
            curves[label] = arr
            styles[label] = {"color": PROCEDURE_COLORS.get(name, _CYCLE_COLORS[j % len(_CYCLE_COLORS)])}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
            warnings.filterwarnings("ignore", "Degrees of freedom", RuntimeWarning)
            warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
            plot_error_curves(ax, x, curves, center="mean", band="sd", styles=styles, legend=False,
                              xlabel="round $t$", ylabel=f"{error_label(ref)} (unitless)",
                              title=f"error to {gram_label(ref)}")
    if gaps_cen:
        axes[1].axhline(float(np.mean(gaps_cen)), color="k", linestyle=(0, (1, 1)), linewidth=1.2, zorder=1.5,
                        label=r"predicted gap: $e_F(G_\ast, G_{\mathrm{cen}})$")
    if gaps_star:
        axes[0].axhline(float(np.mean(gaps_star)), color="0.35", linestyle=(0, (3, 2)), linewidth=1.2, zorder=1.5,
                        label=r"predicted gap: $e_F(G_{\mathrm{cen}}, G_\ast)$")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", handlelength=3.0)
    if title is None:
        names = {str((res.get("dataset") or {}).get("name", "")) for res in results_list} - {""}
        title = "head Gram error per round" + (f" on {', '.join(sorted(names))}" if names else "")
        title += " (mean $\\pm$ 1 sd over seeds)" if any(len(v) > 1 for v in groups.values()) else ""
    fig.suptitle(title)
    return fig


_CYCLE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


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
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return write_bytes_atomic(path, buf.getvalue())
