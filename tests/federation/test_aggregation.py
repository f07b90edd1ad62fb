"""Averaging, validation, moment exchange, diagnosis and round measurements.

(fedhead.federation.aggregation, fedhead.analysis.diagnosis, fedhead.federation.tracking)
"""

from __future__ import annotations

import numpy as np
import pytest

from fedhead import ufm
from fedhead.analysis.diagnosis import diagnose
from fedhead.analysis.metrics import selection_distance
from fedhead.federation import aggregation as agg
from fedhead.federation import tracking

LH = LW = 0.1


def test_average_heads_is_count_weighted():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 2, 5))
    b = rng.standard_normal((3, 2))
    n = np.array([10, 30, 60])
    avg = agg.average_heads(w, b, n)
    np.testing.assert_allclose(avg.weights, [0.1, 0.3, 0.6], rtol=0, atol=1e-15)
    np.testing.assert_allclose(avg.weight, 0.1 * w[0] + 0.3 * w[1] + 0.6 * w[2], rtol=0, atol=1e-14)
    np.testing.assert_allclose(avg.bias, 0.1 * b[0] + 0.3 * b[1] + 0.6 * b[2], rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "weight, bias, count, msg",
    [
        (np.zeros((2, 4)), np.zeros(2), 5, "shape"),
        (np.full((2, 5), np.nan), np.zeros(2), 5, "non-finite"),
        (np.zeros((2, 5)), np.array([0.0, np.inf]), 5, "non-finite"),
        (np.zeros((2, 5)), np.zeros(3), 5, "shape"),
        (np.zeros((2, 5)), np.zeros(2), 0, "positive integer"),
        (np.zeros((2, 5)), np.zeros(2), 2.5, "positive integer"),
        (np.zeros((2, 5)), np.zeros(2), None, "not a number"),
    ],
)
def test_validate_head_names_the_node(weight, bias, count, msg):
    with pytest.raises(agg.ReplyError, match=rf"node 42\b.*{msg}"):
        agg.validate_head(weight, bias, count, node_id=42, shape=(2, 5))


def test_average_states_excludes_batchnorm_statistics():
    s1 = {"lin.weight": np.ones((2, 2)), "bn.running_mean": np.zeros(2), "bn.num_batches_tracked": np.array(3)}
    s2 = {"lin.weight": 3 * np.ones((2, 2)), "bn.running_mean": np.ones(2), "bn.num_batches_tracked": np.array(9)}
    out = agg.average_states([s1, s2], [1, 3])
    assert sorted(out) == ["lin.weight"]
    np.testing.assert_allclose(out["lin.weight"], 2.5 * np.ones((2, 2)), rtol=0, atol=1e-15)
    with pytest.raises(agg.ReplyError, match="node 8"):
        agg.average_states([s1, {"other.weight": np.ones((2, 2))}], [1, 1], node_ids=[7, 8])
    with pytest.raises(agg.ReplyError, match="node 8.*shape"):
        agg.average_states([s1, {"lin.weight": np.ones((3, 2))}], [1, 1], node_ids=[7, 8])


