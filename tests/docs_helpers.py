"""Markdown links and headings of the repository's pages, as the docs site reads them (tests of
the docs and of the README's house rules)."""

from __future__ import annotations

import re
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
# The Markdown pages of the repository: the README and benchmarks/README.md (site pages through
# docs/hooks.py) and the guides of docs/ (the API pages hold only ``::: module`` directives).
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", flags=re.M | re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", flags=re.M)


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a ``#`` comment there is no heading)."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, as the site's toc extension makes them."""
    titles = HEADING.findall(_prose(page.read_text(encoding="utf-8")))
    return {slugify(re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", title), "-") for title in titles}


def relative_links(page: Path) -> list[tuple[str, Path, str]]:
    """Every relative link and image of ``page`` outside code: (target as written, path, anchor)."""
    found = []
    for match in LINK.finditer(_prose(page.read_text(encoding="utf-8"))):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found.append((target, (page.parent / path).resolve() if path else page, anchor))
    return found
