"""The failure policy and the deadlines, with hand-made replies over an in-process grid (no Ray).

Every fault of one client (NaN, Inf, wrong shape, a missing record, a raising client, a client
that never answers) either drops that client (``min_clients`` survivors: the round continues
with renormalised weights and records who was dropped and why) or stops the run with one
error naming the node; every wait ends (short deadlines here).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from app_helpers import FakeGrid, NumpyClient, Recorder
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedhead import ufm
from fedhead.federation import protocol
from fedhead.federation.deploy_checks import FederationMismatch
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.federation.watchdog import EngineDied, EngineWatch
from fedhead.settings.limits import FailurePolicy, Timeouts
from fedhead.strategies import FederationError, HeadAveraging
from fedhead.strategies.failures import TooFewReplies

LH = LW = 0.1
NODES = [101, 57, 33]
FAST = Timeouts(nodes=0.5, exchange=0.5, round=0.5)


# one client's faults, applied to the reply of its NumpyClient
def nan_head(reply):
    w, _ = protocol.read_head(reply.content.array_records[protocol.HEAD])
    w = w.copy()
    w[0, 0] = np.nan
    return w


def inf_head(reply):
    w, _ = protocol.read_head(reply.content.array_records[protocol.HEAD])
    w = w.copy()
    w[1, 1] = np.inf
    return w


def wrong_shape(reply):
    w, _ = protocol.read_head(reply.content.array_records[protocol.HEAD])
    return np.zeros((w.shape[0], w.shape[1] + 1))


class Faulty:
    """A NumpyClient whose reply to ``kind`` messages is broken by ``fault``."""

    def __init__(self, client, kind: str, fault: str):
        self.client, self.kind, self.fault = client, kind, fault

    def __call__(self, msg: Message):
        if msg.metadata.message_type != self.kind:
            return self.client(msg)
        if self.fault == "raise":
            raise RuntimeError("CUDA out of memory on this client")
        if self.fault == "silent":
            return None
        reply = self.client(msg)
        original = reply.metadata.reply_to_message_id
        if self.fault == "missing_record":
            content = RecordDict({protocol.METRICS: reply.content.metric_records[protocol.METRICS]})
            out = Message(content, reply_to=msg)
        elif self.fault in ("nan", "inf", "shape"):
            w = {"nan": nan_head, "inf": inf_head, "shape": wrong_shape}[self.fault](reply)
            out = Message(_replace_head(reply, w), reply_to=msg)
        elif self.fault == "no_gap":
            metrics = dict(reply.content.metric_records[protocol.METRICS])
            metrics.pop("objective_gap")
            content = reply.content
            content[protocol.METRICS] = MetricRecord(metrics)
            out = Message(content, reply_to=msg)
        elif self.fault in ("nan_cov", "asym_cov", "not_psd", "zero_count"):
            arrays = reply.content.array_records[protocol.MOMENTS]
            mean, cov = arrays[protocol.MEAN].numpy(), arrays[protocol.COV].numpy().copy()
            metrics = dict(reply.content.metric_records[protocol.METRICS])
            if self.fault == "nan_cov":
                cov[0, 0] = np.nan
            elif self.fault == "asym_cov":
                cov[0, 1] += 0.5
            elif self.fault == "not_psd":
                cov = cov - 10 * np.eye(len(cov))
            else:
                metrics[protocol.NUM_EXAMPLES] = 0
            out = Message(
                RecordDict(
                    {
                        protocol.MOMENTS: ArrayRecord({protocol.MEAN: Array(mean), protocol.COV: Array(cov)}),
                        protocol.METRICS: MetricRecord(metrics),
                    }
                ),
                reply_to=msg,
            )
        else:
            raise AssertionError(self.fault)
        assert out.metadata.reply_to_message_id == original
        return out


def _replace_head(reply: Message, w: np.ndarray) -> RecordDict:
    _, b = protocol.read_head(reply.content.array_records[protocol.HEAD])
    content = RecordDict(
        {protocol.HEAD: protocol.head_record(w, b), protocol.METRICS: reply.content.metric_records[protocol.METRICS]}
    )
    return content


def _clients(targets):
    return {n: NumpyClient(y, pid, LH, LW) for pid, (n, y) in enumerate(zip(NODES, targets))}


def _run(handlers, *, min_clients=None, rounds=2, timeouts=FAST, watch=None):
    obs = Recorder()
    strategy = HeadAveraging(
        lambda_h=LH, lambda_w=LW, min_nodes=len(NODES), observer=obs, timeouts=timeouts, min_clients=min_clients
    )
    grid = ProgressGrid(FakeGrid(handlers), show=False, poll=0.005)
    grid.watch = watch
    grid.timeouts = timeouts  # as fedhead.driver.server.serve: the straggler rule
    w0 = np.random.default_rng(0).standard_normal((2, 4))
    strategy.run(grid, (w0, np.zeros(2)), rounds)
    return strategy, obs


TRAIN_FAULTS = ["nan", "inf", "shape", "missing_record", "raise", "silent", "no_gap"]


@pytest.mark.parametrize("fault", TRAIN_FAULTS)
def test_a_faulty_client_is_dropped_and_recorded(task_identity, fig2_targets, fault):
    handlers = _clients(fig2_targets)
    handlers[57] = Faulty(handlers[57], "train", fault)
    t0 = time.perf_counter()
    strategy, obs = _run(handlers, min_clients=2)
    assert time.perf_counter() - t0 < 10
    rounds = [r for r in obs.records if r.round >= 1]
    assert [r.round for r in rounds][-1] == 2
    last = rounds[-1]
    assert [d["node"] for d in last.dropped if d["stage"] == "training"] == [57]
    d = next(d for d in last.dropped if d["stage"] == "training")
    expect = {
        "nan": "non-finite",
        "inf": "non-finite",
        "shape": "shape",
        "missing_record": "lacks",
        "raise": "CUDA out of memory",
        "silent": "no reply within 0.5 s",
        "no_gap": "objective_gap",
    }[fault]
    assert expect in d["reason"], d
    assert d["kind"] == {"raise": "error", "silent": "missing"}.get(fault, "invalid")
    # the head is the count-weighted mean over the two survivors (partitions 0 and 2)
    counts = np.asarray(strategy.exchange.moments.counts)
    p = counts[[0, 2]] / counts[[0, 2]].sum()
    np.testing.assert_allclose(last.bias, p @ np.asarray(strategy.exchange.moments.means)[[0, 2]], atol=1e-12)
    assert len(last.objective_gaps) == 2  # the survivors' gaps, none silently lost
    assert last.to_dict()["dropped"][0]["node"] == 57


@pytest.mark.parametrize("fault", ["nan", "raise", "silent", "missing_record"])
def test_without_enough_survivors_the_run_stops_naming_the_node(task_identity, fig2_targets, fault):
    handlers = _clients(fig2_targets)
    handlers[57] = Faulty(handlers[57], "train", fault)
    t0 = time.perf_counter()
    with pytest.raises(TooFewReplies, match=r"training: .*node 57") as err:
        _run(handlers)  # min_clients = every client
    assert time.perf_counter() - t0 < 10
    assert isinstance(err.value, FederationError)


@pytest.mark.parametrize(
    "fault,reason",
    [
        ("nan_cov", "non-finite"),
        ("asym_cov", "not symmetric"),
        ("not_psd", "not positive semi-definite"),
        ("zero_count", "positive integer"),
        ("raise", "CUDA"),
        ("silent", "no reply"),
    ],
)
def test_moment_exchange_drops_invalid_moments(task_identity, fig2_targets, fault, reason):
    handlers = _clients(fig2_targets)
    handlers[33] = Faulty(handlers[33], "query", fault)
    strategy, obs = _run(handlers, min_clients=2, rounds=1)
    ex = strategy.exchange
    assert ex.partition_ids == (0, 1) and ex.node_ids == (101, 57)
    assert [d.node for d in ex.dropped] == [33] and reason in ex.dropped[0].reason
    ref = ufm.TargetMoments.from_targets(fig2_targets[:2])
    np.testing.assert_allclose(ex.moments.weights, ref.weights, atol=1e-15)  # renormalised
    assert [r.round for r in obs.records] == [0, 1]
    with pytest.raises(TooFewReplies, match=rf"moment exchange: .*node 33.*{reason}"):
        _run(dict(handlers), rounds=1)


def test_nodes_that_never_connect_end_with_one_error(task_identity, fig2_targets):
    handlers = _clients(fig2_targets)
    del handlers[33]
    t0 = time.perf_counter()
    with pytest.raises(FederationMismatch, match=r"after waiting 0.5 s .*2 SuperNodes connected .*num_clients=3"):
        _run(handlers)
    assert time.perf_counter() - t0 < 5


def test_too_many_nodes_is_refused_at_once(task_identity, fig2_targets):
    handlers = _clients(fig2_targets)
    handlers[7] = handlers[33]
    with pytest.raises(FederationMismatch, match="4 SuperNodes connected"):
        _run(handlers, timeouts=Timeouts(nodes=60, exchange=60, round=60))


def test_a_dead_engine_ends_the_wait(task_identity, fig2_targets):
    handlers = {n: (lambda m: None) for n in NODES}  # nobody answers: the engine is gone
    watch = EngineWatch()
    import threading

    threading.Timer(0.2, watch.trip, args=("Ray backend crashed",)).start()
    t0 = time.perf_counter()
    with pytest.raises(EngineDied, match="Ray backend crashed"):
        _run(handlers, timeouts=Timeouts(nodes=60, exchange=60, round=60), watch=watch)
    assert time.perf_counter() - t0 < 5


def test_policy_and_timeouts_are_validated():
    from fedhead.settings.config import ConfigError, compose_config, load_config

    with pytest.raises(ConfigError, match="failure.min_clients"):
        FailurePolicy(min_clients=1)
    with pytest.raises(ConfigError, match="timeouts.round"):
        Timeouts(round=0)
    assert FailurePolicy(None).required(4) == 4 and FailurePolicy(2).required(4) == 2
    cfg = load_config(compose_config(["timeouts.round=5", "failure.min_clients=3"]))
    job = cfg.jobs("/tmp/x")[0]
    assert job.timeouts.round == 5 and job.failure.min_clients == 3
    with pytest.raises(ConfigError, match="exceeds num_clients"):
        load_config(compose_config(["failure.min_clients=9"]))
    with pytest.raises(ConfigError, match="unknown keys"):
        load_config(compose_config(["+timeouts.rounds=5"]))


def test_client_error_reasons_are_condensed_to_the_raised_line():
    from fedhead.strategies.failures import condense_reason

    ray = (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m "
        '(pid=1, ip=1.2.3.4)\n  File "x.py", line 3, in query\n    raise RuntimeError("boom")\n'
        "RuntimeError: client exploded on purpose\n\nThe above exception was the direct cause of the "
        "following exception:\n\nflwr.clientapp.exception.ClientAppException: ClientApp raised\n"
    )
    assert condense_reason(ray) == "RuntimeError: client exploded on purpose"
    assert condense_reason("disk full") == "disk full"


# ------------------------------------------------------------------ the straggler rule
STRAGGLER = Timeouts(nodes=5, exchange=600, round=600, straggler=0.3, straggler_factor=0.0)


def test_the_straggler_rule_drops_a_silent_client_long_before_the_phase_deadline(task_identity, fig2_targets):
    handlers = _clients(fig2_targets)
    handlers[57] = Faulty(handlers[57], "train", "silent")
    t0 = time.perf_counter()
    strategy, obs = _run(handlers, min_clients=2, timeouts=STRAGGLER)
    assert time.perf_counter() - t0 < 10  # not the 600 s of timeouts.round
    last = [r for r in obs.records if r.round >= 1][-1]
    (d,) = [d for d in last.dropped if d["stage"] == "training"]
    assert d["node"] == 57 and d["kind"] == "missing"
    assert "after the other 2 of 3 clients had replied" in d["reason"] and "timeouts.straggler=0.3 s" in d["reason"]
    counts = np.asarray(strategy.exchange.moments.counts)
    p = counts[[0, 2]] / counts[[0, 2]].sum()  # weights renormalised over the survivors
    np.testing.assert_allclose(last.bias, p @ np.asarray(strategy.exchange.moments.means)[[0, 2]], atol=1e-12)


def test_the_straggler_rule_stops_the_run_naming_the_node_when_too_few_remain(task_identity, fig2_targets):
    handlers = _clients(fig2_targets)
    handlers[33] = Faulty(handlers[33], "query", "silent")
    t0 = time.perf_counter()
    with pytest.raises(TooFewReplies, match=r"moment exchange: .*node 33: no reply .*straggler rule") as err:
        _run(handlers, timeouts=STRAGGLER)
    assert time.perf_counter() - t0 < 5
    assert "\n" not in str(err.value)  # one line


def test_the_straggler_rule_waits_for_half_the_clients_and_scales_with_the_phase():
    t = Timeouts(straggler=60, straggler_factor=2)
    assert t.straggler_deadline(4, []) is None
    assert t.straggler_deadline(4, [1.0]) is None  # fewer than half replied: no straggler yet
    assert t.straggler_deadline(4, [1.0, 5.0]) == 5.0 + 60  # short phase: the floor
    assert t.straggler_deadline(4, [1000.0, 1800.0, 1900.0]) == 1900.0 + 3800  # long training: 2 x T
    assert t.straggler_deadline(2, [3.0]) == 63.0
    assert t.straggler_deadline(3, [1.0, 2.0, 3.0]) is None  # everyone replied
    assert Timeouts(straggler=None).straggler_deadline(3, [1.0, 2.0]) is None  # off
    # a simulation of 8 clients on 2 slots: 4 replied after 30.8 s, the other 4 run in 2 more waves
    assert t.straggler_deadline(8, [15.0, 15.0, 30.8, 30.8], concurrency=2) == pytest.approx(30.8 + 2 * 61.6)
    assert t.straggler_deadline(8, [15.0, 15.0, 30.8, 30.8], concurrency=4) == pytest.approx(30.8 + 61.6)
    assert t.straggler_deadline(8, [15.0, 15.0, 30.8, 30.8]) == pytest.approx(30.8 + 61.6)  # a deployment: one wave
    from fedhead.settings.limits import straggler_reason

    line = straggler_reason(t, waited=200.0, latest=30.8, replied=4, n_clients=8, concurrency=2)
    assert line.endswith("x 2 waves of 2 clients at once") and "\n" not in line
    from fedhead.settings.config import ConfigError

    with pytest.raises(ConfigError, match="timeouts.straggler_factor"):
        Timeouts(straggler_factor=-1)
    with pytest.raises(ConfigError, match="timeouts.straggler "):
        Timeouts(straggler=0)


def test_a_late_but_legitimate_client_is_not_a_straggler(task_identity, fig2_targets):
    """Replies that keep coming keep the clock going: a client slower than the others by less
    than the grace is waited for."""
    handlers = _clients(fig2_targets)
    slow = handlers[57]

    class Late:
        def __init__(self):
            self.pending = []

        def __call__(self, msg):
            if msg.metadata.message_type != "train":
                return slow(msg)
            self.pending.append(msg)
            return None

    late = Late()
    handlers[57] = late
    grid = ProgressGrid(FakeGrid(handlers), show=False, poll=0.005)
    grid.timeouts = Timeouts(straggler=1.0, straggler_factor=0.0)
    import threading

    def answer_later():  # the reply arrives 0.4 s after the others, within the 1 s grace
        time.sleep(0.4)
        msg = late.pending.pop()
        grid._grid._replies[msg.metadata.message_id] = slow(msg)

    w0 = np.random.default_rng(0).standard_normal((2, 4))
    msgs = [
        Message(RecordDict({protocol.HEAD: protocol.head_record(w0, np.zeros(2))}), dst_node_id=n, message_type="train")
        for n in NODES
    ]
    threading.Timer(0.0, answer_later).start()
    replies = grid.send_and_receive(msgs, timeout=30)
    assert sorted(m.metadata.src_node_id for m in replies) == sorted(NODES)
    assert not any(m.has_error() for m in replies) and grid.stragglers == []


def test_a_node_without_heartbeat_is_an_error_reply_with_flwrs_reason(task_identity, fig2_targets):
    """flwr's SuperLink answers for a SuperNode whose heartbeats stopped (2 x 30 s) with a
    NODE_UNAVAILABLE error reply; the failure policy drops it like any error, reason kept."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode
    from flwr.server.superlink.linkstate.utils import NODE_UNAVAILABLE_ERROR_REASON

    handlers = _clients(fig2_targets)
    ok = handlers[57]
    handlers[57] = lambda m: (
        Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason=NODE_UNAVAILABLE_ERROR_REASON), reply_to=m)
        if m.metadata.message_type == "train"
        else ok(m)
    )
    _, obs = _run(handlers, min_clients=2, timeouts=STRAGGLER)
    (d,) = [d for d in obs.records[-1].dropped if d["stage"] == "training"]
    assert d["node"] == 57 and d["kind"] == "error" and "Node Unavailable" in d["reason"]
