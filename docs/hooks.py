"""MkDocs hook: the README becomes the site's home page, with its links rewritten for the site.

The repository's Markdown links to files by relative path (README -> ``docs/theory.md``), which
GitHub follows. In the site the README is ``index.md`` inside ``docs/``, so ``docs/x`` becomes
``x``; a link to a file outside ``docs/`` (``examples/library-app/``) becomes its path in code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
IMAGE = re.compile(r"!\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def site_link(target: str, source: Path, docs: Path, page_dir: Path) -> str | None:
    """The link ``target`` (relative to ``source``) as seen from ``page_dir``; None if it leaves ``docs/``."""
    if re.match(r"[a-z]+:|#|/", target):
        return target
    path, _, anchor = target.partition("#")
    resolved = (source.parent / path).resolve()
    if not resolved.is_relative_to(docs):
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
    """Add the README as ``index.md``."""
    docs = Path(config["docs_dir"]).resolve()
    readme = rewrite_links((ROOT / "README.md").read_text(encoding="utf-8"), ROOT / "README.md", docs, docs)
    files.append(File.generated(config, "index.md", content=readme))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the guides' links to files outside ``docs/`` (the README's were rewritten on loading)."""
    if page.file.src_uri == "index.md":
        return markdown
    docs = Path(config["docs_dir"]).resolve()
    source = docs / page.file.src_uri
    return rewrite_links(markdown, source, docs, source.parent)
