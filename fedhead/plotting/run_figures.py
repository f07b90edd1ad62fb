"""Figures of finished runs from their results.json (docs/theory.md §11 displays).

[`run_error_figure`][fedhead.plotting.run_error_figure]: one run's errors ``e_F(G_t, .)`` to every reference per round.
[`procedures_figure`][fedhead.plotting.procedures_figure]: the paper-style summary, error to ``G_star`` and to ``G_cen``
per round for each procedure, mean +- 1 sd over seeds, with the diagnosis's predicted gap marked.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from fedhead.plotting.canvas import blank_figure, new_figure
from fedhead.plotting.curves import plot_error_curves
from fedhead.plotting.style import _CYCLE_COLORS, PALETTE, PROCEDURE_COLORS, error_label, gram_label, gram_style
from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import Results

if TYPE_CHECKING:
    from matplotlib.typing import LegendLocType


def _num(v: float | None) -> float:
    return float("nan") if v is None else float(v)


_RUN_CURVES = (("star", "e_f_star"), ("cen", "e_f_cen"), ("within", "e_f_within"), ("recursion", "e_f_recursion"))
_REF_KEY = {"star": "G_star", "cen": "G_cen", "within": "G_within", "recursion": "recursion"}
E_F_AXIS = r"relative error $e_F = \|G_t - G'\|_F / \|G'\|_F$ (unitless)"


def _procedure_name(results: Results) -> str:
    return results.name or "run"


def _error(r: RoundRecord, field: str) -> float:
    return _num(getattr(r, field))


def _predicted_gaps(results: Results) -> tuple[float | None, float | None]:
    """``(||G_cen - G_star|| / ||G_cen||, ||G_cen - G_star|| / ||G_star||)`` of one run, or None."""
    rel_cen = (results.diagnosis or {}).get("rel_gap")
    rel_star = None
    gs, gc = results.target("g_star"), results.target("g_cen")
    if gs is not None and gc is not None:
        rel_star = float(np.linalg.norm(gc - gs) / np.linalg.norm(gs))
        if rel_cen is None:
            rel_cen = float(np.linalg.norm(gc - gs) / np.linalg.norm(gc))
    return (None if rel_cen is None else float(rel_cen)), rel_star


def run_error_figure(results: Results, *, title: str | None = None) -> Figure:
    """One run's head-Gram errors per round, as in ``results.json``.

    Draws ``e_F(G_t, G_star)``, ``e_F(G_t, G_cen)``, ``e_F(G_t, G_within)`` and
    ``e_F(G_t, R_t)`` (``R_t`` the exact recursion from the run's own ``G_0``; not drawn at
    round 0, where it is 0 by construction) in the [`PALETTE`][fedhead.plotting.PALETTE] colours with distinct styles,
    and the diagnosis's predicted gap ``||G_cen - G_star||_F / ||G_cen||_F`` as a horizontal
    line: an uncorrected run's error to ``G_cen`` levels off there.

    Parameters
    ----------
    results : Results
        The run's results.json ([`fedhead.results.schema.Results`][fedhead.results.schema.Results]): its ``rounds``
        (``e_f_star``, ``e_f_cen``, ``e_f_within``, ``e_f_recursion``; ``None`` = undefined),
        procedure name, ``reference``, ``diagnosis`` (``rel_gap``) and ``targets``.
    title : str, optional
        Default: ``"<procedure>: head Gram error per round (reference G_<reference>)"``.

    Returns
    -------
    Figure
    """
    rounds = results.rounds
    if not rounds:
        raise ValueError("run_error_figure: results has no rounds")
    x = np.array([r.round for r in rounds], dtype=float)
    curves: dict[str, np.ndarray] = {}
    styles: dict[str, Mapping[str, object]] = {}
    for ref, field in _RUN_CURVES:
        vals = np.array([np.nan if (ref == "recursion" and r.round == 0) else _error(r, field) for r in rounds])
        if np.isfinite(vals).any():
            label = error_label(_REF_KEY[ref])
            curves[label] = vals
            st = gram_style(_REF_KEY[ref])
            styles[label] = st
    fig, (ax,) = new_figure(1, panel_size=(6.4, 4.4))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
        plot_error_curves(ax, x, curves, band="none", styles=styles, legend=False, xlabel="round $t$", ylabel=E_F_AXIS)
    rel_cen, _ = _predicted_gaps(results)
    if rel_cen is not None and rel_cen > 0:
        ax.axhline(
            rel_cen,
            color=PALETTE["G_cen"],
            linestyle=(0, (1, 1)),
            linewidth=1.2,
            zorder=1.5,
            label=r"predicted gap $\|G_{\mathrm{cen}} - G_\ast\|_F / \|G_{\mathrm{cen}}\|_F$",
        )
    ref = results.reference
    if title is None:
        title = f"{_procedure_name(results)}: head Gram error per round"
        if ref in _REF_KEY:
            title += f" (reference {gram_label(_REF_KEY[ref])})"
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", loc="best", handlelength=3.0)
    return fig


def procedures_figure(results_list: Sequence[Results], *, title: str | None = None) -> Figure:
    """Paper-style summary: error to ``G_star`` and to ``G_cen`` per round, per procedure.

    Runs with the same procedure name (several seeds) are drawn as their mean with a band of
    +- 1 standard deviation.  The predicted gap is marked on both panels: on the ``G_cen``
    panel the level ``||G_cen - G_star||_F / ||G_cen||_F`` (the diagnosis's ``rel_gap``) where an
    uncorrected procedure stops, on the ``G_star`` panel ``||G_cen - G_star||_F / ||G_star||_F``
    where a corrected one stops (mean over runs where they differ).

    Parameters
    ----------
    results_list : sequence of Results
        One per run (see [`run_error_figure`][fedhead.plotting.run_error_figure]).
    title : str, optional
        Figure title (default names the data set when the runs carry one).

    Returns
    -------
    Figure
        Two panels, a shared legend on the right.
    """
    if not results_list:
        raise ValueError("procedures_figure: no results")
    groups: dict[str, list[Results]] = {}
    for res in results_list:
        groups.setdefault(_procedure_name(res), []).append(res)
    all_rounds = sorted({r.round for res in results_list for r in res.rounds})
    if not all_rounds:
        raise ValueError("procedures_figure: the results have no rounds")
    x = np.asarray(all_rounds, dtype=float)
    fig = blank_figure(figsize=(11.0, 4.4), layout="constrained")
    axes = [fig.add_subplot(1, 2, i + 1) for i in range(2)]
    gaps_cen, gaps_star = [], []
    for res in results_list:
        gc, gs = _predicted_gaps(res)
        if gc is not None:
            gaps_cen.append(gc)
        if gs is not None:
            gaps_star.append(gs)
    for ax, (ref, field) in zip(axes, (("G_star", "e_f_star"), ("G_cen", "e_f_cen"))):
        curves, styles = _procedure_curves(groups, all_rounds, field)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
            warnings.filterwarnings("ignore", "Degrees of freedom", RuntimeWarning)
            warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
            plot_error_curves(
                ax,
                x,
                curves,
                center="mean",
                band="sd",
                styles=styles,
                legend=False,
                xlabel="round $t$",
                ylabel=f"{error_label(ref)} (unitless)",
                title=f"error to {gram_label(ref)}",
            )
    if gaps_cen:
        axes[1].axhline(
            float(np.mean(gaps_cen)),
            color="k",
            linestyle=(0, (1, 1)),
            linewidth=1.2,
            zorder=1.5,
            label=r"predicted gap: $e_F(G_\ast, G_{\mathrm{cen}})$",
        )
    if gaps_star:
        axes[0].axhline(
            float(np.mean(gaps_star)),
            color="0.35",
            linestyle=(0, (3, 2)),
            linewidth=1.2,
            zorder=1.5,
            label=r"predicted gap: $e_F(G_{\mathrm{cen}}, G_\ast)$",
        )
    shared_legend(fig, axes)
    fig.suptitle(_procedures_title(results_list, groups) if title is None else title)
    return fig


def _procedure_curves(
    groups: Mapping[str, Sequence[Results]],
    all_rounds: Sequence[int],
    field: str,
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, object]]]:
    """Per procedure, the ``(runs, rounds)`` matrix of one error ``field`` (NaN where a run has
    no such round) and its colour; procedures with no finite value are left out."""
    pos = {t: i for i, t in enumerate(all_rounds)}
    curves: dict[str, np.ndarray] = {}
    styles: dict[str, dict[str, object]] = {}
    for j, (name, runs) in enumerate(groups.items()):
        arr = np.full((len(runs), len(all_rounds)), np.nan)
        for k, res in enumerate(runs):
            for r in res.rounds:
                arr[k, pos[r.round]] = _error(r, field)
        if not np.isfinite(arr).any():
            continue
        label = name if len(runs) == 1 else f"{name} ({len(runs)} seeds)"
        curves[label] = arr
        styles[label] = {"color": PROCEDURE_COLORS.get(name, _CYCLE_COLORS[j % len(_CYCLE_COLORS)])}
    return curves, styles


def shared_legend(fig: Figure, axes: Sequence[Axes], loc: LegendLocType = "outside right upper") -> None:
    """One figure legend for ``axes`` (each label once, in the order the panels first show it) at
    ``loc``; below the panels (``"outside lower center"``) its columns fill the figure's width."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        ncols = (
            1 if isinstance(loc, str) and "right" in loc else max(1, min(len(labels), int(fig.get_figwidth() // 3.2)))
        )
        fig.legend(handles, labels, loc=loc, fontsize="small", handlelength=3.0, ncols=ncols)


def _procedures_title(results_list: Sequence[Results], groups: Mapping[str, Sequence[Results]]) -> str:
    """Default title of [`procedures_figure`][fedhead.plotting.procedures_figure]: the data sets, and the band when
    seeds repeat."""
    names = {res.dataset.name for res in results_list} - {""}
    title = "head Gram error per round" + (f" on {', '.join(sorted(names))}" if names else "")
    title += " (mean $\\pm$ 1 sd over seeds)" if any(len(v) > 1 for v in groups.values()) else ""
    return title
