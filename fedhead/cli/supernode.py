"""``fedhead-supernode``: Flower's SuperNode with a shorter idle pull, starting ``fedhead-superexec``.

flwr 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps a fixed 3 s whenever a pull
from the SuperLink finds no message and checks for its ClientApp's reply every 0.5 s; neither has a
setting. After a site replies it pulls at once, finds nothing (the server is still waiting for the other
sites) and sleeps: every message phase waits about 3 s for its last site, however short its work.
``fedhead-supernode`` takes ``flower-supernode``'s command line, plus::

    --idle-pull S      seconds between pulls that found nothing (flwr: 3; here 0.5 by default)
    --reply-check S    seconds between checks for the ClientApp's reply (flwr: 0.5; here 0.05)
    --pull-retry S     seconds before a message's part not there yet is pulled again, doubling up to
                       10 S (flwr: 1, doubling up to 10; here 0.05)

and runs flwr's SuperNode unchanged but for those waits (the last:
[`fedhead.federation.pull_retry`][fedhead.federation.pull_retry]); in ``--isolation subprocess`` it starts
``fedhead-superexec`` (warm ClientApp processes, [`fedhead.cli.superexec`][fedhead.cli.superexec]) where
flwr starts ``flower-superexec``. A shorter idle pull costs one more request to the SuperLink per site
and interval: 2 a second per idle site at 0.5 s (docs/deployment.md, "What a message costs").
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from types import ModuleType

from fedhead.federation import pull_retry

#: flwr's SuperNode loop, whose ``time`` and ``subprocess`` names ``main`` replaces
SUPERNODE_LOOP = "flwr.supernode.start_client_internal"
#: the waits flwr 1.42 writes into that loop, and the SuperExec it starts
FLWR_IDLE_PULL_S, FLWR_REPLY_CHECK_S, FLWR_SUPEREXEC = 3, 0.5, "flower-superexec"
IDLE_PULL_S, REPLY_CHECK_S, SUPEREXEC = 0.5, 0.05, "fedhead-superexec"
WAIT_RANGE_S = (0.01, 60.0)


class LoopClock:
    """The ``time`` module as flwr's SuperNode loop sees it: its two fixed waits replaced."""

    def __init__(self, idle_pull: float, reply_check: float) -> None:
        self.waits = {FLWR_IDLE_PULL_S: idle_pull, FLWR_REPLY_CHECK_S: reply_check}

    def sleep(self, seconds: float) -> None:
        time.sleep(self.waits.get(seconds, seconds))

    def __getattr__(self, name: str):
        return getattr(time, name)


class SuperExecLauncher:
    """The ``subprocess`` module as flwr's SuperNode loop sees it: ``fedhead-superexec`` for ``flower-superexec``."""

    def __init__(self, subprocess_module: ModuleType, superexec: str = SUPEREXEC) -> None:
        self.module, self.superexec = subprocess_module, superexec

    def Popen(self, args, *rest, **kwargs):
        if isinstance(args, list) and args[:1] == [FLWR_SUPEREXEC]:
            args = [self.superexec, *args[1:]]
        return self.module.Popen(args, *rest, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)


def _wait(text: str) -> float:
    seconds = float(text)
    low, high = WAIT_RANGE_S
    if not (math.isfinite(seconds) and low <= seconds <= high):
        raise argparse.ArgumentTypeError(f"must be seconds between {low} and {high}, got {text!r}")
    return seconds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedhead-supernode",
        add_help=False,
        description="flower-supernode with a shorter idle pull and fedhead-superexec; every other flag is flwr's.",
    )
    p.add_argument("--idle-pull", type=_wait, default=IDLE_PULL_S, help=f"seconds (flwr: {FLWR_IDLE_PULL_S})")
    p.add_argument("--reply-check", type=_wait, default=REPLY_CHECK_S, help=f"seconds (flwr: {FLWR_REPLY_CHECK_S})")
    p.add_argument(
        "--pull-retry",
        type=_wait,
        default=pull_retry.FIRST_RETRY_S,
        help=f"seconds, doubling up to 10 times this (flwr: {pull_retry.FLWR_FIRST_RETRY_S:g})",
    )
    return p


def tune(loop: ModuleType, idle_pull: float, reply_check: float) -> None:
    """Replace ``loop``'s ``time`` and ``subprocess`` (flwr's SuperNode loop module) as described above."""
    for name in ("time", "subprocess"):
        if not isinstance(getattr(loop, name, None), ModuleType):
            raise RuntimeError(f"{loop.__name__}.{name} is not flwr 1.42's module: this flwr is not supported")
    loop.time = LoopClock(idle_pull, reply_check)  # type: ignore[attr-defined]
    loop.subprocess = SuperExecLauncher(loop.subprocess)  # type: ignore[attr-defined]


def main() -> None:
    parser = _parser()
    if {"-h", "--help"} & set(sys.argv[1:]):
        parser.print_help()
        print()
    ours, rest = parser.parse_known_args(sys.argv[1:])
    try:
        tune(importlib.import_module(SUPERNODE_LOOP), ours.idle_pull, ours.reply_check)
        pull_retry.retry_sooner(SUPERNODE_LOOP, ours.pull_retry, 10 * ours.pull_retry)
    except RuntimeError as err:
        sys.exit(f"fedhead-supernode: error: {err}")
    from flwr.supernode.cli import flower_supernode

    sys.argv = [sys.argv[0], *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
