"""Gram matrices drawn as ellipses ``{G^{1/2} u : ||u|| <= 1}`` (docs/theory.md §11 displays).

Planar ellipses of coordinate pairs, or wireframe ellipsoids of triples on 3-D axes; a figure of
named Grams with one panel per coordinate group, a shared legend and a caption.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, cast

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType
    from mpl_toolkits.mplot3d.axes3d import Axes3D

from fedhead.plotting.canvas import blank_figure
from fedhead.plotting.style import _CYCLE_MARKERS, _CYCLE_STYLES, _gram_key, gram_label, gram_style


def _as_gram_mapping(
    grams: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
) -> list[tuple[str | None, np.ndarray]]:
    items: list[tuple[str | None, np.ndarray]]
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
    linestyles: Sequence[LineStyleType] | None = None,
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

    2-D axes: the ellipse of a 2 x 2 principal block, the shadow of the full ellipsoid on that
    plane; 3-D axes (``new_figure(..., projection="3d")``): wireframe ellipsoids of three
    coordinates (docs/theory.md §11). A key named in [`PALETTE`][fedhead.plotting.PALETTE] (``G_star``, ``G_cen``, ...,
    ``G_<round>``) gets its palette style and mathtext label unless styles are given; decreasing
    line widths and staggered markers keep an ellipse drawn on top of another from hiding it.

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
    legend, title
        Whether to add a legend (when labels are known); the axes title.
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
    extent = _draw_ellipses(
        ax,
        items,
        coords,
        is3d,
        n_points,
        colors=colors,
        linestyles=linestyles,
        linewidths=linewidths,
        markers=markers,
        labels=labels,
    )
    _frame_ellipse_axes(ax, extent, [_axis_name(c, target_names, unit) for c in coords], is3d)
    if title:
        ax.set_title(title)
    if legend and any(label is not None for label, _ in items):
        ax.legend(fontsize="small", loc="best", handlelength=3.0)
    return ax


def _draw_ellipses(
    ax: Axes,
    items: Sequence[tuple[str | None, np.ndarray]],
    coords: Sequence[int],
    is3d: bool,
    n_points: int,
    *,
    colors: Sequence[str] | None,
    linestyles: Sequence[LineStyleType] | None,
    linewidths: Sequence[float] | float | None,
    markers: Sequence[str | None] | None,
    labels: Mapping[str, str] | None,
) -> float:
    """Draw every ellipse of ``items`` in order; return the axis half-width that shows them all
    (8 % beyond the largest coordinate, 1 when every Gram is zero)."""
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    widths = None if linewidths is None else [float(w) for w in np.ravel(linewidths)]  # a float: one width
    extent = 0.0
    n_items = len(items)
    for i, (key, g) in enumerate(items):
        color, style, marker, width = _ellipse_style(i, n_items, key, colors, linestyles, markers, widths, cycle)
        label = None if key is None else (labels or {}).get(key, gram_label(key))
        pts = _draw_ellipse(
            ax, g, coords, is3d, i, n_items, n_points, color=color, style=style, marker=marker, width=width, label=label
        )
        extent = max(extent, float(np.max(np.abs(pts))))
    return 1.08 * extent if extent > 0 else 1.0


def _ellipse_style(
    i: int,
    n_items: int,
    key: str | None,
    colors: Sequence[str] | None,
    linestyles: Sequence[LineStyleType] | None,
    markers: Sequence[str | None] | None,
    widths: list[float] | None,
    cycle: Sequence[str],
) -> tuple[str, LineStyleType, str | None, float]:
    """Colour, line style, marker and width of the ``i``-th of ``n_items`` ellipses: the
    explicit sequences (cycled), else the palette style of a known Gram key, else the cycles."""
    known = gram_style(key) if key is not None and _gram_key(key) is not None else None
    color = colors[i % len(colors)] if colors is not None else known["color"] if known else cycle[i % len(cycle)]
    style = (
        linestyles[i % len(linestyles)]
        if linestyles is not None
        else known["linestyle"]
        if known
        else _CYCLE_STYLES[i % len(_CYCLE_STYLES)]
    )
    marker = (
        markers[i % len(markers)]
        if markers is not None
        else known["marker"]
        if known
        else _CYCLE_MARKERS[i % len(_CYCLE_MARKERS)]
    )
    width = widths[i % len(widths)] if widths is not None else max(1.0, 2.6 - 1.4 * i / max(n_items - 1, 1))
    return color, style, marker, width


def _draw_ellipse(
    ax: Axes,
    g: np.ndarray,
    coords: Sequence[int],
    is3d: bool,
    i: int,
    n_items: int,
    n_points: int,
    *,
    color: str,
    style: LineStyleType,
    marker: str | None,
    width: float,
    label: str | None,
) -> np.ndarray:
    """Draw the ``i``-th ellipse (a wireframe ellipsoid on 3-D axes); return its points."""
    if is3d:
        pts = ellipse_points(g, coords, n_points=min(n_points, 24))
        cast("Axes3D", ax).plot_wireframe(
            pts[0], pts[1], pts[2], color=color, linewidth=0.6 * width, linestyle=style, alpha=0.7, label=label
        )
    else:
        pts = ellipse_points(g, coords, n_points=n_points)
        every = max(n_points // 8, 1)
        ax.plot(
            pts[0],
            pts[1],
            color=color,
            linestyle=style,
            linewidth=width,
            label=label,
            marker=marker,
            markersize=max(3.5, 7.0 - 0.6 * i),
            markevery=((i * every) // max(n_items, 1), every),
            markerfacecolor="none" if i % 2 else color,
            zorder=2 + 0.1 * i,
        )
    return pts


def _frame_ellipse_axes(ax: Axes, extent: float, names: Sequence[str], is3d: bool) -> None:
    """Symmetric, equal limits ``[-extent, extent]`` on every axis, and the axis labels."""
    if is3d:
        ax3d = cast("Axes3D", ax)  # is3d: a projection="3d" axes
        ax3d.set_xlim(-extent, extent)
        ax3d.set_ylim(-extent, extent)
        ax3d.set_zlim(-extent, extent)
        ax3d.set_box_aspect((1, 1, 1))
        ax3d.set_xlabel(names[0])
        ax3d.set_ylabel(names[1])
        ax3d.set_zlabel(names[2])
    else:
        ax.set_xlim(-extent, extent)
        ax.set_ylim(-extent, extent)
        ax.set_aspect("equal", adjustable="box")
        ax.axhline(0.0, color="0.85", linewidth=0.6, zorder=0)
        ax.axvline(0.0, color="0.85", linewidth=0.6, zorder=0)
        ax.set_xlabel(names[0])
        ax.set_ylabel(names[1])


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
        text += f"; {c} targets: each panel is its projection on {per} of them (the {per}$\\times${per} block of $G$)"
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
        Keys named in [`PALETTE`][fedhead.plotting.PALETTE] (``G_t``/``G_<round>``, ``G_star``, ``G_cen``,
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
        Planar pairs of coordinates ([`coordinate_groups`][fedhead.plotting.coordinate_groups]), or 3-d
        ellipsoids of triples (needs ``C >= 3``).
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
    fig = blank_figure(figsize=(panel_size[0] * ncols + 1.8, panel_size[1] * nrows + 0.9), layout="constrained")
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
