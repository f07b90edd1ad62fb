"""Write three sites' CSV files (``site_a.csv``, ``site_b.csv``, ``site_c.csv``) to try ``dataset=table``.

Each site measures the same five inputs ``f1..f5`` and two targets ``t1, t2``; the sites differ
in their input distribution and in how the targets depend on the inputs (a shared nonlinear map
plus a site-specific linear part), so their target covariances differ, as real sites' do.

    python make_sites.py [--rows 300] [--out .] [--sites 3]

``--sites N`` writes N files (``site_a.csv`` ... in letter order; the first three are the same
for every N).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def site_rows(rows: int, site: int, seed: int = 0) -> np.ndarray:
    """``(rows, 7)``: columns ``f1..f5, t1, t2`` of one site."""
    rng = np.random.default_rng([seed, site])
    x = rng.normal(loc=0.5 * site, scale=1.0 + 0.3 * site, size=(rows, 5))
    shared = np.stack([np.tanh(x[:, 0] + x[:, 1]), np.sin(x[:, 2]) * x[:, 3]], axis=1)
    own = x @ rng.normal(scale=0.5, size=(5, 2))
    y = shared + own + 0.1 * rng.normal(size=(rows, 2))
    return np.concatenate([x, y], axis=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300, help="rows per site (default 300)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the CSV files")
    parser.add_argument("--sites", type=int, default=3, choices=range(1, 27), metavar="N", help="sites (default 3)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for i in range(args.sites):
        name = f"site_{chr(ord('a') + i)}"
        path = args.out / f"{name}.csv"
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["f1", "f2", "f3", "f4", "f5", "t1", "t2"])
            writer.writerows(site_rows(args.rows, i).round(6).tolist())
        print(path)


if __name__ == "__main__":
    main()
