"""Every console script of ``pyproject.toml`` works from the wheel, the editable install and the FAB.

Each is run with ``--help`` from a folder outside the repository (the Hydra ones with an override,
so that the config tree ``pkg://fedhead.conf`` is composed), and ``fedhead`` must come from the
install under test, not from the source tree. The scripts of one install run at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: name -> "module:function", as the installers read it
SCRIPTS: dict[str, str] = PROJECT["scripts"]
DIST_INFO = f"fedhead-{PROJECT['version']}.dist-info"
#: arguments and a text the help must show: the Hydra commands compose their config
HELP = {
    "fedhead-run": (["dataset=walker2d", "--help"], "name: walker2d"),
    "fedhead-data": (["dataset=walker2d", "--help"], "name: walker2d"),
    "fedhead-sweep": (["--help"], "== Config =="),
}
#: build and tool folders left out of the copy to build from (where git cannot list the files)
NOT_SOURCE = (".git", ".venv", "__pycache__", "*.egg-info", "build", "outputs", ".pytest_cache", ".ruff_cache")
WHERE = "import fedhead; print(fedhead.__file__)"

pytestmark = pytest.mark.timeout(240)


def _env(pythonpath: Path | None) -> dict[str, str]:
    """The caller's environment without its PYTHONPATH (the source tree), plus ``pythonpath``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def _run_all(commands: dict[str, list[str]], *, env: dict[str, str], cwd: Path) -> dict[str, tuple[int, str]]:
    """Run the commands at once; name -> (exit status, stdout and stderr)."""
    procs = {
        name: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, cmd in commands.items()
    }
    outputs = {name: p.communicate(timeout=200)[0] for name, p in procs.items()}
    return {name: (procs[name].returncode, out) for name, out in outputs.items()}


def _check_helps(results: dict[str, tuple[int, str]]) -> None:
    """Every script exited 0 and printed its help (the Hydra ones their composed config)."""
    wrong = []
    for name, (rc, out) in results.items():
        expected = HELP.get(name, ([], f"usage: {name}"))[1]
        if rc != 0 or expected not in out:
            wrong.append(
                f"{name}: exit {rc}, {expected!r} {'missing' if expected not in out else 'shown'}\n{out[-1500:]}"
            )
    assert not wrong, "\n\n".join(wrong)


def _help_args(name: str) -> list[str]:
    return HELP.get(name, (["--help"], ""))[0]


def _entry_point(name: str) -> list[str]:
    """A console script run through its ``module:function`` (where no launcher is installed)."""
    module, function = SCRIPTS[name].split(":")
    code = f"import sys; from {module} import {function}; sys.argv[0] = {name!r}; sys.exit({function}())"
    return [sys.executable, "-c", code, *_help_args(name)]


