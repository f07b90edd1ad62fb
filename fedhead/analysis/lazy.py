"""A package's exports imported on first use (PEP 562): a deployed message starts a fresh process,
and a message that touches no model should not pay for torch
([`lazy_exports`][fedhead.analysis.lazy.lazy_exports])."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``package``: ``exports`` maps each submodule to the names it exports; a name
    is imported from its submodule when first asked for, then kept as the package's attribute. A name
    must not also name a submodule (importing that submodule would rebind it)."""
    where = {name: module for module, names in exports.items() for name in names}
    clash = sorted(set(where) & {m.rsplit(".", 1)[-1] for m in exports})
    if clash:
        raise ValueError(f"{package}: lazy exports {clash} also name submodules")

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
