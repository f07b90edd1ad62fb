"""Benchmark: ``fedhead-run`` on a real federation no one here wrote (Palmer penguins, natural sites).

Issue 20's goal, measured: on real third-party data with natural sites (a few hundred rows per
site, 2-8 sites), with ``model=resmlp_small`` on a CPU, the diagnosis's ``G_cen`` equals the one of
the pooled rows to 1e-8, ``corrected_proximal`` ends within 1e-2 of ``G_cen``, ``proximal`` within
1e-2 of ``G_star``, each run in at most 3 minutes, with overrides only (no fedhead file changes).

The data: ``penguins.csv`` of the ``palmerpenguins`` package (PyPI, CC0; Horst, Hill & Gorman,
Palmer Station LTER): 344 penguins of three species on three islands, measured 2007-2009. It is
not a fedhead dependency; get the file with::

    pip download --no-deps palmerpenguins==0.1.6 -d /tmp/pp
    python -m zipfile -e /tmp/pp/palmerpenguins-0.1.6-py3-none-any.whl /tmp/pp
    # the files: /tmp/pp/palmerpenguins/data/penguins.csv and penguins-raw.csv

What the script does, in one process (the two runs are ``python -m fedhead.cli.run``, i.e.
``fedhead-run``, as subprocesses):

1. Writes one CSV per site (``--sites species``: Adelie 152, Chinstrap 68, Gentoo 124 rows;
   ``--sites island``: Biscoe 168, Dream 124, Torgersen 52) holding the numeric columns a user
   would prepare: the targets (``--targets``, default flipper length, body mass, bill depth),
   the other measurements and ``year`` as inputs, the blood isotope ratios ``d15n``, ``d13c``
   of ``penguins-raw.csv`` (``--inputs isotopes``, the default; the two files list the same
   penguins in the same order, checked), ``male`` (0/1 from ``sex``) and one 0/1 column per
   value of the other grouping (island or species). Missing values stay ``NA``: the runs drop
   those rows with ``dataset.missing=drop`` (2 rows without measurements, 9 more without sex,
   and with the isotopes 9 more without them: 139 / 67 / 118 rows by species).
   ``--inputs basic`` leaves the isotopes out: then some rows of a site share every input
   (Gentoo: 119 rows, 107 distinct inputs), so no backbone can give them the different
   features the local optimum needs, and every client stays far from it (README).
2. Computes ``G_cen`` directly from the pooled rows of those files (the same rows dropped): the
   targets standardised with the pooled mean and population std, ``phi(Sigma)``
   (:func:`fedhead.ufm.optimal_gram`) at the run's ``lambda_H = lambda_W = 0.01``.
3. Runs ``fedhead-run dataset=table dataset.files=[...] dataset.targets=[...]
   dataset.missing=drop model=resmlp_small procedure=P`` for P = proximal and corrected_proximal
   (the default experiment otherwise: 3 rounds, up to 2000 local epochs, ``local_tol=1e-4``,
   lr 3e-3; ``--extra`` appends overrides), each client reading only its own file.
4. Prints, per run: the largest difference between results.json's ``targets.g_cen`` and the
   direct one, e_F(G_T, G_star) (proximal) or e_F(G_T, G_cen) (corrected proximal) per round,
   the largest relative gap of a client to its local optimum in the last round, the smallest
   fully active margin, and the wall time of the subprocess (start-up of Ray included).

Usage::

    python benchmarks/bench_third_party_sites.py --csv /tmp/pp/palmerpenguins/data/penguins.csv
    python benchmarks/bench_third_party_sites.py --csv penguins.csv --sites island --out /tmp/penguins

Measured: README, "Your own data and backbone" (a real federation: Palmer penguins).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedhead import ufm
from fedhead.analysis.metrics import relative_error
from fedhead.results import schema
from fedhead.results.io import atomic_open

TARGETS = ("flipper_length_mm", "body_mass_g", "bill_depth_mm")
GROUPS = ("species", "island")
MEASUREMENTS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g", "year")
MISSING = ("", "NA", "NaN")
PROCEDURES = (("proximal", "g_star"), ("corrected_proximal", "g_cen"))
LAMBDA = 0.01  # conf/config.yaml's lambda_h and lambda_w (the runs keep them)


def _number(text: str) -> float:
    return math.nan if text.strip() in MISSING else float(text)


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def isotopes(csv_path: Path, raw_path: Path) -> list[tuple[str, str]]:
    """The blood isotope ratios (delta 15N, delta 13C) of every row of ``penguins.csv``, from ``penguins-raw.csv``.

    The two files list the same penguins in the same order; every row's measurements are checked.
    """
    rows, raw = _read(csv_path), _read(raw_path)
    pairs = (("bill_length_mm", "Culmen Length (mm)"), ("body_mass_g", "Body Mass (g)"))
    if len(rows) != len(raw) or any(r[a] != q[b] for r, q in zip(rows, raw) for a, b in pairs):
        sys.exit(f"--raw {raw_path}: its rows are not those of {csv_path} (another palmerpenguins version?)")
    return [(q["Delta 15 N (o/oo)"], q["Delta 13 C (o/oo)"]) for q in raw]


def write_sites(
    csv_path: Path, sites: str, targets: tuple[str, ...], folder: Path, raw_path: Path | None = None
) -> list[Path]:
    """One CSV per value of ``sites`` (sorted), with numeric columns only (see the module docstring).

    With ``raw_path`` (``penguins-raw.csv``) the inputs also hold ``d15n`` and ``d13c``.

    Returns
    -------
    list of Path
        The site files, in the sorted order of the site values.
    """
    rows = _read(csv_path)
    iso = isotopes(csv_path, raw_path) if raw_path is not None else None
    other = GROUPS[1 - GROUPS.index(sites)]
    levels = sorted({r[other] for r in rows})
    inputs = [c for c in MEASUREMENTS if c not in targets]
    header = [*targets, *inputs, *(("d15n", "d13c") if iso else ()), "male", *(f"{other}_{v}" for v in levels)]
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for site in sorted({r[sites] for r in rows}):
        lines = [header]
        for i, r in enumerate(rows):
            if r[sites] != site:
                continue
            sex = r["sex"].strip()
            values = [*(r[c] for c in (*targets, *inputs)), *(iso[i] if iso else ())]
            values = ["NA" if v.strip() in MISSING else v for v in values]
            male = "NA" if sex in MISSING else str(int(sex == "male"))
            lines.append([*values, male, *(str(int(r[other] == v)) for v in levels)])
        path = folder / f"penguins_{site.lower()}.csv"
        with atomic_open(path) as fh:
            fh.write("".join(",".join(line) + "\n" for line in lines).encode())
        out.append(path)
    return out


def pooled_g_cen(files: list[Path], n_targets: int) -> tuple[np.ndarray, list[int]]:
    """``G_cen`` of the pooled rows of ``files`` (rows with a missing value dropped) and each file's row count."""
    blocks = []
    for f in files:
        with open(f, newline="") as fh:
            table = np.array([[_number(v) for v in row] for row in list(csv.reader(fh))[1:]])
        blocks.append(table[np.isfinite(table).all(axis=1), :n_targets])
    y = np.concatenate(blocks)
    ys = (y - y.mean(axis=0)) / y.std(axis=0)
    return ufm.optimal_gram(np.cov(ys.T, bias=True), LAMBDA, LAMBDA), [len(b) for b in blocks]


