"""The docs: architecture.md names only what exists, every docstring link has a target, every
relative link of the README, benchmarks/README.md and the guides reaches a file and heading in the
repository, the strict MkDocs build fails on a stale reference (a small site built with the
project's settings), and every privacy claim of privacy.md names a test that exists."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docs_helpers import EVIDENCE, PAGES, anchors, claims_without_evidence, relative_links, sections

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"\bfedhead(?:\.\w+)+")


def _script():
    spec = importlib.util.spec_from_file_location(
        "sphinx_roles_to_autorefs", ROOT / "scripts" / "sphinx_roles_to_autorefs.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _spans() -> list[str]:
    return CODE_SPAN.findall(ARCHITECTURE.read_text(encoding="utf-8"))


def _resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and walk the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_reach_a_file_and_heading_inside_the_repository(page):
    links = relative_links(page)
    outside = [t for t, path, _ in links if not path.is_relative_to(ROOT)]
    assert not outside, f"{page.name} links outside the repository: {outside}"
    missing = [t for t, path, _ in links if not path.exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"
    stale = [t for t, path, anchor in links if anchor and path.suffix == ".md" and anchor not in anchors(path)]
    assert not stale, f"{page.name} links to headings that do not exist: {stale}"


def test_the_link_check_sees_a_stale_anchor_and_skips_code(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\n## `results.json` (schema_version 1)\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#resultsjson-schema_version-1) [gone](a.md#not-a-heading) [web](https://x.org)\n"
        "```\n[in code](nowhere.md)\n```\n"
    )
    links = relative_links(page)
    assert [t for t, _, _ in links] == ["a.md#resultsjson-schema_version-1", "a.md#not-a-heading"]
    assert [t for t, path, anchor in links if anchor not in anchors(path)] == ["a.md#not-a-heading"]


def test_architecture_paths_exist():
    paths = [s for s in _spans() if "/" in s and " " not in s and not s.startswith("http")]
    assert len(paths) > 20, "architecture.md should name the files it maps"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_architecture_dotted_names_import():
    names = sorted({m for s in _spans() for m in DOTTED.findall(s)})
    assert len(names) > 20, "architecture.md should name the functions of one round"
    broken = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{name}: {exc}")
    assert not broken, "docs/architecture.md names what does not exist:\n" + "\n".join(broken)


def test_docstrings_hold_no_sphinx_role_and_every_link_has_a_target():
    """What ``scripts/sphinx_roles_to_autorefs.py --check`` checks: a stale link is reported."""
    report = _script().run([ROOT / "fedhead"], write=False)
    assert not report.changed, f"Sphinx roles left (run the script): {report.changed}"
    assert not report.unresolved, "\n".join(report.unresolved)


def test_the_script_reports_a_stale_link(tmp_path):
    script = _script()
    stale = ROOT / "fedhead" / "ufm" / "moments.py"
    report = script.Report()
    text = '"""See [`gone`][fedhead.ufm.no_such_function] and :func:`TargetMoments`."""\n'
    converted = script.convert_text(text, stale, script.Index(), report)
    assert "[`TargetMoments`][fedhead.ufm.TargetMoments]" in converted
    assert len(report.unresolved) == 1 and "fedhead.ufm.no_such_function" in report.unresolved[0]
    assert script.convert_text(converted, stale, script.Index(), script.Report()) == converted


def _small_site(tmp_path: Path, link: str) -> subprocess.CompletedProcess:
    """Build, with mkdocs.yml's settings, a site of one module whose docstring holds ``link``."""
    package = tmp_path / "probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'"""Probe: {link}."""\n\n\ndef target() -> None:\n    """A target."""\n')
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Probe\n\n::: probe\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config.update(docs_dir=str(docs), site_dir=str(tmp_path / "site"), nav=["index.md"])
    config.pop("hooks", None)
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(tmp_path)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml")]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.timeout(300)
def test_strict_build_fails_on_a_stale_docstring_reference(tmp_path):
    good = _small_site(tmp_path / "good", "[`target`][probe.target]")
    assert good.returncode == 0, good.stderr
    stale = _small_site(tmp_path / "stale", "[`target`][probe.renamed_target]")
    assert stale.returncode != 0
    assert "probe.renamed_target" in stale.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_site_builds_strict(tmp_path):
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "api" / "ufm" / "index.html").is_file()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = next(line for line in readme.splitlines() if "python -m pytest -q" in line and "pip install" in line)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command.split("&& pip install torch", 1)[1] in ci
    assert "mkdocs build --strict" in command


def test_every_package_is_in_the_api_reference():
    """Each folder of fedhead is rendered (so its docstrings' links are checked by the strict build);
    ``fedhead.conf`` holds the yaml config tree, no code."""
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "api").glob("*.md"))
    rendered = set(re.findall(r"^::: (fedhead[\w.]*)", pages, flags=re.M))
    packages = {f"fedhead.{p.parent.name}" for p in (ROOT / "fedhead").glob("*/__init__.py")} - {"fedhead.conf"}
    assert packages <= rendered, sorted(packages - rendered)


PRIVACY = ROOT / "docs" / "privacy.md"


def _defined_tests() -> dict[str, set[str]]:
    """``{path under the repository: the test functions it defines}`` of tests/."""
    out = {}
    for path in (ROOT / "tests").rglob("*.py"):
        out[path.relative_to(ROOT).as_posix()] = set(re.findall(r"^def (test_\w+)\(", path.read_text(), flags=re.M))
    return out


def test_every_test_and_benchmark_privacy_md_names_exists():
    defined = _defined_tests()
    every = set().union(*defined.values())
    found = list(EVIDENCE.finditer(PRIVACY.read_text(encoding="utf-8")))
    assert len(found) > 40
    for ref in found:
        if ref["bare"]:
            assert ref["bare"] in every, ref[0]
        elif ref["test"]:
            assert ref["test"] in defined.get(ref["file"], set()), ref[0]
        else:
            assert (ROOT / ref["file"]).is_file(), ref[0]


def test_every_privacy_claim_of_sections_2_to_8_names_its_test():
    """Section 1 names its tests claim by claim; sections 2-8 do too: a paragraph or list item that says what
    the server learns, what a site refuses or reveals, and so on, names a test or, for a measurement, its
    benchmark (sections 9 and 10, row-level DP of the exchange and of local training, have their own rules)."""
    parts = sections(PRIVACY)
    assert sorted(parts) == list(range(1, 11))
    bare = [b for n in range(2, 9) for b in claims_without_evidence(parts[n])]
    assert not bare, "privacy claims without a test:\n" + "\n".join(b[:120] for b in bare)


def test_the_claim_rule_sees_a_claim_without_its_test():
    text = (
        "Intro.\n\n* the server learns only the sum.\n* the server learns only the sum (`test_the_sum_only`).\n"
        "* it says `nothing leaves the site` (a quoted message).\n\n| a table that never names a test |\n"
    )
    assert claims_without_evidence(text) == ["* the server learns only the sum."]