def test_moment_exchange_reproduces_pooled_covariance(fig2_targets):
    stats = [ufm.TargetMoments.from_targets([y]) for y in fig2_targets]
    moments = agg.aggregate_moments(
        [y.shape[0] for y in fig2_targets], [s.means[0] for s in stats], [s.covs[0] for s in stats]
    )
    pooled = np.concatenate(fig2_targets)
    centred = pooled - pooled.mean(0)
    np.testing.assert_allclose(moments.sigma_cen, centred.T @ centred / pooled.shape[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(moments.mean_global, pooled.mean(0), rtol=0, atol=1e-13)
    np.testing.assert_allclose(moments.weights, np.array([256, 200, 300]) / 756, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "cov, count, msg",
    [
        (np.array([[1.0, 0.5], [0.0, 1.0]]), 5, "not symmetric"),
        (np.array([[1.0, 0.0], [0.0, -0.5]]), 5, "positive semi-definite"),
        (np.array([[np.nan, 0.0], [0.0, 1.0]]), 5, "non-finite"),
        (np.eye(2), -1, "positive integer"),
        (np.eye(3), 5, "shape"),
    ],
)
def test_moment_validation_names_the_client(cov, count, msg):
    good = (10, np.zeros(2), np.eye(2))
    with pytest.raises(agg.ReplyError, match=rf"node 3 \(partition 1\).*{msg}"):
        agg.aggregate_moments(
            [good[0], count],
            [good[1], np.zeros(2)],
            [good[2], cov],
            node_ids=["2 (partition 0)", "3 (partition 1)"],
        )


def test_diagnosis_shares_and_recommendation(fig2_targets):
    moments = ufm.TargetMoments.from_targets(fig2_targets)
    diag, gap = diagnose(moments, LH, LW)
    assert diag.fully_active
    np.testing.assert_allclose(diag.margins, np.linalg.eigvalsh(moments.covs)[:, 0] - LH * LW, rtol=0, atol=1e-14)
    total = np.trace(gap.g_cen - gap.g_star)
    assert diag.gap_trace == pytest.approx(total, rel=1e-12)
    assert diag.share_mu + diag.share_sigma + diag.share_a == pytest.approx(1.0, abs=1e-12)
    assert diag.bw_variance == pytest.approx(diag.trace_a, rel=1e-9)  # Tr M_A = BW variance (theory.md §7)
    assert diag.rel_gap == pytest.approx(np.linalg.norm(gap.g_cen - gap.g_star) / np.linalg.norm(gap.g_cen), rel=1e-12)
    # means +-2.2 along the second axis dominate this instance
    assert diag.share_mu > 0.5 and "mean term dominates" in diag.recommendation
    assert "recommendation" in diag.format()
    assert set(diag.to_dict()) >= {"margins", "rel_gap", "share_m_mu", "share_m_sigma", "share_m_a", "bw_variance"}


def test_diagnosis_equal_means_has_no_mean_term(fig2_targets):
    centred = [y - y.mean(0) for y in fig2_targets]
    diag, _ = diagnose(ufm.TargetMoments.from_targets(centred), LH, LW)
    assert abs(diag.trace_mu) < 1e-12 and diag.share_mu < 1e-10
    assert "mean term" not in diag.recommendation


def test_diagnosis_outside_regime_warns_and_recommends(fig2_targets):
    moments = ufm.TargetMoments.from_targets(fig2_targets)
    with pytest.warns(UserWarning, match="fully active"):
        diag, gap = diagnose(moments, 1.0, 0.5)  # lH lW = 0.5 > lambda_min of client 0 (0.11)
    assert not diag.fully_active and gap is None and np.isnan(diag.rel_gap)
    assert diag.recommendation.startswith("client 0 is outside the fully active regime")


def test_round_tracker_with_exact_selection_follows_recursion(fig2_targets):
    """Clients returning Pi_m(W_t): the aggregated Gram is the theory.md §6 recursion, delta = 0."""
    moments = ufm.TargetMoments.from_targets(fig2_targets)
    _, gap = diagnose(moments, LH, LW)
    targets = tracking.reference_targets(moments, gap, LH, LW)
    assert targets.reference == "star"
    tracker = tracking.RoundTracker(targets)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 4))
    tracker.start(w, np.zeros(2))
    for t in range(1, 9):
        heads = tracking.selected_heads(w, targets.client_grams)
        avg = agg.average_heads(heads, np.asarray(moments.means), moments.counts)
        rec = tracker.record(t, avg.weight, avg.bias, broadcast=w, client_heads=heads)
        np.testing.assert_allclose(rec.gram, tracker.records[t - 1].predicted_gram, rtol=0, atol=1e-10)
        assert rec.e_f_recursion < 1e-10 and rec.trajectory_error < 1e-10
        assert rec.delta == pytest.approx(0.0, abs=1e-12)
        np.testing.assert_allclose(rec.bias, moments.mean_global, rtol=0, atol=1e-13)
        w = avg.weight
    recursion = ufm.gram_recursion(tracker.records[0].gram, targets.client_grams, targets.weights, 8)
    np.testing.assert_allclose(tracker.records[-1].gram, recursion[-1], rtol=0, atol=1e-10)
    # converges to the BW barycenter
    assert tracker.records[-1].e_f_star < 1e-6
    assert tracker.records[-1].e_f_star < tracker.records[1].e_f_star
    d = tracker.records[-1].to_dict()
    for key in (
        "round",
        "gram",
        "bias",
        "e_f_star",
        "e_f_cen",
        "e_f_within",
        "d_star",
        "d_cen",
        "trajectory_error",
        "delta",
        "objective_gaps",
        "train_mse",
        "test_mse",
        "predicted_gram",
    ):
        assert key in d


