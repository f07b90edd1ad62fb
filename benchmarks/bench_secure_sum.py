"""Benchmark: a secure sum (fedhead.federation.secure_sum, all five stages in-process) against the clear sum.

Two vectors of the sizes fedhead exchanges, with ``C = 16`` targets: the moment exchange (mean
``C``, covariance ``C^2``, count: 273 numbers) and a linear head (``C x P`` weights and ``C``
biases with ``P = 512``: 8,208 numbers). One run each, ``M`` sites (default 8), no dropout (or
``--dropped K`` sites dropping after sharing their keys, which the server unmasks from their
key shares). The secure time is every site's work one after the other plus the server's (sites
run in parallel in a deployment, so a site waits about ``secure / M`` plus the server's part);
the clear time is ``sum_m x_m`` in float64. The encoding is the one fedhead's sums get
(``secure_records.encoding_for``: ``k`` 64-bit words per entry, at least 96 fractional bits). Also
printed: the bytes one site sends over the five stages and the largest deviation of the secure sum
from the exact sum, against the bound ``M 2^-(f+1)`` plus half an ulp of the result (the script
exits 1 if it is exceeded).

Usage::

    python benchmarks/bench_secure_sum.py
    python benchmarks/bench_secure_sum.py --sites 20 --dropped 3 --bound 1e4
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from fedhead.federation import secure_records as sr
from fedhead.federation.ring_encoding import RingFixedPoint
from fedhead.federation.roster import UsedSumIds, simulation_roster
from fedhead.federation.secure_server import SecureSumServer
from fedhead.federation.secure_site import SecureSumClient

C, P = 16, 512
CASES = {"moments (C=16)": C + C * C + 1, "head (C=16, P=512)": C * P + C}


def secure_sum(xs: list[np.ndarray], encoding: RingFixedPoint, dropped: int) -> tuple[np.ndarray, float, int]:
    """The secure sum of ``xs`` over all stages, its wall time and the bytes the last site sent."""
    sites = list(range(len(xs)))
    roster, signing = simulation_roster(f"site-{s}" for s in sites)  # not timed: made once per federation
    start = time.perf_counter()
    server = SecureSumServer(sites, xs[0].size, encoding, sum_id="bench", roster=roster)
    clients = [
        SecureSumClient(
            s,
            f"site-{s}",
            sum_id="bench",
            roster=roster,
            signing_key=signing[f"site-{s}"],
            used=UsedSumIds(),
            min_survivors=server.threshold,
        )
        for s in sites
    ]
    keys = {s: c.advertise() for s, c in enumerate(clients)}
    book = server.collect_keys(keys)
    shares = {s: c.share_keys(book, server.threshold) for s, c in enumerate(clients)}
    routed = server.route_shares(shares)
    masked = {s: clients[s].mask(routed[s], xs[s], encoding) for s in sites[dropped:]}
    unmasking = server.collect_masked(masked)
    signatures = {s: clients[s].sign_survivors(unmasking) for s in unmasking.survivors}
    request = server.collect_signatures(signatures)
    revealed = {s: clients[s].reveal(request) for s in request.signatures}
    total = server.unmask(revealed).total
    seconds = time.perf_counter() - start
    site = sites[-1]
    sent = len(keys[site].encryption) + len(keys[site].mask) + len(keys[site].signature) + len(keys[site].name)
    sent += len(shares[site].seed_digest) + len(signatures[site])
    sent += sum(len(c) for c in shares[site].ciphertexts.values()) + masked[site].nbytes
    sent += sum(len(b) for b in revealed[site].seed_shares.values())
    sent += sum(len(b) for b in revealed[site].key_shares.values())
    return total, seconds, sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=8, help="number of sites M (at least 3)")
    parser.add_argument("--dropped", type=int, default=0, help="sites that drop after sharing their keys")
    parser.add_argument("--bound", type=float, default=1e3, help="largest magnitude of an input entry")
    args = parser.parse_args(argv)
    if args.sites < 3:
        parser.error(f"--sites must be at least 3, got {args.sites}")
    if not 0 <= args.dropped <= args.sites - args.sites // 2 - 1:
        parser.error(f"--dropped must leave a majority of the {args.sites} sites")
    encoding = sr.encoding_for(args.bound, args.sites)
    rng = np.random.default_rng(0)
    print(
        f"M = {args.sites} sites, {args.dropped} dropped, bound {args.bound:g}, {encoding.words} words, "
        f"frac_bits {encoding.frac_bits}"
    )
    print(
        f"{'vector':<20} {'length':>7} {'clear ms':>9} {'secure ms':>10} {'ratio':>9} {'site sends':>11} {'max err':>9}"
    )
    ok = True
    for name, length in CASES.items():
        xs = [rng.uniform(-args.bound, args.bound, length) for _ in range(args.sites)]
        start = time.perf_counter()
        clear = sum(xs[args.dropped :], np.zeros(length))
        clear_s = time.perf_counter() - start
        total, secure_s, sent = secure_sum(xs, encoding, args.dropped)
        exact = np.array([math.fsum(x[j] for x in xs[args.dropped :]) for j in range(length)])
        error = float(np.max(np.abs(total - exact)))
        ok &= bool(
            np.all(np.abs(total - exact) <= len(xs) * 2.0 ** -(encoding.frac_bits + 1) + np.spacing(np.abs(exact)))
        )
        ok &= bool(np.max(np.abs(total - clear)) <= 1e-9 * args.bound * args.sites)
        print(
            f"{name:<20} {length:>7} {clear_s * 1e3:>9.3f} {secure_s * 1e3:>10.1f} {secure_s / clear_s:>9.0f} "
            f"{sent / 1024:>8.1f} KiB {error:>9.2e}"
        )
    if not ok:
        print("error: the secure sum is off the stated bound", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
