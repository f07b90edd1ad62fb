"""Every figure type renders (Agg) and carries its elements: titles, named axes with units,
visible legend entries, integer round ticks, coinciding curves kept distinguishable."""

from __future__ import annotations

import re
import types

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D

from fedhead import plotting
from fedhead.driver import tensorboard
from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import SCHEMA_VERSION, DatasetInfo, Results, Timing


@pytest.fixture(autouse=True)
def _close_all():
    yield
    plt.close("all")


def _spd(rng, c):
    a = rng.standard_normal((c, c))
    return a @ a.T + 0.5 * np.eye(c)


def _targets(c, seed=0):
    rng = np.random.default_rng(seed)
    gs = _spd(rng, c)
    return types.SimpleNamespace(g_star=gs, g_cen=gs + 0.5 * np.eye(c), g_within=gs + 0.2 * np.eye(c))


def _results(proc, ref, seed=0, gap=0.3, n_rounds=8):
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


def _drawn(fig):
    fig.canvas.draw()
    return fig


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


# ----------------------------------------------------------------------------- palette, labels
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
    _drawn(fig)
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
    fig = _drawn(plotting.run_error_figure(_results(proc, ref)))
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
        [_results("proximal", "star", s) for s in range(3)]
        + [_results("corrected_proximal", "cen", s) for s in range(2)]
        + [_results("ordinary", "star")]
    )
    fig = _drawn(plotting.procedures_figure(res))
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


# ----------------------------------------------------------------------------- ellipses
@pytest.mark.parametrize("c,n_panels", [(2, 1), (3, 3), (6, 3)])
def test_gram_ellipse_figure(c, n_panels, tmp_path):
    t = _targets(c)
    names = [f"y{i}" for i in range(c)]
    fig = tensorboard.ellipse_figure(
        t.g_star.copy(), t, round_=2, gram0=np.eye(c), target_names=names, unit="standardised", procedure="proximal"
    )
    _drawn(fig)
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
    t = _targets(2)
    fig = _drawn(tensorboard.ellipse_figure(t.g_cen, t, round_=4))  # the old signature still works
    assert "round 4" in fig.get_suptitle() and fig.axes[0].get_xlabel() == "coordinate 1"
    t.g_star = None  # outside the fully active regime
    fig = _drawn(tensorboard.ellipse_figure(t.g_cen, t, round_=1))
    labels = [x.get_text() for x in fig.legends[0].get_texts()]
    assert plotting.GRAM_LABELS["G_star"] not in labels and plotting.GRAM_LABELS["G_cen"] in labels


def test_gram_ellipse_figure_3d_view():
    t = _targets(6)
    fig = _drawn(
        plotting.gram_ellipse_figure({"G_t": t.g_star, "G_cen": t.g_cen}, view="3d", target_names=list("abcdef"))
    )
    assert len(fig.axes) == 2 and all(ax.name == "3d" for ax in fig.axes)
    assert fig.axes[1].get_zlabel() == "f"
    assert "projection on 3" in fig.get_supxlabel()


# ----------------------------------------------------------------------------- fig2
def test_fig2_figures_are_readable(tmp_path, monkeypatch):
    from fedhead.experiments import reference, reference_figure

    figs = []
    real = reference_figure.save_figure

    def capture(fig, path, **kw):
        fig.canvas.draw()
        figs.append(fig)
        return real(fig, path, **kw)

    monkeypatch.setattr(reference_figure, "save_figure", capture)
    reference.run(reference.Settings.quick(), tmp_path)
    main, grams = figs
    a, b, c, d, e, f = main.axes
    for ax in (a, b, c, d, f):
        assert_legend_visible(ax.get_legend())
    labels_a = [t.get_text() for t in a.get_legend().get_texts()]
    assert r"client optimum $G_1$" in labels_a and r"columns of $\Pi_1(W_0)$" in labels_a
    client = [ln for ln in a.get_lines() if ln.get_label() == r"client optimum $G_1$"][0]
    top = [ln for ln in a.get_lines() if ln.get_label().startswith("Adam")][-1]
    assert top.get_linewidth() < client.get_linewidth() and top.get_zorder() > client.get_zorder()
    # (b): the slope-1 guide does not lie on the e_Pi data line
    guide = [ln for ln in b.get_lines() if "slope 1" in ln.get_label()][0]
    e_pi = [ln for ln in b.get_lines() if "e_\\Pi" in ln.get_label()][0]
    assert not np.allclose(guide.get_ydata(), e_pi.get_ydata())
    assert "$\\rho$" in b.get_xlabel()
    for ax in (c, d, f):
        assert "round" in ax.get_xlabel() and "$" in ax.get_ylabel()
        assert_integer_ticks(ax)
        assert_coinciding_lines_distinct(ax)
        assert all("rho" not in s or "$\\rho$" in s for s in (t.get_text() for t in ax.get_legend().get_texts()))
    assert "exact zeros" in e.get_xlabel()
    assert [t.get_text() for t in e.get_legend().get_texts()] == ["Tr $M_\\mu$", "Tr $M_\\Sigma$", "Tr $M_A$"]
    (ax,) = grams.axes
    assert_legend_visible(ax.get_legend())
    assert "\\preceq" in ax.get_title()
    assert any("G^{1/2}" in t.get_text() for t in grams.texts)


