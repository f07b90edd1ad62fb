"""The figures of the reference instance (``fedhead-ufm fig2``): panels (a)-(f) and the Grams.

[`reference_figure`][fedhead.experiments.reference_figure.reference_figure] draws one panel per
experiment of docs/theory.md §12 (one private function each) and the gap picture's ellipses.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from fedhead.plotting import (
    CLIENT_COLORS,
    PALETTE,
    ellipse_caption,
    new_figure,
    plot_ellipses,
    plot_error_curves,
    save_figure,
)

from .common import gram

TARGET_NAMES = ["target 1", "target 2"]


def reference_figure(s, out_dir: Path, moments, W0, grams, g_star, a, b, runs, e, f) -> list[Path]:
    """Draw ``fig2.png`` (panels (a)-(f) from the experiments' results ``a``, ``b``, ``runs``, ``e``,
    ``f``) and ``fig2_grams.png`` (the client optima and the reference Grams); return both paths."""
    fig, axes = new_figure(6, ncols=3, panel_size=(4.8, 4.2))
    _panel_adam(axes[0], s, W0, grams, a)
    _panel_proximal(axes[1], b)
    rounds = np.arange(s.n_rounds + 1)
    _panels_rounds(axes[2], axes[3], rounds, runs)
    _panel_gap_terms(axes[4], e)
    _panel_correction(axes[5], rounds, f)
    path = save_figure(fig, out_dir / "fig2.png")
    return [path, _gram_figure(out_dir, grams, e)]


def _panel_adam(ax, s, W0, grams, a) -> None:
    """(a) client 1 under joint Adam: the Grams it passes and the columns of its head."""
    ell = {"G_0": gram(W0), "G_1": grams[0]}
    labels = {"G_0": r"broadcast $G_0$", "G_1": r"client optimum $G_1$"}
    for e_step, G in zip(a["steps"][1:], a["grams"][1:]):
        ell[f"adam{e_step}"] = G
        labels[f"adam{e_step}"] = f"Adam, $E$={e_step}"
    plot_ellipses(
        ax,
        ell,
        colors=[PALETTE["G_0"], "k", "C0", "C1", "C2"],
        target_names=TARGET_NAMES,
        linestyles=[(0, (1, 2)), "-", ":", "-.", "--"],
        markers=["x", "o", "v", "D", "s"],
        labels=labels,
        legend=False,
    )
    for j in range(W0.shape[1]):
        ax.annotate(
            "", xy=a["closest_head"][:, j], xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": "k", "lw": 1.5}
        )
        ax.annotate(
            "", xy=a["final_head"][:, j], xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": "C2", "lw": 1.5}
        )
    ax.plot(
        [], [], color="k", marker=r"$\rightarrow$", markersize=10, linestyle="none", label=r"columns of $\Pi_1(W_0)$"
    )
    ax.plot(
        [],
        [],
        color="C2",
        marker=r"$\rightarrow$",
        markersize=10,
        linestyle="none",
        label=f"columns of $W$, $E$={s.adam_snapshots[-1]}",
    )
    ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, handlelength=3.0)
    ax.set_title("(a) client 1, joint Adam")


def _panel_proximal(ax, b) -> None:
    """(b) the proximal solution's errors against ``rho``, with a slope-1 guide."""
    rho = np.asarray(b["rho"])
    plot_error_curves(
        ax,
        rho,
        {r"$e_G$ (worst client)": b["e_G_worst"], r"$e_\Pi$ (worst client)": b["e_Pi_worst"]},
        logx=True,
        markers=["o", "s"],
        xlabel=r"proximal weight $\rho$",
        ylabel="relative error (unitless)",
        title=r"(b) proximal solution vs $\rho$",
        legend=False,
    )
    # the guide is shifted up (x3) so that it does not hide under e_Pi, which has slope 1 too
    ax.plot(
        rho,
        3.0 * rho * b["e_Pi_worst"][-1] / rho[-1],
        color="0.3",
        linestyle=(0, (1, 1.5)),
        linewidth=1.4,
        zorder=3,
        label=r"slope 1 ($\propto \rho$, shifted $\times 3$)",
    )
    ax.legend(fontsize="small", handlelength=3.0)


