"""The package's layers, checked over folders: imports point down only, and nothing below the
data layer imports torch or flwr (a static walk over every import, module level or not)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Layer rank of every top-level part of ``fedhead``; a module may import its own rank or lower.
#: Parts of equal rank named in INDEPENDENT must not import each other.
RANK = {
    "ufm": 0,
    "analysis": 1,
    "results": 2,
    "plotting": 3,
    "data": 4,
    "models": 5,
    "train": 6,
    "federation": 7,
    "strategies": 8,
    "clients": 8,
    "conf": 8,
    "driver": 9,
    "sweep": 10,
    "experiments": 10,
    "report": 11,
    "cli": 12,
    "server_app": 12,
    "client_app": 12,
}
INDEPENDENT = {frozenset({"strategies", "clients"}), frozenset({"sweep", "experiments"})}
#: The layers that must stay importable without torch or flwr.
NO_TORCH_OR_FLWR = {"ufm", "analysis", "results", "plotting"}
ROOMS = {"strategies": "strategies", "clients": "clients", "conf": "conf"}


def _part_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ROOMS:
        return rel.parts[0]
    if len(rel.parts) == 2:  # fedhead/<module>.py
        return rel.stem
    return rel.parts[1]


def _sources() -> list[Path]:
    files = [p for p in (ROOT / "fedhead").rglob("*.py")]
    for room in ROOMS:
        files += list((ROOT / room).rglob("*.py"))
    return sorted(files)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            if node.module == "fedhead":  # from fedhead import ufm, plotting
                out += [(node.lineno, f"fedhead.{a.name}") for a in node.names]
    return out


def _target_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "fedhead" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in RANK else None


def test_top_level_holds_only_the_face_and_the_flower_components():
    modules = sorted(p.name for p in (ROOT / "fedhead").glob("*.py"))
    assert modules == ["__init__.py", "client_app.py", "server_app.py"]
    folders = sorted(p.name for p in (ROOT / "fedhead").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert set(folders) | set(ROOMS) | {"server_app", "client_app"} == set(RANK), folders


def test_every_folder_states_its_purpose_in_one_line():
    for init in list((ROOT / "fedhead").glob("*/__init__.py")) + [ROOT / r / "__init__.py" for r in ROOMS]:
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and doc.strip(), f"{init.relative_to(ROOT)} has no docstring"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down_only(path: Path):
    part = _part_of(path)
    if part == "__init__":
        return
    rank = RANK[part]
    wrong = []
    for line, module in _imports(path):
        root = module.split(".")[0]
        if part in NO_TORCH_OR_FLWR and root in {"torch", "torchvision", "flwr", "ray"}:
            wrong.append(f"line {line}: {module} (no torch/flwr/ray in the {part} layer)")
        target = _target_part(module)
        if target is None or target == part:
            continue
        if RANK[target] > rank or frozenset({part, target}) in INDEPENDENT:
            wrong.append(f"line {line}: {module} ({target}, rank {RANK[target]}) from {part} (rank {rank})")
    assert not wrong, "\n".join(wrong)


def test_installed_package_list_covers_every_folder():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fedhead").rglob("__init__.py")}
    found |= {f"fedhead.{room}" for room in ROOMS}
    assert listed == found
    assert cfg["package-dir"] == {f"fedhead.{room}": room for room in ROOMS}
