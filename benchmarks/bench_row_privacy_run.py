"""Benchmark: the whole run under row-level differential privacy, exchange and heads, against epsilon.

The own-data tutorial's three sites (``examples/own-data/make_sites.py --rows R``; 80 % of each
site's rows train, ``delta = 1/N`` of the training rows), kept in their files' units
(``dataset.standardize_targets=none dataset.standardize_inputs=none``, so that the row clip ``C``
is public), ``model=resmlp_small``, ``--rounds`` rounds of ``--epochs`` local epochs, run with
``fedhead-run`` as a user runs it:

1. ``true``: ``procedure=exact`` in clear mode, one round: the true ``G_cen`` of the training rows.
2. per DP-SGD noise multiplier ``sigma`` of ``--sigma``: ``procedure=corrected_proximal`` (and,
   with ``--proximal``, ``proximal``) with ``privacy.mode=secure privacy.dp_unit=row`` (the
   row-level exchange at ``--exchange-noise`` with ``C = --clip``; each site's correction reads its
   ``Sigma_m`` from its own release) and ``train.dp_noise=sigma`` (DP-SGD, Poisson rate
   ``--sample-rate``, clip ``--dp-clip``), ``resources.evaluate_mse=false``.
3. ``closed forms``: ``procedure=exact +procedure.gamma=1`` under the same row-level exchange: each site's head
   is the exact rule's closed form of its own released moments (no training, no further epsilon).
4. with ``--reference``: ``corrected_proximal`` without any differential privacy (clear mode, the same
   recipe): what the optimiser reaches in these rounds without noise.
5. with ``--client-level``: the trained runs with the client-level exchange (``privacy.dp_unit=site``)
   at the same ``z``: refused or off, as docs/privacy.md section 8 predicts.

Each run: ``e_F(G_t, G_cen_true)`` after every round and ``rounds[t].row_epsilon`` (the whole run,
one row, at ``delta``), from its results.json; a run the noise breaks is reported with its error's
first line. Written to ``OUT/points.json``; the table is printed; ``--figure``: each run's ``e_F(G_t, G_cen_true)``
against its epsilon so far, round by round (``--replot DIR ...``: the tables again and one panel per earlier
run's ``points.json``, e.g. 1,000 and 10,000 rows side by side).

Usage::

    python benchmarks/bench_row_privacy_run.py --rows 1000 --out /tmp/rowrun
    python benchmarks/bench_row_privacy_run.py --rows 10000 --sample-rate 0.01 --epochs 5 --lr 3e-3 --dp-clip 5 \\
        --out /tmp/rowrun10k

Measured: docs/privacy.md section 10, "The whole run".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def e_f(a, b) -> float:
    """``||A - B||_F / ||B||_F``."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@dataclass(frozen=True)
class Sites:
    """A federation's site files, its targets, each site's complete rows and the overrides it needs."""

    label: str
    files: list[Path]
    targets: tuple[str, ...]
    rows: list[int]
    extra: tuple[str, ...] = ()

    @property
    def n_train(self) -> int:
        """The training rows (80 % of each site's): ``1/N`` is the runs' ``delta``."""
        return sum(round(0.8 * n) for n in self.rows)


def tutorial_sites(rows: int, folder: Path) -> Sites:
    """The own-data tutorial's three sites of ``rows`` rows (``examples/own-data/make_sites.py``)."""
    make = [sys.executable, str(ROOT / "examples/own-data/make_sites.py"), "--rows", str(rows), "--out", str(folder)]
    subprocess.run(make, check=True, capture_output=True)
    return Sites(f"{rows:,} rows per site", [folder / f"site_{c}.csv" for c in "abc"], ("t1", "t2"), [rows] * 3)