# ----------------------------------------------------------------------------- data sample grid
def test_sample_grid_units_and_clean_values():
    from fedhead.cli.data import sample_grid
    from fedhead.data.base import RawDataset
    from fedhead.data.pipeline import build_federated
    from fedhead.data.units import format_target, target_units

    assert format_target(9.17e-09, "image widths") == "0 image widths"
    assert format_target(30.456, "°") == "30.5°"
    assert target_units("300w_lp", ("head_pitch", "head_yaw", "head_roll")) == ["°", "°", "°"]
    assert target_units("cifar_geo", ("shift_x", "shift_y", "log_zoom"))[0] == "px"
    rng = np.random.default_rng(0)
    y = rng.uniform(0, 1, size=(40, 3))
    y[0, 0] = 9.17e-09
    raw = RawDataset(
        name="dsprites",
        x=rng.integers(0, 256, size=(40, 1, 16, 16), dtype=np.uint8),
        y=y,
        target_names=("pos_x", "pos_y", "scale"),
    )
    fig = _drawn(sample_grid(build_federated(raw, 4), 8))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 8
    assert all("image widths" in s and "relative size" in s and "e-0" not in s for s in titles)
    assert "16 x 16 pixels" in fig._suptitle.get_text()


def test_cifar_geo_grid_names_its_source():
    from fedhead.cli.data import sample_grid
    from fedhead.data.base import RawDataset
    from fedhead.data.pipeline import build_federated

    rng = np.random.default_rng(1)
    raw = RawDataset(
        name="cifar_geo",
        x=rng.integers(0, 256, size=(16, 3, 40, 40), dtype=np.uint8),
        y=rng.normal(size=(16, 3)),
        target_names=("shift_x", "shift_y", "log_zoom"),
        source="fashion_mnist images from /x, shift/zoom construction (seed 0)",
    )
    fig = _drawn(sample_grid(build_federated(raw, 4), 4))
    assert "Fashion-MNIST" in fig._suptitle.get_text() and "40 x 40 pixels" in fig._suptitle.get_text()
    assert all(" px" in ax.get_title() for ax in fig.axes if ax.get_title())


# ----------------------------------------------------------------------------- UFM experiment figures
#: Plain-prose texts allowed without mathtext (everything else is, or contains, ``$...$``); numbers as N.
_PROSE = {
    "exact",
    "Adam joint",
    "proximal, final round",
    "exact selection",
    "Adam joint (no selection)",
    "proximal joint minimiser vs closest head\n(median, IQR)",
    "residual of partial correction",
    "limit error",
    "trace of the term",
    "rounds needed (median of N)",
    "same sign",
    "opposite sign",
    "measured = predicted",
    "theory",
    "local contraction rate",
}
#: ASCII mathematics that must not be left outside ``$...$``.
_ASCII_MATH = re.compile(r"_|\^|\|\||\\|<=|>=|\b(rho|eta|gamma|kappa|theta|Sigma|Delta|Pi|Tr|sum|star|inf)\b")


def _is_prose(s):
    return re.sub(r"\d+", "N", s) in _PROSE


def _figure_texts(fig):
    """(where, text) of every axis label, title and legend entry of a figure."""
    out = [("suptitle", fig._suptitle.get_text())] if fig._suptitle is not None else []
    for i, ax in enumerate(fig.axes):
        out += [
            (f"axes {i} xlabel", ax.get_xlabel()),
            (f"axes {i} ylabel", ax.get_ylabel()),
            (f"axes {i} title", ax.get_title()),
        ]
        if ax.get_legend() is not None:
            out += [(f"axes {i} legend", t.get_text()) for t in ax.get_legend().get_texts()]
    for lg in fig.legends:
        out += [("figure legend", t.get_text()) for t in lg.get_texts()]
    return [(w, s) for w, s in out if s]


def assert_mathtext_labels(fig, n_axes):
    """Every label, title and legend text is mathtext (or listed prose), with no ASCII maths outside
    ``$...$``, and the mathtext parses (the figure draws)."""
    fig.canvas.draw()  # raises ValueError on a mathtext parse error
    assert len(fig.axes) == n_axes
    texts = _figure_texts(fig)
    assert texts
    for where, s in texts:
        assert s.count("$") % 2 == 0, (where, s)
        assert "$" in s or _is_prose(s), f"{where}: {s!r} is not mathtext"
        assert not re.search(r"\$[^$]*\de[-+]?\d[^$]*\$", s), f"{where}: 'e' notation inside mathtext in {s!r}"
        prose = re.sub(r"\$[^$]*\$", "", s)
        assert not _ASCII_MATH.search(prose), f"{where}: ASCII maths outside $...$ in {s!r}"
    for i, ax in enumerate(fig.axes):  # every named axis carries its quantity in mathtext
        for lab in (ax.get_xlabel(), ax.get_ylabel()):
            assert not lab or "$" in lab or _is_prose(lab), (i, lab)
    return texts


