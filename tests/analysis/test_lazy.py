"""Packages whose torch modules are imported on first use ([`lazy_exports`][fedhead.analysis.lazy.lazy_exports])."""

from __future__ import annotations

import importlib
import types

import pytest

from fedhead.analysis.lazy import lazy_exports


@pytest.mark.parametrize("package", ["fedhead.clients", "fedhead.models", "fedhead.train"])
def test_every_export_resolves_to_what_its_module_defines(package):
    mod = importlib.import_module(package)
    for name in mod.__all__:
        value = getattr(mod, name)
        assert not isinstance(value, types.ModuleType), f"{package}.{name} is a module"
        assert getattr(importlib.import_module(value.__module__), name) is value, name


def test_an_unknown_name_and_a_name_of_a_submodule_are_refused():
    getattr_ = lazy_exports("fedhead.train", {"fedhead.train.steps": ("select_device",)})
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        getattr_("nothing")
    with pytest.raises(ValueError, match=r"\['align'\] also name submodules"):
        lazy_exports("fedhead.train", {"fedhead.train.align": ("align",)})
