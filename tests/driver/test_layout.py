"""One formula per quantity, the reference of a partial correction, a visible
non-converged barycenter, the import rules between the layers and the O(1) backbone store."""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest
import torch

from fedhead import ufm
from fedhead.analysis import diagnosis
from fedhead.analysis.constraints import ConfigError
from fedhead.analysis.procedure import reference_name
from fedhead.federation import tracking
from fedhead.settings.procedure import ProcedureConfig
from fedhead.train import round_seed

LH = LW = 0.1


def test_corrected_covariance_is_the_one_formula(fig2_targets):
    mom = ufm.TargetMoments.from_targets(fig2_targets)
    covs = np.asarray(mom.covs)
    np.testing.assert_array_equal(ufm.corrected_covariance(covs, mom.sigma_cen, 0.0), covs)
    np.testing.assert_allclose(
        ufm.corrected_covariance(covs, mom.sigma_cen, 1.0),
        np.broadcast_to(mom.sigma_cen, covs.shape),
        rtol=0,
        atol=1e-15,
    )
    got = ufm.corrected_covariance(covs[1], mom.sigma_cen, 0.3)
    np.testing.assert_allclose(got, 0.7 * covs[1] + 0.3 * mom.sigma_cen, rtol=1e-15, atol=0)
    with pytest.raises(ufm.UFMInputError, match="gamma"):
        ufm.corrected_covariance(covs, mom.sigma_cen, 1.5)
    with pytest.raises(ufm.UFMInputError, match="sigma_cen"):
        ufm.corrected_covariance(covs, None, 0.5)


def test_fully_active_margins_do_not_raise_and_the_check_raises_on_them(fig2_targets):
    mom = ufm.TargetMoments.from_targets(fig2_targets)
    rep = ufm.fully_active_margins(mom, 1.0, 0.5)  # lH lW = 0.5 > lambda_min of client 0
    assert rep.margins[0] < 0 and rep.threshold == 0.5
    np.testing.assert_allclose(rep.margins, rep.min_eigs - 0.5, rtol=0, atol=0)
    with pytest.raises(ufm.NotFullyActiveError, match="client 0"):
        ufm.check_fully_active(mom, 1.0, 0.5)
    ok = ufm.check_fully_active(mom, LH, LW)
    np.testing.assert_array_equal(ok.margins, ufm.fully_active_margins(mom, LH, LW).margins)


def test_reference_rule_and_procedure_validation():
    assert [reference_name(g, False) for g in (0.0, 0.4, 1.0)] == ["star", "corrected", "cen"]
    assert reference_name(0.0, True) == "within"
    assert ProcedureConfig("p", gamma=0.5).reference == "corrected"
    with pytest.raises(ConfigError, match=r"gamma must be >= 0 and <= 1"):
        ProcedureConfig("p", gamma=1.2)


def test_partial_correction_is_measured_against_the_corrected_barycenter(fig2_targets):
    mom = ufm.TargetMoments.from_targets(fig2_targets)
    _, gap = diagnosis.diagnose(mom, LH, LW)
    targets = tracking.reference_targets(mom, gap, LH, LW, gamma=0.5)
    assert targets.reference == "corrected" and targets.corrected_converged
    expect = ufm.bw_barycenter(targets.client_grams, mom.weights).gram
    np.testing.assert_allclose(targets.g_corrected, expect, rtol=0, atol=1e-14)
    tracker = tracking.RoundTracker(targets)
    w = np.random.default_rng(2).standard_normal((2, 3))
    tracker.start(w, np.zeros(2))
    for t in range(1, 40):
        heads = tracking.selected_heads(w, targets.client_grams)
        w = np.einsum("m,mcp->cp", mom.weights, heads)
        rec = tracker.record(t, w, np.zeros(2), broadcast=w, client_heads=heads)
    assert rec.e_f_reference < 1e-8 < rec.e_f_cen  # exact selection ends at the corrected barycenter
    assert targets.to_dict()["g_corrected"] == targets.g_corrected.tolist()


def test_non_converged_barycenter_is_visible(fig2_targets, monkeypatch):
    mom = ufm.TargetMoments.from_targets(fig2_targets)
    monkeypatch.setattr(ufm, "gap_decomposition", functools.partial(ufm.gap_decomposition, max_iter=1))
    with pytest.warns(ufm.ConvergenceWarning):
        diag, gap = diagnosis.diagnose(mom, LH, LW)
    assert not gap.barycenter_converged and diag.barycenter_converged is False
    assert diag.recommendation.startswith("the barycenter G_star did not converge")
    d = diag.to_dict()
    assert d["barycenter_converged"] is False and d["barycenter_iters"] == 1 and d["barycenter_residual"] > 0
    assert "did not converge" in diag.format()


