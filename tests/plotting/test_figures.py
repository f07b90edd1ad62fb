"""Error-curve figures of runs render (Agg) and carry their elements: titles, named axes with units,
visible legend entries, integer round ticks, coinciding curves kept distinguishable."""

from __future__ import annotations

import numpy as np
import pytest
from figure_helpers import (
    assert_coinciding_lines_distinct,
    assert_integer_ticks,
    assert_legend_visible,
    drawn,
    synthetic_results,
)
from matplotlib.colors import to_hex

from fedhead import plotting


def test_palette_and_labels_are_consistent():
    for key in ("G_t", "G_star", "G_cen", "G_within", "G_0", "recursion"):
        st = plotting.gram_style(key)
        assert st["color"] == plotting.PALETTE[key]
    assert plotting.gram_style("G_7") == plotting.gram_style("G_t")
    assert len({plotting.gram_style(k)["linestyle"] for k in ("G_t", "G_star", "G_cen", "G_within")}) == 4
    assert plotting.gram_label("G_star").startswith("$") and plotting.gram_label("G_12") == "$G_{12}$"
    assert plotting.error_label("G_cen") == r"$e_F(G_t, G_{\mathrm{cen}})$"
    with pytest.raises(KeyError):
        plotting.gram_style("nonsense")


def test_coordinate_groups_cover_every_target():
    assert plotting.coordinate_groups(2) == [(0, 1)]
    assert plotting.coordinate_groups(3) == [(0, 1), (0, 2), (1, 2)]
    assert plotting.coordinate_groups(6) == [(0, 1), (2, 3), (4, 5)]
    assert plotting.coordinate_groups(5) == [(0, 1), (2, 3), (3, 4)]
    assert plotting.coordinate_groups(6, 3) == [(0, 1, 2), (3, 4, 5)]
    for c in range(2, 9):
        assert set().union(*plotting.coordinate_groups(c)) == set(range(c))


# ----------------------------------------------------------------------------- error curves
def test_error_curves_integer_rounds_distinct_styles_and_floor_note():
    fig, (ax,) = plotting.new_figure(1)
    x = np.arange(6)
    same = np.array([1.0, 0.1, 1e-2, 1e-3, 0.0, 0.0])
    plotting.plot_error_curves(ax, x, {"reference": same, "recursion": same.copy()}, xlabel="round $t$")
    drawn(fig)
    assert_integer_ticks(ax)
    assert_legend_visible(ax.get_legend())
    assert_coinciding_lines_distinct(ax)
    assert any(t.get_gid() == "floor-note" and "exact zeros" in t.get_text() for t in ax.texts)
    # non-integer abscissae keep the default locator; no zero, no note
    fig, (ax,) = plotting.new_figure(1)
    plotting.plot_error_curves(ax, [0.5, 1.5, 2.5], {"a": [1.0, 0.5, 0.2]})
    assert not [t for t in ax.texts if t.get_gid() == "floor-note"]


@pytest.mark.parametrize("proc,ref", [("proximal", "star"), ("corrected_proximal", "cen")])
def test_run_error_figure(proc, ref, tmp_path):
    fig = drawn(plotting.run_error_figure(synthetic_results(proc, ref)))
    (ax,) = fig.axes
    assert proc in ax.get_title() and "reference" in ax.get_title()
    assert "round" in ax.get_xlabel()
    assert "e_F" in ax.get_ylabel() and "unitless" in ax.get_ylabel()
    assert_integer_ticks(ax)
    legend = ax.get_legend()
    assert_legend_visible(legend)
    labels = [t.get_text() for t in legend.get_texts()]
    assert any("predicted gap" in s for s in labels)
    assert any(r"G_\ast" in s for s in labels) and any(r"G_{\mathrm{cen}}" in s for s in labels)
    assert any("R_t" in s for s in labels)  # the recursion curve
    # the recursion coincides with the reference curve: both stay visible
    assert_coinciding_lines_distinct(ax)
    by_label = {ln.get_label(): ln for ln in ax.get_lines()}
    star = by_label[plotting.error_label("G_star")]
    assert to_hex(star.get_color()) == plotting.PALETTE["G_star"]
    # the reference curve is drawn at every round (no line that stops at round 1)
    key = plotting.error_label("G_star" if ref == "star" else "G_cen")
    assert np.isfinite(np.asarray(by_label[key].get_ydata(), float)).all()
    assert plotting.save_figure(fig, tmp_path / "e.png").stat().st_size > 0


def test_procedures_figure_groups_seeds_and_marks_the_gap():
    res = (
        [synthetic_results("proximal", "star", s) for s in range(3)]
        + [synthetic_results("corrected_proximal", "cen", s) for s in range(2)]
        + [synthetic_results("ordinary", "star")]
    )
    fig = drawn(plotting.procedures_figure(res))
    assert len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == [r"error to $G_\ast$", r"error to $G_{\mathrm{cen}}$"]
    for ax in fig.axes:
        assert "round" in ax.get_xlabel() and "unitless" in ax.get_ylabel()
        assert_integer_ticks(ax)
        assert_coinciding_lines_distinct(ax)
        assert len(ax.collections) >= 2  # the sd bands of the two multi-seed procedures
    assert "hopper" in fig.get_suptitle() and "sd" in fig.get_suptitle()
    (legend,) = fig.legends
    assert_legend_visible(legend)
    labels = [t.get_text() for t in legend.get_texts()]
    assert "proximal (3 seeds)" in labels and "corrected_proximal (2 seeds)" in labels and "ordinary" in labels
    assert sum("predicted gap" in s for s in labels) == 2
    gap_line = [ln for ln in fig.axes[1].get_lines() if "predicted gap" in ln.get_label()][0]
    assert gap_line.get_ydata()[0] == pytest.approx(0.3)
    with pytest.raises(ValueError):
        plotting.procedures_figure([])
