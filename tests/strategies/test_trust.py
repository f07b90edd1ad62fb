"""A lying site against the server (``trust:``), with hand-made replies over an in-process grid.

Each attack of one site is refused (the site is dropped while ``failure.min_clients`` remain) or
bounded (its weight capped, its update clipped), the run goes on, and the honest sites' result
is what the policy says: equal to the run where that site simply failed when it was dropped.
The pure pieces (the cap, the clip, the consistency measures) are checked against known answers.
"""

from __future__ import annotations

import numpy as np
import pytest
from app_helpers import Crashing, FakeGrid, Lying, NumpyClient, Recorder, moments_lie, train_lie
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedhead import ufm
from fedhead.analysis.consistency import gram_errors, outlier_scores
from fedhead.analysis.constraints import ConfigError
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.settings.limits import Timeouts
from fedhead.settings.trust import TrustPolicy
from fedhead.strategies import HeadAveraging
from fedhead.strategies.failures import TooFewReplies

LH = LW = 0.1
NODES = [101, 57, 33]
LIAR = 57  # partition 1
FAST = Timeouts(nodes=0.5, exchange=0.5, round=0.5)


# ------------------------------------------------------------------ pure pieces, known answers
def test_capped_shares_water_fill_and_leave_uncapped_weights_bit_for_bit():
    np.testing.assert_array_equal(agg.capped_shares([1e15, 100, 100, 100], 0.5), [0.5, 1 / 6, 1 / 6, 1 / 6])
    # two sites above the cap: both capped, the rest shared by counts
    np.testing.assert_allclose(agg.capped_shares([50, 40, 5, 5], 0.3), [0.3, 0.3, 0.2, 0.2], rtol=0, atol=1e-15)
    n = np.array([3.0, 5.0, 7.0])
    np.testing.assert_array_equal(agg.capped_shares(n, 0.5), n / n.sum())  # not binding: N_m / N exactly
    np.testing.assert_array_equal(agg.capped_shares([9, 1], 0.5), [0.9, 0.1])  # two sites: no cap
    np.testing.assert_array_equal(agg.capped_shares([9, 1, 1], None), np.array([9, 1, 1]) / 11)
    np.testing.assert_allclose(agg.capped_shares([97, 1, 1, 1], 0.2), [0.25] * 4, rtol=0, atol=0)  # M cap <= 1


def test_clip_updates_scale_each_update_to_the_bound():
    w0, b0 = np.zeros((2, 3)), np.zeros(2)
    w = np.stack([np.full((2, 3), 1.0), np.full((2, 3), 1e-3)])  # ||U_0|| = sqrt(6 + 2), ||U_1|| tiny
    b = np.stack([np.ones(2), np.zeros(2)])
    out = agg.clip_updates(w, b, (w0, b0), 2.0)
    s = 2.0 / np.sqrt(8.0)
    np.testing.assert_allclose(out.scale, [s, 1.0], rtol=1e-15)
    np.testing.assert_allclose(out.weight[0], s * w[0], rtol=1e-15)
    np.testing.assert_array_equal(out.weight[1], w[1])
    norm = np.sqrt(np.sum((out.weight[0] - w0) ** 2) + np.sum((out.bias[0] - b0) ** 2))
    assert norm == pytest.approx(2.0, rel=1e-14)


def test_gram_errors_and_outlier_scores_known_answers():
    g = np.stack([np.diag([4.0, 1.0]), np.diag([1.0, 1.0])])
    heads = np.stack([np.diag([2.0, 1.0]), np.diag([2.0, 1.0])])  # W W^T = diag(4, 1)
    np.testing.assert_allclose(gram_errors(heads, g), [0.0, 3.0 / np.sqrt(2.0)], rtol=1e-15)
    # three equal covariances and one far away: the far one's score is large, the others' ~1
    covs = np.stack([np.eye(2), np.eye(2) * 1.1, np.eye(2) * 0.9, np.eye(2) * 25.0])
    # d_BW(a I, b I) = sqrt(2) |sqrt(a) - sqrt(b)|; r_m: the middle one of each site's 3 distances
    root = np.sqrt([1.0, 1.1, 0.9, 25.0])
    d = np.sqrt(2.0) * np.abs(root[:, None] - root[None, :])
    r = np.array([np.sort(np.delete(d[m], m))[1] for m in range(4)])
    np.testing.assert_allclose(outlier_scores(covs), r / np.median(r), rtol=1e-12)
    assert outlier_scores(covs)[3] > 30
    assert outlier_scores(covs[:2]) is None  # two sites: each is the other's outlier


