"""Sizes of the package's code: no module of ``fedhead/`` over ``MODULE_LIMIT`` lines, no function
or method over ``FUNCTION_LIMIT`` lines, but for the exceptions listed below, each of which must
still be needed (so the list shrinks as the files do).

A module's lines are its physical lines (``wc -l``). A function's lines run from its ``def`` line to
its last line (``ast``'s ``end_lineno - lineno + 1``), its decorators not counted; a nested function
counts inside its enclosing one and on its own.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LIMIT = 400
FUNCTION_LIMIT = 80

#: Modules allowed over MODULE_LIMIT until they are split (paths relative to the repository).
LONG_MODULES: set[str] = set()
#: Functions allowed over FUNCTION_LIMIT until they are split, as ``path:qualified name``.
LONG_FUNCTIONS: set[str] = set()


@dataclass(frozen=True)
class Function:
    path: str
    name: str  # qualified: Class.method, outer.inner
    line: int
    lines: int

    @property
    def key(self) -> str:
        return f"{self.path}:{self.name}"


def _modules() -> dict[str, str]:
    """``path -> source`` of every module of the package."""
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in sorted((ROOT / "fedhead").rglob("*.py"))
    }


def _functions(path: str, source: str) -> list[Function]:
    out: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                assert child.end_lineno is not None
                out.append(Function(path, name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename=path), "")
    return out


MODULES = _modules()
FUNCTIONS = [f for path, source in MODULES.items() for f in _functions(path, source)]


def _module_lines(source: str) -> int:
    return len(source.splitlines())


def test_a_function_counts_from_its_def_line_to_its_last_line():
    source = (
        "@cache\ndef f():\n    def g():\n        pass\n    return g\n\n\n"
        "class C:\n    async def m(self):\n        pass\n"
    )
    found = {f.name: (f.line, f.lines) for f in _functions("x.py", source)}
    assert found == {"f": (2, 4), "f.g": (3, 2), "C.m": (9, 2)}


def test_the_walk_sees_the_whole_package():
    assert len(MODULES) > 150, f"only {len(MODULES)} modules found under fedhead/"
    assert len(FUNCTIONS) > 1000, f"only {len(FUNCTIONS)} functions found under fedhead/"
    assert sum("." in f.name for f in FUNCTIONS) > 300, "methods and nested functions are measured too"
    assert max(map(_module_lines, MODULES.values())) > MODULE_LIMIT / 2


def test_no_module_is_over_the_limit():
    over = [
        f"{path}: {n} lines (limit {MODULE_LIMIT})"
        for path, source in MODULES.items()
        if (n := _module_lines(source)) > MODULE_LIMIT and path not in LONG_MODULES
    ]
    assert not over, "modules over the limit (split them):\n" + "\n".join(over)


def test_no_function_is_over_the_limit():
    over = [
        f"{f.path}:{f.line}: {f.name}: {f.lines} lines (limit {FUNCTION_LIMIT})"
        for f in FUNCTIONS
        if f.lines > FUNCTION_LIMIT and f.key not in LONG_FUNCTIONS
    ]
    assert not over, "functions over the limit (split them):\n" + "\n".join(over)


def test_every_exception_is_still_needed():
    stale = [
        f"{path}: {_module_lines(MODULES[path])} lines, within the limit: drop it from LONG_MODULES"
        if path in MODULES
        else f"{path}: no such module: drop it from LONG_MODULES"
        for path in sorted(LONG_MODULES)
        if path not in MODULES or _module_lines(MODULES[path]) <= MODULE_LIMIT
    ]
    sizes = {f.key: f.lines for f in FUNCTIONS}
    stale += [
        f"{key}: {sizes[key]} lines, within the limit: drop it from LONG_FUNCTIONS"
        if key in sizes
        else f"{key}: no such function: drop it from LONG_FUNCTIONS"
        for key in sorted(LONG_FUNCTIONS)
        if sizes.get(key, 0) <= FUNCTION_LIMIT
    ]
    assert not stale, "exceptions no longer needed:\n" + "\n".join(stale)
