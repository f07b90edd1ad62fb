"""Units of the targets of every data set, in the original (unstandardised) scale.

The run standardises targets (docs/theory.md §10), so Grams and ellipses are in standardised
units; sample grids and reports show original values, and these units say what they mean.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TARGET_UNITS", "MUJOCO", "target_units", "axis_unit", "format_target"]

#: Data set name -> target name -> unit (``""``: a pure number).
TARGET_UNITS: dict[str, dict[str, str]] = {
    "beijing": {"PM2.5": "µg/m³", "NO2": "µg/m³"},
    "mpiigaze": {"gaze_pitch": "rad", "gaze_yaw": "rad"},
    "300w_lp": {"head_pitch": "°", "head_yaw": "°", "head_roll": "°"},
    "dsprites": {"pos_x": "image widths", "pos_y": "image heights", "scale": "relative size"},
    "shapes3d": {"object_hue": "hue circle fraction", "scale": "relative size", "orientation": "°"},
    "cifar_geo": {"shift_x": "px", "shift_y": "px", "log_zoom": "ln of zoom"},
}
#: The MuJoCo data sets; their actions are normalised torque commands in [-1, 1], kept at that
#: stored scale (not standardised).
MUJOCO = ("swimmer", "hopper", "halfcheetah", "walker2d")


def target_units(dataset: str, target_names: Sequence[str]) -> list[str]:
    """Unit of each target of ``dataset`` (``""`` where unknown or a pure number)."""
    if dataset in MUJOCO:
        return ["torque command" for _ in target_names]
    table = TARGET_UNITS.get(dataset, {})
    return [table.get(n, "") for n in target_names]


def axis_unit(dataset: str, target_names: Sequence[str] | None = None, *, standardized: bool = True) -> str:
    """The unit of the Gram axes of a run on ``dataset`` (figure labels).

    Targets kept at their stored scale (``standardized=False``, with their names known) have
    their data set's unit when every target shares one, else ``"stored scale"``; MuJoCo actions
    are ``"torque command"``; every other data set's targets are ``"standardised"``.
    """
    if not standardized and target_names is not None:
        units = sorted(set(target_units(dataset, target_names)) - {""})
        return units[0] if len(units) == 1 else "stored scale"
    return "torque command" if dataset in MUJOCO else "standardised"


def format_target(value: float, unit: str = "", *, scale: float = 1.0) -> str:
    """A target value for a label: 3 significant digits, float noise below ``1e-6 * scale`` shown
    as 0, and the unit (``"30.5°"``, ``"2.1 px"``, ``"0"``)."""
    v = float(value)
    if abs(v) < 1e-6 * max(abs(float(scale)), 1e-12):
        v = 0.0
    text = f"{v:.3g}"
    if "e" in text:  # keep labels short and plain
        text = f"{v:.2e}"
    if text == "-0":
        text = "0"
    if not unit:
        return text
    return f"{text}{unit}" if unit == "°" else f"{text} {unit}"
