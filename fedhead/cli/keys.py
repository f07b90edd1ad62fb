"""``fedhead-keys``: the signing keys and the roster of ``privacy.mode=secure`` against a deviating server.

Each site makes its key once, on its own machine; the federation assembles the roster from the
sites' public halves and hands the one roster file to every site and to the server out of band
([`fedhead.federation.roster`][fedhead.federation.roster])::

    fedhead-keys new-site hospital-a --dir keys/         # keys/hospital-a.key (0600), keys/hospital-a.roster.json
    fedhead-keys roster keys/*.roster.json --out roster.json

``new-site`` writes the private key with mode 0600 from its first byte and never replaces a key
file (nor the public half) unless ``--force`` is given; ``roster`` refuses a site twice and prints
the roster's SHA-256, which the sites compare out of band. A bad input ends with one
``fedhead-keys: error: ...`` line and exit status 2, with no file written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.roster import Roster, check_site_name, new_signing_key, public_key, write_signing_key

PROG = "fedhead-keys"
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Signing keys and the roster of the sites of a secure sum.")
    sub = p.add_subparsers(dest="command", required=True)
    site = sub.add_parser("new-site", help="make a site's signing key and its public roster entry")
    site.add_argument("name", help="the site's name in the roster (letters, digits, '.', '_', '-')")
    site.add_argument("--dir", default=".", help="folder of NAME.key and NAME.roster.json (default: here)")
    site.add_argument("--force", action="store_true", help="replace existing files (the old key is lost)")
    roster = sub.add_parser("roster", help="assemble the roster from the sites' NAME.roster.json files")
    roster.add_argument("entries", nargs="+", metavar="FILE", help="a site's NAME.roster.json (or a roster)")
    roster.add_argument("--out", required=True, help="the roster file to write")
    roster.add_argument("--force", action="store_true", help="replace an existing roster file")
    return p


def new_site(name: str, folder: str | Path, *, force: bool = False) -> tuple[Path, Path]:
    """Write ``folder/NAME.key`` (a fresh signing key, 0600) and ``folder/NAME.roster.json`` (its one-site roster).

    Returns
    -------
    (Path, Path)
        The key file and the roster entry. Neither is replaced without ``force``: an existing one
        raises ``FileExistsError`` before anything is written.
    """
    name = check_site_name(name)
    folder = Path(folder)
    key_path, entry_path = folder / f"{name}.key", folder / f"{name}.roster.json"
    if not force:
        for path in (key_path, entry_path):
            if path.exists():
                raise FileExistsError(f"{path} exists; pass --force to replace it (its key is then lost)")
    key = new_signing_key()
    write_signing_key(key_path, key, force=force)
    Roster({name: public_key(key)}).save(entry_path, force=force)
    return key_path, entry_path


def assemble(entries: Sequence[str | Path], out: str | Path, *, force: bool = False) -> Roster:
    """Merge the roster files ``entries`` into one roster written to ``out`` (replaced only with ``force``)."""
    roster = Roster.merge(Roster.load(path) for path in entries)
    if not force and Path(out).exists():
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    roster.save(out, force=force)
    return roster


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0, or 2 with one error line)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "new-site":
            key_path, entry_path = new_site(args.name, args.dir, force=args.force)
            print(f"{PROG}: signing key {key_path} (keep it on this site), public entry {entry_path} (send it)")
        else:
            roster = assemble(args.entries, args.out, force=args.force)
            print(f"{PROG}: {len(roster)} sites -> {args.out}, sha256 {roster.digest()}")
    except (ConfigError, FileExistsError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or ''}: {exc.strerror or type(exc).__name__}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
