"""The warm parent of a site's ClientApp processes: imports once, forks one child per message.

``fedhead-superexec`` ([`fedhead.cli.superexec`][fedhead.cli.superexec]) starts this module as its own
process (``python -m fedhead.cli.warm_clientapp``). It imports flwr's ClientApp runtime and the third-party
modules the app needs (numpy, scipy, cryptography, torch, Hydra, ...), then reads one launch request per
line on its standard input, a JSON object ``{"argv": [...], "quiet": bool}``, and forks a child that runs
flwr's own ``flwr_clientapp()`` with that ``argv``: the child pulls its message, installs the FAB, imports
the app from it and replies, exactly as a fresh ``flwr-clientapp`` process would, without an interpreter
start and those imports.

The app's own package (``fedhead``) is imported to warm its dependencies and then dropped from
``sys.modules``, so that every child imports it from the FAB it installed, as ``flwr-clientapp`` does: the
code that runs is the run's FAB, never this process's copy. Each child starts with fresh random state
(Python's ``random`` reseeds itself at a fork; numpy's global generator is reseeded here from the
operating system), its default ``SIGCHLD`` handling and no standard input. The parent exits when its
standard input closes (its SuperExec has ended).

A FAB is installed once per node ([`install_once`][fedhead.cli.warm_clientapp.install_once]): flwr extracts
every message's FAB and hashes its files again, then finds the folder installed before and keeps it. A child
pulls a part of its message that its SuperNode does not hold yet again within 0.05 to 0.5 s, not 1 to 10 s
([`fedhead.federation.pull_retry`][fedhead.federation.pull_retry]).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fedhead.federation import pull_retry

#: what is imported before the first fork: flwr's ClientApp runtime, the app (dropped again, see above)
#: and the app's heavy third-party imports that its handlers make lazily
PRELOAD = ("flwr.supernode.cli.flwr_clientapp", "fedhead.client_app", "torch", "hydra", "omegaconf")
#: the package every child imports afresh from its FAB
APP_PACKAGE = "fedhead"


def warm(preload: Sequence[str] = PRELOAD, app_package: str = APP_PACKAGE) -> list[str]:
    """Import ``preload``, then drop ``app_package`` and its submodules from ``sys.modules``.

    Returns the names of the dropped modules (their third-party imports stay loaded)."""
    for name in preload:
        importlib.import_module(name)
    dropped = [name for name in sys.modules if name == app_package or name.startswith(app_package + ".")]
    for name in dropped:
        del sys.modules[name]
    importlib.invalidate_caches()
    return dropped


#: where flwr's ClientApp runtime takes the FAB installer from, and the folder (under flwr's apps folder) of
#: the record of every FAB installed at this node
INSTALLER = "flwr.supernode.runtime.run_clientapp"
INSTALLED = ".fedhead-installed"


def install_once(install: Callable[..., Path]) -> Callable[..., Path]:
    """flwr's ``install_from_fab`` (``install``), installing each FAB once per node: the first message of a FAB
    installs it as flwr does (extracts it, checks every file's hash) and records the folder under the SHA-256
    of the FAB's bytes; a later message of the same bytes takes that folder (flwr too keeps a folder it
    installed before, and checks the new FAB's files only). Other calls go to ``install`` unchanged."""

    def install_fab(fab_file: object, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install(fab_file, install_dir, skip_prompt)
        from flwr.common.constant import APP_DIR
        from flwr.supercore.utils import get_flwr_home

        record = get_flwr_home() / APP_DIR / INSTALLED / hashlib.sha256(fab_file).hexdigest()
        with contextlib.suppress(OSError, ValueError):
            folder = Path(record.read_text(encoding="utf-8"))
            if folder.is_dir():
                return folder
        folder = install(fab_file, install_dir, skip_prompt)
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        partial.write_text(str(folder), encoding="utf-8")
        os.replace(partial, record)
        return folder

    return install_fab


def flwr_clientapp() -> None:
    """flwr's ``flwr-clientapp`` command, reading ``sys.argv``."""
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp as command

    command()


def run_child(argv: list[str], quiet: bool, entry: Callable[[], None] = flwr_clientapp) -> int:
    """In a forked child: ``entry`` (flwr's ``flwr-clientapp``) with ``argv`` as ``sys.argv``; its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    if quiet:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    os.close(devnull)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # the global generator: fresh entropy, not the parent's state
    sys.argv = list(argv)
    try:
        entry()
        return 0
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child's last word, then its exit status
        import traceback

        traceback.print_exc()
        return 1


def fork_child(argv: list[str], quiet: bool, entry: Callable[[], None] = flwr_clientapp) -> int:
    """Fork a child that runs ``run_child``; the child's pid (in the parent)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = run_child(argv, quiet, entry)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(code)
    return pid


def serve(lines: Iterable[str], entry: Callable[[], None] = flwr_clientapp) -> None:
    """Fork one child per launch request read from ``lines`` until they end."""
    for line in lines:
        if not line.strip():
            continue
        request = json.loads(line)
        argv = request["argv"]
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            raise ValueError("a launch request's argv must be a non-empty list of strings")
        fork_child(argv, bool(request.get("quiet", False)), entry)


def patch_installer() -> None:
    """Give flwr's ClientApp runtime [`install_once`][fedhead.cli.warm_clientapp.install_once] (every child
    inherits it); exits with one line when the runtime's installer is not flwr 1.42's."""
    from flwr.cli.install import install_from_fab

    runtime = importlib.import_module(INSTALLER)
    if runtime.install_from_fab is not install_from_fab:
        sys.exit(f"fedhead warm ClientApp parent: {INSTALLER}.install_from_fab is not flwr 1.42's: flwr not supported")
    setattr(runtime, "install_from_fab", install_once(install_from_fab))  # noqa: B010 - a module's name


def main() -> None:
    warm()
    patch_installer()
    try:
        pull_retry.retry_sooner(pull_retry.PULLS)  # the children's pulls of their message from the SuperNode
    except RuntimeError as err:
        sys.exit(f"fedhead warm ClientApp parent: {err}")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children: no zombies
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C ends the SuperExec, whose end closes our input
    serve(sys.stdin)


if __name__ == "__main__":
    main()
