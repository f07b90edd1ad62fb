"""Gram ellipse figures: one panel per coordinate group, labelled axes inside the figure, palette
colours, the caption, the 3-D view (docs/theory.md §11)."""

from __future__ import annotations

import numpy as np
import pytest
from figure_helpers import (
    assert_coinciding_lines_distinct,
    assert_inside_figure,
    assert_legend_visible,
    drawn,
    gram_targets,
)
from matplotlib.colors import to_hex

from fedhead import plotting
from fedhead.driver import tensorboard


@pytest.mark.parametrize("c,n_panels", [(2, 1), (3, 3), (6, 3)])
def test_gram_ellipse_figure(c, n_panels, tmp_path):
    t = gram_targets(c)
    names = [f"y{i}" for i in range(c)]
    fig = tensorboard.ellipse_figure(
        t.g_star.copy(), t, round_=2, gram0=np.eye(c), target_names=names, unit="standardised", procedure="proximal"
    )
    drawn(fig)
    assert len(fig.axes) == n_panels
    assert "proximal" in fig.get_suptitle() and "round 2" in fig.get_suptitle()
    seen = set()
    for ax in fig.axes:
        for lab in (ax.get_xlabel(), ax.get_ylabel()):
            assert "(standardised)" in lab and lab.split(" ")[0] in names
            seen.add(lab.split(" ")[0])
        assert_inside_figure(fig, ax.xaxis.label)
        assert_inside_figure(fig, ax.yaxis.label)
        assert ax.get_aspect() == 1.0
        assert_coinciding_lines_distinct(ax)  # G_2 equals G_star here
    assert seen == set(names)
    caption = fig.get_supxlabel()
    assert "G^{1/2}" in caption and r"\leq 1" in caption
    assert ("projection" in caption) == (c > 2)
    assert_inside_figure(fig, fig._supxlabel)
    (legend,) = fig.legends
    assert_legend_visible(legend)
    labels = [x.get_text() for x in legend.get_texts()]
    assert labels == [
        "$G_{2}$",
        plotting.GRAM_LABELS["G_star"],
        plotting.GRAM_LABELS["G_cen"],
        plotting.GRAM_LABELS["G_within"],
        plotting.GRAM_LABELS["G_0"],
    ]
    colors = {ln.get_label(): to_hex(ln.get_color()) for ln in fig.axes[0].get_lines() if ln.get_label()[0] != "_"}
    for key in ("G_star", "G_cen", "G_within", "G_0"):
        assert colors[plotting.GRAM_LABELS[key]] == plotting.PALETTE[key]
    assert colors["$G_{2}$"] == plotting.PALETTE["G_t"]
    assert plotting.save_figure(fig, tmp_path / "ell.png").stat().st_size > 0


def test_ellipse_figure_old_call_and_missing_g_star():
    t = gram_targets(2)
    fig = drawn(tensorboard.ellipse_figure(t.g_cen, t, round_=4))  # the old signature still works
    assert "round 4" in fig.get_suptitle() and fig.axes[0].get_xlabel() == "coordinate 1"
    t.g_star = None  # outside the fully active regime
    fig = drawn(tensorboard.ellipse_figure(t.g_cen, t, round_=1))
    labels = [x.get_text() for x in fig.legends[0].get_texts()]
    assert plotting.GRAM_LABELS["G_star"] not in labels and plotting.GRAM_LABELS["G_cen"] in labels


def test_gram_ellipse_figure_3d_view():
    t = gram_targets(6)
    fig = drawn(
        plotting.gram_ellipse_figure({"G_t": t.g_star, "G_cen": t.g_cen}, view="3d", target_names=list("abcdef"))
    )
    assert len(fig.axes) == 2 and all(ax.name == "3d" for ax in fig.axes)
    assert fig.axes[1].get_zlabel() == "f"
    assert "projection on 3" in fig.get_supxlabel()
