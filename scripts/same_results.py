"""Check that a deployed run's results.json equals the same job run in process.

Both runs must have completed, in the same privacy mode and with the same rounds; then ``G_cen`` and
the final round's Gram must agree to ``--tol``, relative (Frobenius norm). Prints one line; exits 1
on a difference. Used by ``scripts/docker_check.sh``::

    python scripts/same_results.py DEPLOYED/results.json IN_PROCESS/results.json --tol 1e-9
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from fedhead.results import schema


def relative(a, b) -> float:
    """``|a - b| / |b|`` in the Frobenius norm."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def compare(deployed: schema.Results, reference: schema.Results, tol: float) -> tuple[bool, str]:
    """(agree, one line saying how) for a deployed run's results and the in-process run's."""
    mode = tuple((r.privacy or {}).get("mode", "clear") for r in (deployed, reference))
    rounds = [r.round for r in deployed.rounds], [r.round for r in reference.rounds]
    if deployed.status != "completed" or reference.status != "completed":
        return False, f"status: deployed {deployed.status}, in process {reference.status}"
    if mode[0] != mode[1] or rounds[0] != rounds[1]:
        return False, f"not the same job: privacy modes {mode}, rounds {rounds}"
    g_cen = relative(deployed.targets["g_cen"], reference.targets["g_cen"])
    gram = relative(deployed.rounds[-1].gram, reference.rounds[-1].gram)
    ok = g_cen <= tol and gram <= tol
    line = f"privacy {mode[0]}, rounds {rounds[0]}: G_cen {g_cen:.1e}, final Gram {gram:.1e} relative (tol {tol:.0e})"
    return ok, line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("deployed")
    parser.add_argument("reference")
    parser.add_argument("--tol", type=float, default=1e-9, help="relative tolerance (default 1e-9)")
    args = parser.parse_args(argv)
    ok, line = compare(schema.read(args.deployed), schema.read(args.reference), args.tol)
    print(f"same results: {line} -> {'OK' if ok else 'DIFFERENT'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