def test_the_policy_is_validated_at_start():
    with pytest.raises(ConfigError, match=r"trust.max_weight_share must be a number in \(0, 1\]"):
        TrustPolicy(max_weight_share=1.5)
    with pytest.raises(ConfigError, match="trust.max_abs must be a finite number > 0"):
        TrustPolicy(max_abs=float("inf"))
    with pytest.raises(ConfigError, match="trust.expected_counts must be a list of integers"):
        TrustPolicy(expected_counts=[10, 0])
    with pytest.raises(ConfigError, match="trust.expected_counts lists 2 sites, but num_clients=3"):
        TrustPolicy(expected_counts=[10, 10]).check(3)
    assert TrustPolicy(max_count=[5, 6]).count_problem(7, 1) == "reported 7 rows, above trust.max_count=6"


# ------------------------------------------------------------------ a lying site in a federation
def _run(handlers, *, trust=None, min_clients=2, rounds=2):
    obs = Recorder()
    strategy = HeadAveraging(
        lambda_h=LH,
        lambda_w=LW,
        min_nodes=len(NODES),
        observer=obs,
        timeouts=FAST,
        min_clients=min_clients,
        trust=trust,
    )
    grid = ProgressGrid(FakeGrid(handlers), show=False, poll=0.005)
    grid.timeouts = FAST
    w0 = np.random.default_rng(0).standard_normal((2, 4))
    strategy.run(grid, (w0, np.zeros(2)), rounds)
    return strategy, obs


def _clients(targets):
    return {n: NumpyClient(y, pid, LH, LW) for pid, (n, y) in enumerate(zip(NODES, targets))}


def _with(targets, liar):
    handlers = _clients(targets)
    handlers[LIAR] = liar(handlers[LIAR])
    return handlers


def _same_run(a, b):
    for ra, rb in zip(a.records, b.records, strict=True):
        np.testing.assert_array_equal(ra.gram, rb.gram)
        np.testing.assert_array_equal(ra.bias, rb.bias)


def test_a_huge_count_is_held_to_the_weight_cap(task_identity, fig2_targets, caplog):
    huge = 10**15  # claimed in the exchange and in every training reply

    def liar(client):
        return Lying(
            Lying(client, "query", moments_lie(count=huge)), "train", train_lie(metrics={"num-examples": huge})
        )

    strategy, obs = _run(_with(fig2_targets, liar))
    ex = strategy.exchange
    assert ex.moments.weights[1] == 0.5  # not 1.0
    n = np.array([fig2_targets[0].shape[0], fig2_targets[2].shape[0]], dtype=float)
    np.testing.assert_allclose(ex.moments.weights[[0, 2]], 0.5 * n / n.sum(), rtol=1e-15)
    assert any("capped at 0.5" in f and "node 57" in f for f in ex.diagnosis.flags)
    assert any("its weight is capped" in r.getMessage() for r in caplog.records)
    # every round averages with the capped weights: the bias is sum p_m mu_m
    assert obs.records[-1].dropped == []
    np.testing.assert_allclose(obs.records[-1].bias, ex.moments.weights @ np.asarray(ex.moments.means), atol=1e-12)


def test_a_count_beyond_float64_or_the_declared_counts_drops_the_site(task_identity, fig2_targets):
    crashed = _run(_with(fig2_targets, lambda c: Crashing(c, "query")))[1]
    strategy, obs = _run(_with(fig2_targets, lambda c: Lying(c, "query", moments_lie(count=10**300))))
    assert [d.node for d in strategy.exchange.dropped] == [LIAR]
    assert "above 2^53" in strategy.exchange.dropped[0].reason
    _same_run(obs, crashed)  # the honest sites' result is the run without the attacker
    honest = [y.shape[0] for y in fig2_targets]
    declared = TrustPolicy(expected_counts=honest)
    strategy, obs = _run(
        _with(fig2_targets, lambda c: Lying(c, "query", moments_lie(count=honest[1] + 1))), trust=declared
    )
    assert "trust.expected_counts says" in strategy.exchange.dropped[0].reason
    _same_run(obs, crashed)


