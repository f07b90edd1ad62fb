"""fedhead-superexec (fedhead/cli/superexec.py) and its warm parent (fedhead/cli/warm_clientapp.py): a
ClientApp task is a fork of a process that imported flwr and the app's dependencies once, with flwr's own
command line, the FAB's copy of the app, fresh random state and its own exit status; anything else, and
any launch the parent cannot take, is flwr's subprocess executor's."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from flwr.supercore.constant import TaskType
from flwr.supercore.superexec.executor import get_executor
from flwr.supercore.superexec.executor import subprocess_executor as flwr_subprocess
from flwr.supercore.superexec.executor.types import ExecutionSpec

from fedhead.cli import superexec, warm_clientapp

ROOT = Path(__file__).resolve().parents[2]


def _spec(task_type=TaskType.CLIENT_APP, **kw) -> ExecutionSpec:
    fields = dict(
        task_type=task_type,
        runtime_api_address="127.0.0.1:9094",
        token="secret-token",
        insecure=False,
        root_certificates_path=None,
        runtime_dependency_install=False,
        parent_pid=None,
        suppress_output=False,
        task_id=7,
    )
    fields.update(kw)
    return ExecutionSpec(**fields)


SPECS = [
    _spec(),
    _spec(insecure=True, parent_pid=123),
    _spec(root_certificates_path="/certs/ca.crt", runtime_dependency_install=True),
]


@pytest.mark.parametrize("spec", SPECS)
def test_clientapp_argv_is_the_command_line_of_flwrs_subprocess_executor(spec, monkeypatch):
    started = []
    monkeypatch.setattr(flwr_subprocess.subprocess, "Popen", lambda args, **_: started.append(args))
    flwr_subprocess.SubprocessExecutor().launch(spec)
    assert started == [superexec.clientapp_argv(spec)]


def test_main_runs_flwrs_superexec_loop_with_the_warm_executor(monkeypatch):
    loop = importlib.import_module(superexec.SUPEREXEC_LOOP)
    assert loop.get_executor is get_executor  # the name main replaces is flwr 1.42's
    seen = {}
    monkeypatch.setattr(loop, "get_executor", get_executor)
    monkeypatch.setattr(superexec, "flower_superexec", lambda: seen.setdefault("executor", loop.get_executor))
    superexec.main()
    assert seen["executor"] is superexec.warm_get_executor


def _recording_parent(tmp_path: Path) -> list[str]:
    """A stand-in warm parent that appends every launch request to ``requests.jsonl``."""
    script = f"import sys\nfor line in sys.stdin:\n    open({str(tmp_path / 'requests.jsonl')!r}, 'a').write(line)\n"
    return [sys.executable, "-c", script]


def _requests(tmp_path: Path, n: int) -> list[dict]:
    path = tmp_path / "requests.jsonl"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"{path}: fewer than {n} requests")


def test_clientapp_tasks_go_to_the_warm_parent_and_others_to_flwr(tmp_path, monkeypatch):
    executor = superexec.WarmClientAppExecutor(command=_recording_parent(tmp_path))
    started = []  # flwr's executor's launches (subprocess.Popen is one object: patched after the parent's start)
    monkeypatch.setattr(flwr_subprocess.subprocess, "Popen", lambda args, **_: started.append(args))
    try:
        spec = _spec(suppress_output=True)
        assert executor.launch(spec).status == "accepted"
        assert _requests(tmp_path, 1) == [{"argv": superexec.clientapp_argv(spec), "quiet": True}]
        assert started == []
        other = _spec(task_type=TaskType.AGENT_APP)
        executor.launch(other)
        assert started == [superexec.clientapp_argv(other)]
    finally:
        executor.close()
    assert executor.parent is None


def test_an_ended_parent_is_started_again_and_a_broken_one_falls_back_to_flwr(tmp_path, monkeypatch, caplog):
    real_popen = subprocess.Popen
    executor = superexec.WarmClientAppExecutor.__new__(superexec.WarmClientAppExecutor)
    executor.command = _recording_parent(tmp_path)
    executor.parent = real_popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE, text=True)
    executor.parent.wait()
    executor._start_parent = lambda: setattr(
        executor, "parent", real_popen(executor.command, stdin=subprocess.PIPE, text=True)
    )
    try:
        executor.launch(_spec())
        assert "has ended" in caplog.text
        assert len(_requests(tmp_path, 1)) == 1
        executor.parent.stdin.close()  # a parent whose input is gone: the launch is flwr's
        executor.parent.wait()
        executor._start_parent = lambda: None
        started = []
        monkeypatch.setattr(flwr_subprocess.subprocess, "Popen", lambda args, **_: started.append(args))
        executor.parent = type("Broken", (), {"poll": lambda self: None, "stdin": executor.parent.stdin})()
        assert executor.launch(_spec()).status == "accepted"
        assert started == [superexec.clientapp_argv(_spec())]
        assert "took no launch" in caplog.text
    finally:
        executor.parent = None


CHILD = textwrap.dedent(
    """
    import json, os, random, sys
    import numpy as np
    from fedhead.cli import warm_clientapp

    out = sys.argv[1]

    def entry():
        record = dict(argv=sys.argv, pid=os.getpid(), np=np.random.random(), py=random.random(),
                      stdin=sys.stdin.read())
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
            json.dump(record, f)
        raise SystemExit(int(sys.argv[0]))

    pids = [warm_clientapp.fork_child([str(code)], False, entry) for code in (0, 3)]
    print(json.dumps([[pid, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])] for pid in pids]))
    """
)


def test_children_have_their_argv_fresh_random_state_no_input_and_their_exit_status(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], input="the parent's input", capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    statuses = dict(json.loads(res.stdout))
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert sorted(statuses.values()) == [0, 3]
    assert sorted(r["argv"][0] for r in records) == ["0", "3"]
    assert {statuses[r["pid"]] for r in records} == {0, 3}
    assert records[0]["np"] != records[1]["np"] and records[0]["py"] != records[1]["py"]
    assert [r["stdin"] for r in records] == ["", ""]


def test_warm_parent_keeps_dependencies_but_children_import_the_app_from_their_fab(tmp_path):
    fab = tmp_path / "fab" / "fedhead"
    fab.mkdir(parents=True)
    (fab / "__init__.py").write_text("")
    (fab / "client_app.py").write_text("FROM_FAB = True\n")
    script = textwrap.dedent(
        f"""
        import sys
        from fedhead.cli import warm_clientapp
        dropped = warm_clientapp.warm(("fedhead.client_app", "numpy"), "fedhead")
        assert "fedhead.client_app" in dropped and "numpy" in sys.modules, dropped
        assert not [m for m in sys.modules if m.split(".")[0] == "fedhead"]
        from flwr.supercore.object_ref import load_app
        app = load_app("fedhead.client_app:FROM_FAB", ValueError, {str(fab.parent)!r})
        print(app, sys.modules["fedhead.client_app"].__file__)
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    flag, path = res.stdout.split()
    assert flag == "True" and Path(path) == fab / "client_app.py"


