"""Gap-term sweeps (docs/theory.md §7, protocol in §12): ``G_cen - G_star = M_mu + M_Sigma + M_A``.

Each term PSD, the bounds on ``Tr M_A`` and each term's share of the gap as means, covariances,
``C``, ``M`` and the margin vary.
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

from .common import ExperimentResult, Headline, dirichlet_weights, finish, quartiles, random_spd

log = logging.getLogger(__name__)

NAME = "gap_terms"
DESCRIPTION = "gap decomposition G_cen - G_star = M_mu + M_Sigma + M_A: PSD terms, D <= Tr M_A <= 2D"

TERMS = ("M_mu", "M_Sigma", "M_A")

#: Mathtext of the gap terms and of the sweep variables (figure labels).
TERM_TEX = {"M_mu": r"$\mathrm{Tr}\,M_\mu$", "M_Sigma": r"$\mathrm{Tr}\,M_\Sigma$", "M_A": r"$\mathrm{Tr}\,M_A$"}
SWEEP_TEX = {"C": "$C$", "M": "$M$", "kappa": r"$\kappa$"}


@dataclass(frozen=True)
class Settings:
    """Gap-term sweep parameters (defaults: the full profile of docs/theory.md §12)."""

    lam: float = 0.1
    controlled_seeds: tuple[int, ...] = tuple(range(55, 63))
    controlled_c: int = 3
    controlled_m: int = 4
    controlled_eig_range: tuple[float, float] = (0.3, 3.0)
    mean_scales: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
    cov_scales: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    n_random: int = 512
    random_clients: tuple[int, ...] = (2, 4, 8)
    random_dims: tuple[int, ...] = (2, 3, 5, 8)
    random_eig_range: tuple[float, float] = (0.25, 3.0)
    dirichlet: float = 2.0
    n_sweep: int = 256
    sweep_dims: tuple[int, ...] = (2, 3, 5, 8)
    sweep_clients: tuple[int, ...] = (2, 4, 8, 16)
    kappas: tuple[float, ...] = (50.0, 20.0, 10.0, 5.0, 2.0, 1.2)
    seed: int = 3

    @classmethod
    def quick(cls) -> Settings:
        """Quick profile: 64 random instances and 16 per sweep value (same code path)."""
        return cls(n_random=64, n_sweep=16)

    @classmethod
    def full(cls) -> Settings:
        """Full profile (docs/theory.md §12)."""
        return cls()


def _record(gd: ufm.GapDecomposition) -> dict:
    """Traces, relative smallest eigenvalues, ``Tr M_A``, ``D`` and residual of one decomposition."""
    terms = {"M_mu": gd.m_mu, "M_Sigma": gd.m_sigma, "M_A": gd.m_a}
    scale = float(np.linalg.norm(gd.g_cen))
    return {
        "trace": {k: float(np.trace(v)) for k, v in terms.items()},
        "min_eig_rel": {k: float(np.linalg.eigvalsh(v)[0]) / scale for k, v in terms.items()},
        "tr_m_a": float(np.trace(gd.m_a)),
        "bw_variance": gd.bw_variance,
        "D": gd.pairwise_dispersion,
        "residual_rel": float(np.linalg.norm(gd.g_cen - gd.g_star - gd.m_mu - gd.m_sigma - gd.m_a)) / scale,
        "tr_gap": float(np.trace(gd.g_cen - gd.g_star)),
        "tr_g_cen": float(np.trace(gd.g_cen)),
    }


def _random_moments(
    C: int, M: int, eig_range: tuple[float, float], s: Settings, rng: np.random.Generator
) -> ufm.TargetMoments:
    """Random SPD covariances, Gaussian means and Dirichlet weights of ``M`` clients in dimension ``C``."""
    covs = np.stack([random_spd(C, *eig_range, rng) for _ in range(M)])
    means = rng.standard_normal((M, C))
    return ufm.TargetMoments(weights=dirichlet_weights(M, s.dirichlet, rng), means=means, covs=covs)


def _controlled(s: Settings, bar) -> dict:
    """Records of the controlled sweeps (means scaled, covariances spread), one list per grid value."""
    out = {"means": {str(x): [] for x in s.mean_scales}, "covs": {str(x): [] for x in s.cov_scales}}
    for seed in s.controlled_seeds:
        rng = np.random.default_rng(seed)
        C, M = s.controlled_c, s.controlled_m
        covs = np.stack([random_spd(C, *s.controlled_eig_range, rng) for _ in range(M)])
        means = rng.standard_normal((M, C))
        w = rng.uniform(0.5, 1.5, size=M)
        w = w / w.sum()
        sw = np.einsum("m,mij->ij", w, covs)
        for x in s.mean_scales:
            mom = ufm.TargetMoments(weights=w, means=x * means, covs=covs)
            out["means"][str(x)].append(_record(ufm.gap_decomposition(mom, s.lam, s.lam)))
        for x in s.cov_scales:
            mom = ufm.TargetMoments(weights=w, means=means, covs=sw + x * (covs - sw))
            out["covs"][str(x)].append(_record(ufm.gap_decomposition(mom, s.lam, s.lam)))
        bar.update()
    return out


def _trace_matrix(records: dict[str, list[dict]], key: str) -> np.ndarray:
    """(n_seeds, n_values) traces of one term across the grid values."""
    return np.array([[r["trace"][key] for r in recs] for recs in records.values()]).T


def _share_matrix(records: dict[str, list[dict]], key: str) -> np.ndarray:
    """(n_instances, n_values) share ``Tr term / Tr(G_cen - G_star)`` of one term across the grid values."""
    return np.array([[r["trace"][key] / r["tr_gap"] for r in recs] for recs in records.values()]).T


def _random_records(s: Settings, rng: np.random.Generator, bar) -> list[dict]:
    """Records of ``s.n_random`` random instances (M, C drawn per instance), tagged with M and C."""
    random_recs = []
    for _ in range(s.n_random):
        M = int(rng.choice(s.random_clients))
        C = int(rng.choice(s.random_dims))
        rec = _record(ufm.gap_decomposition(_random_moments(C, M, s.random_eig_range, s, rng), s.lam, s.lam))
        rec.update(M=M, C=C)
        random_recs.append(rec)
        bar.update()
    return random_recs


def _sweeps(s: Settings, rng: np.random.Generator, bar) -> dict[str, dict[str, list[dict]]]:
    """Records of the sweeps over C (M = 4), over M (C = 3) and over the margin kappa."""
    sweeps: dict[str, dict[str, list[dict]]] = {"C": {}, "M": {}, "kappa": {}}
    thr = s.lam * s.lam
    grid = (
        [("C", C, C, 4, s.random_eig_range) for C in s.sweep_dims]
        + [("M", M, 3, M, s.random_eig_range) for M in s.sweep_clients]
        + [("kappa", k, 3, 4, (k * thr, 3.0)) for k in s.kappas]
    )
    for name, value, C, M, eig in grid:
        recs = []
        for _ in range(s.n_sweep):
            recs.append(_record(ufm.gap_decomposition(_random_moments(C, M, eig, s, rng), s.lam, s.lam)))
            bar.update()
        sweeps[name][str(value)] = recs
    return sweeps


def _headline(controlled: dict, random_recs: list[dict], sweeps: dict) -> list[Headline]:
    """Headline numbers: PSD terms, decomposition residual, ``D <= Tr M_A <= 2D``, vanishing terms."""
    every = (
        random_recs
        + [r for d in controlled.values() for recs in d.values() for r in recs]
        + [r for d in sweeps.values() for recs in d.values() for r in recs]
    )
    min_eig = float(min(min(r["min_eig_rel"].values()) for r in every))
    residual = float(max(r["residual_rel"] for r in every))
    tr_vs_var = float(max(abs(r["tr_m_a"] - r["bw_variance"]) / max(r["tr_gap"], 1e-300) for r in every))
    lower = float(max((r["D"] - r["tr_m_a"]) / r["D"] for r in random_recs))
    upper = float(max((r["tr_m_a"] - 2 * r["D"]) / r["D"] for r in random_recs))
    two = [abs(r["tr_m_a"] - r["D"]) / r["D"] for r in random_recs if r["M"] == 2]
    zero_mu = float(max(abs(r["trace"]["M_mu"]) for r in controlled["means"]["0.0"]))
    zero_cov = float(max(abs(r["trace"]["M_Sigma"]) + abs(r["trace"]["M_A"]) for r in controlled["covs"]["0.0"]))
    ratio = np.array([r["tr_m_a"] / r["D"] for r in random_recs])
    return [
        Headline("min_eig_of_terms_rel", min_eig, ">= 0 (each term PSD; rounding ~1e-15)"),
        Headline("max_decomposition_residual_rel", residual, "0"),
        Headline("max_|TrM_A-bw_variance|_rel", tr_vs_var, "0"),
        Headline("max_(D-TrM_A)/D", lower, "<= 0"),
        Headline("max_(TrM_A-2D)/D", upper, "<= 0"),
        Headline("max_|TrM_A-D|/D_for_M=2", float(max(two)) if two else float("nan"), "0 (equality for 2 clients)"),
        Headline("median_TrM_A/D", float(np.median(ratio)), "in [1, 2]"),
        Headline("max_|Tr M_mu|_equal_means", zero_mu, "0"),
        Headline("max_|Tr M_Sigma|+|Tr M_A|_equal_covs", zero_cov, "0"),
    ]


def _plot_bounds(ax, s: Settings, random_recs: list[dict]) -> None:
    """Scatter ``Tr M_A`` against ``D`` per client count, with the lines ``D`` and ``2D``."""
    d = np.array([r["D"] for r in random_recs])
    tr = np.array([r["tr_m_a"] for r in random_recs])
    mm = np.array([r["M"] for r in random_recs])
    for M, c in zip(s.random_clients, ["C0", "C1", "C2", "C3"]):
        sel = mm == M
        ax.scatter(d[sel], tr[sel], s=8, color=c, alpha=0.6, label=f"$M={M}$")
    lim = np.array([max(d.min(), 1e-6) * 0.8, d.max() * 1.2])
    ax.plot(lim, lim, "k-", linewidth=1, label="$D$")
    ax.plot(lim, 2 * lim, "k--", linewidth=1, label="$2D$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"$D=\sum_{m<n} p_m p_n d_{BW}^2(G_m,G_n)$")
    ax.set_ylabel(TERM_TEX["M_A"])
    ax.set_title(r"$D \leq \mathrm{Tr}\,M_A \leq 2D$ (random instances)")
    ax.legend(fontsize="small")


def _figure(s: Settings, controlled: dict, random_recs: list[dict], sweeps: dict) -> Figure:
    """The six panels: controlled sweeps, bounds scatter, shares vs C / M / kappa."""
    fig, axes = new_figure(6, ncols=3, panel_size=(4.6, 3.8))
    ms = np.asarray(s.mean_scales)
    plot_error_curves(
        axes[0],
        ms,
        {TERM_TEX[k]: _trace_matrix(controlled["means"], k) for k in TERMS},
        logy=False,
        markers=["o", "s", "^"],
        xlabel="mean scale $s$",
        ylabel="trace of the term",
        title="means scaled by $s$ (median, IQR)",
    )
    cs = np.asarray(s.cov_scales)
    plot_error_curves(
        axes[1],
        cs,
        {TERM_TEX[k]: _trace_matrix(controlled["covs"], k) for k in TERMS},
        logy=False,
        markers=["o", "s", "^"],
        xlabel="covariance spread $s$",
        ylabel="trace of the term",
        title=r"$\Sigma_{\mathrm{within}} + s\,(\Sigma_m - \Sigma_{\mathrm{within}})$",
    )
    _plot_bounds(axes[2], s, random_recs)
    for ax, (name, label, logx) in zip(
        axes[3:],
        [
            ("C", "$C$ ($M = 4$)", False),
            ("M", "$M$ ($C = 3$)", True),
            ("kappa", r"margin $\kappa$ ($C = 3$, $M = 4$)", True),
        ],
    ):
        xs = np.array([float(k) for k in sweeps[name]])
        plot_error_curves(
            ax,
            xs,
            {f"{TERM_TEX[k]} share": _share_matrix(sweeps[name], k) for k in TERMS},
            logy=False,
            logx=logx,
            markers=["o", "s", "^"],
            xlabel=label,
            ylabel=r"$\mathrm{Tr}\,M \,/\, \mathrm{Tr}(G_{\mathrm{cen}} - G_\ast)$",
            title=f"share of the gap vs {SWEEP_TEX[name]}",
        )
        if logx:
            ax.minorticks_off()
            ax.set_xticks(xs, [f"{v:g}" for v in xs])
    return fig


def _plot(s: Settings, controlled: dict, random_recs: list[dict], sweeps: dict, out_dir: Path) -> list[Path]:
    """The six panels ([`_figure`][fedhead.experiments.gap_terms._figure]) into ``gap_terms.png``."""
    return [save_figure(_figure(s, controlled, random_recs, sweeps), out_dir / "gap_terms.png")]


def _results(s: Settings, controlled: dict, random_recs: list[dict], sweeps: dict) -> dict:
    """The ``results`` block of ``results.json``: quartiles per grid value plus every record."""
    return {
        "controlled": {
            "mean_scales": np.asarray(s.mean_scales),
            "cov_scales": np.asarray(s.cov_scales),
            "means": {k: quartiles(_trace_matrix(controlled["means"], k)) for k in TERMS},
            "covs": {k: quartiles(_trace_matrix(controlled["covs"], k)) for k in TERMS},
            "records": controlled,
        },
        "random": random_recs,
        "sweeps": {
            name: {
                "values": [float(v) for v in recs],
                "share": {k: quartiles(_share_matrix(recs, k)) for k in TERMS},
                "trace": {k: quartiles(_trace_matrix(recs, k)) for k in TERMS},
            }
            for name, recs in sweeps.items()
        },
    }


def run(settings: Settings, out_dir: str | Path) -> ExperimentResult:
    """Run the gap-term sweeps; write ``results.json`` and ``gap_terms.png``.

    Parameters
    ----------
    settings : Settings
        Sweep parameters (``Settings.quick()`` / ``Settings.full()``).
    out_dir : str or Path
        Folder for ``results.json`` and ``gap_terms.png``.

    Returns
    -------
    ExperimentResult
    """
    s = settings
    out_dir = Path(out_dir)
    rng = np.random.default_rng(s.seed)
    total = (
        len(s.controlled_seeds) + s.n_random + s.n_sweep * (len(s.sweep_dims) + len(s.sweep_clients) + len(s.kappas))
    )
    with progress(total=total, desc="gap_terms", unit="inst") as bar:
        controlled = _controlled(s, bar)
        random_recs = _random_records(s, rng, bar)
        sweeps = _sweeps(s, rng, bar)
    headline = _headline(controlled, random_recs, sweeps)
    figures = _plot(s, controlled, random_recs, sweeps, out_dir)
    results = _results(s, controlled, random_recs, sweeps)
    return finish(
        NAME, out_dir, s, {"instances": s.seed, "controlled": list(s.controlled_seeds)}, results, headline, figures
    )