def _panels_rounds(ax_c, ax_d, rounds, runs) -> None:
    """(c) the error to ``G_star`` and (d) the selection distance, per round of each run."""
    nice = {k: re.sub(r"\brho\b", lambda _: r"$\rho$", k) for k in runs}
    plot_error_curves(
        ax_c,
        rounds,
        {nice[k]: v["err_to_g_star"] for k, v in runs.items()},
        xlabel="round $t$",
        ylabel=r"$\|G_t - G_\ast\|_F / \|G_\ast\|_F$",
        title=r"(c) error to $G_\ast$",
    )
    plot_error_curves(
        ax_d,
        rounds[1:],
        {nice[k]: v["selection_distance"] for k, v in runs.items()},
        xlabel="round $t$",
        ylabel=r"$\delta_t = \sum_m p_m \|\tilde W_m - \Pi_m(W_t)\|_F$",
        title="(d) selection distance",
    )


def _panel_gap_terms(ax, e) -> None:
    """(e) the traces of the three gap terms, per variant of the instance."""
    names = list(e.keys())
    x = np.arange(len(names))
    floor = 1e-17
    hatches = ["", "//", ".."]
    for j, (term, tex) in enumerate([("M_mu", r"$M_\mu$"), ("M_Sigma", r"$M_\Sigma$"), ("M_A", r"$M_A$")]):
        vals = [max(e[n]["trace"][term], floor) for n in names]
        ax.bar(x + (j - 1) * 0.27, vals, width=0.27, label=f"Tr {tex}", hatch=hatches[j], edgecolor="k", linewidth=0.5)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor / 30.0)
    ax.set_xticks(x, names, fontsize="small", rotation=15)
    ax.set_ylabel("trace of the term (unitless)")
    ax.set_xlabel(f"bars at {floor:.0e} are exact zeros", fontsize="x-small", color="0.35")
    ax.set_title("(e) gap terms")
    ax.legend(fontsize="small")


def _panel_correction(ax, rounds, f) -> None:
    """(f) the error to ``G_cen`` per round, for each weight ``gamma`` of the correction."""
    plot_error_curves(
        ax,
        rounds,
        {rf"$\gamma$={k}": v for k, v in f["err_to_g_cen"].items()},
        xlabel="round $t$",
        ylabel=r"$\|G_t - G_{\mathrm{cen}}\|_F / \|G_{\mathrm{cen}}\|_F$",
        title=r"(f) moment correction $\gamma C_m$",
    )


def _gram_figure(out_dir: Path, grams, e) -> Path:
    """The client optima and ``G_star``, the averaged optima, ``G_within``, ``G_cen`` as ellipses."""
    fig, axes = new_figure(1, panel_size=(6.6, 4.6))
    o = e["original"]
    ell = {
        "G_1": grams[0],
        "G_2": grams[1],
        "G_3": grams[2],
        "G_star": o["g_star"],
        "G_avg": o["g_avg"],
        "G_within": o["g_within"],
        "G_cen": o["g_cen"],
    }
    labels = {f"G_{m + 1}": f"client optimum $G_{m + 1}$" for m in range(3)}
    plot_ellipses(
        axes[0],
        ell,
        colors=[*CLIENT_COLORS[:3], *(PALETTE[k] for k in ("G_star", "G_avg", "G_within", "G_cen"))],
        linestyles=[":", ":", ":", "-", (0, (3, 1, 1, 1)), (0, (1, 1)), "-."],
        markers=["1", "2", "3", "s", "P", "D", "^"],
        labels=labels,
        target_names=TARGET_NAMES,
        title=r"client optima and $G_\ast \preceq \sum_m p_m G_m \preceq G_{\mathrm{within}} "
        r"\preceq G_{\mathrm{cen}}$",
    )
    axes[0].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5), handlelength=3.0)
    fig.text(0.01, 0.01, ellipse_caption(2), fontsize="small")
    return save_figure(fig, out_dir / "fig2_grams.png")
