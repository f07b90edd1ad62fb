"""Selection sweep (docs/theory.md §5, protocol in §12): proximal minimisers select the closest head.

Proximal joint minimisers down a rho ladder against the closest optimal head ``Pi(W_t)``, and
unregularised L-BFGS at ``rho = 0``, on random single-client instances.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedhead import ufm
from fedhead.plotting import new_figure, plot_error_curves, save_figure
from fedhead.progress import progress

from .common import (
    ExperimentResult,
    Headline,
    finish,
    gram,
    loglog_slope,
    matched_samples,
    quartiles,
    random_head,
    random_spd,
    rel_err,
)
from .solvers import JointState, joint_prox_solve, lbfgs_joint, ridge_features

log = logging.getLogger(__name__)

NAME = "selection"
DESCRIPTION = "selection lemma: proximal joint minimisers -> closest head Pi(W_t)"


@dataclass(frozen=True)
class Settings:
    """Selection sweep parameters (defaults: the full profile of docs/theory.md §12)."""

    n_instances: int = 128
    dims: tuple[int, ...] = (2, 4, 8)
    p_factors: tuple[int, ...] = (1, 2)
    n_samples: int = 64
    lam: float = 1.0
    eig_range: tuple[float, float] = (2.0, 5.0)
    sv_range: tuple[float, float] = (0.7, 1.5)
    rho_ladder: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    n_lbfgs_starts: int = 6
    seed: int = 1

    @classmethod
    def quick(cls) -> Settings:
        """Quick profile: 2 instances per size, 2 L-BFGS starts (same code path)."""
        return cls(n_instances=2, n_lbfgs_starts=2)

    @classmethod
    def full(cls) -> Settings:
        """Full profile (docs/theory.md §12)."""
        return cls()


def _instance(s: Settings, C: int, P: int, rng: np.random.Generator) -> dict:
    lam = s.lam
    mean = rng.standard_normal(C)
    cov = random_spd(C, *s.eig_range, rng)
    Y = matched_samples(mean, cov, s.n_samples, rng)
    Wt = random_head(C, P, *s.sv_range, rng)
    g_m = ufm.optimal_gram(cov, lam, lam)
    pi = ufm.closest_head(Wt, g_m)
    d_bw = float(ufm.bw_distance(gram(Wt), g_m))
    l_star = float(ufm.optimal_loss(cov, lam, lam))
    state = JointState(Wt.copy(), mean.copy(), ridge_features(Wt, mean, Y, lam))
    e_pi, e_g, excess, bound, gnorm = [], [], [], [], []
    for rho in s.rho_ladder:
        state, r = joint_prox_solve(state, Y, Wt, lam, lam, rho)
        e_pi.append(rel_err(state.W, pi))
        e_g.append(rel_err(gram(state.W), g_m))
        loss = ufm.joint_objective(state.W, state.b, state.H, Y, lam, lam).value
        excess.append(loss - l_star)
        bound.append(0.5 * rho * d_bw**2)
        gnorm.append(r.grad_norm)
    lb_ratio, lb_e_g, lb_e_pi = [], [], []
    for _ in range(s.n_lbfgs_starts):
        W0 = rng.standard_normal((C, P))
        b0 = np.zeros(C)
        st, _r = lbfgs_joint(JointState(W0, b0, ridge_features(W0, b0, Y, lam)), Y, lam, lam)
        lb_ratio.append(float(np.linalg.norm(st.W - Wt)) / d_bw)
        lb_e_g.append(rel_err(gram(st.W), g_m))
        lb_e_pi.append(rel_err(st.W, pi))
    return {
        "C": C,
        "P": P,
        "d_bw": d_bw,
        "pi_distance_identity": abs(float(np.linalg.norm(pi - Wt)) - d_bw),
        "e_Pi": e_pi,
        "e_G": e_g,
        "excess_loss": excess,
        "excess_bound": bound,
        "grad_norm": gnorm,
        "lbfgs_dist_ratio": lb_ratio,
        "lbfgs_e_G": lb_e_g,
        "lbfgs_e_Pi": lb_e_pi,
    }


def _size_label(key: str) -> str:
    r"""Mathtext of a size key: ``"C=2,P=4"`` -> ``$C=2,\ P=4$``."""
    return "$" + key.replace(",", r",\ ") + "$"


def _figure(s: Settings, per_size: dict[str, list[dict]]) -> Figure:
    """Both panels of ``selection.png`` from the per-size instance records (``e_Pi``, ``lbfgs_dist_ratio``)."""
    rhos = np.asarray(s.rho_ladder)
    fig, axes = new_figure(2, panel_size=(5.2, 4.2))
    plot_error_curves(
        axes[0],
        rhos,
        {_size_label(k): np.array([r["e_Pi"] for r in rows]) for k, rows in per_size.items()},
        logx=True,
        markers=["o"],
        xlabel=r"proximal weight $\rho$",
        ylabel=r"$\|W_\rho - \Pi(W_t)\|_F / \|\Pi(W_t)\|_F$",
        title="proximal joint minimiser vs closest head\n(median, IQR)",
    )
    axes[0].plot(rhos, rhos, color="0.5", linestyle=":", label=r"$\rho$")
    axes[0].legend(fontsize="x-small")
    keys = list(per_size)
    data = [np.concatenate([r["lbfgs_dist_ratio"] for r in per_size[k]]) for k in keys]
    axes[1].boxplot(data, showfliers=True)
    axes[1].set_xticks(np.arange(1, len(keys) + 1), [_size_label(k) for k in keys], rotation=25, fontsize="small")
    axes[1].axhline(1.0, color="k", linestyle="--", linewidth=1, label=r"$\Pi(W_t)$: ratio 1")
    axes[1].set_yscale("log")
    axes[1].set_ylabel(r"$\|W_{\mathrm{L\text{-}BFGS}} - W_t\|_F \,/\, d_{BW}(G_t, G_m)$")
    axes[1].set_title(r"unregularised L-BFGS heads ($\rho = 0$)")
    axes[1].legend(fontsize="small")
    return fig


def run(settings: Settings, out_dir: str | Path) -> ExperimentResult:
    """Run the selection sweep; write ``results.json`` and ``selection.png``."""
    s = settings
    out_dir = Path(out_dir)
    rng = np.random.default_rng(s.seed)
    sizes = [(C, f * C) for C in s.dims for f in s.p_factors]
    per_size: dict[str, list[dict]] = {}
    with progress(total=len(sizes) * s.n_instances, desc="selection", unit="inst") as bar:
        for C, P in sizes:
            rows = []
            for _ in range(s.n_instances):
                rows.append(_instance(s, C, P, rng))
                bar.update()
            per_size[f"C={C},P={P}"] = rows

    rhos = np.asarray(s.rho_ladder)
    summary = {}
    for key, rows in per_size.items():
        e_pi = np.array([r["e_Pi"] for r in rows])
        summary[key] = {
            "e_Pi": quartiles(e_pi),
            "e_G": quartiles(np.array([r["e_G"] for r in rows])),
            "slope_e_Pi": float(np.median([loglog_slope(rhos, r["e_Pi"]) for r in rows])),
            "excess_over_bound_max": float(
                np.max([np.max(np.array(r["excess_loss"]) / np.array(r["excess_bound"])) for r in rows])
            ),
            "lbfgs_dist_ratio": quartiles(np.concatenate([r["lbfgs_dist_ratio"] for r in rows])),
            "lbfgs_e_G_max": float(np.max([np.max(r["lbfgs_e_G"]) for r in rows])),
            "lbfgs_e_Pi": quartiles(np.concatenate([r["lbfgs_e_Pi"] for r in rows])),
        }
    all_rows = [r for rows in per_size.values() for r in rows]
    slopes = [loglog_slope(rhos, r["e_Pi"]) for r in all_rows]
    ratio_min = float(np.min(np.concatenate([r["lbfgs_dist_ratio"] for r in all_rows])))
    e_pi_min_rho = float(np.median([r["e_Pi"][-1] for r in all_rows]))
    excess_ratio = float(np.max([np.max(np.array(r["excess_loss"]) / np.array(r["excess_bound"])) for r in all_rows]))
    identity = float(np.max([r["pi_distance_identity"] for r in all_rows]))

    figures = [save_figure(_figure(s, per_size), out_dir / "selection.png")]

    headline = [
        Headline("median_slope_e_Pi_vs_rho", float(np.median(slopes)), "1 (e_Pi ~ rho)"),
        Headline("median_e_Pi_at_rho_min", e_pi_min_rho, f"~ rho = {s.rho_ladder[-1]:g}"),
        Headline("max_excess_loss_over_bound", excess_ratio, "<= 1 (excess <= rho/2 d_BW^2)"),
        Headline("max_abs_||Pi-W||-d_BW", identity, "0"),
        Headline("min_lbfgs_dist_ratio", ratio_min, ">= 1 (Pi is the closest optimal head)"),
        Headline(
            "median_lbfgs_e_Pi",
            float(np.median(np.concatenate([r["lbfgs_e_Pi"] for r in all_rows]))),
            "O(1) (no selection at rho = 0)",
        ),
        Headline("max_lbfgs_e_G", float(np.max([np.max(r["lbfgs_e_G"]) for r in all_rows])), "~0 (optimal Gram)"),
    ]
    results = {"rho": rhos, "summary": summary, "instances": per_size}
    return finish(NAME, out_dir, s, {"instances": s.seed}, results, headline, figures)
