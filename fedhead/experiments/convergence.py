"""Convergence sweep (docs/theory.md §6, protocol in §12): exact selection converges to G_star.

Rounds of head averaging with exact selection, proximal returns along a rho ladder and
unregularised Adam joint training, on random instances of several sizes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedhead import ufm
from fedhead.plotting import new_figure, plot_error_curves, save_figure, tex_number
from fedhead.progress import progress

from .common import (
    ExperimentResult,
    Headline,
    dirichlet_weights,
    finish,
    gram,
    loglog_slope,
    matched_samples,
    quartiles,
    random_spd,
    rel_err,
)
from .solvers import JointState, adam_joint, prox_profiled_solve, ridge_features

log = logging.getLogger(__name__)

NAME = "convergence"
DESCRIPTION = "federated rounds: exact selection -> G_star, proximal O(rho), Adam joint training"


@dataclass(frozen=True)
class Settings:
    """Convergence sweep parameters (defaults: the full profile of docs/theory.md §12)."""

    n_instances: int = 16
    dims: tuple[int, ...] = (2, 4, 8)
    clients: tuple[int, ...] = (3, 8)
    lam: float = 1.0
    gram_eig_range: tuple[float, float] = (0.4, 4.0)
    dirichlet: float = 2.0
    n_rounds: int = 18
    rho_ladder: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
    adam_lr: float = 0.02
    adam_steps: int = 200
    seed: int = 2

    @classmethod
    def quick(cls) -> Settings:
        """Quick profile: one instance per size, three rhos (same code path)."""
        return cls(n_instances=1, rho_ladder=(1e-1, 1e-3, 1e-5))

    @classmethod
    def full(cls) -> Settings:
        """Full profile (docs/theory.md §12)."""
        return cls()


def make_instance(C: int, M: int, s: Settings, rng: np.random.Generator) -> dict:
    """One random instance: moments, client Grams, targets, weights, ``W_0`` (``P = 2C``)."""
    P = 2 * C
    eye = np.eye(C)
    grams = np.stack([random_spd(C, *s.gram_eig_range, rng) for _ in range(M)])
    covs = np.stack([ufm.sym((g + s.lam * eye) @ (g + s.lam * eye)) for g in grams])
    means = rng.standard_normal((M, C))
    targets = [matched_samples(means[m], covs[m], 2 * C, rng) for m in range(M)]
    weights = dirichlet_weights(M, s.dirichlet, rng)
    moments = ufm.TargetMoments.from_targets(targets, weights=weights)
    W0 = rng.standard_normal((C, P))
    return {
        "moments": moments,
        "grams": ufm.optimal_gram(np.asarray(moments.covs), s.lam, s.lam),
        "targets": targets,
        "W0": W0,
        "grams_design": grams,
    }


def _run_exact(inst, s, g_star):
    W = inst["W0"]
    errs = [rel_err(gram(W), g_star)]
    for _ in range(s.n_rounds):
        W = ufm.selection_round(W, inst["grams"], inst["moments"].weights)
        errs.append(rel_err(gram(W), g_star))
    return errs


def _run_prox(inst, s, g_star, rho):
    mom, grams = inst["moments"], inst["grams"]
    p = mom.weights
    W = inst["W0"]
    errs = [rel_err(gram(W), g_star)]
    for _ in range(s.n_rounds):
        heads = [
            prox_profiled_solve(ufm.closest_head(W, grams[m]), W, mom.covs[m], s.lam, s.lam, rho).x
            for m in range(len(p))
        ]
        W = np.einsum("m,mij->ij", p, np.stack(heads))
        errs.append(rel_err(gram(W), g_star))
    return errs


def _run_adam(inst, s, g_star):
    mom, targets = inst["moments"], inst["targets"]
    p = mom.weights
    W, b = inst["W0"], np.asarray(mom.mean_global).copy()
    feats = [ridge_features(W, b, Y, s.lam) for Y in targets]
    errs = [rel_err(gram(W), g_star)]
    for _ in range(s.n_rounds):
        Ws, bs = [], []
        for m, Y in enumerate(targets):
            st, _ = adam_joint(JointState(W, b, feats[m]), Y, s.lam, s.lam, lr=s.adam_lr, steps=s.adam_steps)
            feats[m] = st.H
            Ws.append(st.W)
            bs.append(st.b)
        W = np.einsum("m,mij->ij", p, np.stack(Ws))
        b = p @ np.stack(bs)
        errs.append(rel_err(gram(W), g_star))
    return errs


def _method_label(key: str) -> str:
    """Legend text of a method key: ``"rho=1e-05"`` -> ``$\\rho=10^{-5}$``; other keys unchanged."""
    return rf"$\rho={tex_number(float(key[4:]))}$" if key.startswith("rho=") else key


def _figure(s: Settings, arr: dict[str, np.ndarray]) -> Figure:
    """Both panels of ``convergence.png`` from the ``(instances, rounds + 1)`` error arrays per method."""
    rounds = np.arange(s.n_rounds + 1)
    rhos = np.asarray(s.rho_ladder)
    final = {k: v[:, -1] for k, v in arr.items()}
    final_prox_median = np.array([np.median(final[f"rho={r:g}"]) for r in rhos])
    fig, axes = new_figure(2, panel_size=(5.4, 4.3))
    show = ["exact"] + [f"rho={r:g}" for r in rhos[:: max(1, len(rhos) // 3)]] + ["Adam joint"]
    plot_error_curves(
        axes[0],
        rounds,
        {_method_label(k): arr[k] for k in dict.fromkeys(show)},
        xlabel="round $t$",
        ylabel=r"$\|G_t - G_\ast\|_F / \|G_\ast\|_F$",
        title=r"error to $G_\ast$ (median, IQR)",
    )
    plot_error_curves(
        axes[1],
        rhos,
        {"proximal, final round": np.stack([final[f"rho={r:g}"] for r in rhos], 1)},
        logx=True,
        markers=["o"],
        xlabel=r"proximal weight $\rho$",
        ylabel=r"$\|G_T - G_\ast\|_F / \|G_\ast\|_F$",
        title=f"after $T={s.n_rounds}$ rounds (median, IQR)",
    )
    axes[1].axhline(np.median(final["exact"]), color="C1", linestyle="--", label="exact selection")
    axes[1].axhline(np.median(final["Adam joint"]), color="C2", linestyle="-.", label="Adam joint (no selection)")
    axes[1].plot(
        rhos, rhos * final_prox_median[0] / rhos[0], color="0.5", linestyle=":", label=r"slope 1 ($\propto \rho$)"
    )
    axes[1].legend(fontsize="small")
    return fig


def run(settings: Settings, out_dir: str | Path) -> ExperimentResult:
    """Run the convergence sweep; write ``results.json`` and ``convergence.png``."""
    s = settings
    out_dir = Path(out_dir)
    rng = np.random.default_rng(s.seed)
    sizes = [(C, M) for C in s.dims for M in s.clients]
    methods = ["exact"] + [f"rho={r:g}" for r in s.rho_ladder] + ["Adam joint"]
    errs: dict[str, list[list[float]]] = {m: [] for m in methods}
    size_of: list[str] = []
    with progress(total=len(sizes) * s.n_instances, desc="convergence", unit="inst") as bar:
        for C, M in sizes:
            for _ in range(s.n_instances):
                inst = make_instance(C, M, s, rng)
                g_star = ufm.bw_barycenter(inst["grams"], inst["moments"].weights).gram
                errs["exact"].append(_run_exact(inst, s, g_star))
                for rho in s.rho_ladder:
                    errs[f"rho={rho:g}"].append(_run_prox(inst, s, g_star, rho))
                errs["Adam joint"].append(_run_adam(inst, s, g_star))
                size_of.append(f"C={C},M={M}")
                bar.update()
    arr = {k: np.asarray(v) for k, v in errs.items()}
    final = {k: v[:, -1] for k, v in arr.items()}
    rhos = np.asarray(s.rho_ladder)
    final_prox_median = np.array([np.median(final[f"rho={r:g}"]) for r in rhos])
    per_size_exact = {
        k: float(np.median([final["exact"][i] for i in range(len(size_of)) if size_of[i] == k]))
        for k in dict.fromkeys(size_of)
    }

    rounds = np.arange(s.n_rounds + 1)
    figures = [save_figure(_figure(s, arr), out_dir / "convergence.png")]

    headline = [
        Headline("median_exact_final_err", float(np.median(final["exact"])), "~1e-12 or below (-> G_star)"),
        Headline("max_exact_final_err", float(np.max(final["exact"])), "small (geometric convergence)"),
        Headline("slope_final_err_vs_rho", loglog_slope(rhos, final_prox_median), "1 (O(rho) neighbourhood)"),
        *[Headline(f"median_final_err_rho={r:g}", float(v), "~ rho") for r, v in zip(rhos, final_prox_median)],
        Headline("median_adam_final_err", float(np.median(final["Adam joint"])), "O(1e-2..1): no selection"),
    ]
    results = {
        "rounds": rounds,
        "rho": rhos,
        "sizes": size_of,
        "err_to_g_star": {k: quartiles(v) for k, v in arr.items()},
        "err_to_g_star_all": arr,
        "final_err_median": {k: float(np.median(v)) for k, v in final.items()},
        "exact_final_err_median_by_size": per_size_exact,
    }
    return finish(NAME, out_dir, s, {"instances": s.seed}, results, headline, figures)
