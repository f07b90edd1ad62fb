"""Rewrite Sphinx cross-reference roles in docstrings to mkdocstrings/autorefs links.

``:func:`train_local``` becomes ``[`train_local`][fedhead.train.local.train_local]``: the form that
``mkdocs build --strict`` checks. Short names are resolved with griffe (a static view of the package):
the enclosing class, the module's own members, the module's imports, then a name unique in the
package. Names outside the package (flwr, torch, numpy) become plain code. Every reference that
cannot be resolved is printed as ``file:line`` for a human to fix; existing autorefs links whose
target no longer exists are printed too, so a rerun after a rename shows what went stale.
Idempotent: a second run changes nothing.

Usage: ``python scripts/sphinx_roles_to_autorefs.py [--check] [PATH ...]`` (default ``fedhead``);
``--check`` writes nothing and exits 1 if a file would change or a reference is unresolved.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fedhead"
LINE_LIMIT = 120  # [tool.ruff] line-length
# a line starting so would open a list, a heading or a quote in Markdown: never break before one
BLOCK_START = re.compile(r"([-*+>#]|\d+[.)])(\s|$)")

ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj):`(?P<body>[^`]+)`")
# [`text`][target] with a dotted target: the form this script writes
AUTOREF = re.compile(r"\[`(?P<text>[^`\]]+)`\]\[(?P<target>[A-Za-z_][\w.]*)\]")


@dataclass
class Report:
    """What one run found: unresolved references (``file:line: text``) and changed files."""

    unresolved: list[str] = field(default_factory=list)
    guessed: list[str] = field(default_factory=list)
    changed: list[Path] = field(default_factory=list)


class Index:
    """A static view of the package: which dotted paths exist, and where aliases point."""

    def __init__(self, root: Path = ROOT, package: str = PACKAGE):
        self.package = griffe.load(package, search_paths=[str(root)], resolve_aliases=True, resolve_external=False)
        self.by_name: dict[str, list[str]] = {}
        self._index(self.package)

    def _index(self, obj: griffe.Object) -> None:
        for member in obj.members.values():
            if member.is_alias:
                continue
            self.by_name.setdefault(member.name, []).append(member.path)
            if member.is_module or member.is_class:
                self._index(member)  # type: ignore[arg-type]

    def lookup(self, path: str) -> griffe.Object | griffe.Alias | None:
        """The object at a dotted path inside the package, or None."""
        if path == self.package.path:
            return self.package
        prefix = self.package.path + "."
        if not path.startswith(prefix):
            return None
        try:
            return self.package[path[len(prefix) :]]
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def canonical(self, path: str, module: bool | None = None) -> str | None:
        """The public path of the object at ``path`` if it is defined inside the package.

        ``module``: True accepts only a module, False only a non-module (``:func:`align``` must not
        land on the module ``align`` of the same name), None either.
        """
        obj = self.lookup(path)
        if obj is not None and obj.is_alias:
            obj = self._target(obj)  # type: ignore[arg-type]
        if obj is None or not obj.path.startswith(self.package.path):
            return None
        if module is not None and obj.is_module != module:
            return None
        return self.public(obj.path)

    @staticmethod
    def _target(alias: griffe.Alias) -> griffe.Object | griffe.Alias | None:
        try:
            return alias.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None

    def public(self, path: str) -> str:
        """The shortest path a package's ``__init__`` re-exports ``path`` under (itself if none).

        ``fedhead.train.trainer.train_local`` becomes ``fedhead.train.train_local``, which survives
        a move of the function inside its package; methods keep their class's public path.
        """
        obj = self.lookup(path)
        if obj is None:
            return path
        owner = obj
        while owner.parent is not None and owner.parent.is_class:  # a method: shorten its class
            owner = owner.parent
        suffix = path[len(owner.path) :]
        module = owner.parent
        best = owner.path
        while module is not None and module.parent is not None:
            module = module.parent
            exported = module.members.get(owner.name)
            if exported is not None and exported.is_alias and self._target_path(exported) == owner.path:
                best = f"{module.path}.{owner.name}"
        return best + suffix

    @classmethod
    def _target_path(cls, alias: griffe.Alias) -> str | None:
        target = cls._target(alias)
        return target.path if target is not None else None


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted module name of a file under the repository root."""
    parts = list(path.resolve().relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> dotted path, from every import statement in the file."""
    names: dict[str, str] = {}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def class_spans(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every class in the file."""
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                spans.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, prefix)

    visit(tree, "")
    return spans


