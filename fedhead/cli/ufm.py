"""``fedhead-ufm NAME [--quick] [--out DIR]``: the UFM experiment suite of docs/theory.md §12.

Each experiment writes ``results.json`` (every number its figures show, headline numbers,
settings and provenance with seeds) and PNG figures into ``DIR/<name>`` (default
``./results/ufm/<name>``) and prints a table of its headline numbers next to what the theory
predicts.  ``--quick`` runs fewer instances through the same code path (the whole suite in a few
minutes on two cores); without it the instance counts of docs/theory.md §12 are used.
"""

from __future__ import annotations

import os

# The suite solves many small dense problems (at most ~1200 unknowns): multi-threaded BLAS gains
# little there and thrashes on shared cores.  Default to one thread unless the user chose.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402

from fedhead.experiments import convergence, finite_steps, gap_terms, recovery, reference, selection  # noqa: E402
from fedhead.experiments.common import ExperimentResult  # noqa: E402

log = logging.getLogger("fedhead.experiments")

#: experiment name -> module (with ``Settings``, ``run``, ``DESCRIPTION``), in suite order
EXPERIMENTS: dict[str, ModuleType] = {
    m.NAME: m for m in (reference, selection, convergence, gap_terms, recovery, finite_steps)
}


def run_experiment(name: str, *, quick: bool = False, out: str | Path = "results/ufm") -> ExperimentResult:
    """Run one experiment by name with the quick or full profile; outputs go to ``out/<name>``.

    Raises
    ------
    ValueError
        For an unknown experiment name.
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} or 'all'")
    module = EXPERIMENTS[name]
    settings = module.Settings.quick() if quick else module.Settings.full()
    return module.run(settings, Path(out) / name)


def _parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {n:<13} {m.DESCRIPTION}" for n, m in EXPERIMENTS.items())
    p = argparse.ArgumentParser(
        prog="fedhead-ufm",
        description="UFM experiment suite (docs/theory.md §12): closed-form checks of head geometry and dynamics.",
        epilog=f"experiments:\n{listing}\n  {'all':<13} every experiment above, in this order",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "name", choices=[*EXPERIMENTS, "all"], metavar="NAME", help="experiment to run (see the list below) or 'all'"
    )
    p.add_argument("--quick", action="store_true", help="fewer instances, same code path (minutes)")
    p.add_argument(
        "--out",
        default="results/ufm",
        metavar="DIR",
        help="output root; each experiment writes to DIR/<name> (default: results/ufm)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    """Console entry point of ``fedhead-ufm``; returns the exit status (one error line, exit 1,
    on a failure; tracebacks with ``FEDHEAD_DEBUG=1``)."""
    # imported when the command runs, not at start-up (--help stays fast)
    from fedhead.driver.errors import debug_enabled, report

    try:
        return _main(argv)
    except (Exception, KeyboardInterrupt) as exc:
        if debug_enabled():
            raise
        return report("fedhead-ufm", exc)


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    names = list(EXPERIMENTS) if args.name == "all" else [args.name]
    profile = "quick" if args.quick else "full"
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        log.info("running %s (%s profile)", name, profile)
        res = run_experiment(name, quick=args.quick, out=args.out)
        print(res.table())
        print(
            f"  -> {res.out_dir / 'results.json'} and {len(res.figures)} figure(s), {time.perf_counter() - t0:.1f} s\n",
            flush=True,
        )
    if len(names) > 1:
        print(f"suite ({profile}) finished in {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
