"""The UFM experiments' figures (fig2 and the others of docs/theory.md §12) are readable: visible
legends, mathtext for every quantity, no ASCII maths outside ``$...$``."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from figure_helpers import (
    assert_coinciding_lines_distinct,
    assert_integer_ticks,
    assert_legend_visible,
)

from fedhead import plotting

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