def penguin_sites(csv_path: Path, folder: Path) -> Sites:
    """The Palmer penguins' three species sites in public units (bench_privacy_cost.py's ``penguins`` setting:
    each column shifted and scaled by a round field-guide value); the rows with a missing value are dropped."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_privacy_cost

    setting = next(s for s in bench_privacy_cost.penguin_sites(csv_path, folder) if s.name == "penguins")
    rows = [sum("NA" not in line.split(",") for line in f.read_text().splitlines()[1:]) for f in setting.files]
    label = "Palmer penguins (3 species)"
    return Sites(label, list(setting.files), tuple(setting.targets), rows, ("dataset.missing=drop",))


def common(sites: Sites) -> list[str]:
    """The overrides of every run: the sites in their files' units, the DP-SGD recipe, delta = 1/N."""
    return [
        "dataset=table",
        f"dataset.files=[{','.join(str(f) for f in sites.files)}]",
        f"dataset.targets=[{','.join(sites.targets)}]",
        *sites.extra,
        "dataset.test_fraction=0.2",
        "dataset.standardize_targets=none",
        "dataset.standardize_inputs=none",
        "model=resmlp_small",
        "local_tol=null",
        "train.optimal_bias=false",
        "train.solve_last_layer=false",
        "train.finish_features=false",
        "resources.evaluate_mse=false",
        f"privacy.dp_delta={1.0 / sites.n_train!r}",
    ]


def run(overrides: list[str], out: Path, procedure: str) -> dict:
    """One ``fedhead-run``; its results.json, or ``{"error": first line}``."""
    cmd = [sys.executable, "-m", "fedhead.cli.run", *overrides, f"procedure={procedure}", f"output.dir={out}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent)
    results = out / procedure / "results.json"
    if done.returncode != 0 or not results.is_file():
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln.lower()] or done.stderr.splitlines()[-1:]
        return {"error": lines[-1] if lines else f"exit {done.returncode}"}
    return json.loads(results.read_text())


