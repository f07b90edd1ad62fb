"""``fedhead-report DIR... --out OUT``: tables, figures and report.md from fedhead-sweep outputs.

DIR is a sweep folder (holding ``manifest.json``) or a folder with several sweep folders below
it. Writes ``OUT/tables/tableN{.md,.csv,_sources.csv}``, ``OUT/figures/*.png`` and
``OUT/report.md``. Bad input (no manifest, unreadable JSON) ends with one
``fedhead-report: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from fedhead.driver.errors import EXIT_USAGE, debug_enabled, report

PROG = "fedhead-report"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Paper tables (4-9), figures and report.md from the output folders of fedhead-sweep.",
        epilog="Every number is traceable: OUT/tables/<table>_sources.csv lists the run folders of each cell.",
    )
    p.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="a sweep folder (with manifest.json) or a folder holding several sweep folders",
    )
    p.add_argument("--out", required=True, metavar="OUT", help="output folder (created)")
    p.add_argument("--no-figures", action="store_true", help="write the tables and report.md only")
    p.add_argument("-v", "--verbose", action="store_true", help="log every sweep and figure")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0, 2 for bad input, 1 otherwise)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(levelname)s: %(message)s"
    )
    # imported when the command runs, not at start-up (--help stays fast); the report pulls matplotlib
    from fedhead.report.build import build_report
    from fedhead.report.collect import ReportInputError

    try:
        rep = build_report(args.dirs, args.out, figures=not args.no_figures)
    except ReportInputError as exc:
        if debug_enabled():
            raise
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as exc:
        if debug_enabled():
            raise
        return report(PROG, exc)
    c = rep.collection
    print(
        f"{PROG}: {len(c.runs)} runs counted ({len(c.excluded)} not) from {len(c.sweeps)} sweep folder(s); "
        f"{len(rep.tables)} tables, {len(rep.figures)} figures; missing tables: "
        f"{', '.join(str(s.number) for s in rep.missing) or 'none'} -> {rep.markdown}"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
