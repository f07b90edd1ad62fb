"""Report figures over rounds and swept knobs: error curves per setting, final-Gram ellipses,
the direction error to G_star against the local epochs E, δ_last and e_F against ρ.

Each function takes counted runs ([`fedhead.report.collect.RunEntry`][fedhead.report.RunEntry]) and returns a
matplotlib Figure (or None when the runs cannot fill it); colours come from
[`fedhead.plotting.style`][fedhead.plotting.style] (one colour per procedure, the Gram palette for ellipses).
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from fedhead.data.units import axis_unit
from fedhead.plotting.canvas import new_figure
from fedhead.plotting.curves import plot_error_curves
from fedhead.plotting.ellipses import coordinate_groups, plot_ellipses
from fedhead.plotting.run_figures import shared_legend
from fedhead.plotting.style import _CYCLE_COLORS, PROCEDURE_COLORS, gram_label, tex_number
from fedhead.report import measures
from fedhead.report.collect import RunEntry
from fedhead.report.selection_tables import rho_value
from fedhead.report.tables import group, procedure_label, procedure_order

_REF_LABEL = {"star": "G_star", "cen": "G_cen", "within": "G_within", "corrected": "corrected barycenter"}
E_F_REF = r"$e_F(G_t, G_{\mathrm{ref}})$ (unitless)"


def target_unit(dataset: str) -> str:
    """Unit of the Gram axes: MuJoCo actions keep their stored scale, other targets are standardised."""
    return axis_unit(dataset)


def color(name: str, i: int = 0) -> str:
    """The procedure's colour ([`PROCEDURE_COLORS`][fedhead.plotting.PROCEDURE_COLORS]), else the colour cycle."""
    return PROCEDURE_COLORS.get(name.split("+")[0], _CYCLE_COLORS[i % len(_CYCLE_COLORS)])


def _floor(curves: Mapping[str, np.ndarray]) -> float:
    """A log-axis floor a little below the smallest positive value (so sd bands stay in view)."""
    vals = np.concatenate([np.ravel(v) for v in curves.values()]) if curves else np.array([])
    pos = vals[np.isfinite(vals) & (vals > 0)]
    return float(pos.min() / 3.0) if pos.size else 1e-17


def _quiet_curves(ax, x, curves, **kw) -> None:
    """[`plot_error_curves`][fedhead.plotting.plot_error_curves] (mean +- 1 sd) without numpy's warnings on all-NaN
    columns."""
    with warnings.catch_warnings():
        for msg in ("All-NaN slice", "Degrees of freedom", "Mean of empty slice", "invalid value"):
            warnings.filterwarnings("ignore", msg, RuntimeWarning)
        plot_error_curves(ax, x, curves, center="mean", band="sd", floor=_floor(curves), **kw)


def _point(x: float | None, value: float | None) -> dict[float, float | None]:
    """One point ``{x: value}`` of a curve; none where ``x`` is undefined."""
    return {} if x is None else {x: value}


def _matrix(
    runs: Sequence[RunEntry], xs: Sequence[float], point: Callable[[RunEntry], dict[float, float | None]]
) -> np.ndarray:
    """``(seeds, len(xs))``: one row per seed, ``point(run)`` maps x -> value (NaN elsewhere)."""
    by_seed = group(runs, lambda r: r.seed)
    pos = {x: i for i, x in enumerate(xs)}
    arr = np.full((len(by_seed), len(xs)), np.nan)
    for k, members in enumerate(by_seed.values()):
        for r in members:
            for x, v in point(r).items():
                if x in pos and v is not None:
                    arr[k, pos[x]] = v
    return arr


def suptitle(fig: Figure, text: str) -> None:
    """A figure title wrapped to the figure's width."""
    width = max(40, int(fig.get_figwidth() * 11))
    fig.suptitle(textwrap.fill(text, width, break_long_words=False, break_on_hyphens=False), fontsize="medium")


def _panels(n: int, panel_size=(4.6, 3.6)):
    fig, axes = new_figure(n, panel_size=panel_size)
    fig.set_layout_engine("constrained")
    return fig, axes