def _ufm_figures():
    """The figure of each UFM experiment, drawn from small synthetic arrays of the right shapes."""
    from fedhead.experiments import convergence, finite_steps, gap_terms, recovery, selection

    rng = np.random.default_rng(0)
    out = {}
    # convergence: (instances, rounds + 1) errors per method
    s = convergence.Settings.quick()
    methods = ["exact"] + [f"rho={r:g}" for r in s.rho_ladder] + ["Adam joint"]
    out["convergence"] = (convergence._figure(s, {k: rng.uniform(1e-6, 1, (2, s.n_rounds + 1)) for k in methods}), 2)
    # selection: per size, instance records with e_Pi along the ladder and L-BFGS distance ratios
    s = selection.Settings.quick()
    per_size = {
        f"C={c},P={f * c}": [
            {"e_Pi": rng.uniform(1e-6, 1, len(s.rho_ladder)), "lbfgs_dist_ratio": rng.uniform(1, 3, 2)}
            for _ in range(2)
        ]
        for c in (2, 4)
        for f in (1, 2)
    }
    out["selection"] = (selection._figure(s, per_size), 2)
    # recovery: trajectories / limits per correction level, numerical checks per gamma
    s = recovery.Settings.quick()
    levels = ["none", "full"] + [f"1-gamma={x:g}" for x in s.one_minus_gammas]
    ex = {
        "traj": {k: rng.uniform(1e-6, 1, (3, s.n_rounds + 1)) for k in levels},
        "limit": {k: rng.uniform(1e-6, 1, 3) for k in levels},
    }
    checks = [{f"{g:g}": {"e_Pi_worst": rng.uniform(1e-6, 1, len(s.check_rhos))} for g in s.check_gammas}]
    out["recovery"] = (recovery._figure(s, ex, checks), 3)
    # gap_terms: decomposition records of the controlled sweeps, random instances and sweeps
    s = gap_terms.Settings(controlled_seeds=(55, 56), n_random=8, n_sweep=2)

    def rec(M=4):
        tr = {k: float(v) for k, v in zip(gap_terms.TERMS, rng.uniform(0.1, 1, 3))}
        d = float(rng.uniform(0.1, 1))
        return {"trace": tr, "tr_gap": sum(tr.values()), "D": d, "tr_m_a": 1.5 * d, "M": M}

    controlled = {
        "means": {str(x): [rec(), rec()] for x in s.mean_scales},
        "covs": {str(x): [rec(), rec()] for x in s.cov_scales},
    }
    random_recs = [rec(int(M)) for M in rng.choice(s.random_clients, s.n_random)]
    sweeps = {
        "C": {str(c): [rec(), rec()] for c in s.sweep_dims},
        "M": {str(m): [rec(), rec()] for m in s.sweep_clients},
        "kappa": {str(k): [rec(), rec()] for k in s.kappas},
    }
    out["gap_terms"] = (gap_terms._figure(s, controlled, random_recs, sweeps), 6)
    # finite_steps: (instances, etas, steps) grid, (instances, E, h) Jacobian arrays, commuting scatter
    s = finite_steps.Settings.quick()
    grid = (1, len(s.etas), len(s.steps))
    jac = (1, len(s.jacobian_steps), len(s.jacobian_h))
    a = {
        "to_within": rng.uniform(1e-3, 1, grid),
        "to_star": rng.uniform(1e-3, 1, grid),
        "rounds": rng.uniform(10, 1e4, grid),
        "ratio_jac": rng.uniform(0.9, 1.1, jac),
        "disp_err": rng.uniform(1e-4, 1e-2, jac),
    }
    pred = rng.uniform(1e-5, 1e-3, (s.n_commuting, s.C)) * rng.choice([-1, 1], (s.n_commuting, s.C))
    meas = pred * rng.uniform(0.9, 1.1, pred.shape)
    meas[0, 0] *= -1  # one opposite sign: both scatter entries appear
    comm = {"eta": s.displacement_eta, "E": s.displacement_steps, "predicted": pred, "measured": meas}
    out["finite_steps"] = (finite_steps._figure(s, a, comm), 6)
    return out


def test_tex_number():
    assert plotting.tex_number(1e-5) == "10^{-5}" and plotting.tex_number(2.5e-7) == r"2.5 \times 10^{-7}"
    assert plotting.tex_number(0.001) == "0.001" and plotting.tex_number(0.5) == "0.5" and plotting.tex_number(3) == "3"


@pytest.fixture(scope="module")
def ufm_figures():
    figs = _ufm_figures()
    yield figs
    plt.close("all")


@pytest.mark.parametrize("name", ["convergence", "selection", "gap_terms", "recovery", "finite_steps"])
def test_ufm_experiment_figures_use_mathtext(name, ufm_figures):
    fig, n_axes = ufm_figures[name]
    texts = assert_mathtext_labels(fig, n_axes)
    assert sum("$" in s for _, s in texts) >= len(texts) // 2, texts  # mostly mathematics, not prose
    for ax in fig.axes:
        if ax.get_legend() is not None:
            assert_legend_visible(ax.get_legend())
