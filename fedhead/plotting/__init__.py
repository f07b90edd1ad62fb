"""Plotting layer: matplotlib figures shared by the UFM suite and the Flower app (docs/theory.md §11 displays).

Pure plotting on numpy input: no torch, no flwr.  The non-interactive ``Agg`` backend is
selected on import, so figures can be produced on machines without a display.

Public functions
----------------
plot_ellipses
    Gram matrices as ellipses ``{G^{1/2} u : ||u|| = 1}`` (planar, or ellipsoids in 3-D).
plot_error_curves
    Error-vs-round curves: median with interquartile band, or mean with +- 1 sd band; distinct
    line styles and staggered markers so that coinciding curves stay visible, integer ticks on
    round axes, a note when exact zeros are drawn at the log floor.
gram_ellipse_figure
    A figure of named Grams as ellipses, one panel per pair of target coordinates (or 3-d views),
    titled with the procedure and round, with a caption saying what is drawn and projected.
run_error_figure
    One run's errors ``e_F(G_t, .)`` to every reference per round (``results.json`` input).
procedures_figure
    The paper-style summary: error to ``G_star`` and to ``G_cen`` per round for each procedure,
    mean +- 1 sd over seeds, with the diagnosis's predicted gap marked.
new_figure, save_figure
    Figure creation with the right axes kinds, and atomic PNG writing.

Colours: [`PALETTE`][fedhead.plotting.PALETTE] fixes one colour per Gram (``G_t``, ``G_star``, ``G_cen``,
``G_within``, ``G_0``, the exact recursion) for every figure and TensorBoard image;
[`gram_style`][fedhead.plotting.gram_style] and [`gram_label`][fedhead.plotting.gram_label] give the
matching style and mathtext label.

This module is the public facade: the implementation lives in [`fedhead.plotting`][fedhead.plotting]
(``style``: palette and labels; ``canvas``: ``new_figure``/``save_figure``; ``ellipses``;
``curves``: ``plot_error_curves``; ``run_figures``: ``run_error_figure``/``procedures_figure``).
Import from here: ``from fedhead import plots`` or ``from fedhead.plotting import X``.
"""

import matplotlib

matplotlib.use("Agg")  # before any submodule imports matplotlib.pyplot


from fedhead.plotting.canvas import new_figure, save_figure
from fedhead.plotting.curves import plot_error_curves
from fedhead.plotting.ellipses import (
    coordinate_groups,
    ellipse_caption,
    ellipse_points,
    gram_ellipse_figure,
    plot_ellipses,
)
from fedhead.plotting.run_figures import E_F_AXIS, procedures_figure, run_error_figure
from fedhead.plotting.style import (
    CLIENT_COLORS,
    GRAM_LABELS,
    PALETTE,
    PROCEDURE_COLORS,
    error_label,
    gram_label,
    gram_style,
    tex_number,
)

__all__ = [
    "PALETTE",
    "GRAM_LABELS",
    "PROCEDURE_COLORS",
    "CLIENT_COLORS",
    "ellipse_caption",
    "gram_style",
    "gram_label",
    "tex_number",
    "error_label",
    "coordinate_groups",
    "gram_ellipse_figure",
    "run_error_figure",
    "E_F_AXIS",
    "procedures_figure",
    "ellipse_points",
    "plot_ellipses",
    "plot_error_curves",
    "new_figure",
    "save_figure",
]
