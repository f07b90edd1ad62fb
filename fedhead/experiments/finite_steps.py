"""Finite local training (docs/theory.md §9, protocol in §12): E profiled gradient steps per round.

The fixed point of the rounds between ``G_within`` and ``G_star``, its first-order displacement
and the local contraction rate, on random instances.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedhead import ufm
from fedhead.plotting import new_figure, save_figure, tex_number
from fedhead.progress import progress

from .common import ExperimentResult, Headline, dirichlet_weights, finish, quartiles, random_head, random_spd

log = logging.getLogger(__name__)

NAME = "finite_steps"
DESCRIPTION = "E local gradient steps: fixed point G_within (E=1) -> G_star, displacement Delta, rate"


@dataclass(frozen=True)
class Settings:
    """Finite-step study parameters (defaults: the full profile of docs/theory.md §12)."""

    n_instances: int = 3
    C: int = 3
    M: int = 4
    lam: float = 1.0
    gram_eig_range: tuple[float, float] = (0.4, 4.0)
    etas: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.5)
    steps: tuple[int, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 2000)
    tol: float = 1e-13
    max_rounds: int = 200_000
    n_commuting: int = 24
    displacement_eta: float = 5e-4
    displacement_steps: int = 4
    jacobian_steps: tuple[int, ...] = (2, 4, 8)
    jacobian_h: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)
    seed: int = 5

    @classmethod
    def quick(cls) -> Settings:
        """Quick profile: one instance, three step sizes, eight commuting configurations."""
        return cls(n_instances=1, etas=(0.02, 0.1, 0.5), n_commuting=8)

    @classmethod
    def full(cls) -> Settings:
        """Full profile (docs/theory.md §12)."""
        return cls()


def _instance(s: Settings, rng: np.random.Generator):
    """Client covariances ``(G_m + lam I)^2`` of random SPD Grams, Dirichlet(2) weights, a random start head."""
    eye = np.eye(s.C)
    grams = np.stack([random_spd(s.C, *s.gram_eig_range, rng) for _ in range(s.M)])
    sigmas = np.stack([ufm.sym((g + s.lam * eye) @ (g + s.lam * eye)) for g in grams])
    return sigmas, dirichlet_weights(s.M, 2.0, rng), random_head(s.C, s.C, 0.7, 1.5, rng)


def newton_fixed_point(
    G0, sigmas, weights, lam: float, eta: float, E: int, *, tol: float = 1e-14, max_iter: int = 50
) -> tuple[np.ndarray, int, float]:
    """Fixed point of the profiled Gram map by Newton's method on ``g(G) - G``.

    Uses [`fedhead.ufm.profiled_gram_map`][fedhead.ufm.profiled_gram_map] and its exact Jacobian
    [`fedhead.ufm.gram_map_jacobian`][fedhead.ufm.gram_map_jacobian] in upper-triangle coordinates; needed for small
    ``h = eta E``, where plain rounds contract only by ``1 - 2 h theta_min`` each.

    Returns
    -------
    (G (C, C), iterations, final relative residual ``||g(G) - G|| / ||G||``)
    """
    G = np.array(G0, dtype=np.float64)
    C = G.shape[0]
    iu, ju = np.triu_indices(C)
    res = np.inf
    for k in range(1, max_iter + 1):
        r = ufm.profiled_gram_map(G, sigmas, weights, lam, lam, eta, E).gram - G
        res = float(np.linalg.norm(r) / np.linalg.norm(G))
        if res < tol:
            return G, k - 1, res
        J = ufm.gram_map_jacobian(G, sigmas, weights, lam, lam, eta, E)
        dx = np.linalg.solve(J - np.eye(J.shape[0]), -r[iu, ju])
        D = np.zeros((C, C))
        D[iu, ju] = dx
        D[ju, iu] = dx
        G = G + D
    return G, max_iter, res


def _grid(s: Settings, sigmas, weights, W0, g_within, g_star, bar) -> dict:
    """Fixed points for every (eta, E): normalised BW distances to ``G_within`` / ``G_star``, rounds, status."""
    d_ref = float(ufm.bw_distance(g_within, g_star))
    shape = (len(s.etas), len(s.steps))
    to_within, to_star, rounds = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    status = [["" for _ in s.steps] for _ in s.etas]
    for i, eta in enumerate(s.etas):
        for j, E in enumerate(s.steps):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ufm.ConvergenceWarning)
                try:
                    fp = ufm.finite_step_fixed_point(
                        sigmas, weights, s.lam, s.lam, eta, E, w0=W0, tol=s.tol, max_rounds=s.max_rounds
                    )
                except ufm.UFMInputError as exc:
                    status[i][j] = f"diverged: {exc}"
                    bar.update()
                    continue
            status[i][j] = "converged" if fp.converged and not caught else f"not converged ({fp.residual:.1e})"
            to_within[i, j] = float(ufm.bw_distance(fp.gram, g_within)) / d_ref
            to_star[i, j] = float(ufm.bw_distance(fp.gram, g_star)) / d_ref
            rounds[i, j] = fp.n_rounds
            bar.update()
    return {"d_within_star": d_ref, "to_within": to_within, "to_star": to_star, "rounds": rounds, "status": status}


def _commuting(s: Settings, rng) -> dict:
    """Measured against predicted diagonal displacement on random commuting configurations."""
    eta, E = s.displacement_eta, s.displacement_steps
    measured, predicted = [], []
    for _ in range(s.n_commuting):
        g = rng.uniform(*s.gram_eig_range, size=(s.M, s.C))
        eigs = (g + s.lam) ** 2
        w = dirichlet_weights(s.M, 2.0, rng)
        sigmas = np.stack([np.diag(e) for e in eigs])
        g_within = ufm.optimal_gram(np.diag(w @ eigs), s.lam, s.lam)
        G, _, _ = newton_fixed_point(g_within, sigmas, w, s.lam, eta, E)
        measured.append(np.diag(G - g_within))
        predicted.append(eta * (E - 1) * ufm.commuting_delta(eigs, w, s.lam, s.lam))
    measured, predicted = np.array(measured), np.array(predicted)
    return {"eta": eta, "E": E, "measured": measured, "predicted": predicted, "ratio": measured / predicted}


def _jacobian(s: Settings, sigmas, weights, g_within) -> dict:
    """Spectral radius and displacement error of the Newton fixed point for small ``h = eta E``."""
    th = ufm.theta_min(np.einsum("m,mij->ij", weights, sigmas), s.lam, s.lam)
    one_minus = np.zeros((len(s.jacobian_steps), len(s.jacobian_h)))
    disp_err = np.zeros_like(one_minus)
    delta = ufm.displacement_delta(sigmas, weights, s.lam, s.lam)
    for i, E in enumerate(s.jacobian_steps):
        for j, h in enumerate(s.jacobian_h):
            eta = h / E
            G, _, _ = newton_fixed_point(g_within, sigmas, weights, s.lam, eta, E)
            rho = ufm.jacobian_spectral_radius(G, sigmas, weights, s.lam, s.lam, eta, E)
            one_minus[i, j] = 1.0 - rho
            pred = eta * (E - 1) * delta
            disp_err[i, j] = float(np.linalg.norm(G - g_within - pred) / np.linalg.norm(pred))
    return {
        "theta_min": th,
        "one_minus_radius": one_minus,
        "ratio_to_2h_theta": one_minus / (2.0 * np.asarray(s.jacobian_h) * th),
        "displacement_rel_err": disp_err,
    }


def _solve_all(s: Settings, rng: np.random.Generator) -> tuple[list[dict], list[dict], dict]:
    """Per instance the (eta, E) grid and the Jacobian study, then the commuting configurations."""
    grids, jacs = [], []
    total = s.n_instances * (len(s.etas) * len(s.steps) + 1) + 1
    with progress(total=total, desc="finite_steps", unit="solve") as bar:
        for _ in range(s.n_instances):
            sigmas, weights, W0 = _instance(s, rng)
            g_within = ufm.optimal_gram(np.einsum("m,mij->ij", weights, sigmas), s.lam, s.lam)
            g_star = ufm.bw_barycenter(ufm.optimal_gram(sigmas, s.lam, s.lam), weights).gram
            grids.append(_grid(s, sigmas, weights, W0, g_within, g_star, bar))
            jacs.append(_jacobian(s, sigmas, weights, g_within))
            bar.update()
        comm = _commuting(s, rng)
        bar.update()
    return grids, jacs, comm


def _stack(grids: list[dict], jacs: list[dict]) -> dict[str, np.ndarray]:
    """Grid arrays stacked over instances, ``(inst, eta, E)``, and Jacobian arrays, ``(inst, E, h)``."""
    return {
        "to_within": np.stack([g["to_within"] for g in grids]),
        "to_star": np.stack([g["to_star"] for g in grids]),
        "rounds": np.stack([g["rounds"] for g in grids]),
        "ratio_jac": np.stack([j["ratio_to_2h_theta"] for j in jacs]),
        "disp_err": np.stack([j["displacement_rel_err"] for j in jacs]),
    }


def _plot_grid(axes, s: Settings, a: dict[str, np.ndarray]) -> None:
    """Panels 1-3: distance to ``G_within``, distance to ``G_star`` and rounds needed against E."""
    steps = np.asarray(s.steps)
    for i, eta in enumerate(s.etas):
        lab = rf"$\eta={tex_number(eta)}$"
        axes[0].plot(steps, np.nanmedian(a["to_within"][:, i], 0), marker="o", markersize=3, label=lab)
        axes[1].plot(steps, np.nanmedian(a["to_star"][:, i], 0), marker="o", markersize=3, label=lab)
        axes[2].plot(steps, np.nanmedian(a["rounds"][:, i], 0), marker="o", markersize=3, label=lab)
    norm = r"d_{BW}(G_{\mathrm{within}}, G_\ast)"
    for ax, ylab, title in [
        (
            axes[0],
            rf"$d_{{BW}}(G_{{\eta,E}}, G_{{\mathrm{{within}}}}) \,/\, {norm}$",
            r"distance to $G_{\mathrm{within}}$",
        ),
        (axes[1], rf"$d_{{BW}}(G_{{\eta,E}}, G_\ast) \,/\, {norm}$", r"distance to $G_\ast$"),
        (axes[2], r"rounds to residual $< 10^{-13}$", "rounds needed"),
    ]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("local steps $E$")
        ax.set_ylabel(ylab, fontsize="small")
        ax.set_title(title + f" (median of {s.n_instances})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")


def _plot_commuting(ax, comm: dict) -> None:
    """Panel 4: measured against predicted commuting displacement ``eta (E-1) Delta_i`` (log-log)."""
    pred, meas = comm["predicted"].ravel(), comm["measured"].ravel()
    agree = np.sign(pred) == np.sign(meas)
    ax.scatter(np.abs(pred[agree]), np.abs(meas[agree]), s=10, color="C0", label="same sign")
    if not agree.all():
        ax.scatter(np.abs(pred[~agree]), np.abs(meas[~agree]), s=14, color="C3", marker="x", label="opposite sign")
    lim = np.array([np.abs(pred).min() * 0.7, np.abs(pred).max() * 1.4])
    ax.plot(lim, lim, "k-", linewidth=1, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"$|\eta\,(E-1)\,\Delta_i|$")
    ax.set_ylabel(r"$|(G_{\eta,E} - G_{\mathrm{within}})_{ii}|$")
    ax.set_title(rf"commuting: $\eta={tex_number(comm['eta'])}$, $E={comm['E']}$")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)


def _plot_jacobian(ax_rate, ax_disp, s: Settings, a: dict[str, np.ndarray]) -> None:
    """Panels 5-6: local contraction rate and non-commuting displacement error against ``h = eta E``."""
    hs = np.asarray(s.jacobian_h)
    ax = ax_rate
    for i, E in enumerate(s.jacobian_steps):
        ax.plot(hs, np.median(a["ratio_jac"][:, i], 0), marker="o", label=f"$E={E}$")
    ax.axhline(1.0, color="k", linestyle="--", linewidth=1, label="theory")
    ax.set_xscale("log")
    ax.set_xlabel(r"$h = \eta E$")
    ax.set_ylabel(r"$(1 - \mathrm{spectral\ radius}) \,/\, (2h\,\theta_{\min})$")
    ax.set_title("local contraction rate")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    ax = ax_disp
    for i, E in enumerate(s.jacobian_steps):
        ax.plot(hs, np.median(a["disp_err"][:, i], 0), marker="o", label=f"$E={E}$")
    ax.plot(hs, hs, color="0.5", linestyle=":", label=r"slope 1 ($O(h)$)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"$h = \eta E$")
    ax.set_ylabel(r"$\|G - G_{\mathrm{within}} - \eta(E-1)\Delta\|_F \,/\, \|\eta(E-1)\Delta\|_F$", fontsize="small")
    ax.set_title(r"non-commuting displacement vs $\Delta$")
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)


def _figure(s: Settings, a: dict[str, np.ndarray], comm: dict) -> Figure:
    """The six panels: the (eta, E) grid, the commuting displacement, the Jacobian study."""
    fig, axes = new_figure(6, ncols=3, panel_size=(4.6, 3.9))
    _plot_grid(axes[:3], s, a)
    _plot_commuting(axes[3], comm)
    _plot_jacobian(axes[4], axes[5], s, a)
    return fig


def _plot(s: Settings, a: dict[str, np.ndarray], comm: dict, out_dir: Path) -> list[Path]:
    """The six panels ([`_figure`][fedhead.experiments.finite_steps._figure]) into ``finite_steps.png``."""
    return [save_figure(_figure(s, a, comm), out_dir / "finite_steps.png")]


def _headline(s: Settings, grids: list[dict], a: dict[str, np.ndarray], comm: dict) -> list[Headline]:
    """Headline numbers: E = 1 fixed point, drift toward ``G_star``, convergence, displacement, rate."""
    to_within, to_star, ratio_jac = a["to_within"], a["to_star"], a["ratio_jac"]
    steps = np.asarray(s.steps)
    e1 = list(s.steps).index(1) if 1 in s.steps else None
    n_bad = sum(st != "converged" for g in grids for row in g["status"] for st in row)
    return [
        Headline(
            "max_E=1_dist_to_G_within_rel",
            float(np.nanmax(to_within[:, :, e1])) if e1 is not None else np.nan,
            "0 (E = 1 fixed point is G_within)",
        ),
        Headline(
            f"median_E={steps[-1]}_dist_to_G_star_rel",
            float(np.nanmedian(to_star[:, :, -1])),
            "< 1 (drifts toward G_star)",
        ),
        Headline(
            f"median_E={steps[-1]}_dist_to_G_within_rel",
            float(np.nanmedian(to_within[:, :, -1])),
            "> 0 (leaves G_within)",
        ),
        Headline("runs_not_converged", float(n_bad), "0"),
        Headline("median_displacement_ratio", float(np.median(comm["ratio"])), "1 (eta (E-1) Delta_i)"),
        Headline("max_|displacement_ratio-1|", float(np.max(np.abs(comm["ratio"] - 1.0))), "O(h) small"),
        Headline("spectral_ratio_at_h_min", float(np.median(ratio_jac[:, :, 0])), "1 (1 - 2 h theta_min)"),
        Headline("spectral_ratio_at_h_max", float(np.median(ratio_jac[:, :, -1])), "1 + O(h)"),
        Headline("noncommuting_displacement_err_at_h_min", float(np.median(a["disp_err"][:, :, 0])), "O(h)"),
    ]


def _results(s: Settings, grids: list[dict], jacs: list[dict], a: dict[str, np.ndarray], comm: dict) -> dict:
    """The ``results`` block of ``results.json``."""
    return {
        "etas": list(s.etas),
        "steps": list(s.steps),
        "to_within": a["to_within"],
        "to_star": a["to_star"],
        "rounds": a["rounds"],
        "status": [g["status"] for g in grids],
        "d_within_star": [g["d_within_star"] for g in grids],
        "commuting": comm,
        "commuting_ratio": quartiles(comm["ratio"].ravel()),
        "jacobian": {
            "E": list(s.jacobian_steps),
            "h": np.asarray(s.jacobian_h),
            "theta_min": [j["theta_min"] for j in jacs],
            "one_minus_radius": np.stack([j["one_minus_radius"] for j in jacs]),
            "ratio_to_2h_theta": a["ratio_jac"],
            "displacement_rel_err": a["disp_err"],
        },
    }


def run(settings: Settings, out_dir: str | Path) -> ExperimentResult:
    """Run the finite-step study; write ``results.json`` and ``finite_steps.png``.

    Parameters
    ----------
    settings : Settings
        Study parameters (``Settings.quick()`` / ``Settings.full()``).
    out_dir : str or Path
        Folder for ``results.json`` and ``finite_steps.png``.

    Returns
    -------
    ExperimentResult
    """
    s = settings
    out_dir = Path(out_dir)
    rng = np.random.default_rng(s.seed)
    grids, jacs, comm = _solve_all(s, rng)
    a = _stack(grids, jacs)
    figures = _plot(s, a, comm, out_dir)
    headline = _headline(s, grids, a, comm)
    results = _results(s, grids, jacs, a, comm)
    return finish(NAME, out_dir, s, {"instances": s.seed}, results, headline, figures)