def point(name: str, res: dict, g_true) -> dict:
    """What the table shows of one run."""
    if "error" in res:
        return {"run": name, "error": res["error"]}
    rounds = res["rounds"]
    return {
        "run": name,
        "e_f_true": [e_f(r["gram"], g_true) for r in rounds],
        "row_epsilon": [r.get("row_epsilon", r.get("dp_epsilon")) for r in rounds],
        "g_cen_e_f": e_f(res["targets"]["g_cen"], g_true),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1000, help="rows per site of the tutorial's sites (default 1000)")
    ap.add_argument("--penguins", type=Path, default=None, help="penguins.csv: the Palmer penguins' species sites")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=20, help="local epochs per round")
    ap.add_argument("--sigma", type=float, nargs="*", default=[1.2], help="DP-SGD noise multipliers (none: no run)")
    ap.add_argument("--sample-rate", type=float, default=0.02, help="DP-SGD Poisson rate q")
    ap.add_argument("--dp-clip", type=float, default=1.0, help="DP-SGD per-row gradient clip (train.dp_clip)")
    ap.add_argument("--lr", type=float, default=1e-3, help="train.lr")
    ap.add_argument("--exchange-noise", type=float, default=4.53, help="the row-level exchange's z")
    ap.add_argument("--clip", type=float, default=8.0, help="the exchange's row clip C (the files' units)")
    ap.add_argument("--proximal", action="store_true", help="also proximal, without the correction")
    ap.add_argument("--client-level", action="store_true", help="also the client-level exchange")
    ap.add_argument("--reference", action="store_true", help="also corrected_proximal without DP")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_row_privacy_run"))
    ap.add_argument("--figure", type=Path, default=None, help="where to draw the figure (PNG)")
    ap.add_argument("--replot", type=Path, nargs="+", default=None, help="earlier OUT folders: tables and figure")
    args = ap.parse_args(argv)
    if args.replot:
        panels = []
        for folder in args.replot:
            saved = json.loads((folder / "points.json").read_text())
            settings = argparse.Namespace(**{**vars(args), **saved.get("args", {})})
            label = saved.get("label", f"{settings.rows:,} rows per site")
            print_table(saved["points"], settings, label)
            panels.append((label, saved["points"]))
        if args.figure is not None:
            plot(panels, args.figure)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.penguins is not None:
        sites = penguin_sites(args.penguins, args.out / "penguins")
    else:
        sites = tutorial_sites(args.rows, args.out / f"sites{args.rows}")
    base = common(sites)
    truth = run([*base, "rounds=1"], args.out / "true", "exact")
    if "error" in truth:
        raise SystemExit(f"the clear reference failed: {truth['error']}")
    g_true = truth["targets"]["g_cen"]
    row = ["privacy.mode=secure", f"privacy.dp_noise={args.exchange_noise}", f"privacy.dp_clip={args.clip}"]
    row += [
        f"privacy.dp_max_rows={round(0.8 * max(sites.rows))}",
        f"rounds={args.rounds}",
        f"local_epochs={args.epochs}",
    ]
    closed = run([*base, *row, "privacy.dp_unit=row", "+procedure.gamma=1.0"], args.out / "closed_forms", "exact")
    points = [point("closed forms (exact, gamma = 1) row-level", closed, g_true)]
    print(json.dumps(points[-1]), flush=True)
    if args.reference:
        clear = [f"rounds={args.rounds}", f"local_epochs={args.epochs}"]
        reference = run([*base, *clear], args.out / "no_dp", "corrected_proximal")
        points.append(point("corrected_proximal no DP", reference, g_true))
        print(json.dumps(points[-1]), flush=True)
    for sigma in args.sigma:
        dp_sgd = [f"train.dp_noise={sigma}", f"train.dp_sample_rate={args.sample_rate}"]
        dp_sgd += [f"train.dp_clip={args.dp_clip}", f"train.lr={args.lr}"]
        units = [("row", "privacy.dp_unit=row")] + ([("site", "privacy.dp_unit=site")] if args.client_level else [])
        procedures = ["corrected_proximal"] + (["proximal"] if args.proximal else [])
        for unit, setting in units:
            for procedure in procedures:
                name = f"{procedure} {unit}-level sigma={sigma:g}"
                out = args.out / name.replace(" ", "_").replace("=", "")
                res = run([*base, *row, *dp_sgd, setting], out, procedure)
                points.append(point(name, res, g_true))
                print(json.dumps(points[-1]), flush=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    (args.out / "points.json").write_text(json.dumps({"args": settings, "label": sites.label, "points": points}))
    print_table(points, args, sites.label)
    if args.figure is not None:
        plot([(sites.label, points)], args.figure)


def plot(panels: list[tuple[str, list[dict]]], path: Path) -> None:
    """One panel per ``(title, points)``: each run's ``e_F(G_t, G_cen_true)`` against its epsilon so far, one
    marker per round (log scales); a run without a finite epsilon as its last round's level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), sharey=True, squeeze=False)
    for ax, (title, points) in zip(axes[0], panels, strict=True):
        for p in points:
            if "error" in p:
                continue
            finite = [(e, f) for e, f in zip(p["row_epsilon"], p["e_f_true"], strict=True) if e and e < 1e300]
            if finite:
                ax.plot(*zip(*finite, strict=True), marker="o", label=p["run"])
            else:
                ax.axhline(p["e_f_true"][-1], ls=":", color="grey", label=f"{p['run']} (last round)")
        ax.axhline(0.1, ls="--", color="k", lw=0.8, label="goal e_F = 0.1")
        ax.set(xscale="log", yscale="log", xlabel="row-level epsilon so far (delta = 1/N)", title=title)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("e_F(G_t, G_cen true)")
    fig.suptitle("The whole run, round by round (first marker: the exchange)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(points: list[dict], args: argparse.Namespace, label: str) -> None:
    """The measured points of ``label``'s sites as a Markdown table."""
    print(f"\n{label}, exchange z {args.exchange_noise:g}, C {args.clip:g}, q {args.sample_rate}")
    print("| run | e_F(G_t, G_cen true) by round | row-level epsilon by round | noised G_cen e_F |")
    print("|---|---|---|---|")
    for p in points:
        if "error" in p:
            print(f"| {p['run']} | refused: {p['error']} | | |")
            continue
        ef = " / ".join(f"{v:.3f}" for v in p["e_f_true"])
        eps = " / ".join("-" if v is None else f"{v:.2f}" for v in p["row_epsilon"])
        print(f"| {p['run']} | {ef} | {eps} | {p['g_cen_e_f']:.3f} |")


if __name__ == "__main__":
    main()
