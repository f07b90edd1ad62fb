"""Recovery by moment correction (docs/theory.md §8, protocol in §12).

One-round recovery of ``G_cen`` and the ``1 - gamma`` law under exact selection, the proximal
solves of the corrected objective, and the identity behind the correction.
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

from . import convergence
from .common import (
    ExperimentResult,
    Headline,
    dirichlet_weights,
    finish,
    gram,
    loglog_slope,
    quartiles,
    random_spd,
    rel_err,
)
from .solvers import prox_profiled_solve

log = logging.getLogger(__name__)

NAME = "recovery"
DESCRIPTION = "moment correction: one-round recovery of G_cen, residual ~ (1 - gamma), identity check"


@dataclass(frozen=True)
class Settings:
    """Recovery parameters (defaults: the full profile of docs/theory.md §12)."""

    n_instances: int = 32
    dims: tuple[int, ...] = (2, 4, 8)
    clients: tuple[int, ...] = (3, 8)
    lam: float = 1.0
    gram_eig_range: tuple[float, float] = (0.4, 4.0)
    n_rounds: int = 18
    one_minus_gammas: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
    n_check: int = 4
    check_gammas: tuple[float, ...] = (1.0, 0.5)
    check_rhos: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
    check_rounds: int = 5
    n_identity: int = 512
    seed: int = 4

    @classmethod
    def quick(cls) -> Settings:
        """Quick profile: 2 instances per size, 1 numerical check, 64 identity instances."""
        return cls(n_instances=2, n_check=1, n_identity=64)

    @classmethod
    def full(cls) -> Settings:
        """Full profile (docs/theory.md §12)."""
        return cls()


def corrected_grams(moments: ufm.TargetMoments, gamma: float, lam: float) -> np.ndarray:
    """Client optimal Grams under ``gamma C_m``: ``phi((1 - gamma) Sigma_m + gamma Sigma_cen)`` (docs/theory.md §8)."""
    return ufm.optimal_gram(ufm.corrected_covariance(moments.covs, moments.sigma_cen, gamma), lam, lam)


def _exact_part(s: Settings, rng, bar) -> dict:
    conv = convergence.Settings(gram_eig_range=s.gram_eig_range, lam=s.lam)
    gammas = [0.0, 1.0] + [1.0 - x for x in s.one_minus_gammas]
    labels = ["none", "full"] + [f"1-gamma={x:g}" for x in s.one_minus_gammas]
    traj = {lab: [] for lab in labels}
    limit = {lab: [] for lab in labels}
    gap = []
    for C in s.dims:
        for M in s.clients:
            for _ in range(s.n_instances):
                inst = convergence.make_instance(C, M, conv, rng)
                mom = inst["moments"]
                g_cen = ufm.optimal_gram(mom.sigma_cen, s.lam, s.lam)
                G0 = gram(inst["W0"])
                for g, lab in zip(gammas, labels):
                    grams_g = corrected_grams(mom, g, s.lam)
                    tr = ufm.gram_recursion(G0, grams_g, mom.weights, s.n_rounds)
                    traj[lab].append([rel_err(G, g_cen) for G in tr])
                    limit[lab].append(rel_err(ufm.bw_barycenter(grams_g, mom.weights).gram, g_cen))
                gap.append(limit["none"][-1])
                bar.update()
    return {
        "labels": labels,
        "gammas": gammas,
        "traj": {k: np.asarray(v) for k, v in traj.items()},
        "limit": {k: np.asarray(v) for k, v in limit.items()},
        "rel_gap": np.asarray(gap),
    }


def _check_instance(s: Settings, rng) -> dict:
    C = 3
    M = 4
    covs = np.stack([random_spd(C, 2.0, 5.0, rng) for _ in range(M)])
    mom = ufm.TargetMoments(weights=dirichlet_weights(M, 2.0, rng), means=rng.standard_normal((M, C)), covs=covs)
    W0 = rng.standard_normal((C, C))
    out = {}
    for gamma in s.check_gammas:
        grams_g = corrected_grams(mom, gamma, s.lam)
        e_pi = np.zeros((M, len(s.check_rhos)))
        for m in range(M):
            pi = ufm.closest_head(W0, grams_g[m])
            W = W0.copy()
            for k, rho in enumerate(s.check_rhos):
                W = prox_profiled_solve(W, W0, mom.covs[m], s.lam, s.lam, rho, gamma=gamma, sigma_cen=mom.sigma_cen).x
                e_pi[m, k] = rel_err(W, pi)
        # federated rounds with the smallest rho, against the exact corrected recursion
        rho = s.check_rhos[-1]
        W = W0.copy()
        exact = ufm.gram_recursion(gram(W0), grams_g, mom.weights, s.check_rounds)
        err = []
        for t in range(s.check_rounds):
            heads = [
                prox_profiled_solve(
                    ufm.closest_head(W, grams_g[m]),
                    W,
                    mom.covs[m],
                    s.lam,
                    s.lam,
                    rho,
                    gamma=gamma,
                    sigma_cen=mom.sigma_cen,
                ).x
                for m in range(M)
            ]
            W = np.einsum("m,mij->ij", mom.weights, np.stack(heads))
            err.append(rel_err(gram(W), exact[t + 1]))
        g_cen = ufm.optimal_gram(mom.sigma_cen, s.lam, s.lam)
        out[f"{gamma:g}"] = {
            "e_Pi_worst": e_pi.max(0),
            "round_err_vs_exact": err,
            "err_to_g_cen_round1": rel_err(exact[1], g_cen),
        }
    return out


def _identity(s: Settings, rng) -> dict:
    val_err, grad_err = [], []
    for _ in range(s.n_identity):
        C = int(rng.choice([2, 3, 5, 8]))
        M = 4
        mom = ufm.TargetMoments(
            weights=dirichlet_weights(M, 2.0, rng),
            means=rng.standard_normal((M, C)),
            covs=np.stack([random_spd(C, 0.25, 3.0, rng) for _ in range(M)]),
        )
        W = rng.standard_normal((C, int(rng.choice([C, 2 * C]))))
        ref = ufm.profiled_objective(W, mom.sigma_cen, s.lam, s.lam, hessian=False)
        for m in range(M):
            f = ufm.profiled_objective(W, mom.covs[m], s.lam, s.lam, hessian=False)
            c = ufm.moment_correction(W, mom.covs[m], mom.sigma_cen, s.lam, hessian=False)
            val_err.append(abs(f.value + c.value - ref.value) / abs(ref.value))
            grad_err.append(float(np.linalg.norm(f.grad + c.grad - ref.grad) / np.linalg.norm(ref.grad)))
    return {"value_rel_err": np.asarray(val_err), "grad_rel_err": np.asarray(grad_err)}


#: Legend text of the correction levels of the exact part.
_LEVEL_LABELS = {"none": r"none ($\gamma = 0$)", "full": r"full ($\gamma = 1$)"}


def _level_label(key: str) -> str:
    r"""Legend text of a correction level: ``"1-gamma=1e-05"`` -> ``$1-\gamma=10^{-5}$``."""
    if key.startswith("1-gamma="):
        return rf"$1-\gamma={tex_number(float(key[8:]))}$"
    return _LEVEL_LABELS.get(key, key)


def _figure(s: Settings, ex: dict, checks: list[dict]) -> Figure:
    """The three panels of ``recovery.png``: trajectories and limits of the exact part, the numerical check.

    ``ex``: ``traj`` / ``limit`` per level (``"none"``, ``"full"``, ``"1-gamma=<x>"``) with shapes
    ``(instances, rounds + 1)`` / ``(instances,)``; ``checks``: per instance, per gamma key, ``e_Pi_worst``
    along ``s.check_rhos``.
    """
    omg = np.asarray(s.one_minus_gammas)
    limit_med = np.array([np.median(ex["limit"][f"1-gamma={x:g}"]) for x in omg])
    rounds = np.arange(s.n_rounds + 1)
    fig, axes = new_figure(3, panel_size=(4.8, 4.0))
    show = ["none", "full"] + [f"1-gamma={x:g}" for x in omg[::2]]
    plot_error_curves(
        axes[0],
        rounds,
        {_level_label(k): ex["traj"][k] for k in show},
        xlabel="round $t$",
        ylabel=r"$\|G_t - G_{\mathrm{cen}}\|_F / \|G_{\mathrm{cen}}\|_F$",
        title="exact selection with $\\gamma C_m$\n(median, IQR)",
    )
    plot_error_curves(
        axes[1],
        omg,
        {"limit error": np.stack([ex["limit"][f"1-gamma={x:g}"] for x in omg], 1)},
        logx=True,
        markers=["o"],
        xlabel=r"$1 - \gamma$",
        ylabel=r"$\|G_\infty - G_{\mathrm{cen}}\|_F / \|G_{\mathrm{cen}}\|_F$",
        title="residual of partial correction",
    )
    axes[1].plot(omg, omg * limit_med[0] / omg[0], color="0.5", linestyle=":", label=r"slope 1 ($\propto 1 - \gamma$)")
    axes[1].axhline(np.median(ex["limit"]["none"]), color="C3", linestyle="--", label=r"no correction ($G_\ast$)")
    axes[1].legend(fontsize="small")
    plot_error_curves(
        axes[2],
        np.asarray(s.check_rhos),
        {rf"$\gamma={g}$": np.stack([c[g]["e_Pi_worst"] for c in checks]) for g in checks[0]},
        logx=True,
        markers=["o", "s"],
        xlabel=r"proximal weight $\rho$",
        ylabel=r"$\|W_\rho - \Pi_\gamma(W_0)\|_F / \|\Pi_\gamma(W_0)\|_F$",
        title=r"explicit $C_m$, trust-exact ($M=4$, $C=P=3$)",
    )
    return fig


def run(settings: Settings, out_dir: str | Path) -> ExperimentResult:
    """Run the recovery checks; write ``results.json`` and ``recovery.png``."""
    s = settings
    out_dir = Path(out_dir)
    rng = np.random.default_rng(s.seed)
    n_exact = len(s.dims) * len(s.clients) * s.n_instances
    with progress(total=n_exact + s.n_check, desc="recovery", unit="inst") as bar:
        ex = _exact_part(s, rng, bar)
        checks = []
        for _ in range(s.n_check):
            checks.append(_check_instance(s, rng))
            bar.update()
    ident = _identity(s, rng)

    omg = np.asarray(s.one_minus_gammas)
    limit_med = np.array([np.median(ex["limit"][f"1-gamma={x:g}"]) for x in omg])
    ratios = np.stack([ex["limit"][f"1-gamma={x:g}"] / x for x in omg], 1)  # (instances, gammas)
    small = omg <= 1e-2 if np.count_nonzero(omg <= 1e-2) >= 2 else np.ones_like(omg, dtype=bool)
    slope = loglog_slope(omg[small], limit_med[small])  # first-order regime of the theory
    full_round1 = float(np.max(ex["traj"]["full"][:, 1]))
    full_final = float(np.max(ex["traj"]["full"][:, -1]))
    check_slopes = {
        g: float(np.median([loglog_slope(s.check_rhos, c[g]["e_Pi_worst"]) for c in checks])) for g in checks[0]
    }
    check_round = {g: float(max(max(c[g]["round_err_vs_exact"]) for c in checks)) for g in checks[0]}

    rounds = np.arange(s.n_rounds + 1)
    figures = [save_figure(_figure(s, ex, checks), out_dir / "recovery.png")]

    headline = [
        Headline("max_err_full_correction_round1", full_round1, "0 (one-round recovery)"),
        Headline("max_err_full_correction_final", full_final, "0"),
        Headline("median_err_no_correction", float(np.median(ex["limit"]["none"])), "= rel. gap G_star vs G_cen > 0"),
        Headline("slope_limit_err_vs_1-gamma", slope, "1 (residual ~ 1 - gamma, fit over 1-gamma <= 1e-2)"),
        Headline(
            "spread_err/(1-gamma)_median_q75/q25",
            float(np.median(np.percentile(ratios, 75, axis=1) / np.percentile(ratios, 25, axis=1))),
            "~1 (constant per instance)",
        ),
        *[Headline(f"check_slope_e_Pi_vs_rho_gamma={g}", v, "1") for g, v in check_slopes.items()],
        *[Headline(f"check_max_round_err_vs_exact_gamma={g}", v, "~ rho_min") for g, v in check_round.items()],
        Headline("identity_max_value_rel_err", float(np.max(ident["value_rel_err"])), "0 (rounding)"),
        Headline("identity_max_grad_rel_err", float(np.max(ident["grad_rel_err"])), "0 (rounding)"),
    ]
    results = {
        "rounds": rounds,
        "one_minus_gamma": omg,
        "traj_err_to_g_cen": {k: quartiles(v) for k, v in ex["traj"].items()},
        "limit_err_to_g_cen": {k: quartiles(v) for k, v in ex["limit"].items()},
        "limit_err_all": ex["limit"],
        "check": {"rho": list(s.check_rhos), "instances": checks},
        "identity": {
            "value_rel_err": quartiles(ident["value_rel_err"]),
            "grad_rel_err": quartiles(ident["grad_rel_err"]),
            "value_max": float(np.max(ident["value_rel_err"])),
            "grad_max": float(np.max(ident["grad_rel_err"])),
        },
    }
    return finish(NAME, out_dir, s, {"instances": s.seed}, results, headline, figures)


__all__ = ["Settings", "run", "corrected_grams"]
