"""Fixtures of the report tests: one tiny real sweep per session (six federations, one Ray start)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import build_sweeps


@pytest.fixture(scope="session")
def sweeps(tmp_path_factory, ray_session) -> Path:
    """``<root>/main`` and ``<root>/prediction`` sweep folders of real runs (see report_helpers)."""
    return build_sweeps(tmp_path_factory.mktemp("sweeps"))
