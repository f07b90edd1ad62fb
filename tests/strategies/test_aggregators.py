"""The aggregation seam (``fedhead.strategies.aggregator``) with hand-made replies: each aggregator
against sums known in closed form. Clear mode averages the heads it sees; secure mode gets the same
sums from sites behind fedhead's secure mod; differential privacy, wrapped around the secure one,
makes the exchange's covariances PSD and accounts every release.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest
from app_helpers import FakeGrid, instruction, query_reply, simulated_sites, targets_with_moments, train_reply
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from test_secure_strategy import behind_secure_mod

from fedhead import ufm
from fedhead.analysis.constraints import ConfigError
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.privacy_noise import privacy_spent
from fedhead.settings.limits import Timeouts
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.strategies import HeadAveraging
from fedhead.strategies.aggregator import HeadSum, MseSum, Phase
from fedhead.strategies.clear import ClearAggregator
from fedhead.strategies.exchange import ExchangeSettings, collect_moments
from fedhead.strategies.phases import TrainReplies
from fedhead.strategies.privacy_modes import DifferentialPrivacy, make_aggregator
from fedhead.strategies.secure import SITES_AT_OPTIMUM, SITES_SUMMED, SecureSum, SumSetup
from fedhead.strategies.secure_aggregator import SecureAggregator
from fedhead.strategies.secure_exchange import PooledExchange, pooled_exchange, screen_sites, standardize

LH = LW = 0.1
NODES = [101, 57, 33, 12]  # partitions 0..3, node ids not in partition order
ROSTER = simulated_sites(len(NODES)).roster
C, P = 2, 3
FAST = Timeouts(nodes=0.5, exchange=2.0, round=2.0)
SECURE = PrivacyPolicy(mode="secure")


def _settings(required: int = len(NODES)) -> ExchangeSettings:
    return ExchangeSettings(
        lambda_h=LH,
        lambda_w=LW,
        gamma=0.0,
        centered=False,
        num_clients=len(NODES),
        required=required,
        timeouts=FAST,
        message_config=MappingProxyType({}),
    )


def _targets(dim: int = C) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    out = []
    for pid in range(len(NODES)):
        a = rng.normal(size=(dim, dim))
        out.append(targets_with_moments(20 + 7 * pid, rng.normal(size=dim), a @ a.T + 0.5 * np.eye(dim), seed=pid))
    return out


def _exchange(settings: ExchangeSettings):
    replies = [query_reply(instruction(n, "query"), y, pid) for pid, (n, y) in enumerate(zip(NODES, _targets()))]
    return collect_moments(reversed(replies), settings, expected_nodes=None)


def _heads() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return rng.standard_normal((len(NODES), C, P)), rng.standard_normal((len(NODES), C))


def _phase(kind: str, settings: ExchangeSettings, grid=None, **kw) -> Phase:
    exchange = _exchange(settings)
    broadcast = (np.eye(C, P), np.zeros(C))
    return Phase(kind, 1, exchange, settings, sent=NODES, grid=grid, head_shape=(C, P), broadcast=broadcast, **kw)


def _clear_site(pid: int, weight: np.ndarray, bias: np.ndarray, count: int, mse: tuple[float, float | None]):
    """A site answering a training message with its head, an evaluation with its errors."""

    def handle(msg: Message) -> Message:
        if msg.metadata.message_type == "train":
            return train_reply(msg, weight, bias, count, pid)
        metrics = {protocol.NUM_EXAMPLES: count, protocol.PARTITION_ID: pid, protocol.TRAIN_MSE: mse[0]}
        if mse[1] is not None:
            metrics.update({protocol.TEST_MSE: mse[1], protocol.NUM_TEST_EXAMPLES: 5})
        return Message(RecordDict({protocol.METRICS: MetricRecord(metrics)}), reply_to=msg)

    return handle


def _sites(counts, mse=lambda pid: (float(pid + 1), None)) -> dict:
    weights, biases = _heads()
    return {n: _clear_site(pid, weights[pid], biases[pid], counts[pid], mse(pid)) for pid, n in enumerate(NODES)}


def _replies(handlers: dict, kind: str, aggregator, phase: Phase | None = None) -> list[Message]:
    """Each site's reply to the phase message of round 1, as the aggregator addresses it (in secure mode: its
    keys, or its masked input when the sum was set up within the previous sum's messages)."""
    config = ConfigRecord({protocol.SERVER_ROUND: 1})
    content = RecordDict({protocol.HEAD: protocol.head_record(np.eye(C, P), np.zeros(C)), protocol.CONFIG: config})
    phase = phase or _phase(kind, _settings())
    messages = aggregator.address(phase, [instruction(n, kind, content) for n in reversed(NODES)])
    return [handlers[int(m.metadata.dst_node_id)](m) for m in messages]