def test_diagnosis_json_keys_and_remedies(fig2_targets):
    diag, _ = diagnosis.diagnose(ufm.TargetMoments.from_targets(fig2_targets), LH, LW)
    d = diag.to_dict()
    for key in (
        "margins",
        "threshold",
        "fully_active",
        "rel_gap",
        "gap_trace",
        "trace_m_mu",
        "trace_m_sigma",
        "trace_m_a",
        "share_m_mu",
        "share_m_sigma",
        "share_m_a",
        "bw_variance",
        "recommendation",
    ):
        assert key in d
    assert d["barycenter_converged"] is True
    assert "G_within" in diag.recommendation and "does not move G_star toward G_cen" in diag.recommendation


def test_round_seed_rule():
    assert round_seed(0, 1, 0) == 1_009 and round_seed(2, 3, 5) == 2 * 1_000_003 + 3 * 1_009 + 5


@pytest.mark.parametrize(
    "module, banned",
    [
        ("fedhead.strategies", ("torch", "fedhead.data", "fedhead.clients")),
        ("fedhead.clients", ("fedhead.strategies",)),
        ("fedhead.federation.aggregation", ("torch", "flwr")),
        ("fedhead.analysis.diagnosis", ("torch", "flwr")),
        ("fedhead.federation.tracking", ("torch", "flwr")),
        ("fedhead.federation.protocol", ("torch", "flwr")),
    ],
)
def test_import_rules(module, banned):
    code = (
        f"import sys, {module}; bad = [m for m in sys.modules for b in {banned!r} "
        f"if m == b or m.startswith(b + '.')]; print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"{module} imports {out.stdout.strip()} {out.stderr[-500:]}"


def test_store_finds_the_expected_round_without_listing(tmp_path, monkeypatch):
    from fedhead.clients import BackboneStore
    from fedhead.clients.cache import CLIENT_CACHE

    store = BackboneStore(tmp_path / "s", sync=False)
    for pid in range(5):
        store.save(pid, 1, {"w": torch.full((2,), float(pid))})
    store.save(3, 2, {"w": torch.ones(2)})
    assert store.path(3, 1).exists() and store.path(3, 2).exists()  # the previous round is kept
    store.save(3, 3, {"w": 3 * torch.ones(2)})
    assert not store.path(3, 1).exists()
    store.path(3, 3).unlink()
    CLIENT_CACHE.clear()  # what a new process sees

    def no_listing(self, partition):
        raise AssertionError("the folder was listed")

    monkeypatch.setattr(BackboneStore, "_files", no_listing)
    rnd, state = store.load(3, expected_round=2)
    assert rnd == 2 and torch.equal(state["w"], torch.ones(2))
    assert store.load(3)[0] == 2  # the cached round is the guess


def test_each_parameter_is_stored_once_and_jobs_derive_the_trainer_view(tmp_path):
    import dataclasses

    from fedhead.settings.config import compose_config, load_config
    from fedhead.train import LocalProblem, TrainConfig, TrainInputError

    cfg = load_config(
        compose_config(
            [
                "experiment=single",
                "procedure=corrected_proximal",
                "rho=0.3",
                "lambda_h=0.02",
                "lambda_w=0.03",
                "local_epochs=7",
                "seed=4",
            ]
        )
    )
    job = cfg.jobs(tmp_path)[0]
    # the recipe holds none of the procedure's or the top level's terms ...
    recipe = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not recipe & {"epochs", "lambda_h", "lambda_w", "seed", "rho", "gamma", "center_targets"}
    assert job.train is cfg.train
    # ... the trainer receives them from where they are stored
    assert job.local_problem() == LocalProblem(
        epochs=7,
        lambda_h=0.02,
        lambda_w=0.03,
        rho=0.3,
        gamma=job.procedure.gamma,
        center_targets=job.procedure.centered,
    )
    assert job.procedure.rho == 0.3 and job.procedure.gamma == 1.0 and job.settings.seed == 4
    with pytest.raises(ConfigError, match=r"^train.lambda_h is not a train setting .*; set lambda_h=$"):
        load_config(compose_config(["experiment=single", "procedure=proximal", "+train.lambda_h=0.5"]))
    with pytest.raises(ConfigError, match=r"^train.gamma is not a train setting .*; set procedure.gamma=$"):
        load_config(compose_config(["experiment=single", "procedure=proximal", "+train.gamma=0.5"]))
    with pytest.raises(TrainInputError, match=r"LocalProblem.gamma must be >= 0 and <= 1"):
        LocalProblem(gamma=1.5)
