"""MkDocs hook: the README and benchmarks/README.md become site pages, with their links rewritten.

The repository's Markdown links to files by relative path (README -> ``docs/theory.md``), which
GitHub follows. In the site the README is ``index.md`` inside ``docs/`` and benchmarks/README.md
is ``benchmarks.md``, so ``docs/x`` becomes ``x`` and a link to either file becomes a link to its
page; a link to any other file outside ``docs/`` (``examples/library-app/``) becomes its path in
code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
#: Markdown files outside ``docs/`` that are site pages: repository path -> page inside ``docs/``.
PAGES = {"README.md": "index.md", "benchmarks/README.md": "benchmarks.md"}
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
IMAGE = re.compile(r"!\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def site_path(resolved: Path, docs: Path) -> Path | None:
    """The file a resolved repository path is in the site (inside ``docs``); None if it is not there."""
    for source, page in PAGES.items():
        if resolved == (ROOT / source).resolve():
            return docs / page
    return resolved if resolved.is_relative_to(docs) else None


def site_link(target: str, source: Path, docs: Path, page_dir: Path) -> str | None:
    """The link ``target`` (relative to ``source``) as seen from ``page_dir``; None if it leaves the site."""
    if re.match(r"[a-z]+:|#|/", target):
        return target
    path, _, anchor = target.partition("#")
    resolved = site_path((source.parent / path).resolve(), docs)
    if resolved is None:
        return None
    relative = Path(os.path.relpath(resolved, page_dir)).as_posix() + ("/" if path.endswith("/") else "")
    return relative + (f"#{anchor}" if anchor else "")


def rewrite_links(markdown: str, source: Path, docs: Path, page_dir: Path) -> str:
    """Links and images of a Markdown file at ``source`` rewritten for a page in ``page_dir``."""

    def link(match: re.Match[str]) -> str:
        target = site_link(match["target"], source, docs, page_dir)
        if target is None:
            return f"{match['text']} (`{match['target'].lstrip('./')}` in the repository)"
        return f"[{match['text']}]({target})"

    def image(match: re.Match[str]) -> str:
        target = site_link(match["target"], source, docs, page_dir)
        return f"![{match['text']}]({target})" if target else match["text"]

    return LINK.sub(link, IMAGE.sub(image, markdown))


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README as ``index.md`` and benchmarks/README.md as ``benchmarks.md``."""
    docs = Path(config["docs_dir"]).resolve()
    for source, page in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        content = rewrite_links(text, ROOT / source, docs, (docs / page).parent)
        files.append(File.generated(config, page, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the guides' links to files outside ``docs/`` (the generated pages' were rewritten on loading)."""
    if page.file.src_uri in PAGES.values():
        return markdown
    docs = Path(config["docs_dir"]).resolve()
    source = docs / page.file.src_uri
    return rewrite_links(markdown, source, docs, source.parent)