def error_curves_figure(runs: Sequence[RunEntry], sweep: str) -> Figure | None:
    """Per setting (one panel each) the error of ``G_t`` to each procedure's own reference per
    round, one line per procedure: mean +- 1 sd over seeds, log y."""
    if not runs:
        return None
    settings = sorted({r.setting for r in runs})
    fig, axes = _panels(len(settings))
    for ax, setting in zip(axes, settings):
        members = [r for r in runs if r.setting == setting]
        xs = sorted({float(t) for r in members for t in measures.error_curve(r.counted_results)[0]})
        curves, styles = {}, {}
        procs = group(members, procedure_label)
        for i, name in enumerate(sorted(procs, key=procedure_order)):
            ref = _REF_LABEL[measures.reference(procs[name][0].counted_results)]
            lab = f"{name} (to {ref})"
            curves[lab] = _matrix(
                procs[name], xs, lambda r: dict(zip(*map(list, measures.error_curve(r.counted_results))))
            )
            styles[lab] = {"color": color(name, i)}
        _quiet_curves(ax, xs, curves, styles=styles, legend=False, xlabel="round $t$", ylabel=E_F_REF, title=setting)
    seeds = sorted({r.seed for r in runs})
    over = f"mean ± 1 sd over {len(seeds)} seeds" if len(seeds) > 1 else f"seed {seeds[0]}"
    suptitle(fig, f"sweep {sweep}: head Gram error to each procedure's reference per round ({over})")
    shared_legend(fig, axes, loc="outside lower center")
    return fig


def ellipses_figure(runs: Sequence[RunEntry], setting: str) -> Figure | None:
    """The final head Gram ``G_T`` of each procedure (smallest seed) against ``G_star`` and
    ``G_cen`` as ellipses: one row per procedure, one panel per pair of the first three targets."""
    finals = {
        r.ref: gram
        for r in runs
        if r.setting == setting and (gram := measures.final_gram(r.counted_results)) is not None
    }
    members = [r for r in runs if r.ref in finals]
    if not members:
        return None
    seed = min(r.seed for r in members)
    procs = {procedure_label(r): r for r in sorted(members, key=lambda r: -r.seed) if r.seed == seed}
    names = sorted(procs, key=procedure_order)
    c = finals[procs[names[0]].ref].shape[0]
    if c < 2:
        return None
    k = min(c, 3)
    pairs = coordinate_groups(k, 2)
    fig, axes = new_figure(len(names) * len(pairs), ncols=len(pairs), panel_size=(3.6, 3.4))
    fig.set_layout_engine("constrained")
    unit = target_unit(procs[names[0]].dataset or setting)
    for row, name in enumerate(names):
        res = procs[name].counted_results
        t_last = measures.last_round(res).round
        grams = {f"G_{t_last}": finals[procs[name].ref][:k, :k]}
        for key, gk in (("G_star", "g_star"), ("G_cen", "g_cen")):
            g = res.target(gk)
            if g is not None:
                grams[key] = g[:k, :k]
        for j, pair in enumerate(pairs):
            ax = axes[row * len(pairs) + j]
            plot_ellipses(
                ax,
                grams,
                coords=pair,
                legend=False,
                unit=unit,
                labels={f"G_{t_last}": f"final {gram_label(f'G_{t_last}')} (round {t_last})"},
            )
            ax.set_title(f"{name}", fontsize="medium")
    note = f"; first 3 of {c} targets" if c > 3 else ""
    suptitle(
        fig, f"{setting}, seed {seed}: final head Gram against {gram_label('G_star')} and {gram_label('G_cen')}{note}"
    )
    fig.supxlabel(
        r"each curve: the ellipse $\{G^{1/2}u : \|u\| \leq 1\}$ of a Gram, projected on two targets", fontsize="small"
    )
    shared_legend(fig, axes[: len(pairs)], loc="outside right upper")
    return fig


def d_star(record) -> float | None:
    """A round's direction error to G_star."""
    return record.d_star


def epochs_value(run: RunEntry) -> float | None:
    """The run's local epochs E (``params.local_epochs``, else its config)."""
    return measures.num(measures.param(run.counted_results, run.params, "local_epochs"))


