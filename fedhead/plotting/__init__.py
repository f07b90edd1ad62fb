"""Implementation modules of :mod:`fedhead.plots` (the public facade; import from there).

Pure plotting on numpy input: no torch, no flwr.  The non-interactive ``Agg`` backend is
selected here, before any submodule imports :mod:`matplotlib.pyplot`.

Modules
-------
style
    :data:`PALETTE`, Gram labels and styles, procedure and client colours, ``tex_number``.
canvas
    ``new_figure`` and the atomic PNG writer ``save_figure``.
ellipses
    Gram ellipses: ``ellipse_points``, ``plot_ellipses``, ``coordinate_groups``,
    ``ellipse_caption``, ``gram_ellipse_figure``.
curves
    ``plot_error_curves``: centre lines with bands, distinct styles, the log-floor note.
run_figures
    ``run_error_figure`` (one run) and ``procedures_figure`` (several procedures and seeds).
"""

import matplotlib

matplotlib.use("Agg")