@dataclass
class FileContext:
    """What resolving a short name in one file needs."""

    module: str
    is_package: bool
    imports: dict[str, str]
    classes: list[tuple[int, int, str]]

    def enclosing_class(self, line: int) -> str | None:
        inner = [span for span in self.classes if span[0] <= line <= span[1]]
        return max(inner, key=lambda span: span[0])[2] if inner else None


def candidates(name: str, role: str, line: int, ctx: FileContext, index: Index) -> list[str]:
    """Dotted paths ``name`` may mean in this file, most specific first."""
    if name.startswith("."):
        package = ctx.module if ctx.is_package else ctx.module.rpartition(".")[0]
        level = len(name) - len(name.lstrip("."))
        anchor = package.split(".")[: len(package.split(".")) - level + 1]
        return [".".join(anchor + [name.lstrip(".")])]
    found: list[str] = []
    cls = ctx.enclosing_class(line)
    if cls:
        found.append(f"{ctx.module}.{cls}.{name}")
    found.append(f"{ctx.module}.{name}")
    head, _, rest = name.partition(".")
    if head in ctx.imports:
        found.append(ctx.imports[head] + (f".{rest}" if rest else ""))
    if head == PACKAGE:
        found.append(name)
    else:
        found.append(f"{PACKAGE}.{name}")  # a bare folder name: strategies.x means fedhead.strategies.x
    if role in ("meth", "attr"):
        for _start, _end, qual in ctx.classes:
            found.append(f"{ctx.module}.{qual}.{name}")
    return found


def is_external(name: str, ctx: FileContext) -> bool:
    """True when the name points outside the package (flwr, torch, numpy, the standard library)."""
    head = name.lstrip(".").split(".")[0]
    if head in ctx.imports:
        return not ctx.imports[head].startswith(PACKAGE + ".") and ctx.imports[head] != PACKAGE
    if head == PACKAGE or (ROOT / PACKAGE / head).exists() or (ROOT / PACKAGE / f"{head}.py").exists():
        return False
    return head in dir(builtins) or importlib.util.find_spec(head) is not None


def resolve(name: str, role: str, line: int, ctx: FileContext, index: Index) -> tuple[str | None, bool]:
    """The canonical target of one reference and whether it was a unique-name guess (None: not found)."""
    want_module = role == "mod" if role != "obj" else None
    for candidate in candidates(name, role, line, ctx, index):
        target = index.canonical(candidate, module=want_module)
        if target:
            return target, False
    last = name.split(".")[-1]
    matches = [
        path
        for path in index.by_name.get(last, [])
        if path.endswith("." + name) and index.canonical(path, module=want_module)
    ]
    if len(matches) == 1:
        return index.public(matches[0]), True
    return None, False


def display_text(body: str) -> tuple[str, str]:
    """(shown text, referenced name) of a role's body: ``~a.b`` shows ``b``; ``title <a.b>`` shows ``title``."""
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<name>[^>]+)>", body)
    if explicit:
        return explicit["title"], explicit["name"].lstrip("~")
    name = body.lstrip("~")
    shown = name.split(".")[-1] if body.startswith("~") else name.lstrip(".")
    return shown, name