def epochs_figure(runs: Sequence[RunEntry]) -> Figure | None:
    """The direction error d(G_T, G_star) against the local epochs E (log-log; the paper's Figure
    13), one panel per setting, one line per procedure, mean +- 1 sd over seeds, a dotted line at
    d = 0.1 (the budget of claim C19)."""
    runs = [r for r in runs if epochs_value(r) is not None]
    if not runs:
        return None
    settings = sorted({r.setting for r in runs})
    fig, axes = _panels(len(settings))
    for ax, setting in zip(axes, settings):
        members = [r for r in runs if r.setting == setting]
        xs = sorted({e for r in members if (e := epochs_value(r)) is not None})
        procs = group(members, procedure_label)
        curves, styles = {}, {}
        for i, name in enumerate(sorted(procs, key=procedure_order)):
            curves[name] = _matrix(
                procs[name], xs, lambda r: _point(epochs_value(r), measures.final(r.counted_results, d_star))
            )
            styles[name] = {"color": color(name, i)}
        _quiet_curves(
            ax,
            xs,
            curves,
            styles=styles,
            legend=False,
            logx=True,
            xlabel="local epochs $E$ per round",
            ylabel=r"$d(G_T, G_\ast)$ (unitless)",
            title=setting,
        )
        ax.axhline(0.1, color="0.5", linestyle=":", linewidth=1.0)
    suptitle(fig, "sweep epochs: direction error to G_star against the local epochs E (mean ± 1 sd over seeds)")
    shared_legend(fig, axes, loc="outside lower center")
    return fig


def rho_positions(rhos: Sequence[float]) -> tuple[dict[float, float], float | None]:
    """x positions on a log axis: ρ > 0 at itself, ρ = 0 at a placeholder 1.5 decades left of
    the smallest positive ρ. Returns ``(rho -> x, placeholder or None)``."""
    pos = sorted(r for r in rhos if r > 0)
    base = pos[0] if pos else 1.0
    zero = base / 10**1.5 if 0.0 in rhos else None
    out = {r: r for r in pos}
    if zero is not None:
        out[0.0] = zero
    return out, zero


def rho_figure(runs: Sequence[RunEntry]) -> Figure | None:
    """δ_last and endpoint e_F against ρ (two panels, one line per setting, mean +- 1 sd over
    seeds); ρ = 0 sits at a placeholder tick labelled 0 left of an axis break."""
    runs = [r for r in runs if rho_value(r) is not None]
    if not runs:
        return None
    positions, zero = rho_positions(sorted({rho for r in runs if (rho := rho_value(r)) is not None}))
    xs = [positions[r] for r in sorted(positions)]
    fig, axes = _panels(2, panel_size=(5.0, 3.8))
    metrics = (
        ("δ_last", measures.delta_last, r"$\delta_{\mathrm{last}} = \sum_m p_m \|W_m - \Pi_m(W_t)\|_F$"),
        ("endpoint e_F", measures.endpoint_error, "endpoint " + E_F_REF),
    )
    settings = group(runs, lambda r: r.setting)
    for ax, (title, fn, ylabel) in zip(axes, metrics):
        curves = {
            s: _matrix(m, xs, lambda r, fn=fn: _point(positions.get(rho_value(r) or 0.0), fn(r.counted_results)))
            for s, m in sorted(settings.items())
        }
        _quiet_curves(
            ax, xs, curves, legend=False, logx=True, xlabel=r"proximal weight $\rho$", ylabel=ylabel, title=title
        )
        _rho_ticks(ax, positions, zero)
    suptitle(fig, "sweep rho: selection distance and endpoint error against ρ (mean ± 1 sd over seeds)")
    shared_legend(fig, axes, loc="outside lower center")
    return fig


def _rho_ticks(ax: Axes, positions: Mapping[float, float], zero: float | None) -> None:
    """Ticks at the swept ρ (``0`` at the placeholder) and a dotted axis break beside it."""
    rhos = sorted(positions)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(
        [positions[r] for r in rhos],
        ["0" if r == 0 else f"${tex_number(r)}$" for r in rhos],
        fontsize="x-small",
        rotation=45,
    )
    if zero is not None and len(rhos) > 1:
        ax.axvline(np.sqrt(zero * positions[rhos[1]]), color="0.5", linestyle=":", linewidth=1.0)
