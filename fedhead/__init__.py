"""fedhead: federated multivariate regression with private backbones and a shared linear head.

Layers, one folder each; imports point down only (``tests/test_layers.py`` checks it):

``ufm`` (math, numpy/scipy) <- ``analysis`` (numpy) <- ``results`` (files) <- ``plotting``
<- ``data`` / ``models`` (torch) <- ``train`` <- ``federation`` (job, protocol, aggregation)
<- ``strategies`` / ``clients`` (Flower) <- ``driver`` (simulation, recorder) <- ``sweep`` /
``report`` / ``experiments`` <- ``cli`` and the two Flower components ``server_app`` and
``client_app``.

``fedhead.strategies``, ``fedhead.clients`` and ``fedhead.conf`` live in the top-level folders
``strategies/``, ``clients/`` and ``conf/`` of the source tree (the Flower-facing rooms); an
installed fedhead carries them inside the package, and a source tree or FAB finds them with
:class:`_RoomFinder`. Their import names cannot collide with a user's own ``clients`` package.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

_ROOMS = ("strategies", "clients", "conf")


class _RoomFinder(importlib.abc.MetaPathFinder):
    """Resolve ``fedhead.<room>`` to the folder ``<root>/<room>`` beside this package."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        parent, _, room = fullname.rpartition(".")
        if parent != __name__ or room not in _ROOMS:
            return None
        init = self.root / room / "__init__.py"
        if not init.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def _install_room_finder() -> None:
    here = Path(__file__).resolve().parent
    if all((here / room).is_dir() for room in _ROOMS):  # an installed wheel carries the rooms inside
        return
    if not any(isinstance(f, _RoomFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RoomFinder(here.parent))


_install_room_finder()
