"""``fedhead-superexec``: Flower's SuperExec, with a site's ClientApp processes forked from a warm parent.

In flwr 1.42 a SuperNode's SuperExec starts a fresh ``flwr-clientapp`` process for every message, a
SecAgg step or a statistics query included: an interpreter, flwr's imports and the app's before a
handler of milliseconds. ``fedhead-superexec`` takes ``flower-superexec``'s command line and runs
flwr's own SuperExec loop unchanged, with one executor swapped: a ClientApp task is run by a child of
[`fedhead.cli.warm_clientapp`][fedhead.cli.warm_clientapp], a process that made those imports once.
The child runs flwr's ``flwr_clientapp()`` with the arguments flwr's subprocess executor would pass
(``clientapp_argv``) and imports the app from the run's FAB, so what runs at the site is unchanged.
Any other task type, and any launch the warm parent cannot take, goes to flwr's subprocess executor::

    fedhead-superexec --runtime-api-address 127.0.0.1:9094 --root-certificates ca.crt \\
        --superexec-auth-secret-file supernode-1.superexec.secret

``fedhead-supernode`` starts it in place of ``flower-superexec`` in ``--isolation subprocess``
(docs/deployment.md, "What a message costs").
"""

from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from typing import IO

from flwr.supercore.cli.flower_superexec import flower_superexec
from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND, ExecutorType, TaskType
from flwr.supercore.superexec.executor import LaunchResult, get_executor
from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor
from flwr.supercore.superexec.executor.types import ExecutionSpec, Executor

LOG = logging.getLogger(__name__)
#: flwr's SuperExec loop, whose ``get_executor`` is the one name ``main`` replaces
SUPEREXEC_LOOP = "flwr.supercore.superexec.run_superexec"
WARM_PARENT = [sys.executable, "-m", "fedhead.cli.warm_clientapp"]


def clientapp_argv(spec: ExecutionSpec) -> list[str]:
    """The command line flwr 1.42's ``SubprocessExecutor.launch`` gives ``flwr-clientapp`` for ``spec``."""
    argv = [
        TASK_TYPE_TO_COMMAND[spec.task_type],
        TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
        spec.runtime_api_address,
        "--token",
        spec.token,
    ]
    if spec.insecure:
        argv.append("--insecure")
    elif spec.root_certificates_path is not None:
        argv += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        argv += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        argv.append("--allow-runtime-dependency-installation")
    return argv


class WarmClientAppExecutor(SubprocessExecutor):
    """flwr's subprocess executor, but a ClientApp task is a fork of the warm parent.

    The parent (``command``, default ``python -m fedhead.cli.warm_clientapp``) starts with the executor
    and is started again if it has ended; a launch it cannot take is started as a fresh process."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = list(command or WARM_PARENT)
        self.parent: subprocess.Popen | None = None
        self._start_parent()

    def _start_parent(self) -> None:
        try:
            self.parent = subprocess.Popen(self.command, stdin=subprocess.PIPE, text=True)
        except OSError as err:
            LOG.warning("the warm ClientApp parent did not start (%s): fresh flwr-clientapp processes", err)
            self.parent = None

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        """Fork ``spec``'s ClientApp from the warm parent; anything else as flwr does."""
        if spec.task_type != TaskType.CLIENT_APP:
            return super().launch(spec)
        if self.parent is None or self.parent.poll() is not None:
            LOG.warning("the warm ClientApp parent has ended (status %s): starting it again", self._status())
            self._start_parent()
        request = json.dumps({"argv": clientapp_argv(spec), "quiet": spec.suppress_output})
        try:
            stdin: IO[str] | None = None if self.parent is None else self.parent.stdin
            if stdin is None:
                raise OSError("no warm parent")
            stdin.write(request + "\n")
            stdin.flush()
        except (OSError, ValueError) as err:
            LOG.warning("the warm ClientApp parent took no launch (%s): a fresh flwr-clientapp process", err)
            return super().launch(spec)
        return LaunchResult.accepted()

    def _status(self) -> int | None:
        return None if self.parent is None else self.parent.returncode

    def close(self) -> None:
        """End the warm parent (its children finish their messages)."""
        if self.parent is None:
            return
        try:
            if self.parent.stdin is not None:
                self.parent.stdin.close()
            self.parent.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.parent.kill()
        self.parent = None


def warm_get_executor(executor_type: ExecutorType, executor_config=None, **kwargs) -> Executor:
    """flwr's ``get_executor``, with ``WarmClientAppExecutor`` for its subprocess executor."""
    if executor_type == ExecutorType.SUBPROCESS:
        return WarmClientAppExecutor()
    return get_executor(executor_type, executor_config=executor_config, **kwargs)


def main() -> None:
    loop = importlib.import_module(SUPEREXEC_LOOP)
    if getattr(loop, "get_executor", None) is not get_executor:
        sys.exit(f"fedhead-superexec: error: {SUPEREXEC_LOOP}.get_executor is not flwr 1.42's: flwr not supported")
    setattr(loop, "get_executor", warm_get_executor)  # noqa: B010 - a module's name, set on purpose
    flower_superexec()


if __name__ == "__main__":
    main()
