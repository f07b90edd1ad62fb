"""Tests of fedhead.plotting: ellipse geometry, curve bands, atomic PNG writing."""

from __future__ import annotations

import numpy as np
import pytest

from fedhead.plotting import ellipse_points, new_figure, plot_ellipses, plot_error_curves, save_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _spd(rng, c):
    a = rng.standard_normal((c, c))
    return a @ a.T + 0.5 * np.eye(c)


def test_ellipse_points_lie_on_ellipse_2d():
    rng = np.random.default_rng(0)
    G = _spd(rng, 4)
    pts = ellipse_points(G, (0, 1), n_points=64)
    assert pts.shape == (2, 64)
    block = G[:2, :2]
    # x = B^{1/2} u with ||u|| = 1  <=>  x^T B^{-1} x = 1
    q = np.einsum("in,ij,jn->n", pts, np.linalg.inv(block), pts)
    np.testing.assert_allclose(q, 1.0, rtol=1e-12)


def test_ellipse_points_3d_on_ellipsoid():
    rng = np.random.default_rng(1)
    G = _spd(rng, 6)
    pts = ellipse_points(G, (0, 1, 2), n_points=12)
    assert pts.shape == (3, 12, 12)
    flat = pts.reshape(3, -1)
    q = np.einsum("in,ij,jn->n", flat, np.linalg.inv(G[:3, :3]), flat)
    np.testing.assert_allclose(q, 1.0, rtol=1e-12)


def test_ellipse_points_bad_coords():
    with pytest.raises(ValueError, match="out of range"):
        ellipse_points(np.eye(2), (0, 2))
    with pytest.raises(ValueError, match="2 or 3"):
        ellipse_points(np.eye(4), (0,))


def test_plot_ellipses_equal_axes_and_png(tmp_path):
    rng = np.random.default_rng(2)
    fig, (ax2, ax3) = new_figure(2, projection=[None, "3d"])
    plot_ellipses(ax2, {"A": _spd(rng, 3), "B": np.diag([4.0, 0.1, 1.0])})
    assert ax2.get_aspect() == 1.0
    assert ax2.get_xlim() == ax2.get_ylim()
    assert [t.get_text() for t in ax2.get_legend().get_texts()] == ["A", "B"]
    plot_ellipses(ax3, [_spd(rng, 3), _spd(rng, 3)])
    assert ax3.get_xlim() == ax3.get_zlim()
    path = save_figure(fig, tmp_path / "sub" / "ell.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_ellipses_rejects_bad_input():
    fig, (ax,) = new_figure(1)
    with pytest.raises(ValueError, match="square"):
        plot_ellipses(ax, [np.ones((2, 3))])
    with pytest.raises(ValueError, match="NaN"):
        plot_ellipses(ax, [np.array([[1.0, np.nan], [np.nan, 1.0]])])


def test_plot_error_curves_bands(tmp_path):
    x = np.arange(5)
    runs = np.array([[1e-1, 1e-2, 1e-3, 0.0, 1e-5], [2e-1, 2e-2, 2e-3, 2e-4, 2e-5], [4e-1, 4e-2, 4e-3, 4e-4, 4e-5]])
    fig, (ax1, ax2) = new_figure(2)
    plot_error_curves(ax1, x, {"runs": runs}, xlabel="round")
    assert ax1.get_yscale() == "log"
    line = ax1.get_lines()[0]
    np.testing.assert_allclose(line.get_ydata(), np.median(runs, axis=0).clip(1e-17))
    assert len(ax1.collections) == 1  # the IQR band
    plot_error_curves(ax2, x, {"mean": runs}, center="mean", band="sd", logy=False)
    np.testing.assert_allclose(ax2.get_lines()[0].get_ydata(), runs.mean(axis=0))
    with pytest.raises(ValueError, match="expected"):
        plot_error_curves(ax2, x, {"bad": np.ones((2, 4))})
    with pytest.raises(ValueError, match="band"):
        plot_error_curves(ax2, x, {"r": runs}, band="minmax")
    assert save_figure(fig, tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC
