"""scripts/debian_mirror.sh: the Debian mirror that scripts/docker_check.sh bootstraps the base image from,
read from apt's one-line and deb822 sources (a Debian that has only ``*.sources`` files made the old
lookup end the script at once under ``set -e``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "debian_mirror.sh"

DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.example.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.example.org/debian-security
Suites: bookworm-security
Components: main
"""
ONE_LINE = """# deb http://snapshot.debian.org/archive/debian/20250520T000000Z bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] https://mirror.example.net/debian/ bookworm main
deb http://security.example.net/debian-security bookworm-security main
"""


def mirror(apt: Path) -> str:
    done = subprocess.run(["bash", str(SCRIPT), str(apt)], capture_output=True, text=True, timeout=30, check=True)
    assert done.stderr == ""
    return done.stdout.strip()


@pytest.fixture
def apt(tmp_path: Path) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    return tmp_path


def test_a_deb822_only_debian_gives_its_uri_not_the_commented_snapshot(apt):
    (apt / "sources.list.d" / "debian.sources").write_text(DEB822)
    (apt / "sources.list.d" / "other.sources.disabled").write_text("URIs: http://disabled.example.org/debian\n")
    assert mirror(apt) == "http://deb.example.org/debian"


def test_a_one_line_sources_list_gives_its_uri_past_options_and_comments(apt):
    (apt / "sources.list").write_text(ONE_LINE)
    assert mirror(apt) == "https://mirror.example.net/debian/"


def test_sources_list_comes_before_the_files_of_sources_list_d(apt):
    (apt / "sources.list").write_text(ONE_LINE)
    (apt / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert mirror(apt) == "https://mirror.example.net/debian/"


@pytest.mark.parametrize(
    "files",
    [{}, {"sources.list": "# deb http://deb.example.org/debian bookworm main\n"}, {"sources.list.d/x.list": ""}],
)
def test_no_active_debian_source_prints_nothing_and_succeeds(apt, files):
    for name, text in files.items():
        (apt / name).write_text(text)
    assert mirror(apt) == ""


def test_docker_check_takes_the_mirror_from_this_script():
    text = (SCRIPT.parent / "docker_check.sh").read_text()
    assert '"$SRC/scripts/debian_mirror.sh"' in text
    assert "/etc/apt/sources.list /etc/apt" not in text