def test_a_fake_covariance_is_dropped_beyond_the_bound_and_flagged_below_it(task_identity, fig2_targets):
    crashed = _run(_with(fig2_targets, lambda c: Crashing(c, "query")))[1]
    gross = 1e14 * np.eye(2)  # a standard deviation of 1e7 > trust.max_abs
    strategy, obs = _run(_with(fig2_targets, lambda c: Lying(c, "query", moments_lie(cov=gross))))
    assert [d.node for d in strategy.exchange.dropped] == [LIAR]
    assert "Sigma_m exceeds the magnitude bound" in strategy.exchange.dropped[0].reason
    _same_run(obs, crashed)
    # a moderate fake passes the bound; it is named in the diagnosis with its figure
    honest = ufm.TargetMoments.from_targets(fig2_targets)
    fake = 200 * np.asarray(honest.covs[1])  # standard deviations x 14, far below trust.max_abs
    strategy, _ = _run(_with(fig2_targets, lambda c: Lying(c, "query", moments_lie(cov=fake))))
    flags = strategy.exchange.diagnosis.flags
    assert len(flags) == 1 and flags[0].startswith("node 57 (partition 1): its covariance lies 8.91 times as far"), (
        flags
    )
    assert strategy.exchange.diagnosis.outlier_scores[1] > 5
    # without a lie nothing is flagged
    assert _run(_clients(fig2_targets))[0].exchange.diagnosis.flags == ()


def test_a_mean_of_1e200_drops_the_site_instead_of_poisoning_sigma_cen(task_identity, fig2_targets):
    crashed = _run(_with(fig2_targets, lambda c: Crashing(c, "query")))[1]
    strategy, obs = _run(_with(fig2_targets, lambda c: Lying(c, "query", moments_lie(mean=np.full(2, 1e200)))))
    assert "target mean mu_m exceeds the magnitude bound" in strategy.exchange.dropped[0].reason
    assert np.all(np.isfinite(strategy.exchange.moments.sigma_cen))
    _same_run(obs, crashed)


def test_a_head_of_1e200_drops_the_site_for_the_round(task_identity, fig2_targets):
    crashed = _run(_with(fig2_targets, lambda c: Crashing(c, "train")))[1]
    strategy, obs = _run(_with(fig2_targets, lambda c: Lying(c, "train", train_lie(head=lambda w: w * 0 + 1e200))))
    last = obs.records[-1]
    assert [(d["node"], d["kind"]) for d in last.dropped if d["stage"] == "training"] == [(LIAR, "invalid")]
    assert "head weight exceeds the magnitude bound 1e+06 (trust.max_abs)" in last.dropped[0]["reason"]
    assert "1e+200" not in last.dropped[0]["reason"]  # the value a site sent is not quoted
    _same_run(obs, crashed)
    with pytest.raises(TooFewReplies, match="node 57.*trust.max_abs"):  # all required: one clear stop
        _run(
            _with(fig2_targets, lambda c: Lying(c, "train", train_lie(head=lambda w: w * 0 + 1e200))), min_clients=None
        )


def test_another_sites_partition_id_drops_only_the_liar(task_identity, fig2_targets):
    crashed = _run(_with(fig2_targets, lambda c: Crashing(c, "train")))[1]
    strategy, obs = _run(
        _with(fig2_targets, lambda c: Lying(c, "train", train_lie(metrics={protocol.PARTITION_ID: 2})))
    )
    training = [d for d in obs.records[-1].dropped if d["stage"] == "training"]
    assert [d["node"] for d in training] == [LIAR]
    assert "reports partition 2, but it is partition 1 of this run" in training[0]["reason"]
    _same_run(obs, crashed)
    # a list where the id belongs is invalid too, not a crash
    strategy, obs = _run(
        _with(fig2_targets, lambda c: Lying(c, "train", train_lie(metrics={protocol.PARTITION_ID: [1, 2]})))
    )
    assert "'partition-id' is not an integer" in obs.records[-1].dropped[0]["reason"]


def test_junk_metrics_are_ignored_and_counted(task_identity, fig2_targets):
    junk = {f"junk_{i}": float(i) for i in range(2008)}
    junk.update({"objective": float("nan"), "train_seconds": float("inf")})
    honest_run = _run(_clients(fig2_targets))[1]
    strategy, obs = _run(_with(fig2_targets, lambda c: Lying(c, "train", train_lie(metrics=junk))))
    last = obs.records[-1]
    assert last.ignored_metrics == 2010 and last.dropped == []
    declared = {k for m in last.client_metrics for k in m}
    assert not any(k.startswith("junk_") for k in declared) and "objective" not in last.client_metrics[1]
    assert all(np.isfinite(v) for m in last.client_metrics for v in m.values())
    _same_run(obs, honest_run)  # nothing else changes


