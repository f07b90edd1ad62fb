"""Strategies and the moment exchange, tested with hand-made Message replies (no Ray)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from app_helpers import FakeGrid, NumpyClient, Recorder, captured_strategies_log, instruction, query_reply, train_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, Strategy

from fedhead import ufm
from fedhead.analysis.metrics import selection_distance
from fedhead.federation import aggregation as agg
from fedhead.federation import protocol, tracking
from fedhead.strategies import (
    AlignedHeadAveraging,
    FederationError,
    FullModelAveraging,
    HeadAveraging,
    make_strategy,
)
from fedhead.strategies.exchange import query_messages

LH = LW = 0.1
NODES = [101, 57, 33]  # node ids deliberately not in partition order


def _strategy(cls=HeadAveraging, **kw):
    kw.setdefault("lambda_h", LH)
    kw.setdefault("lambda_w", LW)
    kw.setdefault("min_nodes", 3)
    return cls(**kw)


def _exchange(strategy, targets):
    replies = [query_reply(instruction(n, "query"), y, pid) for pid, (n, y) in enumerate(zip(NODES, targets))]
    return strategy.aggregate_moments(reversed(replies))


def test_moment_exchange_from_hand_made_replies(task_identity, fig2_targets):
    strategy = _strategy(gamma=1.0)
    ex = _exchange(strategy, fig2_targets)
    ref = ufm.TargetMoments.from_targets(fig2_targets)
    assert ex.partition_ids == (0, 1, 2) and ex.node_ids == tuple(NODES)
    np.testing.assert_allclose(ex.moments.sigma_cen, ref.sigma_cen, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ex.moments.weights, ref.weights, rtol=0, atol=1e-15)
    gap = ufm.gap_decomposition(ref, LH, LW)
    np.testing.assert_allclose(ex.targets.g_star, gap.g_star, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ex.targets.g_cen, gap.g_cen, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ex.targets.client_grams[0], gap.g_cen, rtol=0, atol=1e-12)  # corrected
    assert ex.diagnosis.fully_active


def test_query_messages_are_query_type(task_identity):
    msgs = query_messages([5, 6], {protocol.JOB: 1})
    assert [m.metadata.message_type for m in msgs] == ["query", "query"]
    assert [m.metadata.dst_node_id for m in msgs] == [5, 6]
    assert all(m.content.config_records[protocol.CONFIG][protocol.JOB] == 1 for m in msgs)


def test_exchange_rejects_errors_missing_and_bad_replies(task_identity, fig2_targets):
    strategy = _strategy()
    good = [query_reply(instruction(n, "query"), y, pid) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))]
    err = Message(Error(code=0, reason="disk full"), reply_to=instruction(57, "query"))
    with pytest.raises(FederationError, match="node 57: disk full"):
        strategy.aggregate_moments([good[0], err, good[2]])
    with pytest.raises(FederationError, match="expected 3 replies, received 2"):
        strategy.aggregate_moments(good[:2])
    bad = query_reply(instruction(33, "query"), fig2_targets[2], 2, count=0)
    with pytest.raises(agg.ReplyError, match="node 33 .*positive integer"):
        strategy.aggregate_moments([good[0], good[1], bad])
    dup = query_reply(instruction(33, "query"), fig2_targets[2], 1)
    # two nodes claiming one partition: neither is used (the server cannot tell which is honest)
    with pytest.raises(
        FederationError, match=r"node 33 \(partition 1\): partition 1 is also claimed by node\(s\) \[57\]"
    ):
        strategy.aggregate_moments([good[0], good[1], dup])


def _train_round(strategy, heads, counts, nodes=NODES, **records):
    replies = []
    for pid, (n, w) in enumerate(zip(nodes, heads)):
        extra = {k: v[pid] for k, v in records.items()}
        replies.append(train_reply(instruction(n, "train"), w, np.full(w.shape[0], pid), counts[pid], pid, **extra))
    return strategy.aggregate_train(1, replies)


def test_head_averaging_aggregates_hand_made_replies(task_identity, fig2_targets):
    obs = Recorder()
    strategy = _strategy(observer=obs, evaluate_mse=False)
    ex = _exchange(strategy, fig2_targets)
    w0 = np.random.default_rng(0).standard_normal((2, 4))
    strategy.begin((w0, np.zeros(2)))
    grid = FakeGrid({n: None for n in NODES})
    msgs = list(strategy.configure_train(1, protocol.head_record(w0, np.zeros(2)), ConfigRecord(), grid))
    assert sorted(m.metadata.dst_node_id for m in msgs) == sorted(NODES)
    assert all(m.metadata.message_type == "train" for m in msgs)
    assert protocol.SIGMA_CEN not in msgs[0].content.array_records  # uncorrected: no Sigma_cen sent
    assert int(msgs[0].content.config_records[protocol.CONFIG][protocol.SERVER_ROUND]) == 1
    heads = np.random.default_rng(1).standard_normal((3, 2, 4))
    counts = [int(c) for c in ex.moments.counts]
    arrays, metrics = _train_round(strategy, heads, counts)
    w, b = protocol.read_head(arrays)
    p = np.asarray(counts) / sum(counts)
    np.testing.assert_allclose(w, np.einsum("m,mcp->cp", p, heads), rtol=0, atol=1e-14)
    np.testing.assert_allclose(b, p @ np.array([[0, 0], [1, 1], [2, 2]]), rtol=0, atol=1e-14)
    rec = obs.records[-1]
    assert rec.round == 1 and rec.objective_gaps == pytest.approx([0.01, 0.02, 0.03])
    assert rec.delta == pytest.approx(
        selection_distance(heads, tracking.selected_heads(w0, ex.targets.client_grams), p), rel=1e-13
    )
    assert metrics["e_f_star"] == pytest.approx(rec.e_f_star)


def test_training_replies_are_validated(task_identity, fig2_targets):
    strategy = _strategy(evaluate_mse=False)
    ex = _exchange(strategy, fig2_targets)
    w0 = np.eye(2, 4)
    strategy.begin((w0, np.zeros(2)))
    strategy._broadcast = (w0, np.zeros(2))
    counts = [int(c) for c in ex.moments.counts]
    heads = np.stack([w0] * 3)
    bad = heads.copy()
    bad[1, 0, 0] = np.nan
    with pytest.raises(agg.ReplyError, match="node 57.*non-finite"):
        _train_round(strategy, bad, counts)
    with pytest.raises(agg.ReplyError, match="node 33.*shape"):
        _train_round(strategy, [w0, w0, np.eye(2, 5)], counts)
    with pytest.raises(agg.ReplyError, match="node 101.*reported 7 samples"):
        _train_round(strategy, heads, [7] + counts[1:])
    with pytest.raises(FederationError, match="node 57 .*reports partition 0, but it is partition 1 of this run"):
        replies = [train_reply(instruction(n, "train"), w0, np.zeros(2), counts[0], 0) for n in NODES]
        strategy.aggregate_train(1, replies)


def test_full_loop_with_exact_clients_follows_recursion(task_identity, fig2_targets):
    """HeadAveraging.run over an in-process grid of closed-form clients (theory.md §6)."""
    obs = Recorder()
    clients = {n: NumpyClient(y, pid, LH, LW) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    strategy = _strategy(observer=obs)
    w0 = ufm.psd_sqrt(np.array([[2.5, 0.3], [0.3, 0.09 + 0.05]]))
    strategy.run(FakeGrid(clients), (w0, np.zeros(2)), num_rounds=6)
    assert len(obs.exchanges) == 1
    rounds = [r.round for r in obs.records]
    assert rounds == [0, 1, 2, 3, 4, 5, 6]  # round 0 + each round once its MSE is in
    ex = obs.exchanges[0]
    recursion = ufm.gram_recursion(w0 @ w0.T, ex.targets.client_grams, ex.targets.weights, 6)
    for rec in obs.records[1:]:
        np.testing.assert_allclose(rec.gram, recursion[rec.round], rtol=0, atol=1e-10)
        assert rec.delta < 1e-12 and rec.trajectory_error < 1e-10
        np.testing.assert_allclose(rec.bias, ex.moments.mean_global, rtol=0, atol=1e-13)
        expected_mse = float(np.dot(ex.moments.weights, [1.0, 2.0, 3.0]))
        assert rec.train_mse == pytest.approx(expected_mse, rel=1e-14) and rec.test_mse is None
    assert obs.records[-1].e_f_star < obs.records[1].e_f_star


def test_only_the_last_round_s_evaluate_says_final_round(task_identity, fig2_targets):
    """The flag on which each client saves its final model (clients/export.py), one record per round."""
    clients = {n: NumpyClient(y, pid, LH, LW) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    grid = FakeGrid(clients)
    _strategy().run(grid, (np.eye(2), np.zeros(2)), num_rounds=3)
    flags = [
        (
            m.content.config_records[protocol.CONFIG][protocol.SERVER_ROUND],
            m.content.config_records[protocol.CONFIG].get(protocol.FINAL_ROUND),
        )
        for m in grid.sent
        if m.metadata.message_type == "evaluate"
    ]
    assert flags == [(1, None)] * 3 + [(2, None)] * 3 + [(3, True)] * 3


def test_corrected_clients_receive_sigma_cen_and_reach_g_cen(task_identity, fig2_targets):
    obs = Recorder()
    clients = {n: NumpyClient(y, pid, LH, LW, gamma=1.0) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    strategy = _strategy(observer=obs, gamma=1.0)
    w0 = np.array([[1.0, 0.2, 0.0], [0.0, 0.5, 0.3]])
    strategy.run(FakeGrid(clients), (w0, np.zeros(2)), num_rounds=2)
    ref = ufm.TargetMoments.from_targets(fig2_targets)
    for c in clients.values():
        assert len(c.seen_sigma_cen) == 2
        np.testing.assert_allclose(c.seen_sigma_cen[0], ref.sigma_cen, rtol=0, atol=1e-12)
    assert obs.records[1].e_f_cen < 1e-12 and obs.records[2].e_f_reference < 1e-12


def test_diagnose_only_stops_after_the_exchange(task_identity, fig2_targets):
    obs = Recorder()
    clients = {n: NumpyClient(y, pid, LH, LW) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    grid = FakeGrid(clients)
    assert _strategy(observer=obs).run(grid, (np.eye(2), np.zeros(2)), 3, diagnose_only=True) is None
    assert len(obs.exchanges) == 1 and obs.records == []
    assert {m.metadata.message_type for m in grid.sent} == {"query"}


def test_training_outside_regime_fails_after_reporting(task_identity, fig2_targets):
    obs = Recorder()
    clients = {n: NumpyClient(y, pid, 1.0, 0.5) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    grid = FakeGrid(clients)
    with pytest.raises(ufm.NotFullyActiveError, match=r"worst: client 0.*allow_outside_regime=true"):
        _strategy(observer=obs, lambda_h=1.0, lambda_w=0.5).run(grid, (np.eye(2), np.zeros(2)), 2)
    assert len(obs.exchanges) == 1 and not obs.exchanges[0].diagnosis.fully_active
    assert obs.records == [] and {m.metadata.message_type for m in grid.sent} == {"query"}


def test_training_outside_regime_with_the_override(task_identity, fig2_targets, caplog):
    """lH lW = 0.5 > lambda_min(Sigma_0) = 0.11: client 0's optimal Gram is the clipped phi
    (rank 1); with the override the exact rule still runs and G_star-based numbers are null."""
    obs = Recorder()
    clients = {n: NumpyClient(y, pid, 1.0, 0.5) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    strategy = _strategy(observer=obs, lambda_h=1.0, lambda_w=0.5, allow_outside_regime=True)
    with caplog.at_level(logging.WARNING, logger="fedhead.strategies"), captured_strategies_log(caplog):
        strategy.run(FakeGrid(clients), (np.eye(2), np.zeros(2)), 2)
    assert any("client 0" in r.getMessage() and "fully active regime" in r.getMessage() for r in caplog.records)
    tg = obs.exchanges[0].targets
    assert tg.g_star is None and not tg.fully_active
    np.testing.assert_allclose(tg.g_cen, ufm.optimal_gram(obs.exchanges[0].moments.sigma_cen, 1.0, 0.5), atol=1e-14)
    assert np.linalg.matrix_rank(tg.grams[0], tol=1e-10) == 1
    rounds = [r for r in obs.records if r.train_mse is not None]
    assert [r.round for r in rounds] == [1, 2]
    for r in rounds:
        assert r.e_f_star is None and r.recursion_gram is None and r.delta is None
        assert r.predicted_gram is None and r.trajectory_error is None
        assert np.isfinite(r.e_f_cen) and r.objective_gaps is not None
        np.testing.assert_allclose(r.gram, r.gram.T, atol=0)


def test_aligned_strategy_verifies_the_gram(task_identity, fig2_targets):
    strategy = _strategy(AlignedHeadAveraging, evaluate_mse=False)
    ex = _exchange(strategy, fig2_targets)
    counts = [int(c) for c in ex.moments.counts]
    w0 = np.eye(2, 3)
    strategy.begin((w0, np.zeros(2)))
    strategy._broadcast = (w0, np.zeros(2))
    rng = np.random.default_rng(2)
    trained = rng.standard_normal((3, 2, 3))
    q = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    aligned = trained @ q  # a rotation keeps the Gram
    checks = [ArrayRecord({"trained_gram": Array(t @ t.T)}) for t in trained]
    _, metrics = _train_round(strategy, aligned, counts, checks=checks)
    assert metrics["alignment_gram_error"] < 1e-13
    tampered = aligned.copy()
    tampered[2] *= 1.1
    with pytest.raises(agg.ReplyError, match="node 33.*changed the trained Gram"):
        _train_round(strategy, tampered, counts, checks=checks)
    with pytest.raises(agg.ReplyError, match="lacks the 'checks'"):
        _train_round(strategy, aligned, counts)


def test_full_model_strategy_averages_backbones_not_batchnorm(task_identity, fig2_targets):
    init = {"fc.weight": np.zeros((2, 2), np.float32), "bn.running_var": np.ones(2, np.float32)}
    strategy = _strategy(FullModelAveraging, evaluate_mse=False, initial_backbone=init)
    ex = _exchange(strategy, fig2_targets)
    counts = [int(c) for c in ex.moments.counts]
    w0 = np.eye(2, 3)
    strategy.begin((w0, np.zeros(2)))
    grid = FakeGrid({n: None for n in NODES})
    first = list(strategy.configure_train(1, protocol.head_record(w0, np.zeros(2)), ConfigRecord(), grid))
    sent = first[0].content.array_records[protocol.BACKBONE]
    assert list(sent.keys()) == ["fc.weight"]  # BatchNorm statistics never broadcast
    states = [
        ArrayRecord(
            {
                "fc.weight": Array(np.full((2, 2), float(pid), np.float32)),
                "bn.running_var": Array(np.full(2, 100.0 + pid, np.float32)),
            }
        )
        for pid in range(3)
    ]
    arrays, _ = _train_round(strategy, np.stack([w0] * 3), counts, backbone=states)
    msgs = list(strategy.configure_train(2, arrays, ConfigRecord(), grid))
    avg = msgs[0].content.array_records[protocol.BACKBONE]
    p = np.asarray(counts) / sum(counts)
    np.testing.assert_allclose(avg["fc.weight"].numpy(), np.full((2, 2), p @ [0.0, 1.0, 2.0]), rtol=1e-6)
    assert avg["fc.weight"].numpy().dtype == np.float32 and "bn.running_var" not in avg


def test_head_averaging_is_a_strategy_whose_exchange_reads_frozen_settings(task_identity, fig2_targets):
    """flwr's Strategy implemented directly (no FedAvg code), and one ExchangeSettings built once."""
    strategy = _strategy(gamma=1.0, centered=True, min_clients=2, message_config={protocol.JOB: 4})
    assert isinstance(strategy, Strategy) and not isinstance(strategy, FedAvg)
    st = strategy.settings
    assert (st.lambda_h, st.gamma, st.centered, st.num_clients, st.required) == (LH, 1.0, True, 3, 2)
    assert strategy.gamma == 1.0 and strategy.centered
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.gamma = 0.0
    with pytest.raises(TypeError):
        st.message_config[protocol.JOB] = 5
    clients = {n: NumpyClient(y, pid, LH, LW) for pid, (n, y) in enumerate(zip(NODES, fig2_targets))}
    grid = FakeGrid(clients)
    strategy.run(grid, (np.eye(2), np.zeros(2)), 1, diagnose_only=True)
    assert [m.content.config_records[protocol.CONFIG][protocol.JOB] for m in grid.sent] == [4, 4, 4]