def _where(env: dict[str, str], cwd: Path, *, imports: str = "") -> Path:
    """The folder ``fedhead`` is imported from under ``env`` (after importing ``imports``)."""
    code = f"import {imports}; {WHERE}" if imports else WHERE
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip().splitlines()[-1]).resolve()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the repository as a fresh clone has it (git's files, links kept, uncommitted changes too)."""
    dest = tmp_path_factory.mktemp("checkout") / "fedhead"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if listed.returncode != 0:  # not a git checkout: copy the tree without its build and tool folders
        shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
        return dest
    for rel in filter(None, listed.stdout.decode().split("\0")):
        source, target = ROOT / rel, dest / rel
        if not source.is_symlink() and not source.is_file():
            continue  # listed but deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        else:
            shutil.copy2(source, target)
    return dest


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A working folder outside the repository."""
    return tmp_path_factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def wheel(checkout, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", out, checkout], check=True, cwd=out)
    (path,) = out.glob("fedhead-*.whl")
    return path


@pytest.fixture(scope="module")
def fab(checkout, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fab")
    flwr = shutil.which("flwr", path=str(BIN)) or shutil.which("flwr")
    if flwr is None:
        pytest.skip("flwr's command line is not installed")
    subprocess.run([flwr, "build", "--app", str(checkout)], check=True, cwd=out, capture_output=True, timeout=200)
    (path,) = out.glob("*.fab")  # flwr build writes the bundle into the working folder
    return path


def _package_files(names: list[str]) -> set[str]:
    return {n for n in names if n.startswith("fedhead/")}


def _source_files() -> set[str]:
    """The files a build must carry: every .py and .yaml under fedhead/."""
    return {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "fedhead").rglob("*")
        if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    }


def test_the_wheel_carries_the_package_once_with_its_config_tree(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert len(names) == len(set(names)), "a file twice in the wheel"
    assert _package_files(names) == _source_files()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"fedhead", DIST_INFO}, tops  # no strategies/, clients/, conf/ links
    entry_points = zipfile.ZipFile(wheel).read(f"{DIST_INFO}/entry_points.txt").decode()
    assert all(f"{name} = {target}" in entry_points for name, target in SCRIPTS.items()), entry_points


def test_every_console_script_runs_from_the_wheel_outside_the_repository(wheel, outside, tmp_path):
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--no-deps", "--target", target, wheel], check=True, cwd=outside)
    env = _env(target)
    assert _where(env, outside).is_relative_to(target.resolve())
    commands = {name: [str(target / "bin" / name), *_help_args(name)] for name in SCRIPTS}
    _check_helps(_run_all(commands, env=env, cwd=outside))


def _editable_project() -> Path | None:
    """The project folder of an editable install of fedhead in this interpreter, if any."""
    try:
        direct = json.loads(metadata.distribution("fedhead").read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        return None
    if not direct.get("dir_info", {}).get("editable"):
        return None
    return Path(direct["url"].removeprefix("file://")).resolve()


def test_every_console_script_runs_from_the_editable_install_outside_the_repository(outside):
    project = _editable_project()
    if project is None:
        pytest.skip("fedhead is not installed in editable mode in this interpreter")
    env = _env(None)
    assert _where(env, outside).is_relative_to(project / "fedhead")
    missing = [name for name in SCRIPTS if not (BIN / name).is_file()]
    assert not missing, f"console scripts not installed in {BIN}: {missing} (reinstall: pip install -e .)"
    _check_helps(_run_all({name: [str(BIN / name), *_help_args(name)] for name in SCRIPTS}, env=env, cwd=outside))


def test_the_fab_carries_the_flower_facing_packages_and_the_config_tree(fab):
    names = zipfile.ZipFile(fab).namelist()
    assert len(names) == len(set(names)), "a file twice in the FAB"
    assert _package_files(names) == _source_files()
    assert {n for n in names if not n.startswith(("fedhead/", ".info/"))} == {"pyproject.toml"}, "docs, tests..."
    for required in ("fedhead/strategies/__init__.py", "fedhead/clients/__init__.py", "fedhead/conf/config.yaml"):
        assert required in names
    tops = {n.split("/")[0] for n in names}
    assert not tops & {"strategies", "clients", "conf"}, "flwr build skips the top-level links"


@pytest.fixture(scope="module")
def unpacked_fab(fab, tmp_path_factory) -> Path:
    unpacked = tmp_path_factory.mktemp("fab-unpacked")
    zipfile.ZipFile(fab).extractall(unpacked)
    return unpacked


def test_the_fab_imports_the_flower_components_outside_the_repository(unpacked_fab, outside):
    components = "fedhead.strategies, fedhead.clients, fedhead.conf, fedhead.server_app, fedhead.client_app"
    assert _where(_env(unpacked_fab), outside, imports=components).is_relative_to(unpacked_fab.resolve())


@pytest.mark.slow  # ~17 s of CPU; the FAB carries the wheel's files (checked above) and Flower runs no script from it
def test_every_console_script_runs_from_the_fab_outside_the_repository(unpacked_fab, outside):
    _check_helps(_run_all({name: _entry_point(name) for name in SCRIPTS}, env=_env(unpacked_fab), cwd=outside))
