"""Benchmark: a secure sum's time per site and at the server as the number of sites M grows, with
fedhead's prime-field Shamir against flwr's, in one run.

One secure sum (``fedhead.federation.secure_sum``, all five stages in one process, the sites signing
with a simulated roster) of a head's
vector (``C = 16``, ``P = 512``: 8,208 numbers) per ``M`` in ``--sites``, the encoding
``secure_records.encoding_for`` picks. Each party's calls are timed apart: *site* is the mean over
the surviving sites of one site's own work over the five stages (key pairs, signatures, Shamir splits, ECDH,
Fernet, ChaCha20 streams, ring arithmetic), *server* the server's (routing, the sum, and the
unmasking: Shamir combines, the self-mask streams and, per dropped site, one ECDH and one stream
per survivor). ``--dropped F`` lets ``floor(F M)`` sites drop after sharing their keys. Each time is
the minimum over ``--repeats`` sums (shared cores are noisy).

``--shamir both`` (the default) runs every ``M`` twice: with ``fedhead.federation.shamir`` (GF(2^521
- 1), one field element per 32-byte seed or 48-byte P-384 scalar, the Lagrange coefficients once per
set of helpers) and with flwr's ``create_shares`` / ``combine_shares`` (GF(2^128), pycryptodome,
per 16-byte chunk) swapped in for the same secrets, and prints their ratio; flwr's only up to
``--flwr-max-sites`` (its time grows as ``M^2`` per site). The script exits 1 if a sum is off the
clear sum by more than ``1e-9 bound M``.

Usage::

    python benchmarks/bench_secure_sum_scale.py                          # M = 8, 16, 32, 64, 128
    python benchmarks/bench_secure_sum_scale.py --sites 8 16 --repeats 1 --dropped 0.25
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

from fedhead.federation import secure_records as sr
from fedhead.federation import secure_server, secure_site
from fedhead.federation.roster import UsedSumIds, simulation_roster
from fedhead.federation.secure_server import SecureSumServer
from fedhead.federation.secure_site import SecureSumClient
from fedhead.federation.secure_sum import default_threshold

LENGTH = 16 * 512 + 16  # a head: C x P weights and C biases
BOUND = 1e3


def _flwr_is_share(share: object, index: int | None = None) -> bool:
    """flwr's share format: a 4-byte little-endian index, then 16 bytes per chunk."""
    if not isinstance(share, bytes) or len(share) < 20 or (len(share) - 4) % 16:
        return False
    return index is None or int.from_bytes(share[:4], "little") == index


FLWR_SHAMIR = SimpleNamespace(
    split=create_shares, combine=lambda shares: combine_shares(list(shares)), is_share=_flwr_is_share
)


@contextlib.contextmanager
def flwr_shamir():
    """flwr's Shamir in place of fedhead's, at the site and at the server."""
    with mock.patch.object(secure_site, "shamir", FLWR_SHAMIR), mock.patch.object(secure_server, "shamir", FLWR_SHAMIR):
        yield