def test_the_warm_parent_forks_flwr_clientapp_per_request_and_ends_with_its_input():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    parent = subprocess.Popen(
        [*superexec.WARM_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    request = {"argv": ["flwr-clientapp", "--help"], "quiet": False}
    out, err = parent.communicate(json.dumps(request).encode() + b"\n", timeout=120)
    assert parent.returncode == 0, err.decode()[-2000:]
    assert b"usage: flwr-clientapp" in out, (out + err).decode()[-2000:]
    assert warm_clientapp.PRELOAD[0] == "flwr.supernode.cli.flwr_clientapp"


_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "tinyapp"
version = "1.0.0"

[tool.flwr.app]
publisher = "tester"

[tool.flwr.app.components]
serverapp = "tinyapp.server:app"
clientapp = "tinyapp.client:app"

[tool.flwr.app.config]
rounds = 1
"""


def _fab(body: str = "x = 1\n", *, tamper: bool = False) -> bytes:
    """A FAB as flwr builds one: the files, and ``.info/CONTENT`` with each file's SHA-256 (``tamper``: a wrong one)."""
    import hashlib
    import io
    import zipfile

    files = {"pyproject.toml": _PYPROJECT, "tinyapp/__init__.py": body}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        lines = []
        for name, text in files.items():
            archive.writestr(name, text)
            digest = hashlib.sha256((text + ("#" if tamper else "")).encode()).hexdigest()
            lines.append(f"{name},{digest},{len(text)}")
        archive.writestr(".info/CONTENT", "\n".join(lines) + "\n")
    return buf.getvalue()


@pytest.fixture
def counted_install(tmp_path, monkeypatch):
    """flwr's own ``install_from_fab`` into a private ``FLWR_HOME``, counting its calls, behind ``install_once``."""
    from flwr.cli.install import install_from_fab

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    calls = []

    def install(*args):
        calls.append(args)
        return install_from_fab(*args)

    return warm_clientapp.install_once(install), calls


def test_a_fab_is_installed_and_checked_once_per_node(counted_install, tmp_path):
    install, calls = counted_install
    first = install(_fab(), None, True)
    assert (first / "tinyapp" / "__init__.py").read_text() == "x = 1\n" and len(calls) == 1
    assert install(_fab(), None, True) == first and len(calls) == 1  # the same bytes: the folder installed before
    other = install(_fab("x = 2\n"), None, True)
    assert other != first and (other / "tinyapp" / "__init__.py").read_text() == "x = 2\n" and len(calls) == 2
    import shutil

    shutil.rmtree(first)  # a folder that is gone is installed again
    assert install(_fab(), None, True) == first and first.is_dir() and len(calls) == 3
    records = list((tmp_path / "flwr-home" / "apps" / warm_clientapp.INSTALLED).iterdir())
    assert len(records) == 2 and not [r for r in records if r.name.endswith(".tmp")]


def test_a_fab_whose_files_fail_their_hashes_is_refused_every_time(counted_install, tmp_path):
    import click

    install, calls = counted_install
    for _ in range(2):
        with pytest.raises(click.ClickException, match="hashes couldn't be verified"):
            install(_fab(tamper=True), None, True)
    assert len(calls) == 2 and not (tmp_path / "flwr-home" / "apps" / warm_clientapp.INSTALLED).exists()


def test_the_parent_gives_flwrs_runtime_the_install_once_installer_and_refuses_another(monkeypatch):
    from flwr.cli.install import install_from_fab

    runtime = importlib.import_module(warm_clientapp.INSTALLER)
    monkeypatch.setattr(runtime, "install_from_fab", install_from_fab)
    warm_clientapp.patch_installer()
    assert runtime.install_from_fab is not install_from_fab and runtime.install_from_fab.__name__ == "install_fab"
    with pytest.raises(SystemExit, match="is not flwr 1.42's"):
        warm_clientapp.patch_installer()  # not flwr's any more
