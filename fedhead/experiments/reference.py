"""Reference instance "fig2" (docs/theory.md §12): C = P = 2, M = 3, all six panels (a)-(f).

What each panel shows is in docs/theory.md §12 (Protocols); `.reference_figure` draws them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhead import ufm
from fedhead.analysis.metrics import selection_distance

from .common import ExperimentResult, Headline, finish, gram, loglog_slope, matched_samples, rel_err, rotation
from .reference_figure import reference_figure
from .solvers import JointState, adam_joint, lbfgs_profiled, prox_profiled_solve, ridge_features

log = logging.getLogger(__name__)

NAME = "fig2"
DESCRIPTION = "reference instance C=P=2, M=3: panels (a)-(f)"


@dataclass(frozen=True)
class Settings:
    """Parameters of the reference instance (docs/theory.md §12; the same in every profile)."""

    n_per_client: int = 256
    lambda_h: float = 0.1
    lambda_w: float = 0.1
    seed: int = 0
    adam_lr: float = 0.02
    adam_snapshots: tuple[int, ...] = (0, 20, 80, 240)
    rho_ladder: tuple[float, ...] = tuple(np.logspace(-1, -6, 11).tolist())
    round_rhos: tuple[float, ...] = (1e-1, 1e-2, 1e-3, 1e-4)
    n_rounds: int = 18
    gammas: tuple[float, ...] = (0.0, 0.9, 0.99, 1.0)

    @classmethod
    def quick(cls) -> Settings:
        """Quick profile: the same single instance (it is already cheap)."""
        return cls()

    @classmethod
    def full(cls) -> Settings:
        """Full profile (docs/theory.md §12)."""
        return cls()


def reference_instance(settings: Settings):
    """Moments, targets and ``W_0`` of the reference instance.

    Returns
    -------
    (TargetMoments, list of (N_m, 2) targets, W_0 (2, 2))
    """
    covs = [
        rotation(-40) @ np.diag([3.0, 0.11]) @ rotation(-40).T,
        rotation(10) @ np.diag([1.1, 0.45]) @ rotation(10).T,
        rotation(55) @ np.diag([2.4, 0.13]) @ rotation(55).T,
    ]
    means = [np.array([0.0, -2.2]), np.zeros(2), np.array([0.0, 2.2])]
    rng = np.random.default_rng(settings.seed)
    targets = [matched_samples(mu, S, settings.n_per_client, rng) for mu, S in zip(means, covs)]
    moments = ufm.TargetMoments.from_targets(targets)
    g0 = rotation(100) @ np.diag([2.5, 0.09]) @ rotation(100).T
    return moments, targets, ufm.psd_sqrt(g0)


def _panel_a(s: Settings, moments, targets, W0, grams):
    Y = targets[0]
    b0 = moments.means[0].copy()
    H0 = ridge_features(W0, b0, Y, s.lambda_h)
    steps = max(s.adam_snapshots)
    _, snaps = adam_joint(
        JointState(W0, b0, H0), Y, s.lambda_h, s.lambda_w, lr=s.adam_lr, steps=steps, snapshots=s.adam_snapshots
    )
    pi = ufm.closest_head(W0, grams[0])
    d_bw = float(ufm.bw_distance(gram(W0), grams[0]))
    out = {"steps": list(s.adam_snapshots), "grams": [], "e_G": [], "e_Pi": [], "dist_to_W0": []}
    for e in s.adam_snapshots:
        W = snaps[e].W
        out["grams"].append(gram(W))
        out["e_G"].append(rel_err(gram(W), grams[0]))
        out["e_Pi"].append(rel_err(W, pi))
        out["dist_to_W0"].append(float(np.linalg.norm(W - W0)))
    out["closest_head"] = pi
    out["bw_distance_G0_G1"] = d_bw
    out["final_head"] = snaps[steps].W
    return out


def _panel_b(s: Settings, moments, W0, grams):
    M = grams.shape[0]
    e_g = np.zeros((M, len(s.rho_ladder)))
    e_pi = np.zeros_like(e_g)
    gnorm = np.zeros_like(e_g)
    for m in range(M):
        pi = ufm.closest_head(W0, grams[m])
        W = W0.copy()
        for k, rho in enumerate(s.rho_ladder):
            r = prox_profiled_solve(W, W0, moments.covs[m], s.lambda_h, s.lambda_w, rho)
            W = r.x
            e_g[m, k] = rel_err(gram(W), grams[m])
            e_pi[m, k] = rel_err(W, pi)
            gnorm[m, k] = r.grad_norm
    return {
        "rho": list(s.rho_ladder),
        "e_G": e_g,
        "e_Pi": e_pi,
        "e_G_worst": e_g.max(0),
        "e_Pi_worst": e_pi.max(0),
        "grad_norm": gnorm,
        "slope_e_Pi": loglog_slope(s.rho_ladder, e_pi.max(0)),
        "slope_e_G": loglog_slope(s.rho_ladder, e_g.max(0)),
    }


def _federated(s: Settings, moments, W0, grams, g_star, local):
    """Run ``n_rounds`` of head averaging with local solver ``local(m, W_t) -> W~``."""
    p = moments.weights
    W = W0.copy()
    errs, deltas, traj = [rel_err(gram(W), g_star)], [], [gram(W)]
    for _ in range(s.n_rounds):
        heads = [local(m, W) for m in range(len(p))]
        pis = [ufm.closest_head(W, grams[m]) for m in range(len(p))]
        deltas.append(selection_distance(np.stack(heads), np.stack(pis), p))
        W = np.asarray(sum(p[m] * heads[m] for m in range(len(p))))  # M >= 1 terms: sum's start 0 never stays
        traj.append(gram(W))
        errs.append(rel_err(gram(W), g_star))
    return {"err_to_g_star": errs, "selection_distance": deltas, "grams": np.array(traj)}


def _panels_cd(s: Settings, moments, W0, grams, g_star):
    covs = moments.covs
    runs = {"exact": _federated(s, moments, W0, grams, g_star, lambda m, W: ufm.closest_head(W, grams[m]))}
    for rho in s.round_rhos:

        def local(m, W, rho=rho):
            return prox_profiled_solve(ufm.closest_head(W, grams[m]), W, covs[m], s.lambda_h, s.lambda_w, rho).x

        runs[f"rho={rho:g}"] = _federated(s, moments, W0, grams, g_star, local)
    runs["L-BFGS (rho=0)"] = _federated(
        s, moments, W0, grams, g_star, lambda m, W: lbfgs_profiled(W, covs[m], s.lambda_h, s.lambda_w).x
    )
    return runs


def _variant(moments, equal_means: bool, equal_covs: bool):
    means = np.asarray(moments.means)
    covs = np.asarray(moments.covs)
    if equal_means:
        means = np.broadcast_to(moments.mean_global, means.shape)
    if equal_covs:
        covs = np.broadcast_to(moments.sigma_within, covs.shape)
    return ufm.TargetMoments(weights=moments.weights, means=means, covs=covs)


def _panel_e(s: Settings, moments):
    out = {}
    for label, em, ec in [
        ("original", False, False),
        ("equal means", True, False),
        ("equal covariances", False, True),
        ("both equal", True, True),
    ]:
        gd = ufm.gap_decomposition(_variant(moments, em, ec), s.lambda_h, s.lambda_w)
        terms = {"M_mu": gd.m_mu, "M_Sigma": gd.m_sigma, "M_A": gd.m_a}
        out[label] = {
            "trace": {k: float(np.trace(v)) for k, v in terms.items()},
            "min_eig": {k: float(np.linalg.eigvalsh(v)[0]) for k, v in terms.items()},
            "gap_norm": float(np.linalg.norm(gd.g_cen - gd.g_star)),
            "decomposition_residual": float(np.linalg.norm(gd.g_cen - gd.g_star - gd.m_mu - gd.m_sigma - gd.m_a)),
            "g_star": gd.g_star,
            "g_cen": gd.g_cen,
            "g_within": gd.g_within,
            "g_avg": np.einsum("m,mij->ij", moments.weights, gd.grams),
        }
    return out


def _panel_f(s: Settings, moments, W0):
    g_cen = ufm.optimal_gram(moments.sigma_cen, s.lambda_h, s.lambda_w)
    out = {"gamma": list(s.gammas), "err_to_g_cen": {}}
    for g in s.gammas:
        corrected = (1.0 - g) * np.asarray(moments.covs) + g * moments.sigma_cen
        grams_g = ufm.optimal_gram(corrected, s.lambda_h, s.lambda_w)
        traj = ufm.gram_recursion(gram(W0), grams_g, moments.weights, s.n_rounds)
        out["err_to_g_cen"][f"{g:g}"] = [rel_err(G, g_cen) for G in traj]
    return out


def run(settings: Settings, out_dir: str | Path) -> ExperimentResult:
    """Run all six panels of the reference instance and write ``results.json`` and PNGs."""
    s = settings
    out_dir = Path(out_dir)
    moments, targets, W0 = reference_instance(s)
    ufm.check_fully_active(moments, s.lambda_h, s.lambda_w)
    grams = ufm.optimal_gram(np.asarray(moments.covs), s.lambda_h, s.lambda_w)
    g_star = ufm.bw_barycenter(grams, moments.weights).gram
    log.info("fig2: panel (a)")
    a = _panel_a(s, moments, targets, W0, grams)
    log.info("fig2: panel (b)")
    b = _panel_b(s, moments, W0, grams)
    log.info("fig2: panels (c, d)")
    runs = _panels_cd(s, moments, W0, grams, g_star)
    log.info("fig2: panels (e, f)")
    e = _panel_e(s, moments)
    f = _panel_f(s, moments, W0)
    figures = reference_figure(s, out_dir, moments, W0, grams, g_star, a, b, runs, e, f)

    rho_final = {k: v["err_to_g_star"][-1] for k, v in runs.items()}
    min_eig_all = min(min(v["min_eig"].values()) for v in e.values())
    zero_terms = max(
        abs(e["equal means"]["trace"]["M_mu"]),
        abs(e["equal covariances"]["trace"]["M_Sigma"]),
        abs(e["equal covariances"]["trace"]["M_A"]),
        *map(abs, e["both equal"]["trace"].values()),
    )
    fe = f["err_to_g_cen"]
    headline = [
        Headline("a_adam_e_G_final", a["e_G"][-1], "-> 0 (Gram reaches G_1)"),
        Headline("a_adam_e_Pi_final", a["e_Pi"][-1], "O(1): not the closest head"),
        Headline("b_slope_e_Pi_vs_rho", b["slope_e_Pi"], "1 (e_Pi ~ rho)"),
        Headline("b_e_Pi_at_rho_min", float(b["e_Pi_worst"][-1]), f"~ rho = {s.rho_ladder[-1]:g}"),
        Headline("c_exact_final_err_to_G_star", rho_final["exact"], "-> 0 (geometric)"),
        *[Headline(f"c_{k}_final_err", v, "~ rho") for k, v in rho_final.items() if k.startswith("rho")],
        Headline("c_lbfgs_final_err", rho_final["L-BFGS (rho=0)"], "> 0: stalls (no exact selection)"),
        Headline("e_min_eig_of_terms", min_eig_all, ">= 0 (PSD)"),
        Headline("e_max_term_that_must_vanish", zero_terms, "0"),
        Headline("f_err_gamma1_round1", fe["1"][1], "0 (one-round recovery)"),
        Headline("f_ratio_err_0.9_over_0.99", fe["0.9"][-1] / fe["0.99"][-1], "~10 (residual ~ 1-gamma)"),
    ]
    results = {
        "lambda_h": s.lambda_h,
        "lambda_w": s.lambda_w,
        "moments": {"weights": moments.weights, "means": moments.means, "covs": moments.covs},
        "W0": W0,
        "grams": grams,
        "g_star": g_star,
        "panel_a": a,
        "panel_b": b,
        "panel_cd": {k: {kk: vv for kk, vv in v.items()} for k, v in runs.items()},
        "panel_e": e,
        "panel_f": f,
    }
    return finish(NAME, out_dir, s, {"targets": s.seed}, results, headline, figures)
