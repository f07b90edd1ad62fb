"""Each experiment of the UFM suite in a tiny profile: the theory's predictions on its numbers,
results.json and PNGs written, determinism, and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedhead.cli import ufm as cli
from fedhead.cli.ufm import EXPERIMENTS
from fedhead.experiments import convergence, finite_steps, gap_terms, recovery, reference, selection

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _check_outputs(res, name):
    payload = json.loads((res.out_dir / "results.json").read_text())
    assert payload["experiment"] == name
    assert set(payload["headline"]) == {h.name for h in res.headline}
    assert "seeds" in payload["provenance"] and payload["provenance"]["seeds"]
    assert res.figures and all(p.read_bytes()[:8] == PNG_MAGIC for p in res.figures)
    assert [p.name for p in res.figures] == payload["figures"]
    return payload


def test_fig2_reference(tmp_path):
    s = reference.Settings(rho_ladder=tuple(np.logspace(-2, -6, 5).tolist()), round_rhos=(1e-2, 1e-3))
    res = reference.run(s, tmp_path / "fig2")
    _check_outputs(res, "fig2")
    h = res.headline_dict
    r = res.results
    # (a) joint Adam reaches the client Gram but not the closest head
    assert h["a_adam_e_G_final"] < 5e-3
    assert h["a_adam_e_Pi_final"] > 0.1
    # (b) proximal errors proportional to rho
    assert abs(h["b_slope_e_Pi_vs_rho"] - 1.0) < 0.03
    assert h["b_e_Pi_at_rho_min"] < 1e-5
    # (c) exact selection converges to G_star; proximal stalls at O(rho)
    assert h["c_exact_final_err_to_G_star"] < 1e-12
    ratio = h["c_rho=0.001_final_err"] / h["c_rho=0.01_final_err"]
    assert 0.05 < ratio < 0.2
    assert max(r["panel_cd"]["exact"]["selection_distance"]) < 1e-12
    # (e) PSD terms; zero terms vanish
    assert h["e_min_eig_of_terms"] > -1e-12
    assert h["e_max_term_that_must_vanish"] < 1e-12
    assert r["panel_e"]["original"]["decomposition_residual"] < 1e-12
    # (f) full correction recovers G_cen in one round; residual ~ 1 - gamma
    assert h["f_err_gamma1_round1"] < 1e-12
    assert 8.0 < h["f_ratio_err_0.9_over_0.99"] < 12.0


def test_selection_sweep(tmp_path):
    s = selection.Settings(n_instances=1, dims=(2,), rho_ladder=(1e-2, 1e-3, 1e-4, 1e-5), n_lbfgs_starts=2)
    res = selection.run(s, tmp_path / "selection")
    _check_outputs(res, "selection")
    h = res.headline_dict
    assert abs(h["median_slope_e_Pi_vs_rho"] - 1.0) < 0.03
    assert h["median_e_Pi_at_rho_min"] < 1e-4
    assert h["max_excess_loss_over_bound"] <= 1.0
    assert h["max_abs_||Pi-W||-d_BW"] < 1e-12
    assert h["min_lbfgs_dist_ratio"] >= 1.0
    assert h["max_lbfgs_e_G"] < 1e-6


def test_convergence_sweep(tmp_path):
    s = convergence.Settings(n_instances=1, dims=(2,), clients=(3,), rho_ladder=(1e-2, 1e-3), adam_steps=40)
    res = convergence.run(s, tmp_path / "convergence")
    _check_outputs(res, "convergence")
    h = res.headline_dict
    assert h["max_exact_final_err"] < 1e-12
    assert abs(h["slope_final_err_vs_rho"] - 1.0) < 0.1
    assert h["median_adam_final_err"] > 10 * h["median_final_err_rho=0.001"]


@pytest.fixture(scope="module")
def tiny_gap():
    return gap_terms.Settings(
        controlled_seeds=(55, 56),
        mean_scales=(0.0, 1.0),
        cov_scales=(0.0, 0.5, 1.0),
        n_random=12,
        n_sweep=3,
        sweep_dims=(2, 3),
        sweep_clients=(2, 4),
        kappas=(10.0, 1.2),
    )


def test_gap_terms(tmp_path, tiny_gap):
    res = gap_terms.run(tiny_gap, tmp_path / "gap")
    _check_outputs(res, "gap_terms")
    h = res.headline_dict
    assert h["min_eig_of_terms_rel"] > -1e-12
    assert h["max_decomposition_residual_rel"] < 1e-12
    assert h["max_|TrM_A-bw_variance|_rel"] < 1e-10
    assert h["max_(D-TrM_A)/D"] < 1e-10
    assert h["max_(TrM_A-2D)/D"] < 0
    assert h["max_|Tr M_mu|_equal_means"] < 1e-12
    assert h["max_|Tr M_Sigma|+|Tr M_A|_equal_covs"] < 1e-12
    # M_mu grows with the mean scale while M_Sigma, M_A do not depend on it
    med = res.results["controlled"]["means"]
    assert med["M_mu"]["median"][1] > med["M_mu"]["median"][0]
    np.testing.assert_allclose(med["M_A"]["median"][0], med["M_A"]["median"][1], rtol=1e-9)


def test_gap_terms_deterministic(tmp_path, tiny_gap):
    a = gap_terms.run(tiny_gap, tmp_path / "a")
    b = gap_terms.run(tiny_gap, tmp_path / "b")
    assert (a.out_dir / "results.json").read_bytes() == (b.out_dir / "results.json").read_bytes()


def test_recovery(tmp_path):
    s = recovery.Settings(
        n_instances=1, dims=(2,), clients=(3,), n_check=1, check_rhos=(1e-2, 1e-3, 1e-4), check_rounds=2, n_identity=8
    )
    res = recovery.run(s, tmp_path / "recovery")
    _check_outputs(res, "recovery")
    h = res.headline_dict
    assert h["max_err_full_correction_round1"] < 1e-12
    assert h["median_err_no_correction"] > 1e-3
    assert abs(h["slope_limit_err_vs_1-gamma"] - 1.0) < 0.05
    for g in ("1", "0.5"):
        assert abs(h[f"check_slope_e_Pi_vs_rho_gamma={g}"] - 1.0) < 0.05
    assert h["identity_max_value_rel_err"] < 1e-13
    assert h["identity_max_grad_rel_err"] < 1e-12


def test_finite_steps(tmp_path):
    s = finite_steps.Settings(
        n_instances=1, etas=(0.1,), steps=(1, 2, 20, 500), n_commuting=3, jacobian_steps=(2,), jacobian_h=(1e-4, 1e-3)
    )
    res = finite_steps.run(s, tmp_path / "finite")
    _check_outputs(res, "finite_steps")
    h = res.headline_dict
    assert h["max_E=1_dist_to_G_within_rel"] < 1e-9
    assert h["runs_not_converged"] == 0
    assert h["median_E=500_dist_to_G_star_rel"] < 0.1
    assert abs(h["median_displacement_ratio"] - 1.0) < 0.01
    assert abs(h["spectral_ratio_at_h_min"] - 1.0) < 1e-3
    assert h["noncommuting_displacement_err_at_h_min"] < 1e-2
    to_star = res.results["to_star"][0, 0]
    assert to_star[-1] < to_star[1] < to_star[0]  # drifts from G_within toward G_star as E grows


def test_cli_help_lists_experiments(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert name in out
    assert "all" in out


def test_cli_rejects_unknown_name(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["nope"])
    assert exc.value.code == 2
    with pytest.raises(ValueError, match="unknown experiment"):
        cli.run_experiment("nope")


def test_cli_runs_one_experiment(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        gap_terms.Settings,
        "quick",
        classmethod(
            lambda cls: cls(
                controlled_seeds=(55,),
                mean_scales=(0.0, 1.0),
                cov_scales=(0.0, 1.0),
                n_random=4,
                n_sweep=2,
                sweep_dims=(2,),
                sweep_clients=(2,),
                kappas=(10.0,),
            )
        ),
    )
    assert cli.main(["gap_terms", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[gap_terms]" in out and "min_eig_of_terms_rel" in out
    assert (tmp_path / "gap_terms" / "results.json").exists()
    assert (tmp_path / "gap_terms" / "gap_terms.png").exists()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # longer than the default 300 s per test
def test_quick_suite_all(tmp_path, capsys):
    """The whole quick profile through the CLI (about 1-2 minutes on 2 cores)."""
    assert cli.main(["all", "--quick", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in EXPERIMENTS:
        assert f"[{name}]" in out
        payload = json.loads((tmp_path / name / "results.json").read_text())
        assert payload["experiment"] == name
        assert all((tmp_path / name / f).exists() for f in payload["figures"])