def convert_text(text: str, path: Path, index: Index, report: Report) -> str:
    """The file's text with every role rewritten; unresolved ones are kept and reported."""
    tree = ast.parse(text)
    module = module_name(path)
    is_package = path.name == "__init__.py"
    ctx = FileContext(module, is_package, imported_names(tree, module, is_package), class_spans(tree))
    line_starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]

    def line_of(offset: int) -> int:
        low, high = 0, len(line_starts)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if line_starts[mid] <= offset else (low, mid)
        return low + 1

    def rewrite(match: re.Match[str]) -> str:
        line = line_of(match.start())
        shown, name = display_text(match["body"])
        where = f"{path.relative_to(ROOT)}:{line}"
        target, guessed = resolve(name, match["role"], line, ctx, index)
        if (target is None or guessed) and is_external(name, ctx):
            return f"`{shown}`"
        if target is None:
            report.unresolved.append(f"{where}: {match.group(0)}")
            return match.group(0)
        if guessed:
            report.guessed.append(f"{where}: {match.group(0)} -> {target}")
        return f"[`{shown}`][{target}]"

    converted = wrap_long_lines(ROLE.sub(rewrite, text))
    for match in AUTOREF.finditer(converted):
        if match["target"].startswith(PACKAGE) and index.lookup(match["target"]) is None:
            report.unresolved.append(f"{path.relative_to(ROOT)}:{line_of(match.start())}: stale link {match.group(0)}")
    return converted


def break_points(line: str) -> list[int]:
    """Offsets of the spaces of a line outside code spans and links (where it may be broken)."""
    points, in_code, depth = [], False, 0
    for offset, char in enumerate(line):
        if char == "`":
            in_code = not in_code
        elif not in_code and char == "[":
            depth += 1
        elif not in_code and char == "]":
            depth = max(depth - 1, 0)
        elif char == " " and not in_code and depth == 0:
            points.append(offset)
    return points


def wrap_long_lines(text: str, limit: int = LINE_LIMIT) -> str:
    """Break the lines a link made longer than ``limit`` at spaces, keeping their indentation.

    Only lines holding an autorefs link are touched; a comment's continuation keeps its ``#``.
    """
    out: list[str] = []
    for line in text.split("\n"):
        while len(line) > limit and AUTOREF.search(line):
            body = line.lstrip()
            prefix = line[: len(line) - len(body)] + ("# " if body.startswith("#") else "")
            points = [
                p
                for p in break_points(line)
                if len(prefix) < p <= limit and line[:p].strip(" #") and not BLOCK_START.match(line[p + 1 :])
            ]
            if not points:
                break
            out.append(line[: points[-1]].rstrip())
            line = prefix + line[points[-1] + 1 :].lstrip()
        out.append(line)
    return "\n".join(out)


def python_files(paths: list[Path]) -> list[Path]:
    """Every .py file under the given files and folders, symlinked folders skipped."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts))
        else:
            files.append(path)
    return files


def run(paths: list[Path], write: bool, index: Index | None = None) -> Report:
    """Convert (or, with ``write=False``, only check) every file; returns what was found."""
    index = index or Index()
    report = Report()
    for path in python_files(paths):
        text = path.read_text(encoding="utf-8")
        converted = convert_text(text, path.resolve(), index, report)
        if converted != text:
            report.changed.append(path)
            if write:
                path.write_text(converted, encoding="utf-8")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, default=[ROOT / PACKAGE])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change")
    args = parser.parse_args(argv)
    report = run(args.paths, write=not args.check)
    for line in report.guessed:
        print(f"guessed (unique name, check it): {line}")
    for line in report.unresolved:
        print(f"unresolved: {line}")
    verb = "would change" if args.check else "changed"
    print(f"{verb} {len(report.changed)} files; {len(report.unresolved)} unresolved; {len(report.guessed)} guessed")
    return 1 if report.unresolved or (args.check and report.changed) else 0


if __name__ == "__main__":
    sys.exit(main())
