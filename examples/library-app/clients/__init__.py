"""The user's own ``clients`` package: the sites of the federation and how each one's data look.

Its import name is the same as fedhead's Flower-facing folder, which installs as ``fedhead.clients``:
both import side by side (``myapp.task`` uses this one, ``myapp.client_app`` fedhead's).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Site:
    """One client: its sample count, the angle (degrees) and scales of its targets, their mean."""

    name: str
    n: int
    angle: float
    scales: tuple[float, float]
    mean: tuple[float, float]


#: One site per SuperNode (``partition-id`` 0, 1, 2): three differently oriented target clouds.
SITES = (
    Site("north", 120, -40.0, (1.7, 0.35), (0.0, -1.5)),
    Site("centre", 160, 10.0, (1.0, 0.65), (0.0, 0.0)),
    Site("south", 200, 55.0, (1.5, 0.35), (0.0, 1.5)),
)