def one_sum(xs: list[np.ndarray], dropped: int) -> tuple[float, float, np.ndarray]:
    """The mean time of one surviving site, the server's time, and the sum over the survivors."""
    m = len(xs)
    encoding = sr.encoding_for(BOUND, m)
    spent: dict[Any, float] = defaultdict(float)

    def timed(party: Any, call: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        out = call(*args)
        spent[party] += time.perf_counter() - start
        return out

    names = [f"site-{u}" for u in range(m)]
    roster, signing = simulation_roster(names)  # made once per federation: not timed
    server = timed("server", lambda: SecureSumServer(range(m), LENGTH, encoding, sum_id="scale", roster=roster))
    clients = [
        timed(
            u,
            lambda u=u: SecureSumClient(
                u,
                names[u],
                sum_id="scale",
                roster=roster,
                signing_key=signing[names[u]],
                used=UsedSumIds(),
                min_survivors=server.threshold,
            ),
        )
        for u in range(m)
    ]
    keys = {u: timed(u, c.advertise) for u, c in enumerate(clients)}
    book = timed("server", server.collect_keys, keys)
    shares = {u: timed(u, c.share_keys, book, server.threshold) for u, c in enumerate(clients)}
    routed = timed("server", server.route_shares, shares)
    masked = {u: timed(u, clients[u].mask, routed[u], xs[u], encoding) for u in range(dropped, m)}
    unmasking = timed("server", server.collect_masked, masked)
    signatures = {u: timed(u, clients[u].sign_survivors, unmasking) for u in unmasking.survivors}
    request = timed("server", server.collect_signatures, signatures)
    revealed = {u: timed(u, clients[u].reveal, request) for u in request.signatures}
    total = timed("server", server.unmask, revealed).total
    site = float(np.mean([spent[s] for s in unmasking.survivors]))
    return site, spent["server"], total


def measure(m: int, dropped: int, repeats: int, flwr: bool) -> tuple[float, float, bool]:
    """The least per-site and server times of ``repeats`` sums over ``m`` sites, and whether every sum was right."""
    rng = np.random.default_rng(m)
    xs = [rng.uniform(-BOUND, BOUND, LENGTH) for _ in range(m)]
    clear = np.sum(xs[dropped:], axis=0)
    site = server = float("inf")
    ok = True
    with flwr_shamir() if flwr else contextlib.nullcontext():
        for _ in range(repeats):
            s, v, total = one_sum(xs, dropped)
            site, server = min(site, s), min(server, v)
            ok &= bool(np.max(np.abs(total - clear)) <= 1e-9 * BOUND * m)
    return site, server, ok


def _row(m: int, t: int, dropped: int, times: dict[str, tuple[float, float]]) -> str:
    """One line of the table: times in ms, ratios flwr / prime ("-" where a column was not run)."""
    prime, flwr = times.get("prime"), times.get("flwr")
    cells = []
    for pair, widths in ((prime, (13, 9)), (flwr, (12, 9))):
        cells.append(" ".join(f"{x * 1e3:>{w}.1f}" if pair else f"{'-':>{w}}" for x, w in zip(pair or (0, 0), widths)))
    ratios = [
        f"{f / p:>{w}.1f}" if prime and flwr else f"{'-':>{w}}"
        for p, f, w in zip(prime or (1, 1), flwr or (1, 1), (6, 8))
    ]
    return f"{m:>4} {t:>3} {dropped:>4} | {cells[0]} | {cells[1]} | {' '.join(ratios)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[8, 16, 32, 64, 128], help="values of M (>= 3)")
    parser.add_argument("--dropped", type=float, default=0.0, help="fraction of sites dropping after sharing keys")
    parser.add_argument("--repeats", type=int, default=3, help="sums per M and Shamir; the least time is printed")
    parser.add_argument("--shamir", choices=("both", "prime", "flwr"), default="both")
    parser.add_argument("--flwr-max-sites", type=int, default=64, help="largest M run with flwr's Shamir")
    args = parser.parse_args(argv)
    if min(args.sites) < 3 or args.repeats < 1 or not 0 <= args.dropped < 0.5:
        parser.error("--sites must be at least 3, --repeats at least 1, --dropped in [0, 0.5)")
    print(f"L = {LENGTH} entries, bound {BOUND:g}, dropped fraction {args.dropped:g}, least of {args.repeats} sums")
    print(
        f"{'M':>4} {'t':>3} {'drop':>4} | {'prime site ms':>13} {'server ms':>9} | {'flwr site ms':>12} "
        f"{'server ms':>9} | {'site x':>6} {'server x':>8}"
    )
    ok = True
    for m in args.sites:
        dropped = int(args.dropped * m)  # at most ceil(M/2) - 1: the default threshold's majority survives
        t = default_threshold(m)
        times: dict[str, tuple[float, float]] = {}
        for name in ("prime", "flwr"):
            if args.shamir in (name, "both") and (name == "prime" or m <= args.flwr_max_sites):
                site, server, right = measure(m, dropped, args.repeats, flwr=name == "flwr")
                times[name], ok = (site, server), ok and right
        print(_row(m, t, dropped, times))
    if not ok:
        print("error: a secure sum is off the clear sum", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