def test_clipping_bounds_a_sites_update(task_identity, fig2_targets):
    trust = TrustPolicy(clip_update=0.05)
    strategy, obs = _run(_clients(fig2_targets), trust=trust, rounds=1)
    rec = obs.records[1]
    assert rec.clipped_updates == 3
    w0 = np.random.default_rng(0).standard_normal((2, 4))
    # the average of the clipped heads: W_0 + sum p_m s_m (W~_m - W_0)
    heads = np.stack([ufm.closest_head(w0, g) for g in strategy.exchange.targets.client_grams])
    biases = np.asarray(strategy.exchange.moments.means)
    clipped = agg.clip_updates(heads, biases, (w0, np.zeros(2)), 0.05)
    p = np.asarray(strategy.exchange.moments.weights)
    w = np.einsum("m,mcp->cp", p, clipped.weight)
    np.testing.assert_allclose(rec.gram, w @ w.T, rtol=1e-12)


def test_a_head_that_contradicts_its_covariance_is_flagged(task_identity, fig2_targets):
    strategy, obs = _run(
        _with(
            fig2_targets, lambda c: Lying(c, "train", train_lie(head=lambda w: 3.0 * w, metrics={"trained_gap": 0.0}))
        )
    )
    last = obs.records[-1]
    assert last.gram_errors[1] == pytest.approx(8.0, rel=1e-9)  # (3 W)(3 W)^T = 9 G
    assert len(last.flags) == 1 and last.flags[0].startswith("node 57 (partition 1): reports its local optimum")
    assert max(last.gram_errors[0], last.gram_errors[2]) < 1e-12  # honest: exactly phi(Sigma_m)


# ------------------------------------------------------------------ site-local statistics
def test_two_nodes_with_the_same_site_file_are_both_refused(task_identity):
    from fedhead.strategies.statistics import STAGE, StatsRow, refuse_duplicate_sites

    rows = [
        StatsRow(None, node, key, ("t",), 10, np.zeros(1), np.eye(1), np.zeros(1), np.ones(1))
        for node, key in ((1, "aaaa"), (2, "bbbb"), (3, "aaaa"))
    ]
    dropped = []
    kept = refuse_duplicate_sites(rows, dropped)
    assert [r.node for r in kept] == [2]
    assert [(d.node, d.stage) for d in dropped] == [(1, STAGE), (3, STAGE)]
    assert "byte-identical to that of node(s) [3] (site key aaaa)" in dropped[0].reason


def test_raw_statistics_beyond_float64_pooling_are_refused(task_identity):
    from fedhead.strategies.statistics import parse_statistics_reply

    ask = Message(content=RecordDict(), dst_node_id=5, message_type="query")
    content = RecordDict(
        {
            protocol.SITE_STATS: ArrayRecord(
                {
                    protocol.Y_MEAN: Array(np.array([1e200])),
                    protocol.Y_COV: Array(np.eye(1)),
                    protocol.X_MEAN: Array(np.zeros(2)),
                    protocol.X_VAR: Array(np.ones(2)),
                }
            ),
            protocol.SITE: ConfigRecord({protocol.COLUMNS: ["a", "b", "t"], protocol.SITE_KEY: "k"}),
            protocol.METRICS: MetricRecord({protocol.NUM_EXAMPLES: 10}),
        }
    )
    with pytest.raises(agg.ReplyError, match="target means exceeds the magnitude bound 1e.100 "):
        parse_statistics_reply(Message(content, reply_to=ask))


def test_partition_claims_that_cannot_all_be_honest_drop_the_claimants():
    from fedhead.strategies.exchange import ExchangeSettings, screen_rows

    settings = ExchangeSettings(
        lambda_h=LH,
        lambda_w=LW,
        gamma=0.0,
        centered=False,
        num_clients=3,
        required=1,
        timeouts=FAST,
        message_config={},
    )
    mu, cov = np.zeros(2), np.eye(2)
    rows = [(0, 5, 10, mu, cov), (0, 6, 10, mu, cov), (1, 7, 10, mu, cov), (2, 7, 10, mu, cov), (3, 8, 10, mu, cov)]
    kept, dropped = screen_rows(rows, settings)
    assert kept == []
    reasons = {d.node: d.reason for d in dropped}
    assert reasons[5].startswith("partition 0 is also claimed by node(s) [6]")
    assert reasons[7] == "answered more than once" and reasons[8] == "reports partition 3 outside 0..2"


def test_metrics_the_app_declares_are_kept(task_identity, fig2_targets):
    lie = train_lie(metrics={"backbone_norm": 2.5, "other": 1.0})
    _, obs = _run(
        _with(fig2_targets, lambda c: Lying(c, "train", lie)), trust=TrustPolicy(extra_metrics=["backbone_norm"])
    )
    last = obs.records[-1]
    assert last.client_metrics[1]["backbone_norm"] == 2.5 and "other" not in last.client_metrics[1]
    assert last.ignored_metrics == 1