def test_round_tracker_corrected_targets_reach_g_cen_in_one_round(fig2_targets):
    moments = ufm.TargetMoments.from_targets(fig2_targets)
    _, gap = diagnose(moments, LH, LW)
    targets = tracking.reference_targets(moments, gap, LH, LW, gamma=1.0)
    assert targets.reference == "cen"
    np.testing.assert_allclose(targets.client_grams, np.broadcast_to(gap.g_cen, (3, 2, 2)), rtol=0, atol=1e-12)
    tracker = tracking.RoundTracker(targets)
    w = np.random.default_rng(4).standard_normal((2, 3))
    tracker.start(w, np.zeros(2))
    heads = tracking.selected_heads(w, targets.client_grams)
    avg = agg.average_heads(heads, np.zeros((3, 2)), moments.counts)
    rec = tracker.record(1, avg.weight, avg.bias, broadcast=w, client_heads=heads)
    assert rec.e_f_cen < 1e-12 and rec.e_f_reference == rec.e_f_cen


def test_round_tracker_rejects_out_of_order_rounds(fig2_targets):
    moments = ufm.TargetMoments.from_targets(fig2_targets)
    _, gap = diagnose(moments, LH, LW)
    tracker = tracking.RoundTracker(tracking.reference_targets(moments, gap, LH, LW))
    w = np.eye(2)
    with pytest.raises(RuntimeError, match="start"):
        tracker.record(1, w, np.zeros(2), broadcast=w, client_heads=np.stack([w] * 3))
    tracker.start(w, np.zeros(2))
    with pytest.raises(ValueError, match="round 2 recorded after round 0"):
        tracker.record(2, w, np.zeros(2), broadcast=w, client_heads=np.stack([w] * 3))


def test_selection_distance_matches_definition(fig2_targets):
    moments = ufm.TargetMoments.from_targets(fig2_targets)
    grams = ufm.optimal_gram(np.asarray(moments.covs), LH, LW)
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 3))
    heads = rng.standard_normal((3, 2, 3))
    expected = sum(p * np.linalg.norm(h - ufm.closest_head(w, g)) for p, h, g in zip(moments.weights, heads, grams))
    assert selection_distance(heads, tracking.selected_heads(w, grams), moments.weights) == pytest.approx(
        expected, rel=1e-13
    )


def test_weighted_mean():
    assert agg.weighted_mean([1.0, 4.0], [3, 1]) == pytest.approx(1.75, rel=1e-15)
    with pytest.raises(ValueError):
        agg.weighted_mean([1.0], [0])


def test_the_head_average_does_not_depend_on_how_the_clients_are_numbered():
    """Bit for bit: a simulation numbers site-local clients by file order, a deployment by their
    files' keys, and the two must train from the same broadcast."""
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((5, 3, 7)), rng.standard_normal((5, 3))
    counts = np.array([10, 30, 10, 20, 30])
    ref = agg.average_heads(w, b, counts)
    for perm in (rng.permutation(5) for _ in range(6)):
        out = agg.average_heads(w[perm], b[perm], counts[perm])
        np.testing.assert_array_equal(out.weight, ref.weight)
        np.testing.assert_array_equal(out.bias, ref.bias)