def run(procedure: str, files: list[Path], targets: tuple[str, ...], out: Path, extra: list[str]) -> tuple[Path, float]:
    """``fedhead-run`` of one procedure on ``files``; the results.json path and the wall seconds."""
    cmd = [
        sys.executable,
        "-m",
        "fedhead.cli.run",
        "dataset=table",
        f"dataset.files=[{','.join(str(f) for f in files)}]",
        f"dataset.targets=[{','.join(targets)}]",
        "dataset.missing=drop",
        "model=resmlp_small",
        f"procedure={procedure}",
        f"hydra.run.dir={out}",
        *extra,
    ]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:  # its one-line error (and the progress bars before it)
        sys.exit(f"fedhead-run {procedure} failed (exit status {done.returncode}):\n{done.stderr[-2000:]}")
    return out / procedure / schema.FILE_NAME, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, required=True, help="palmerpenguins' data/penguins.csv")
    ap.add_argument("--sites", choices=GROUPS, default="species", help="the natural sites (default species)")
    ap.add_argument(
        "--inputs",
        choices=("isotopes", "basic"),
        default="isotopes",
        help="isotopes (default): also the blood isotope ratios of penguins-raw.csv; basic: penguins.csv only",
    )
    ap.add_argument("--raw", type=Path, default=None, help="penguins-raw.csv (default: next to --csv)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated target columns")
    ap.add_argument("--out", type=Path, default=None, help="folder for the site files and runs (default: temporary)")
    ap.add_argument("--extra", nargs="*", default=[], help="further fedhead-run overrides for both runs")
    args = ap.parse_args()
    if not args.csv.is_file():
        sys.exit(f"--csv {args.csv}: no such file (pip download palmerpenguins; see this script's docstring)")
    targets = tuple(t for t in args.targets.split(",") if t)
    root = args.out or Path(tempfile.mkdtemp(prefix="fedhead-penguins-"))
    raw = None
    if args.inputs == "isotopes":
        raw = args.raw or args.csv.with_name("penguins-raw.csv")
        if not raw.is_file():
            sys.exit(f"--raw {raw}: no such file (palmerpenguins' data/penguins-raw.csv, or --inputs basic)")
    files = write_sites(args.csv, args.sites, targets, root / "sites", raw)
    g_cen, counts = pooled_g_cen(files, len(targets))
    print(f"sites by {args.sites}: " + ", ".join(f"{f.name} ({n} rows)" for f, n in zip(files, counts)))
    print(f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}\n")
    report = []
    for procedure, reference in PROCEDURES:
        path, seconds = run(procedure, files, targets, root / procedure, args.extra)
        res = schema.read(path)
        errors = [relative_error(r.gram, res.target(reference)) for r in res.rounds[1:]]
        report.append(
            {
                "procedure": procedure,
                "reference": reference,
                "status": res.status,
                "g_cen_max_abs_diff": float(np.abs(res.target("g_cen") - g_cen).max()),
                "counts": res.dataset.counts,
                "min_margin": float(min(res.diagnosis["margins"])),
                "e_f_per_round": errors,
                "max_local_gap": res.local_optimality.last_round_max_trained_gap,
                "wall_seconds": seconds,
                "results": str(path),
            }
        )
    print(f"\n{'procedure':<20} {'vs':<7} {'|G_cen-pooled|':>14} {'e_F per round':<28} {'local gap':>9} {'wall s':>7}")
    for r in report:
        e_f = " / ".join(f"{e:.1e}" for e in r["e_f_per_round"])
        print(
            f"{r['procedure']:<20} {r['reference']:<7} {r['g_cen_max_abs_diff']:>14.1e} {e_f:<28} "
            f"{r['max_local_gap']:>9.1e} {r['wall_seconds']:>7.1f}"
        )
    print(f"counts {report[0]['counts']}, smallest fully active margin {report[0]['min_margin']:.3g}")
    with atomic_open(root / "bench_third_party_sites.json") as fh:
        fh.write(json.dumps(report, indent=2).encode())
    print(f"written: {root / 'bench_third_party_sites.json'}")


if __name__ == "__main__":
    main()
