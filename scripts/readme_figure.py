"""Regenerate the README's figure (docs/quickstart_procedures.png) from the default run.

    python scripts/readme_figure.py                 # runs the default fedhead-run (a few minutes)
    python scripts/readme_figure.py RUN_DIR         # reads RUN_DIR/summary.json of a finished run

The figure is the run's ``procedures.png``: per procedure, e_F(G_t, G_star) and e_F(G_t, G_cen)
per round with the diagnosis's predicted gap (:func:`fedhead.plotting.procedures_figure`). It also
prints the numbers the README's "Reading the output" section quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_OUT = REPO / "docs" / "quickstart_procedures.png"


def run_default(run_dir: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    subprocess.run([sys.executable, "-m", "fedhead.cli.run", f"hydra.run.dir={run_dir}"], check=True, env=env, cwd=REPO)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path, help="a finished default run (default: run one now)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"PNG to write (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    from fedhead.plotting import procedures_figure, save_figure
    from fedhead.results import schema

    run_dir = args.run_dir
    if run_dir is None:
        run_dir = Path(tempfile.mkdtemp(prefix="fedhead_readme_"))
        run_default(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    results = [schema.read(p) for p in summary["results"]]
    path = save_figure(procedures_figure(results), args.out)
    print(f"wrote {path}")
    print(f"diagnosis rel_gap ||G_cen - G_star||/||G_cen|| = {summary['diagnosis']['rel_gap']:.4g}")
    for res in results:
        for r in res.rounds:
            print(
                f"{res.name:20s} round {r.round}: e_F(G_t, G_star) = {r.e_f_star:.3g}  "
                f"e_F(G_t, G_cen) = {r.e_f_cen:.3g}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
