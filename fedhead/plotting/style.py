"""Colours, line styles and mathtext labels shared by every figure (docs/theory.md §11).

[`PALETTE`][fedhead.plotting.PALETTE] fixes one colour per Gram (``G_t``, ``G_star``, ``G_cen``, ``G_within``,
``G_0``, the exact recursion) for every figure and TensorBoard image; [`gram_style`][fedhead.plotting.gram_style] and
[`gram_label`][fedhead.plotting.gram_label] give the matching style and mathtext label.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from matplotlib.typing import LineStyleType

#: One colour per Gram, the same in every figure and TensorBoard image.
PALETTE: dict[str, str] = {
    "G_t": "#1f77b4",  # blue: the measured (federated) Gram
    "G_star": "#ff7f0e",  # orange: the Bures-Wasserstein barycenter
    "G_cen": "#d62728",  # red: centralised training
    "G_within": "#2ca02c",  # green: phi(Sigma_within)
    "G_0": "#7f7f7f",  # grey: the initial head
    "recursion": "#9467bd",  # purple: the exact recursion from the run's own G_0
    "G_avg": "#8c564b",  # brown: sum_m p_m G_m
}

#: Line style and marker per Gram (coinciding ellipses and curves stay distinguishable).
_GRAM_LINES: dict[str, tuple[LineStyleType, str]] = {
    "G_t": ("-", "o"),
    "G_star": ("--", "s"),
    "G_cen": ("-.", "^"),
    "G_within": (":", "D"),
    "G_0": ((0, (1, 2)), "x"),
    "recursion": ((0, (6, 2)), "v"),
    "G_avg": ((0, (3, 1, 1, 1)), "P"),
}

#: Mathtext labels of the Grams.
GRAM_LABELS: dict[str, str] = {
    "G_t": r"$G_t$",
    "G_star": r"$G_\ast$",
    "G_cen": r"$G_{\mathrm{cen}}$",
    "G_within": r"$G_{\mathrm{within}}$",
    "G_0": r"$G_0$",
    "recursion": "exact recursion",
    "G_avg": r"$\sum_m p_m G_m$",
}

#: Colours of the client optima ``G_m`` (distinct from [`PALETTE`][fedhead.plotting.PALETTE]).
CLIENT_COLORS = ["#17becf", "#bcbd22", "#e377c2", "#8c564b", "#393b79", "#637939", "#843c39", "#7b4173"]

#: One colour per procedure in the multi-procedure figures.
PROCEDURE_COLORS: dict[str, str] = {
    "ordinary": "#7f7f7f",
    "proximal": "#ff7f0e",
    "exact": "#9467bd",
    "aligned": "#8c564b",
    "corrected": "#e377c2",
    "corrected_proximal": "#d62728",
    "aligned_corrected": "#17becf",
    "centered": "#2ca02c",
    "full_model": "#bcbd22",
}

_CYCLE_STYLES: list[LineStyleType] = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (8, 3))]
_CYCLE_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]

#: Colour cycle of procedures missing from [`PROCEDURE_COLORS`][fedhead.plotting.PROCEDURE_COLORS].
_CYCLE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _gram_key(label: str | None) -> str | None:
    """The [`PALETTE`][fedhead.plotting.PALETTE] key a label names (``"G_3"``/``"G_t"`` -> ``G_t``), or None."""
    if label is None:
        return None
    if label in PALETTE:
        return label
    if label.startswith("G_") and label[2:].isdigit():
        return "G_t"
    return None


class GramStyle(TypedDict):
    """What [`gram_style`][fedhead.plotting.gram_style] returns: matplotlib keywords of a Gram's lines."""

    color: str
    linestyle: LineStyleType
    marker: str


def gram_style(key: str) -> GramStyle:
    """Colour, line style and marker of a Gram named in [`PALETTE`][fedhead.plotting.PALETTE] (``G_<digits>`` is
    ``G_t``)."""
    k = _gram_key(key)
    if k is None:
        raise KeyError(f"gram_style: unknown Gram {key!r}; known: {sorted(PALETTE)}")
    ls, marker = _GRAM_LINES[k]
    return {"color": PALETTE[k], "linestyle": ls, "marker": marker}


def gram_label(key: str) -> str:
    """Mathtext label of a Gram key (``"G_star"`` -> ``$G_\\star$``; ``"G_5"`` -> ``$G_{5}$``)."""
    if key in GRAM_LABELS:
        return GRAM_LABELS[key]
    if key.startswith("G_") and key[2:].isdigit():
        return f"$G_{{{key[2:]}}}$"
    return key


def tex_number(x: float) -> str:
    """A number for use inside mathtext: ``1e-05`` -> ``10^{-5}``, ``2.5e-07`` -> ``2.5 \\times 10^{-7}``,
    ``0.001`` -> ``0.001`` (``:g`` formatting, whose ``e-05`` would read as a subtraction)."""
    s = f"{float(x):g}"
    if "e" not in s:
        return s
    mantissa, exponent = s.split("e")
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa} \times {power}"


def error_label(reference: str, measured: str = "G_t") -> str:
    """``$e_F(G_t, G_\\star)$``-style label of the relative error of ``measured`` to ``reference``."""
    ref = "R_t" if reference == "recursion" else gram_label(reference).strip("$")
    return f"$e_F({gram_label(measured).strip('$')}, {ref})$"
