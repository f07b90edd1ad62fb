"""Benchmark: the moment exchange alone under row-level and under client-level differential privacy.

Per setting (data, sites ``M`` x rows per site ``n``) and ``epsilon`` (``delta`` = ``--delta``), each
repeat noises one exchange both ways and measures, against the true pooled covariance and ``G_cen``
(``phi(Sigma_cen)``, ``lambda_h = lambda_w = 0.01``), ``e_F`` of the noised covariance, of the noised
``G_cen`` and of corrected proximal's ``G_T`` (``gamma = 1``: every site fits
``corrected_covariance(Sigma_m, noised Sigma_cen, 1)``; ``T = 3`` rounds of the exact-selection
recursion from the sites' average Gram, [`fedhead.ufm.gram_recursion`][fedhead.ufm.gram_recursion]), next to
proximal's ``G_T`` (``gamma = 0``, no exchange: the gap the correction closes):

* row-level ([`fedhead.federation.row_privacy`][fedhead.federation.row_privacy]): rows clipped to
  ``C = sqrt(chi2_d quantile 0.99)`` in the data's public units (declared, not read from the rows;
  a sweep of ``C`` on the tutorial's sites), discrete Gaussian shares on the secure
  sum's grid drawn by the sites (``m_min = M``,
  [`site_release`][fedhead.federation.row_privacy.site_release]), ``z`` from the accountant for one
  release (``privacy.dp_noise``);
* client-level (``privacy.dp_noise``, [`fedhead.federation.privacy_noise`][fedhead.federation.privacy_noise]):
  each site's per-row moment vector ``[1, mu_m, Sigma_m, mu_m mu_m^T]`` clipped to ``Delta`` = 1.1 times
  the largest site's norm, weight capped at ``K = n``, ``z`` for one release over ``M`` sites. A noised
  count <= 0 is a refused exchange (counted, no error).

Data: ``gauss10``: 10 targets, site ``m`` drawn from ``N(0.3 m / sqrt(10), D)`` with ``D`` a fixed
decaying diagonal (public units: the generator's); ``tutorial``: docs/own-data.md's sites
(``examples/own-data/make_sites.py``'s ``site_rows``, targets ``t1, t2``, public units: as written, which
do not standardise them: its curves are drawn at the default ``C`` and at ``C = 8``);
``penguins`` (with ``--penguins``): the Palmer penguins' three species as sites (rows with all three
targets of ``benchmarks/bench_third_party_sites.py``: 151 / 68 / 123), in the public units of
``benchmarks/bench_privacy_cost.py`` (round values fixed without looking at the rows).

Usage::

    python benchmarks/bench_row_privacy.py --out /tmp/rowdp --figure docs/row_privacy.png \
        --penguins /tmp/pp/palmerpenguins/data/penguins.csv
    python benchmarks/bench_row_privacy.py --quick          # seconds

(``penguins.csv``: ``pip download --no-deps palmerpenguins==0.1.6`` and unzip, see
bench_third_party_sites.py.)

Prints the table (medians; docs/privacy.md, "Row-level differential privacy") and writes
``OUT/points.json``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import random
import sys
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fedhead import ufm  # noqa: E402
from fedhead.analysis.metrics import relative_error  # noqa: E402
from fedhead.federation import row_privacy as rp  # noqa: E402
from fedhead.federation import secure_records as sr  # noqa: E402
from fedhead.federation.privacy_noise import dp_contribution, noise_for_epsilon  # noqa: E402

LAMBDA = 0.01  # lambda_h = lambda_w (conf default)
ROUNDS = 3  # T of corrected proximal's G_T
CELLS = (("gauss10", 3, 1000), ("gauss10", 3, 10000), ("gauss10", 3, 100000), ("gauss10", 10, 1000),
         ("gauss10", 10, 10000), ("tutorial", 3, 1000), ("tutorial", 3, 10000))  # fmt: skip
EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
CURVES = (("gauss10", 3, 10000), ("tutorial", 3, 1000), ("tutorial", 3, 10000))
PENGUINS = ("penguins", 3, 0)  # the species' own rows
CLIPS = (1.5, 5.0, 8.0, 12.0)  # the sweep of C on the tutorial's 3 x 10,000 rows (with the default's 3.0)
WIDE_CLIP = 8.0  # the tutorial's curves again at this C (about 1 % of its rows clip in its written units)


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def penguin_sites(csv_path: Path) -> list[np.ndarray]:
    """The species' rows of the third-party benchmark's targets (all three present), in public units."""
    targets = _module(REPO / "benchmarks" / "bench_third_party_sites.py", "bench_third_party_sites").TARGETS
    units = _module(REPO / "benchmarks" / "bench_privacy_cost.py", "bench_privacy_cost").PUBLIC_UNITS
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for species in sorted({r["species"] for r in rows}):
        mine = [r for r in rows if r["species"] == species and all(r[t] not in ("", "NA") for t in targets)]
        out.append(np.array([[(float(r[t]) - units[t][0]) / units[t][1] for t in targets] for r in mine]))
    return out


def sites_of(data: str, sites: int, rows: int, penguins: Path | None = None) -> list[np.ndarray]:
    """``sites`` arrays ``(rows, d)`` of targets in public units."""
    if data == "gauss10":
        scale = np.sqrt(np.linspace(1.6, 0.4, 10))
        gen = np.random.default_rng(0)
        return [gen.normal(size=(rows, 10)) * scale + 0.3 * m / math.sqrt(10) for m in range(sites)]
    if data == "penguins":
        assert penguins is not None
        return penguin_sites(penguins)
    module = _module(REPO / "examples" / "own-data" / "make_sites.py", "make_sites")
    return [module.site_rows(rows, m % 3, seed=m // 3)[:, 5:] for m in range(sites)]


def default_clip(dim: int) -> float:
    """``C = sqrt(chi2_d quantile 0.99)``: about 1 % of standard Gaussian rows clip."""
    return math.sqrt(float(stats.chi2.ppf(0.99, dim)))


def row_level(sites: list[np.ndarray], epsilon: float, delta: float, rng: random.Random, clip: float):
    """The pooled covariance of one row-level exchange (None: the noised count is not positive)."""
    dim = sites[0].shape[1]
    z = rp.noise_for_row_epsilon(epsilon, sum(y.shape[0] for y in sites), delta)
    shares = [
        rp.site_release(y, clip=clip, noise_multiplier=z, min_sites=len(sites), sites=len(sites), rng=rng)
        for y in sites
    ]
    total = np.sum(shares, axis=0)
    return None if total[0] <= 0 else rp.pooled_moments(total, dim).cov


def client_level(sites: list[np.ndarray], epsilon: float, delta: float, gen: np.random.Generator) -> np.ndarray | None:
    dim = sites[0].shape[1]
    vectors = [sr.moment_vector(1.0, y.mean(axis=0), np.cov(y.T, bias=True)) for y in sites]
    clip = 1.1 * max(float(np.linalg.norm(v)) for v in vectors)
    cap = max(y.shape[0] for y in sites)
    z = noise_for_epsilon(epsilon, 1, len(sites), delta)
    total = np.sum(
        [
            dp_contribution(
                v * y.shape[0], y.shape[0], clip=clip, max_rows=cap, noise_multiplier=z, min_sites=len(sites), rng=gen
            )
            for v, y in zip(vectors, sites, strict=True)
        ],
        axis=0,
    )
    return None if total[0] <= 0 else sr.read_moments(total, dim).cov


def corrected_gram(sites: list[np.ndarray], sigma_cen: np.ndarray | None, gamma: float) -> np.ndarray:
    """``G_T`` of the exact-selection recursion after ``ROUNDS`` rounds, the sites fitting
    ``corrected_covariance(Sigma_m, sigma_cen, gamma)`` (gamma 1: corrected proximal; 0: proximal)."""
    covs = np.array([np.cov(y.T, bias=True) for y in sites])
    weights = np.array([y.shape[0] for y in sites], dtype=np.float64)
    weights /= weights.sum()
    grams = np.array([ufm.optimal_gram(c, LAMBDA, LAMBDA) for c in covs])
    fitted = ufm.corrected_covariance(covs, sigma_cen, gamma)
    targets = np.array([ufm.optimal_gram(c, LAMBDA, LAMBDA) for c in fitted])
    return ufm.gram_recursion(np.einsum("m,mij->ij", weights, grams), targets, weights, ROUNDS)[-1]


def errors(sites: list[np.ndarray], cov: np.ndarray | None, true: np.ndarray) -> tuple[float, float, float]:
    """``(e_F(cov), e_F(G_cen), e_F(G_T))`` against the true covariance and ``G_cen`` (nans: refused)."""
    if cov is None:
        return math.nan, math.nan, math.nan
    psd = sr.nearest_psd(cov)
    g_cen = ufm.optimal_gram(true, LAMBDA, LAMBDA)
    try:
        g_t = float(relative_error(corrected_gram(sites, psd, 1.0), g_cen))
    except (np.linalg.LinAlgError, ValueError):  # a rank-deficient Gram (noised Sigma_cen outside the regime)
        g_t = math.nan
    return float(relative_error(cov, true)), float(relative_error(ufm.optimal_gram(psd, LAMBDA, LAMBDA), g_cen)), g_t


def measure(cell, epsilon: float, delta: float, repeats: int, *, penguins=None, clip=None) -> dict:
    data, m, n = cell
    sites = sites_of(data, m, n, penguins)
    true = np.cov(np.vstack(sites).T, bias=True)
    c = default_clip(true.shape[0]) if clip is None else float(clip)
    seed = zlib.crc32(repr((data, m, n, epsilon, round(c, 6))).encode())  # the same draws in every process
    rng, gen = random.Random(seed), np.random.default_rng([m, n, int(epsilon * 100)])
    rows, clients = [], []
    for _ in range(repeats):
        rows.append(errors(sites, row_level(sites, epsilon, delta, rng, c), true))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clients.append(errors(sites, client_level(sites, epsilon, delta, gen), true))
    g_cen = ufm.optimal_gram(true, LAMBDA, LAMBDA)
    point = {"data": data, "sites": m, "rows": int(sites[0].shape[0]) if n == 0 else n, "epsilon": epsilon}
    point["clip"], point["clipped"] = c, float(np.mean(np.linalg.norm(np.vstack(sites), axis=1) > c))
    point["proximal_gt"] = float(relative_error(corrected_gram(sites, None, 0.0), g_cen))
    for name, values in (("row", np.array(rows)), ("client", np.array(clients))):
        for k, key in enumerate(("cov", "gcen", "gt")):
            col = values[:, k]
            point[f"{name}_{key}"] = float(np.nanmedian(col)) if np.isfinite(col).any() else None
        point[f"{name}_refused"] = int(np.isnan(values[:, 0]).sum())
        point[f"{name}_undefined"] = int((np.isnan(values[:, 2]) & ~np.isnan(values[:, 0])).sum())
    return point


def table(points: list[dict], epsilon: float) -> str:
    def cell(p: dict, name: str) -> str:
        cov, gcen, gt, refused, undefined = (p[f"{name}_{k}"] for k in ("cov", "gcen", "gt", "refused", "undefined"))
        shown = ("-" if v is None or not math.isfinite(v) else f"{v:.2g}" for v in (cov, gcen, gt))
        text = "refused" if cov is None else " / ".join(shown)
        notes = [f"{refused} refused"] * bool(refused and cov is not None) + [f"{undefined} no G_T"] * bool(undefined)
        return text + (f" ({', '.join(notes)})" if notes else "")

    lines = [
        "| data | sites x rows | C (rows clipped) | row-level e_F cov / G_cen / G_T | "
        "client-level e_F cov / G_cen / G_T | proximal G_T |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        if p["epsilon"] == epsilon:
            size = f"{p['sites']} x {p['rows']:,}" if p["data"] != "penguins" else "3 species (151 / 68 / 123)"
            lines.append(
                f"| {p['data']} | {size} | {p['clip']:.2g} ({100 * p['clipped']:.2g} %) | {cell(p, 'row')} | "
                f"{cell(p, 'client')} | {p['proximal_gt']:.2g} |"
            )
    return "\n".join(lines)


def figure(points: list[dict], curves, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 4.1), squeeze=False)
    for ax, (data, m, n) in zip(axes[0], curves, strict=True):
        mine = [p for p in points if (p["data"], p["sites"]) == (data, m) and (n == 0 or p["rows"] == n)]
        clips = sorted({p["clip"] for p in mine if p["epsilon"] != 1.0})
        for c, marker in zip(clips, ("o", "s"), strict=False):
            line = sorted((p for p in mine if p["clip"] == c), key=lambda p: p["epsilon"])
            eps = [p["epsilon"] for p in line]
            for name, colour in (("row", "C0"), ("client", "C3")):
                if name == "client" and c != clips[0]:
                    continue  # the client-level mechanism has no row clip
                where = f" (C = {c:.2g})" if name == "row" else ""
                ys = [math.nan if p[f"{name}_gcen"] is None else p[f"{name}_gcen"] for p in line]
                ax.plot(eps, ys, f"{marker}-", color=colour, alpha=1.0 if c == clips[0] else 0.6,
                        label=f"{name}-level noised G_cen{where}")  # fmt: skip
                ys = [math.nan if p[f"{name}_gt"] is None else p[f"{name}_gt"] for p in line]
                ax.plot(eps, ys, "x:", color=colour, label=f"{name}-level corrected proximal G_T{where}")
        if mine:
            ax.axhline(mine[0]["proximal_gt"], color="grey", ls="--", lw=1, label="proximal G_T (no correction)")
        ax.axhline(0.02, color="k", lw=0.6, alpha=0.5)
        ax.set(xscale="log", yscale="log", xlabel="epsilon (delta = 1e-6)", ylabel="e_F against the true G_cen")
        ax.xaxis.set_major_locator(FixedLocator(list(EPSILONS)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        title = "penguins: 3 species, 342 rows" if data == "penguins" else f"{data}: {m} sites x {n:,} rows"
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    fig.suptitle("The moment exchange alone: row-level and client-level DP at the same epsilon", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for points.json (default: a temporary one)")
    ap.add_argument("--figure", type=Path, default=None, help="the PNG (default OUT/row_privacy.png)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--penguins", type=Path, default=None, help="penguins.csv of the palmerpenguins package")
    ap.add_argument("--quick", action="store_true", help="3 x 1,000 and 3 x 10,000 of gauss10 at epsilon 1, 2 repeats")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="fedhead-rowdp-"))
    out.mkdir(parents=True, exist_ok=True)
    cells, curves, repeats = list(CELLS), list(CURVES), args.repeats
    if args.penguins is not None:
        cells.append(PENGUINS)
        curves.append(PENGUINS)
    if args.quick:
        cells, curves, repeats = CELLS[:2], [CELLS[1]], 2
    kw = {"penguins": args.penguins}
    points = [measure(c, 1.0, args.delta, repeats, **kw) for c in cells]
    points += [measure(c, e, args.delta, repeats, **kw) for c in curves for e in EPSILONS if e != 1.0]
    if not args.quick:
        points += [measure(("tutorial", 3, 10000), 1.0, args.delta, repeats, clip=c) for c in CLIPS]
        wide = [c for c in curves if c[0] == "tutorial"]
        points += [measure(c, e, args.delta, repeats, clip=WIDE_CLIP) for c in wide for e in EPSILONS]
    points = list({(p["data"], p["sites"], p["rows"], p["epsilon"], p["clip"]): p for p in points}.values())
    (out / "points.json").write_text(json.dumps({"delta": args.delta, "repeats": repeats, "points": points}, indent=1))
    print(f"epsilon = 1, delta = {args.delta:g}, median of {repeats} repeats")
    print(table(points, 1.0))
    figure(sorted(points, key=lambda p: p["epsilon"]), curves, args.figure or out / "row_privacy.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
