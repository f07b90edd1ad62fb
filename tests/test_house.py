"""House rules of the repository's front door: the README is at most 300 lines and undated, every
docs page it links to exists and is in the site's navigation, and every guide of the navigation
is linked from it (everything else lives on its page of the site)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from docs_helpers import relative_links
from script_helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 300
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _hooks():
    """docs/hooks.py, which makes the README and benchmarks/README.md site pages."""
    return load_script(DOCS / "hooks.py", "docs_hooks")


def _nav_pages(entries) -> set[str]:
    """Every page of mkdocs.yml's ``nav`` (paths inside docs/)."""
    pages = set()
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def _nav() -> set[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    return _nav_pages(config["nav"])


def _linked_site_pages() -> dict[str, tuple[str, Path]]:
    """The README's links to Markdown pages: site page (inside docs/) -> (the link as written, its file)."""
    hooks = _hooks()
    linked = {}
    for target, path, _ in relative_links(README):
        if path.suffix != ".md":
            continue
        page = hooks.site_path(path, DOCS)
        assert page is not None, f"README links to {target}, which is not a page of the site"
        linked[page.relative_to(DOCS).as_posix()] = (target, path)
    return linked


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move a section to its page of docs/"
    )


def test_readme_holds_no_dated_measurement():
    dated = [line for line in README.read_text(encoding="utf-8").splitlines() if DATE.search(line)]
    assert not dated, f"README.md: a dated measurement belongs in benchmarks/README.md or its page: {dated}"


def test_every_page_the_readme_links_to_exists_and_is_in_the_nav():
    linked = _linked_site_pages()
    assert len(linked) >= 10, "the README should map the site's pages"
    missing = {t for t, path in linked.values() if not path.is_file()}
    assert not missing, f"README links to pages that do not exist: {sorted(missing)}"
    outside = {t for page, (t, _) in linked.items() if page not in _nav()}
    assert not outside, f"README links to pages missing from mkdocs.yml's nav: {sorted(outside)}"


def test_every_guide_of_the_nav_is_linked_from_the_readme():
    guides = {page for page in _nav() if not page.startswith("api/") and page != "index.md"}
    unlinked = guides - set(_linked_site_pages())
    assert not unlinked, f"pages of the site the README does not link to: {sorted(unlinked)}"


def test_every_docs_page_is_in_the_nav():
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert not pages - _nav(), f"docs pages missing from mkdocs.yml's nav: {sorted(pages - _nav())}"
