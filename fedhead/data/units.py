"""Units of the targets of every data set, in the original (unstandardised) scale.

The run standardises targets (docs/theory.md §10), so Grams and ellipses are in standardised
units; sample grids and reports show original values, and these units say what they mean.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TARGET_UNITS", "target_units", "format_target"]

#: Data set name -> target name -> unit (``""``: a pure number).
TARGET_UNITS: dict[str, dict[str, str]] = {
    "beijing": {"PM2.5": "µg/m³", "NO2": "µg/m³"},
    "mpiigaze": {"gaze_pitch": "rad", "gaze_yaw": "rad"},
    "300w_lp": {"head_pitch": "°", "head_yaw": "°", "head_roll": "°"},
    "dsprites": {"pos_x": "image widths", "pos_y": "image heights", "scale": "relative size"},
    "shapes3d": {"object_hue": "hue circle fraction", "scale": "relative size", "orientation": "°"},
    "cifar_geo": {"shift_x": "px", "shift_y": "px", "log_zoom": "ln of zoom"},
}
#: MuJoCo actions are normalised torque commands in [-1, 1].
_MUJOCO = ("swimmer", "hopper", "halfcheetah", "walker2d")


def target_units(dataset: str, target_names: Sequence[str]) -> list[str]:
    """Unit of each target of ``dataset`` (``""`` where unknown or a pure number)."""
    if dataset in _MUJOCO:
        return ["torque command" for _ in target_names]
    table = TARGET_UNITS.get(dataset, {})
    return [table.get(n, "") for n in target_names]


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
