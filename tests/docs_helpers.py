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


# privacy.md's claims: a paragraph or list item of its sections 2-8 with one of these words makes a privacy
# claim, and names the test that holds it (`tests/<file>.py::test_<name>`, or a `test_<name>` of a file the
# section named: three words at least, so that a metric such as `test_mse` is none) or, for a measured
# number, its benchmark (`benchmarks/<file>.py`).
CLAIM = re.compile(
    r"\b(learns?|never|cannot|hides?|protects?|refus\w*|nothing|leaves? the site|not noised|oracle|reveal\w*|"
    r"decod\w*|private|only sums?)\b",
    flags=re.I,
)
EVIDENCE = re.compile(
    r"`(?P<file>(?:tests|benchmarks)/[\w/]+\.py)(?:::(?P<test>test_\w+))?`|`(?P<bare>test_[a-z0-9]+_[a-z0-9]+_\w+)`"
)


def sections(page: Path) -> dict[int, str]:
    """The numbered ``## N. Title`` sections of ``page``, by number, without fenced code."""
    parts = re.split(r"^## (\d+)\. .*$", _prose(page.read_text(encoding="utf-8")), flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts), 2)}


def blocks(section: str) -> list[str]:
    """The paragraphs and list items of a section, each on one line (tables and headings left out; a link's
    text, often a heading's name, does not count as a claim)."""
    out: list[str] = []
    current: list[str] = []
    for line in [*section.splitlines(), ""]:
        if (not line.strip() or re.match(r"\s*[*-] |[|#]", line)) and current:
            out.append(" ".join(current))
            current = []
        if line.strip() and not re.match(r"[|#]", line):
            current.append(re.sub(r"\[([^\]]*)\]\([^)]*\)", "(link)", line.strip()))
    return out


def claims_without_evidence(section: str) -> list[str]:
    """The blocks of ``section`` that make a privacy claim (outside code spans: a quoted message or setting is
    no claim) and name no test or benchmark."""
    return [b for b in blocks(section) if CLAIM.search(re.sub(r"`[^`]*`", "", b)) and not EVIDENCE.search(b)]