def test_make_strategy_kinds():
    assert type(make_strategy("aligned", lambda_h=1, lambda_w=1, min_nodes=2)) is AlignedHeadAveraging
    with pytest.raises(ValueError, match="unknown strategy kind"):
        make_strategy("nope", lambda_h=1, lambda_w=1, min_nodes=2)


def test_evaluation_replies_are_validated(task_identity, fig2_targets):
    """A NaN MSE or a bad count stops the run and names the client (no corrupted record)."""
    strategy = _strategy()
    _exchange(strategy, fig2_targets)
    strategy.begin((np.eye(2), np.zeros(2)))

    def replies(bad_node, **bad):
        out = []
        for pid, (n, y) in enumerate(zip(NODES, fig2_targets)):
            metrics = {protocol.NUM_EXAMPLES: y.shape[0], protocol.PARTITION_ID: pid, "train_mse": 1.0}
            if n == bad_node:
                metrics.update(bad)
            out.append(
                Message(RecordDict({protocol.METRICS: MetricRecord(metrics)}), reply_to=instruction(n, "evaluate"))
            )
        return out

    with pytest.raises(agg.ReplyError, match="node 57.*train_mse has 1 non-finite"):
        strategy.aggregate_evaluate(0, replies(57, train_mse=float("nan")))
    with pytest.raises(agg.ReplyError, match="node 33.*positive integer"):
        strategy.aggregate_evaluate(0, replies(33, **{protocol.NUM_EXAMPLES: 0}))
    assert strategy.rounds.tracker.records[0].train_mse is None
    out = strategy.aggregate_evaluate(0, replies(None))
    assert out["train_mse"] == pytest.approx(1.0, abs=1e-15)
