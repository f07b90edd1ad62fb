"""Shared set-up and checks of the figure tests (tests/plotting): synthetic runs and Grams, and
assertions that legends, coinciding curves, round ticks and labels stay readable."""

from __future__ import annotations

import types

import numpy as np
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import SCHEMA_VERSION, DatasetInfo, Results, Timing


def drawn(fig):
    fig.canvas.draw()
    return fig


def spd(rng, c):
    a = rng.standard_normal((c, c))
    return a @ a.T + 0.5 * np.eye(c)


def gram_targets(c, seed=0):
    rng = np.random.default_rng(seed)
    gs = spd(rng, c)
    return types.SimpleNamespace(g_star=gs, g_cen=gs + 0.5 * np.eye(c), g_within=gs + 0.2 * np.eye(c))


def synthetic_results(proc, ref, seed=0, gap=0.3, n_rounds=8):
    rng = np.random.default_rng(seed)
    rounds = []
    for t in range(n_rounds + 1):
        dec = np.exp(-1.2 * t) * (1 + 0.1 * rng.random())
        if ref == "star":
            es, ec = dec, float(np.hypot(gap, dec))
        else:
            es, ec = 1.2 * gap, (dec if t == 0 else 0.0)
        rec = es if ref == "star" else ec
        rounds.append(
            RoundRecord(
                round=t,
                gram=np.eye(2),
                bias=np.zeros(2),
                e_f_star=es,
                e_f_cen=ec,
                e_f_within=0.5 * gap + dec,
                d_star=None,
                d_cen=None,
                d_within=None,
                e_f_reference=None,
                recursion_gram=None,
                e_f_recursion=None if t == 0 else rec,
                trajectory_error=None,
                predicted_gram=None,
            )
        )
    return Results(
        schema_version=SCHEMA_VERSION,
        status="completed",
        procedure={"name": proc},
        reference=ref,
        config={},
        seeds={},
        git_revision="unknown",
        provenance={},
        dataset=DatasetInfo(name="hopper", num_clients=2),
        diagnosis={"rel_gap": gap},
        moments=None,
        targets={"g_star": np.eye(2).tolist(), "g_cen": (1.3 * np.eye(2)).tolist()},
        rounds=rounds,
        timing=Timing(),
    )


def assert_legend_visible(legend):
    """Every legend entry has text and a visible artist (nonzero alpha, a line or a marker)."""
    assert legend is not None and legend.get_visible()
    texts = [t.get_text() for t in legend.get_texts()]
    handles = legend.legend_handles
    assert len(handles) == len(texts) > 0
    for h, text in zip(handles, texts):
        assert text.strip(), "empty legend label"
        assert h.get_visible(), text
        assert h.get_alpha() is None or h.get_alpha() > 0, text
        if isinstance(h, Line2D):
            has_line = h.get_linestyle() not in ("None", "", " ") and h.get_linewidth() > 0
            has_marker = h.get_marker() not in (None, "None", "", " ")
            assert has_line or has_marker, text


def assert_coinciding_lines_distinct(ax):
    """Lines with identical data differ in style or marker, and the one on top is thinner or has
    hollow markers, so the one below stays visible."""
    lines = [ln for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")]
    for i, a in enumerate(lines):
        for b in lines[i + 1 :]:
            xa, ya = np.asarray(a.get_xdata(), float), np.asarray(a.get_ydata(), float)
            xb, yb = np.asarray(b.get_xdata(), float), np.asarray(b.get_ydata(), float)
            if xa.shape != xb.shape or not np.allclose(xa, xb):
                continue
            both = np.isfinite(ya) & np.isfinite(yb)
            if not both.any() or not np.allclose(ya[both], yb[both]):
                continue
            assert (a.get_linestyle(), a.get_marker()) != (b.get_linestyle(), b.get_marker()), (a, b)
            below, top = (a, b) if a.get_zorder() <= b.get_zorder() else (b, a)
            assert (
                top.get_linewidth() < below.get_linewidth()
                or top.get_markerfacecolor() == "none"
                or to_hex(top.get_color()) != to_hex(below.get_color())
            )


def assert_integer_ticks(ax):
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] - 1e-9 <= t <= ax.get_xlim()[1] + 1e-9]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def assert_inside_figure(fig, artist):
    bb = artist.get_window_extent(fig.canvas.get_renderer())
    fb = fig.bbox
    assert bb.x0 >= fb.x0 - 1 and bb.y0 >= fb.y0 - 1 and bb.x1 <= fb.x1 + 1 and bb.y1 <= fb.y1 + 1, artist
