"""Benchmark: local steps (epochs, seconds) to reach a client's local optimum, literal recipe vs fixed defaults.

Trains each client of a setting for one round with both recipes (the paper's, and the
``TrainConfig`` defaults of docs/theory.md §14) and reports the steps to a trained gap of 1e-2,
1e-3 and 1e-4; how they are counted: benchmarks/README.md.

Usage::

    python benchmarks/bench_local_optimum.py --quick                # smoke run (< 1 minute)
    OMP_NUM_THREADS=1 python benchmarks/bench_local_optimum.py --threads 1 --out results/local_optimum.json
    python benchmarks/bench_local_optimum.py --settings quickstart --literal-cap 8000
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import statistics
import sys
import tempfile
import time

import torch
from local_optimum_settings import Client, Setting, dsprites_setting, quickstart_setting

from fedhead.results.io import provenance, write_json_atomic
from fedhead.train import train_local

log = logging.getLogger("bench_local_optimum")

GAPS = (1e-2, 1e-3, 1e-4)
LITERAL = dict(optimal_bias=False, solve_last_layer=False, finish_features=False, warmup_steps=0)
RECIPES = ("literal", "fixed")


# ------------------------------------------------------------------------------------------ runs
def run_one(setting: Setting, client: Client, recipe: str, rho: float, check_every: int) -> dict:
    """One ``train_local`` call; the steps and estimated seconds to each gap of :data:`GAPS`."""
    backbone, head = client.make_backbone(), client.make_head()
    w0 = head.weight.detach().double().numpy().copy()
    cap = setting.literal_cap if recipe == "literal" else setting.cap
    cfg = dataclasses.replace(
        setting.train,
        local_tol=min(GAPS),
        check_every=check_every,
        progress=False,
        **(LITERAL if recipe == "literal" else {}),
    )
    problem = dataclasses.replace(setting.problem, rho=float(rho), gamma=0.0, center_targets=False, epochs=cap)
    t0 = time.perf_counter()
    res = train_local(
        backbone,
        head,
        client.x,
        client.y,
        cfg,
        problem,
        broadcast_weight=w0 if rho > 0 else None,
        device="cpu",
        seed=client.seed,
    )
    wall = time.perf_counter() - t0
    m = res.metrics
    n = int(client.y.shape[0])
    spe = math.ceil(n / min(cfg.batch_size, n))
    setup = max(0.0, wall - m.seconds)
    per_epoch = m.seconds / max(m.epochs, 1)
    to_gap = {}
    for gap in GAPS:
        e = next((ep for ep, g in m.gap_trace if g <= gap), None)
        to_gap[f"{gap:g}"] = {
            "epochs": e,
            "steps": None if e is None else e * spe,
            "seconds_est": None if e is None else setup + per_epoch * e,
        }
    log.info(
        "%s rho=%g client %d %-7s: %d epochs (%.1f s), final gap %.3g; steps to %s",
        setting.name,
        rho,
        client.pid,
        recipe,
        m.epochs,
        wall,
        m.trained_gap,
        ", ".join(f"{k}: {v['steps'] if v['steps'] is not None else '>' + str(cap * spe)}" for k, v in to_gap.items()),
    )
    return {
        "setting": setting.name,
        "rho": rho,
        "client": client.pid,
        "recipe": recipe,
        "n": n,
        "cap_epochs": cap,
        "steps_per_epoch": spe,
        "cap_steps": cap * spe,
        "check_every": check_every,
        "epochs": m.epochs,
        "n_steps": m.n_steps,
        "final_trained_gap": m.trained_gap,
        "final_relative_gap": m.relative_gap,
        "converged": m.converged,
        "call_seconds": wall,
        "loop_seconds": m.seconds,
        "setup_and_final_seconds": setup,
        "to_gap": to_gap,
        "gap_trace": [list(p) for p in m.gap_trace],
    }


# ------------------------------------------------------------------------------------------ table
def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _bounded(v: float, cap: float, fmt: str) -> str:
    """A count or seconds; ``inf`` (not reached) as ``>cap``."""
    return f">{format(cap, fmt)}" if math.isinf(v) else format(v, fmt)


def _ratio(lit: float, fix: float, lit_cap: float, fix_cap: float) -> str:
    """literal / fixed, with a bound where one side did not reach the gap."""
    if math.isinf(lit) and math.isinf(fix):
        return "-"
    if math.isinf(lit):
        return f">{lit_cap / fix:.1f}x"
    if math.isinf(fix):
        return f"<{lit / fix_cap:.2f}x"
    return f"{lit / fix:.1f}x" if fix > 0 else "-"


def _value(run: dict, gap: float, key: str) -> float:
    v = run["to_gap"][f"{gap:g}"][key]
    return float("inf") if v is None else float(v)


def print_block(setting: Setting, rho: float, runs: list[dict]) -> None:
    by = {(r["client"], r["recipe"]): r for r in runs}
    pids = [c.pid for c in setting.clients]
    lit0, fix0 = by[(pids[0], "literal")], by[(pids[0], "fixed")]
    spe = fix0["steps_per_epoch"]
    print(f"\n## {setting.name}, rho = {rho:g}: {setting.description}")
    print(
        f"# steps/epoch {spe} (epochs = steps / {spe}); cap: fixed {fix0['cap_steps']} steps, literal "
        f"{lit0['cap_steps']} steps; gap checked every {fix0['check_every']} epochs"
    )
    gap_hdr = "".join(f"{'gap<=' + format(g, 'g') + ': lit':>17}{'fixed':>7}{'ratio':>8}" for g in GAPS)
    rows = [(str(p), [by[(p, "literal")]], [by[(p, "fixed")]]) for p in pids]
    if len(pids) > 1:
        rows.append(("median", [by[(p, "literal")] for p in pids], [by[(p, "fixed")] for p in pids]))
    # steps
    print(f"{'steps':<8}{gap_hdr}{'final gap: lit':>18}{'fixed':>10}")
    for label, lits, fixs in rows:
        cells = []
        for g in GAPS:
            lv = _median([_value(r, g, "steps") for r in lits])
            fv = _median([_value(r, g, "steps") for r in fixs])
            lc, fc = lits[0]["cap_steps"], fixs[0]["cap_steps"]
            cells.append(f"{_bounded(lv, lc, '.0f'):>17}{_bounded(fv, fc, '.0f'):>7}{_ratio(lv, fv, lc, fc):>8}")
        lg = _median([r["final_trained_gap"] for r in lits])
        fg = _median([r["final_trained_gap"] for r in fixs])
        print(f"{label:<8}{''.join(cells)}{_num(lg, '.2e'):>18}{_num(fg, '.2e'):>10}")
    # seconds
    print(f"{'~seconds':<8}{gap_hdr}{'call s: lit':>18}{'fixed':>10}")
    for label, lits, fixs in rows:
        cells = []
        for g in GAPS:
            lv = _median([_value(r, g, "seconds_est") for r in lits])
            fv = _median([_value(r, g, "seconds_est") for r in fixs])
            lc = _median([r["call_seconds"] for r in lits])
            fc = _median([r["call_seconds"] for r in fixs])
            cells.append(f"{_bounded(lv, lc, '.1f'):>17}{_bounded(fv, fc, '.1f'):>7}{_ratio(lv, fv, lc, fc):>8}")
        lcs = _median([r["call_seconds"] for r in lits])
        fcs = _median([r["call_seconds"] for r in fixs])
        print(f"{label:<8}{''.join(cells)}{lcs:>18.1f}{fcs:>10.1f}")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--quick`` applied and the literal caps defaulted to the fixed ones."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--settings", nargs="+", default=["quickstart", "dsprites"], choices=["quickstart", "dsprites"])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 client per setting, cap 1000 epochs (quickstart) / 250 (dsprites), "
        "100 dSprites images, rho = 0 only",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    ap.add_argument("--clients", type=int, default=4, help="quickstart clients to train (of 4)")
    ap.add_argument("--cap", type=int, default=2000, help="epoch cap E of the fixed recipe (quickstart)")
    ap.add_argument(
        "--literal-cap", type=int, default=None, help="epoch cap of the literal recipe (quickstart); default: --cap"
    )
    ap.add_argument(
        "--rhos",
        type=float,
        nargs="+",
        default=None,
        help="proximal weights of the quickstart rows; default: 0 and the quickstart's rho",
    )
    ap.add_argument("--check-every", type=int, default=10, help="epochs between two gap checks")
    ap.add_argument("--image-clients", type=int, default=2, help="dSprites clients to train (of 2)")
    ap.add_argument("--image-n", type=int, default=400, help="dSprites training images, over 2 clients")
    ap.add_argument("--image-width", type=int, default=32, help="channels of the small CNN")
    ap.add_argument("--image-p", type=int, default=64, help="feature dimension P of the small CNN")
    ap.add_argument("--image-batch", type=int, default=256, help="dSprites batch size (>= N_m: full batch)")
    ap.add_argument("--image-lr", type=float, default=3e-3, help="dSprites peak learning rate")
    ap.add_argument("--image-cap", type=int, default=1000, help="epoch cap of the fixed recipe (dSprites)")
    ap.add_argument(
        "--image-literal-cap",
        type=int,
        default=None,
        help="epoch cap of the literal recipe (dSprites); default: --image-cap",
    )
    ap.add_argument("--out", default=None, help="write every run (gap traces included) as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every run")
    args = ap.parse_args(argv)
    if args.quick:
        args.clients, args.image_clients, args.image_n = 1, 1, 100
        args.cap, args.image_cap = min(args.cap, 1000), min(args.image_cap, 250)
        args.literal_cap = min(args.literal_cap or args.cap, args.cap)
        args.image_literal_cap = min(args.image_literal_cap or args.image_cap, args.image_cap)
    args.literal_cap = args.literal_cap or args.cap
    args.image_literal_cap = args.image_literal_cap or args.image_cap
    if not 1 <= args.clients <= 4:
        ap.error("--clients must be 1..4")
    if not 1 <= args.image_clients <= 2:
        ap.error("--image-clients must be 1 or 2")
    return args


def print_header(machine: str) -> None:
    """What the tables below mean."""
    print(
        f"# bench_local_optimum: torch {torch.__version__}, {machine}, load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    print(
        "# steps (epochs x steps/epoch) of one local training call to reach a relative gap of the trained "
        "objective to its closed-form optimum <= 1e-2/1e-3/1e-4;\n# lit = literal recipe (optimal_bias, "
        "solve_last_layer, finish_features off, warmup_steps 0), fixed = TrainConfig defaults; ratio = lit / "
        "fixed;\n# '>N' = not reached within the cap of N steps (ratios then bounds); median row: medians over "
        "clients (ratio of the medians);\n# ~seconds: set-up + training loop prorated to the epochs reached; "
        "both include the gap checks every check_every epochs\n# (a full-data forward pass each); 'call s' = "
        "wall time of the whole train_local call. One run per recipe and client, no repeats."
    )


def build_setting(name: str, args: argparse.Namespace, outdir: str) -> tuple[Setting, list[float]]:
    """The setting ``name`` and the proximal weights of its rows."""
    if name == "quickstart":
        setting = quickstart_setting(args.clients, args.cap, args.literal_cap, outdir)
    else:
        setting = dsprites_setting(
            args.image_n,
            args.image_clients,
            args.image_width,
            args.image_p,
            args.image_batch,
            args.image_lr,
            args.image_cap,
            args.image_literal_cap,
            outdir,
        )
    rhos = setting.rhos
    if setting.name == "quickstart" and args.rhos is not None:
        rhos = sorted(set(args.rhos))
    if args.quick:
        rhos = [0.0]
    return setting, rhos


def run_setting(setting: Setting, rhos: list[float], check_every: int) -> list[dict]:
    """Both recipes on every client for every ``rho``, each block printed as it completes."""
    all_runs: list[dict] = []
    for rho in rhos:
        runs = []
        for i, client in enumerate(setting.clients):
            # alternate which recipe runs first, so that a change of machine load hits both alike
            order = RECIPES if i % 2 == 0 else RECIPES[::-1]
            for recipe in order:
                runs.append(run_one(setting, client, recipe, rho, check_every))
        print_block(setting, rho, runs)
        all_runs.extend(runs)
    return all_runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    machine = f"CPU, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
    print_header(machine)

    t_start = time.perf_counter()
    all_runs: list[dict] = []
    settings_meta = []
    with tempfile.TemporaryDirectory(prefix="bench_local_optimum_") as outdir:
        for name in args.settings:
            setting, rhos = build_setting(name, args, outdir)
            settings_meta.append(
                {
                    "name": setting.name,
                    "description": setting.description,
                    "rhos": rhos,
                    "cap": setting.cap,
                    "literal_cap": setting.literal_cap,
                    "train": dataclasses.asdict(setting.train),
                    "problem": dataclasses.asdict(setting.problem),
                }
            )
            all_runs.extend(run_setting(setting, rhos, args.check_every))
    total = time.perf_counter() - t_start
    print(f"\n# total wall time {total:.0f} s")
    if args.out:
        write_json_atomic(
            args.out,
            {
                "gaps": list(GAPS),
                "literal_overrides": LITERAL,
                "machine": machine,
                "torch": torch.__version__,
                "settings": settings_meta,
                "runs": all_runs,
                "wall_seconds": total,
                "provenance": provenance({"model": 0, "data": 0}),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
