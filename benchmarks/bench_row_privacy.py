"""Benchmark: the moment exchange alone under row-level and under client-level differential privacy.

Per setting (data, sites ``M`` x rows per site ``n``) and ``epsilon`` (``delta`` = ``--delta``), each
repeat noises one exchange both ways and measures ``e_F`` of the noised pooled covariance and of the
noised ``G_cen`` (``phi(Sigma_cen)``, ``lambda_h = lambda_w = 0.01``) against the true ones:

* row-level ([`fedhead.federation.row_privacy`][fedhead.federation.row_privacy]): rows clipped to
  ``C = sqrt(chi2_d quantile 0.99)`` in the data's public units (declared, not read from the rows),
  discrete Gaussian shares on the secure sum's grid drawn by the sites (``m_min = M``), ``z`` from the
  accountant for one release over the ``M n`` rows;
* client-level (``privacy.dp_noise``, [`fedhead.federation.privacy_noise`][fedhead.federation.privacy_noise]):
  each site's per-row moment vector ``[1, mu_m, Sigma_m, mu_m mu_m^T]`` clipped to ``Delta`` = 1.1 times
  the largest site's norm, weight capped at ``K = n``, ``z`` for one release over ``M`` sites. A noised
  count <= 0 is a refused exchange (counted, no error).

Data: ``gauss10``: 10 targets, site ``m`` drawn from ``N(0.3 m / sqrt(10), D)`` with ``D`` a fixed
decaying diagonal (public units: the generator's); ``tutorial``: docs/own-data.md's sites
(``examples/own-data/make_sites.py``'s ``site_rows``, targets ``t1, t2``, public units: as written).

Usage::

    python benchmarks/bench_row_privacy.py --out /tmp/rowdp --figure docs/row_privacy.png
    python benchmarks/bench_row_privacy.py --quick          # seconds

Prints the table (medians; docs/privacy.md, "Row-level differential privacy") and writes
``OUT/points.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import random
import sys
import tempfile
import warnings
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
CELLS = (("gauss10", 3, 1000), ("gauss10", 3, 10000), ("gauss10", 3, 100000), ("gauss10", 10, 1000),
         ("gauss10", 10, 10000), ("tutorial", 3, 1000), ("tutorial", 3, 10000))  # fmt: skip
EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
CURVES = (("gauss10", 3, 10000), ("tutorial", 3, 10000))


def sites_of(data: str, sites: int, rows: int) -> list[np.ndarray]:
    """``sites`` arrays ``(rows, d)`` of targets in public units."""
    if data == "gauss10":
        scale = np.sqrt(np.linspace(1.6, 0.4, 10))
        gen = np.random.default_rng(0)
        return [gen.normal(size=(rows, 10)) * scale + 0.3 * m / math.sqrt(10) for m in range(sites)]
    spec = importlib.util.spec_from_file_location("make_sites", REPO / "examples" / "own-data" / "make_sites.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [module.site_rows(rows, m % 3, seed=m // 3)[:, 5:] for m in range(sites)]


def row_level(sites: list[np.ndarray], epsilon: float, delta: float, rng: random.Random) -> np.ndarray | None:
    dim, total_rows = sites[0].shape[1], sum(y.shape[0] for y in sites)
    clip = math.sqrt(float(stats.chi2.ppf(0.99, dim)))
    z = rp.noise_for_row_epsilon(epsilon, dim, clip, total_rows, delta)
    shares = [
        rp.site_share(rp.row_statistics(y, clip), dim, clip=clip, noise_multiplier=z, min_sites=len(sites), rng=rng)
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


def errors(cov: np.ndarray | None, true: np.ndarray) -> tuple[float, float]:
    """``(e_F(cov), e_F(G_cen))`` against the true covariance (nan, nan: refused)."""
    if cov is None:
        return math.nan, math.nan
    psd = sr.nearest_psd(cov)
    return float(relative_error(cov, true)), float(
        relative_error(ufm.optimal_gram(psd, LAMBDA, LAMBDA), ufm.optimal_gram(true, LAMBDA, LAMBDA))
    )


def measure(cell: tuple[str, int, int], epsilon: float, delta: float, repeats: int) -> dict:
    data, m, n = cell
    sites = sites_of(data, m, n)
    true = np.cov(np.vstack(sites).T, bias=True)
    rng, gen = random.Random(hash((data, m, n, epsilon)) % 2**32), np.random.default_rng([m, n, int(epsilon * 100)])
    rows, clients = [], []
    for _ in range(repeats):
        rows.append(errors(row_level(sites, epsilon, delta, rng), true))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clients.append(errors(client_level(sites, epsilon, delta, gen), true))
    point = {"data": data, "sites": m, "rows": n, "epsilon": epsilon}
    for name, values in (("row", np.array(rows)), ("client", np.array(clients))):
        point[f"{name}_cov"] = float(np.nanmedian(values[:, 0])) if np.isfinite(values[:, 0]).any() else None
        point[f"{name}_gcen"] = float(np.nanmedian(values[:, 1])) if np.isfinite(values[:, 1]).any() else None
        point[f"{name}_refused"] = int(np.isnan(values[:, 0]).sum())
    return point


def table(points: list[dict], epsilon: float) -> str:
    def cell(p: dict, name: str) -> str:
        cov, gcen, refused = p[f"{name}_cov"], p[f"{name}_gcen"], p[f"{name}_refused"]
        text = "refused" if cov is None else f"{cov:.3g} / {gcen:.3g}"
        return text + (f" ({refused} refused)" if refused and cov is not None else "")

    lines = [
        "| data | sites x rows | row-level e_F(cov) / e_F(G_cen) | client-level e_F(cov) / e_F(G_cen) |",
        "|---|---|---|---|",
    ]
    for p in points:
        if p["epsilon"] == epsilon:
            lines.append(f"| {p['data']} | {p['sites']} x {p['rows']:,} | {cell(p, 'row')} | {cell(p, 'client')} |")
    return "\n".join(lines)


def figure(points: list[dict], curves, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.8), squeeze=False)
    for ax, (data, m, n) in zip(axes[0], curves, strict=True):
        mine = [p for p in points if (p["data"], p["sites"], p["rows"]) == (data, m, n)]
        eps = [p["epsilon"] for p in mine]
        for name, style in (("row", "o-"), ("client", "s--")):
            ys = [math.nan if p[f"{name}_gcen"] is None else p[f"{name}_gcen"] for p in mine]
            ax.plot(eps, ys, style, label=f"{name}-level")
        ax.set(xscale="log", yscale="log", xlabel="epsilon (delta = 1e-6)", ylabel="e_F(noised G_cen, G_cen)")
        ax.set_title(f"{data}: {m} sites x {n:,} rows (exchange alone)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for points.json (default: a temporary one)")
    ap.add_argument("--figure", type=Path, default=None, help="the PNG (default OUT/row_privacy.png)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--quick", action="store_true", help="3 x 1,000 and 3 x 10,000 of gauss10 at epsilon 1, 2 repeats")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="fedhead-rowdp-"))
    out.mkdir(parents=True, exist_ok=True)
    cells, curves, repeats = CELLS, CURVES, args.repeats
    if args.quick:
        cells, curves, repeats = CELLS[:2], (CELLS[1],), 2
    points = [measure(c, 1.0, args.delta, repeats) for c in cells]
    points += [measure(c, e, args.delta, repeats) for c in curves for e in EPSILONS if e != 1.0]
    (out / "points.json").write_text(json.dumps({"delta": args.delta, "repeats": repeats, "points": points}, indent=1))
    print(f"epsilon = 1, delta = {args.delta:g}, median of {repeats} repeats")
    print(table(points, 1.0))
    figure(sorted(points, key=lambda p: p["epsilon"]), curves, args.figure or out / "row_privacy.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