# ------------------------------------------------------------------ clear mode
def test_clear_heads_are_the_count_weighted_average_in_partition_order(task_identity):
    settings = _settings()
    phase = _phase("train", settings)
    counts = [int(c) for c in phase.exchange.moments.counts]
    weights, biases = _heads()
    summed = ClearAggregator().aggregate_train(phase, _replies(_sites(counts), "train", ClearAggregator()))
    n = np.asarray(counts, dtype=np.float64)
    np.testing.assert_allclose(summed.weight, np.einsum("m,mcp->cp", n, weights) / n.sum(), rtol=0, atol=1e-15)
    np.testing.assert_allclose(summed.bias, n @ biases / n.sum(), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(summed.kept.heads, weights)  # partition order, whatever the reply order
    np.testing.assert_array_equal(summed.shares, n)
    assert summed.present == [0, 1, 2, 3] and list(summed.dropped) == [] and summed.extra == {}
    assert summed.fit is not None and summed.fit.trained_gaps == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert summed.gram_errors is not None and len(summed.gram_errors) == 4 and summed.clipped_updates == 0


class _Refuse57:
    """A variant's checks: node 57's head is refused; the measurement counts the heads it saw."""

    def check_reply(self, msg: Message, weight: np.ndarray) -> None:
        if protocol.node_of(msg) == 57:
            raise agg.ReplyError(57, "refused by the variant")

    def verify_replies(self, msgs, heads) -> dict[str, float]:
        return {"heads_seen": float(len(heads))}


def test_clear_heads_of_the_sites_a_variant_refuses_leave_the_average(task_identity):
    settings = _settings(required=3)
    phase = _phase("train", settings, checks=_Refuse57())
    counts = [int(c) for c in phase.exchange.moments.counts]
    weights, _ = _heads()
    summed = ClearAggregator().aggregate_train(phase, _replies(_sites(counts), "train", ClearAggregator()))
    keep = [0, 2, 3]  # node 57 is partition 1
    n = np.asarray(counts, dtype=np.float64)[keep]
    np.testing.assert_allclose(summed.weight, np.einsum("m,mcp->cp", n, weights[keep]) / n.sum(), atol=1e-15)
    assert [d.node for d in summed.dropped] == [57] and "refused by the variant" in summed.dropped[0].reason
    assert summed.present == keep and summed.extra == {"heads_seen": 3.0}


def test_clear_errors_are_weighted_by_the_counts(task_identity):
    settings = _settings()
    phase = _phase("evaluate", settings)
    counts = [int(c) for c in phase.exchange.moments.counts]
    n = np.asarray(counts, dtype=np.float64)
    mse = ClearAggregator().aggregate_evaluate(phase, _replies(_sites(counts), "evaluate", ClearAggregator()))
    assert mse.train == pytest.approx(float(n @ [1, 2, 3, 4] / n.sum()), rel=1e-15) and mse.test is None
    both = _sites(counts, mse=lambda pid: (1.0, 0.5 * pid))
    mse = ClearAggregator().aggregate_evaluate(phase, _replies(both, "evaluate", ClearAggregator()))
    assert mse.test == pytest.approx(0.75, rel=1e-15)  # 5 test rows each: the plain mean of 0, 0.5, 1, 1.5


def test_clear_phases_name_no_sum_and_account_no_privacy(task_identity):
    messages = [instruction(NODES[0], "train", RecordDict({protocol.CONFIG: ConfigRecord({protocol.SERVER_ROUND: 2})}))]
    phase = _phase("train", _settings())
    assert ClearAggregator().address(phase, messages) is messages and ClearAggregator().privacy_spent() == {}


# ------------------------------------------------------------------ secure mode
def test_secure_heads_and_errors_are_the_clear_sums(task_identity):
    settings = _settings()
    phase = _phase("train", settings)
    counts = [int(c) for c in phase.exchange.moments.counts]
    handlers = behind_secure_mod(_sites(counts))
    secure = SecureAggregator(SumSetup(ROSTER))
    grid = FakeGrid(handlers)
    train = Phase("train", 1, phase.exchange, settings, sent=NODES, grid=grid, head_shape=(C, P))
    summed = secure.aggregate_train(train, _replies(handlers, "train", secure, train))
    clear = ClearAggregator().aggregate_train(phase, _replies(_sites(counts), "train", ClearAggregator()))
    np.testing.assert_allclose(summed.weight, clear.weight, rtol=0, atol=1e-14)
    np.testing.assert_allclose(summed.bias, clear.bias, rtol=0, atol=1e-14)
    assert summed.kept.heads.shape == (0, C, P) and summed.fit is None and summed.gram_errors is None
    # trained_gap 0.01 (pid + 1): only partition 0 reports its local optimum (gap <= 1e-2)
    assert summed.extra == {SITES_AT_OPTIMUM: 1.0, SITES_SUMMED: 4.0}
    evaluate = Phase("evaluate", 1, phase.exchange, settings, sent=NODES, grid=grid)
    mse = secure.aggregate_evaluate(evaluate, _replies(handlers, "evaluate", secure, evaluate))
    n = np.asarray(counts, dtype=np.float64)
    assert mse.train == pytest.approx(float(n @ [1, 2, 3, 4] / n.sum()), rel=1e-14) and mse.test is None


def _steps(grid: FakeGrid) -> list[str]:
    """The secure steps the grid carried, one per message phase (its messages' ``secure-step``, or the phase)."""
    steps = []
    for m in grid.sent:
        cfg = m.content.config_records.get(protocol.CONFIG, ConfigRecord())
        steps.append(str(cfg.get(sr.STEP, m.metadata.message_type)))
    return [s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s]


def test_a_sum_set_up_within_the_previous_sums_messages_takes_two_message_phases(task_identity):
    settings = _settings()
    phase = _phase("train", settings)
    counts = [int(c) for c in phase.exchange.moments.counts]
    handlers = behind_secure_mod(_sites(counts))
    secure, grid = SecureAggregator(SumSetup(ROSTER)), FakeGrid(handlers)
    train = Phase("train", 1, phase.exchange, settings, sent=NODES, grid=grid, head_shape=(C, P), next_sum="evaluate-1")
    first = _replies(handlers, "train", secure, train)
    assert all(sr.NEXT in r.content.config_records for r in first)  # each site's keys for the next sum
    summed = secure.aggregate_train(train, first)
    assert _steps(grid) == [sr.SHARE_KEYS, sr.MASK, sr.REVEAL]  # the first sum: its own key messages
    prepared = secure.setup.pipeline.prepared
    assert prepared is not None and prepared.sum_id == secure.setup.sum_id("evaluate-1")
    assert sorted(prepared.routed) == sorted(NODES)
    grid.sent.clear()
    evaluate = Phase("evaluate", 1, phase.exchange, settings, sent=NODES, grid=grid)
    replies = _replies(handlers, "evaluate", secure, evaluate)
    assert all(sr.SECURE in r.content.array_records for r in replies)  # the phase reply is the masked input
    mse = secure.aggregate_evaluate(evaluate, replies)
    assert _steps(grid) == [sr.REVEAL]  # with the phase message: two message phases
    n = np.asarray(counts, dtype=np.float64)
    assert mse.train == pytest.approx(float(n @ [1, 2, 3, 4] / n.sum()), rel=1e-14) and not mse.dropped
    clear = ClearAggregator().aggregate_train(phase, _replies(_sites(counts), "train", ClearAggregator()))
    np.testing.assert_allclose(summed.weight, clear.weight, rtol=0, atol=1e-14)
    assert secure.setup.pipeline.prepared is None  # the last sum sets nothing up


def test_secure_phases_name_their_sum_and_the_next_and_account_no_privacy(task_identity):
    secure = SecureAggregator(SumSetup(ROSTER))
    phase = dataclasses.replace(_phase("evaluate", _settings()), server_round=3, next_sum="train-4")
    content = RecordDict({protocol.CONFIG: ConfigRecord({protocol.SERVER_ROUND: 3})})
    (msg,) = secure.address(phase, [instruction(NODES[0], "evaluate", content)])
    config = msg.content.config_records[protocol.CONFIG]
    assert config[sr.SUM_ID] == f"{secure.setup.tag}/evaluate-3" and secure.privacy_spent() == {}
    assert config[sr.NEXT_SUM] == f"{secure.setup.tag}/train-4" and sr.SECURE not in msg.content.config_records
    assert sr.SUM_ID not in content.config_records[protocol.CONFIG]  # the phase's own content is not changed
    other = SecureAggregator(SumSetup(ROSTER)).setup.sum_id("evaluate-3")
    assert other != config[sr.SUM_ID]  # every strategy's sums have ids of their own


def test_the_secure_exchange_pools_the_summed_moments_and_takes_the_sites_votes(task_identity):
    settings = _settings()
    rows = screen_sites(settings, FakeGrid(behind_secure_mod(_moment_sites())), NODES, SumSetup(ROSTER))
    assert [r.node for r in rows.rows] == NODES and (rows.dim, rows.features) == (C, 0) and not rows.assigned
    moments = ufm.TargetMoments.from_targets(_targets())
    total = sum(sr.moment_vector(n, m, s) for n, m, s in zip(moments.counts, moments.means, moments.covs))
    pooled = standardize(SecureSum(total, tuple(NODES), ()), rows, settings)
    assert pooled.count == sum(moments.counts)
    np.testing.assert_allclose(pooled.cov, moments.sigma_cen, rtol=0, atol=1e-13)
    exchange = pooled_exchange(pooled, settings)
    np.testing.assert_allclose(exchange.targets.g_cen, ufm.optimal_gram(pooled.cov, LH, LW), rtol=0, atol=0)
    assert exchange.diagnosis.fully_active and exchange.partition_ids == (0, 1, 2, 3)
    one_fails = [*pooled.sites[:3], _vote(pooled.sites[3], 0)]
    refused = pooled_exchange(dataclasses.replace(pooled, sites=one_fails), settings)
    assert not refused.diagnosis.fully_active and not refused.targets.fully_active


def _moment_sites(odd: bool = False) -> dict:
    """Sites answering the exchange's query with their moments (``odd``: partition 3 has three targets)."""
    ys = _targets()
    if odd:
        ys[3] = _targets(dim=3)[3]
    return {n: (lambda msg, y=y, pid=pid: query_reply(msg, y, pid)) for pid, (n, y) in enumerate(zip(NODES, ys))}


def _vote(site, passed: int):
    return dataclasses.replace(site, metrics={**site.metrics, sr.FULLY_ACTIVE: passed})


def test_a_site_of_another_shape_leaves_the_secure_exchange(task_identity):
    rows = screen_sites(
        _settings(required=3), FakeGrid(behind_secure_mod(_moment_sites(odd=True))), NODES, SumSetup(ROSTER)
    )
    assert [r.node for r in rows.rows] == [101, 57, 33] and [d.node for d in rows.dropped] == [12]
    assert rows.dropped[0].reason == "reports 3 targets and 0 inputs, the run has (2, 0)"


# ------------------------------------------------------------------ differential privacy, by wrapping
class _Sums(SecureAggregator):
    """Secure sums known in advance: a noised (not PSD) pooled covariance, a head and its errors."""

    def __init__(self, pooled: PooledExchange, heads: HeadSum):
        super().__init__(SumSetup(ROSTER, 3))
        self.pooled, self.heads = pooled, heads

    def pool(self, settings, grid, node_ids) -> PooledExchange:
        return self.pooled

    def aggregate_train(self, phase, replies) -> HeadSum:
        return self.heads

    def aggregate_evaluate(self, phase, replies) -> MseSum:
        return MseSum(0.5, None, ())


def test_differential_privacy_makes_the_covariances_psd_and_accounts_each_release(task_identity):
    cov = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1, as a noised sum may give
    sites = [_vote(s, 1) for s in _site_rows()]
    pooled = PooledExchange(50.0, np.zeros(2), cov, np.eye(2), sites, [], False)
    heads = HeadSum(np.ones((C, P)), np.ones(C), TrainReplies.none((C, P)), np.zeros(0), (), [], {})
    dp = DifferentialPrivacy(_Sums(pooled, heads), noise_multiplier=0.7, sites=4, delta=1e-5)
    assert dp.privacy_spent() == {}
    exchange = dp.exchange(_settings(), FakeGrid({}), NODES)
    psd = sr.nearest_psd(cov)
    np.testing.assert_array_equal(exchange.moments.sigma_cen, psd)
    assert np.linalg.eigvalsh(psd).min() > -1e-12
    np.testing.assert_array_equal(exchange.targets.g_cen, ufm.optimal_gram(psd, LH, LW))
    assert dp.privacy_spent() == {"dp_releases": 1.0, "dp_epsilon": privacy_spent(0.7, 1, 4, 1e-5).epsilon}
    phase = Phase("train", 1, exchange, _settings())
    assert dp.aggregate_train(phase, []) is heads and dp.aggregate_evaluate(phase, []).train == 0.5
    spent = dp.privacy_spent()
    assert spent == {"dp_releases": 3.0, "dp_epsilon": privacy_spent(0.7, 3, 4, 1e-5).epsilon}
    content = RecordDict({protocol.CONFIG: ConfigRecord({protocol.SERVER_ROUND: 1})})
    (msg,) = dp.address(phase, [Message(content=content, dst_node_id=NODES[0], message_type="train")])
    assert msg.content.config_records[protocol.CONFIG][sr.SUM_ID] == dp.inner.setup.sum_id("train-1")


def _site_rows():
    return screen_sites(_settings(), FakeGrid(behind_secure_mod(_moment_sites())), NODES, SumSetup(ROSTER)).rows


def test_the_privacy_mode_picks_the_aggregator_once():
    assert type(make_aggregator(PrivacyPolicy(), 4)) is ClearAggregator
    secure = make_aggregator(PrivacyPolicy(mode="secure", threshold=3), 4, ROSTER)
    assert type(secure) is SecureAggregator and secure.setup.threshold == 3 and secure.setup.roster is ROSTER
    with pytest.raises(ConfigError, match="privacy.mode=secure needs the federation's roster"):
        make_aggregator(PrivacyPolicy(mode="secure"), 4)
    dp = make_aggregator(PrivacyPolicy(mode="secure", dp_noise=0.5, dp_max_rows=100, dp_delta=1e-6), 4, ROSTER)
    assert isinstance(dp, DifferentialPrivacy) and type(dp.inner) is SecureAggregator
    assert (dp.noise_multiplier, dp.sites, dp.delta) == (0.5, 4, 1e-6)
    strategy = HeadAveraging(lambda_h=LH, lambda_w=LW, min_nodes=4, privacy=SECURE, roster=ROSTER)
    assert type(strategy.aggregator) is SecureAggregator


def test_private_heads_are_no_release_of_their_own(task_identity):
    """A head sum of DP-SGD outputs (un-noised, charged with the training) counts no release, an evaluation one;
    the aggregator is told so only under the row unit."""
    sites = [_vote(s, 1) for s in _site_rows()]
    pooled = PooledExchange(50.0, np.zeros(2), np.eye(2), np.eye(2), sites, [], False)
    heads = HeadSum(np.ones((C, P)), np.ones(C), TrainReplies.none((C, P)), np.zeros(0), (), [], {})
    counted = []
    for private_heads in (True, False):
        dp = DifferentialPrivacy(
            _Sums(pooled, heads), noise_multiplier=0.7, sites=4, delta=1e-5, row_level=True, private_heads=private_heads
        )
        phase = Phase("train", 1, dp.exchange(_settings(), FakeGrid({}), NODES), _settings())
        assert dp.aggregate_train(phase, []) is heads
        counted.append(dp.releases)
        dp.aggregate_evaluate(phase, [])
        counted.append(dp.releases)
    assert counted == [1, 2, 2, 3]  # the exchange, (the head,) the evaluation
    row = PrivacyPolicy(mode="secure", dp_noise=0.5, dp_max_rows=100, dp_unit="row")
    site = PrivacyPolicy(mode="secure", dp_noise=0.5, dp_max_rows=100)
    made = [make_aggregator(p, 4, ROSTER, private_heads=True) for p in (row, site)]
    assert [isinstance(a, DifferentialPrivacy) and a.private_heads for a in made] == [True, False]
