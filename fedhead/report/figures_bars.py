"""Report bar and dot figures: the gap terms under client-wise centring (sweep ``centering``) and
the paired changes of the final MSE against ordinary (sweep ``prediction``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from fedhead.plotting.canvas import new_figure
from fedhead.plotting.style import CLIENT_COLORS
from fedhead.report import measures
from fedhead.report.collect import RunEntry
from fedhead.report.figures import color, suptitle
from fedhead.report.scope_tables import mse_pairs
from fedhead.report.tables import procedure_label, procedure_order

#: the three PSD terms of G_cen - G_star (docs/theory.md §7): (name, label, colour)
GAP_TERMS = (
    ("mu", r"mean term $\mathrm{Tr}\,M_\mu$", "#4c72b0"),
    ("sigma", r"covariance term $\mathrm{Tr}\,M_\Sigma$", "#dd8452"),
    ("a", r"alignment term $\mathrm{Tr}\,M_A$", "#55a868"),
)

CENTERING_NOTE = (
    "Each setting has two bars. ordinary: Tr(G_cen − G_star) = Tr M_mu + Tr M_Sigma + Tr M_A, the gap "
    "between where head averaging ends (G_star) and centralised training (G_cen). centered: Tr(G_within − "
    "G_star) = Tr M_Sigma + Tr M_A, the gap to the centred centralised reference G_within. The terms come "
    "from each run's diagnosis (the exchanged moments; median over seeds). Centring does not move the "
    "federation's endpoint G_star; it removes the mean term from the reference, so the bars show what it "
    "can and cannot remove. A black diamond marks the measured Tr(G_ref − G_T) of the final round (mean over "
    "seeds): on the bar top when the run ends at G_star. Chosen over stacking endpoint errors because the "
    "three terms are PSD, so their traces add up exactly to the gap, while Frobenius errors do not add."
)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


@dataclass(frozen=True)
class GapBar:
    """One stacked bar: a setting's procedure, its gap terms and the measured gap (None: not recorded)."""

    setting: str
    procedure: str
    terms: dict[str, float]
    measured: float | None
    runs: int


def centering_bars(runs: Sequence[RunEntry]) -> list[GapBar]:
    """Per setting and procedure (``ordinary``, ``centered``): the stacked terms and the measured
    gap of [`CENTERING_NOTE`][fedhead.report.figures_bars.CENTERING_NOTE], medians (terms) and means (measured) over
    seeds."""
    bars = []
    for setting in sorted({r.setting for r in runs}):
        for name in ("ordinary", "centered"):
            members = [r for r in runs if r.setting == setting and procedure_label(r) == name]
            traces = [t for r in members if (t := measures.gap_traces(r.counted_results)) is not None]
            if not traces:
                continue
            terms = {k: _median([t[i] for t in traces]) for i, (k, _, _) in enumerate(GAP_TERMS)}
            if name == "centered":
                terms["mu"] = 0.0
            measured = [m for r in members if (m := measures.measured_gap_trace(r.counted_results)) is not None]
            bars.append(GapBar(setting, name, terms, float(np.mean(measured)) if measured else None, len(members)))
    return bars


def centering_figure(runs: Sequence[RunEntry]) -> Figure | None:
    """Stacked bars of the gap terms, ordinary (to G_cen) beside centered (to G_within), per setting."""
    bars = centering_bars(runs)
    if not bars:
        return None
    fig, (ax,) = new_figure(1, panel_size=(max(5.0, 1.1 * len(bars) + 2.0), 4.4))
    fig.set_layout_engine("constrained")
    settings = list(dict.fromkeys(b.setting for b in bars))
    x = np.arange(len(bars), dtype=float) + 0.3 * np.array([settings.index(b.setting) for b in bars])
    bottom = np.zeros(len(bars))
    for key, lab, col in GAP_TERMS:
        h = np.array([b.terms[key] for b in bars])
        ax.bar(x, h, bottom=bottom, color=col, label=lab, width=0.7, edgecolor="white", linewidth=0.5)
        bottom += h
    for xi, b in zip(x, bars):
        if b.measured is not None:
            ax.plot([xi], [b.measured], marker="D", color="k", markersize=6, linestyle="none")
    ref = {
        "ordinary": "ordinary\nTr($G_{\\mathrm{cen}} - G_\\ast$)",
        "centered": "centered\nTr($G_{\\mathrm{within}} - G_\\ast$)",
    }
    ax.set_xticks(x, [f"{b.setting}\n{ref[b.procedure]}" for b in bars], fontsize="x-small")
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_ylabel("trace of the gap (squared target units)")
    suptitle(
        fig,
        "sweep centering: the gap between G_star and the centralised reference, split into its "
        "PSD terms (medians over seeds)",
    )
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="D", color="k", linestyle="none"))
    labels.append(r"measured Tr($G_{\mathrm{ref}} - G_T$), final round")
    fig.legend(handles, labels, fontsize="small", loc="outside lower center", ncols=2)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def mse_figure(runs: Sequence[RunEntry], sweep: str) -> Figure | None:
    """Per procedure, one dot per (setting, seed) pair: the change (%) of its final MSE against
    ordinary on the same setting and seed; a bar at the median; colours by setting."""
    names = sorted({procedure_label(r) for r in runs} - {"ordinary"}, key=procedure_order)
    pairs = {n: p for n in names if (p := mse_pairs(runs, n))}
    if not pairs:
        return None
    settings = sorted({a.setting for p in pairs.values() for a, _, _ in p})
    scolor = {s: CLIENT_COLORS[i % len(CLIENT_COLORS)] for i, s in enumerate(settings)}
    fig, (ax,) = new_figure(1, panel_size=(max(4.8, 1.6 * len(pairs) + 2.4), 4.2))
    fig.set_layout_engine("constrained")
    rng = np.random.default_rng(0)
    for i, (name, p) in enumerate(pairs.items()):
        jitter = rng.uniform(-0.15, 0.15, len(p))
        for (a, _, change), dx in zip(p, jitter):
            ax.plot(
                i + dx,
                change,
                "o",
                color=scolor[a.setting],
                markersize=6,
                alpha=0.85,
                markeredgecolor="k",
                markeredgewidth=0.4,
            )
        med = _median([c for *_, c in p])
        ax.hlines(med, i - 0.3, i + 0.3, color=color(name, i), linewidth=3, zorder=3)
    ax.axhline(0.0, color="0.4", linewidth=1.0, linestyle="--")
    ax.set_xticks(range(len(pairs)), list(pairs), fontsize="small")
    ax.set_xlim(-0.6, len(pairs) - 0.4)
    ax.set_ylabel("change of final MSE vs ordinary (%)")
    splits = sorted({measures.final_mse(a.counted_results)[1] for p in pairs.values() for a, _, _ in p})
    suptitle(
        fig,
        f"sweep {sweep}: paired change of the final {'/'.join(splits)} MSE against ordinary "
        "(one dot per setting and seed; bar: median; below 0: better than ordinary)",
    )
    handles = [Line2D([], [], marker="o", color=scolor[s], linestyle="none", markeredgecolor="k") for s in settings]
    handles.append(Line2D([], [], color="0.3", linewidth=3))
    ax.legend(handles, settings + ["median"], fontsize="small", loc="best", title="setting")
    ax.grid(True, axis="y", alpha=0.3)
    return fig
