"""Loading a script of the repository (benchmarks/, scripts/) as a module, for tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The script at ``path`` imported as a module named after its file (its ``__main__`` block not run)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module
