"""The package's layers, checked over folders: imports point down only, and nothing below the
data layer imports torch or flwr (a static walk over every import, module level or not)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Layer rank of every top-level part of ``fedhead``; a module may import its own rank or lower.
#: Parts of equal rank named in INDEPENDENT must not import each other.
RANK = {
    "ufm": 0,
    "progress": 0,
    "analysis": 1,
    "results": 2,
    "plotting": 3,
    "data": 4,
    "models": 5,
    "train": 6,
    "settings": 7,
    "federation": 8,
    "strategies": 9,
    "clients": 9,
    "conf": 9,
    "driver": 10,
    "sweep": 11,
    "experiments": 11,
    "report": 12,
    "cli": 13,
    "server_app": 13,
    "client_app": 13,
}
INDEPENDENT = {frozenset({"strategies", "clients"}), frozenset({"sweep", "experiments"})}
#: The layers that must stay importable without torch or flwr.
NO_TORCH_OR_FLWR = {"ufm", "progress", "analysis", "results", "plotting"}
#: The Flower-facing folders, shown at the repository's top level as links into ``fedhead/``.
ROOMS = ("strategies", "clients", "conf")


def _part_of(path: Path) -> str:
    rel = path.relative_to(ROOT / "fedhead")
    return rel.stem if len(rel.parts) == 1 else rel.parts[0]


def _sources() -> list[Path]:
    return sorted((ROOT / "fedhead").rglob("*.py"))


def _module_name(path: Path) -> list[str]:
    """The dotted name of ``path``'s package (``fedhead/train/trainer.py`` -> fedhead.train)."""
    return list(path.relative_to(ROOT).parent.parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every import of ``path`` as an absolute module name; relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _module_name(path)[: len(_module_name(path)) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.append((node.lineno, base))
            if base == "fedhead" or node.level:  # from fedhead import ufm / from .. import ufm
                out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
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
    assert set(folders) | {"server_app", "client_app"} == set(RANK), folders
    assert all((ROOT / "fedhead" / f / "__init__.py").is_file() for f in folders), "a folder without __init__.py"


def test_top_level_links_are_the_flower_facing_folders():
    """``strategies/``, ``clients/`` and ``conf/`` at the top are links into ``fedhead/`` (one
    folder, one import name: ``fedhead.<room>``), and no other link exists there."""
    links = sorted(p.name for p in ROOT.iterdir() if p.is_symlink())
    assert links == sorted(ROOMS)
    for room in ROOMS:
        assert (ROOT / room).readlink() == Path("fedhead") / room


def test_only_fedhead_names_import_the_flower_facing_folders():
    """Code imports ``fedhead.strategies`` and the like, never the bare top-level names (the
    examples are a user's own project, with a ``clients`` package of its own)."""
    roots = [ROOT / d for d in ("fedhead", "tests", "benchmarks", "scripts")]
    bare = []
    for path in sorted(p for r in roots for p in r.rglob("*.py") if "examples" not in p.relative_to(ROOT).parts):
        for line, module in _imports(path):
            if module.split(".")[0] in ROOMS:
                bare.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not bare, "\n".join(bare)


def test_every_folder_states_its_purpose_in_one_line():
    for init in (ROOT / "fedhead").glob("*/__init__.py"):
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
