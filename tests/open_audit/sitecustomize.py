"""Logs which files under one folder a Python process opens (a test aid, never imported by fedhead).

A process started with this folder first on ``PYTHONPATH`` and ``FEDHEAD_OPEN_AUDIT=<log dir>``
and ``FEDHEAD_OPEN_AUDIT_UNDER=<watched dir>`` in its environment imports this module at start-up
(Python's ``site``), which adds an audit hook (:func:`sys.addaudithook`, PEP 578) for the
``open`` event: every ``open()``, ``io.open`` and ``os.open`` of a path under the watched folder
is appended to ``<log dir>/<pid>.log``. The file's first line is JSON: the pid, the pids of its
ancestors at start-up (parent first) and its command line; every further line is one opened
absolute path. Children inherit the environment, so a SuperNode's ClientApp processes log too.
``tests/driver/test_own_data_tutorial.py`` reads these logs.
"""

import json
import os
import sys


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1 and len(out) < 64:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        out.append(pid)
    return out


def _install(log_dir: str, under: str) -> None:
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        argv = list(sys.argv)
    head = {"pid": os.getpid(), "ancestors": _ancestors(os.getpid()), "argv": argv}
    fd = os.open(os.path.join(log_dir, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (json.dumps(head) + "\n").encode())
    prefix = os.path.join(os.path.abspath(under), "")

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(args[0])
        full = os.path.abspath(path)
        if full.startswith(prefix):
            os.write(fd, (full + "\n").encode())

    sys.addaudithook(hook)


if os.environ.get("FEDHEAD_OPEN_AUDIT") and os.environ.get("FEDHEAD_OPEN_AUDIT_UNDER"):
    _install(os.environ["FEDHEAD_OPEN_AUDIT"], os.environ["FEDHEAD_OPEN_AUDIT_UNDER"])
