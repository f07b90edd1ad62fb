"""``HeadAveraging(privacy=PrivacyPolicy(mode="secure"))`` with hand-made replies: closed-form clients
behind fedhead's secure mod. The strategy gets the clear run's pooled moments and heads from sums only,
and what it cannot see it cannot check (a lying site's sum is refused as a whole)."""

from __future__ import annotations

import numpy as np
import pytest
from app_helpers import FakeGrid, Lying, NumpyClient, Recorder, simulated_sites, targets_with_moments, train_lie
from flwr.app import ConfigRecord, Context, RecordDict

from fedhead.clients import SecureSite, secure_mod
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.progress_grid import ProgressGrid
from fedhead.settings.limits import Timeouts
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.strategies import HeadAveraging
from fedhead.strategies.secure import SecureSumFailed

LH = LW = 0.1
NODES = [101, 57, 33, 12]
FAST = Timeouts(nodes=0.5, exchange=2.0, round=2.0)
SECURE = PrivacyPolicy(mode="secure")


def _clients(gamma: float = 1.0) -> dict[int, NumpyClient]:
    rng = np.random.default_rng(4)
    out = {}
    for pid, node in enumerate(NODES):
        a = rng.normal(size=(3, 3))
        y = targets_with_moments(20 + 7 * pid, rng.normal(size=3), a @ a.T + 0.5 * np.eye(3), seed=pid)
        out[node] = NumpyClient(y, pid, LH, LW, gamma=gamma)
    return out


def behind_secure_mod(handlers: dict) -> dict:
    """Each handler behind fedhead's secure mod, with its own node state; the sites sign with the keys of
    [`simulated_sites`][] (the handlers' order is their partitions')."""
    mod = secure_mod(lambda msg, ctx: SecureSite(lambdas=(LH, LW), privacy=SECURE), simulated_sites(len(handlers)))

    def wrap(pid, node, handler):
        ctx = Context(run_id=1, node_id=node, node_config={"partition-id": pid}, state=RecordDict(), run_config={})
        return lambda msg: mod(msg, ctx, lambda m, c: handler(m))

    return {node: wrap(pid, node, h) for pid, (node, h) in enumerate(handlers.items())}


def _run(handlers, privacy=None, rounds=2, fake: FakeGrid | None = None, min_clients: int | None = None):
    obs = Recorder()
    strategy = HeadAveraging(
        lambda_h=LH,
        lambda_w=LW,
        min_nodes=len(NODES),
        min_clients=min_clients,
        gamma=1.0,
        observer=obs,
        timeouts=FAST,
        privacy=privacy,
        roster=simulated_sites(len(NODES)).roster,
    )
    grid = ProgressGrid(fake or FakeGrid(handlers), show=False, poll=0.005)
    grid.timeouts = FAST
    strategy.run(grid, (np.eye(3, 5), np.zeros(3)), rounds)
    return strategy, obs


def _phases(grid: FakeGrid) -> list[str]:
    """The message phases the grid carried: each batch's message type, or its secure step."""
    names = []
    for m in grid.sent:
        cfg = m.content.config_records.get(protocol.CONFIG, ConfigRecord())
        name = str(cfg.get(sr.STEP, m.metadata.message_type))
        if not names or names[-1] != name:
            names.append(name)
    return names


def test_a_secure_round_takes_two_message_phases_after_the_first_sum(task_identity):
    grid = FakeGrid(behind_secure_mod(_clients()))
    clear, clear_obs = _run(_clients(), rounds=3)
    secure, secure_obs = _run({}, privacy=SECURE, rounds=3, fake=grid)
    # each site signs its full list with its masked input: no phase of survivor lists when no site drops
    exchange = ["query", sr.SHARE_KEYS, sr.MASK, sr.REVEAL]  # the first sum starts with its own key messages
    assert _phases(grid) == [*exchange, *(["train", sr.REVEAL, "evaluate", sr.REVEAL] * 3)]
    for a, b in zip(clear_obs.records, secure_obs.records, strict=True):
        np.testing.assert_allclose(b.gram, a.gram, rtol=1e-12, atol=1e-14)
    assert secure.aggregator.setup.pipeline.prepared is None  # the last evaluation sets nothing up


class _FailsOnce:
    """A site whose ``kind`` message of round ``server_round`` fails (a transient fault)."""

    def __init__(self, client, kind: str, server_round: int):
        self.client, self.kind, self.server_round = client, kind, server_round

    def __call__(self, msg):
        cfg = msg.content.config_records.get(protocol.CONFIG, ConfigRecord())
        if msg.metadata.message_type == self.kind and cfg.get(protocol.SERVER_ROUND) == self.server_round:
            raise RuntimeError("a transient fault")
        return self.client(msg)


def test_a_site_that_missed_a_sums_set_up_takes_part_again_from_the_next(task_identity):
    handlers = _clients()
    handlers[57] = _FailsOnce(handlers[57], "train", 2)
    grid = FakeGrid(behind_secure_mod(handlers))
    faulty = _clients()
    faulty[57] = _FailsOnce(faulty[57], "train", 2)
    clear, clear_obs = _run(faulty, rounds=3, min_clients=3)
    secure, obs = _run({}, privacy=SECURE, rounds=3, min_clients=3, fake=grid)
    # round 2's sum was set up with 57, which then dropped: the others' inputs move to a fresh sum, which
    # takes its own key messages and a survivor list; the other rounds take two phases
    moved = ["train", sr.RESUM, sr.SHARE_KEYS, sr.MASK, sr.SIGN, sr.REVEAL]
    fast = ["train", sr.REVEAL, "evaluate", sr.REVEAL]
    # 57, back for the evaluation, shares its keys for round 3's sum with the others' reveal (same batch)
    assert _phases(grid)[4:] == [*fast, *moved, "evaluate", sr.REVEAL, sr.SHARE_KEYS, *fast]
    for a, b in zip(clear_obs.records, obs.records, strict=True):  # round 2's head: the sum over the other three
        np.testing.assert_allclose(b.gram, a.gram, rtol=1e-12, atol=1e-14)
    sites = {(r.round, "train"): r.extra.get("secure_sites") for r in obs.records if r.round}
    assert sites == {(1, "train"): 4, (2, "train"): 3, (3, "train"): 4}
    round2 = next(r for r in obs.records if r.round == 2)
    late = [d for d in round2.dropped if d["node"] == 57]
    assert [d["stage"] for d in late] == ["training", "evaluation"]  # the fault, then the sum set up without it
    assert "takes part from the next" in late[1]["reason"]


def test_secure_strategy_reaches_the_clear_runs_sums_from_hand_made_replies(task_identity):
    clear, clear_obs = _run(_clients())
    secure, secure_obs = _run(behind_secure_mod(_clients()), privacy=SECURE)
    np.testing.assert_allclose(secure.exchange.moments.sigma_cen, clear.exchange.moments.sigma_cen, rtol=1e-13)
    np.testing.assert_allclose(secure.exchange.targets.g_cen, clear.exchange.targets.g_cen, rtol=1e-12)
    assert secure.exchange.secure is not None and secure.exchange.secure.count == sum(20 + 7 * p for p in range(4))
    assert secure.exchange.targets.g_star is None and secure.exchange.diagnosis.margins.size == 0
    for a, b in zip(clear_obs.records, secure_obs.records, strict=True):
        np.testing.assert_allclose(b.gram, a.gram, rtol=1e-12, atol=1e-14)
        if a.round:
            assert b.train_mse == pytest.approx(a.train_mse, rel=1e-14)  # sum N_m (pid + 1) / N
            assert b.delta is None and b.trained_gaps is None
            # trained_gap 0.01 (pid + 1): only partition 0 reports its local optimum (gap <= 1e-2)
            assert b.extra["secure_sites"] == 4 and b.extra["secure_sites_at_local_optimum"] == 1


def test_a_site_beyond_the_bounds_fails_the_secure_sum_as_a_whole(task_identity):
    handlers = _clients()
    handlers[57] = Lying(handlers[57], "train", train_lie(head=lambda w: w * 1e9))
    with pytest.raises(SecureSumFailed, match=r"beyond trust.max_abs.*cannot tell which"):
        _run(behind_secure_mod(handlers), privacy=SECURE)


def _keeps_its_next_shares(handler, sum_name: str):
    """A site that reveals for ``sum_name`` but sends no key shares for the sum after it."""

    def handle(msg):
        reply = handler(msg)
        cfg = msg.content.config_records.get(protocol.CONFIG, ConfigRecord())
        if cfg.get(sr.STEP) == sr.REVEAL and str(cfg.get(sr.SUM_ID, "")).endswith(sum_name):
            del reply.content[sr.NEXT]
        return reply

    return handle


def test_a_next_sum_too_few_sites_set_up_runs_under_a_fresh_id(task_identity):
    sites = behind_secure_mod(_clients())
    for node in (57, 33):  # 2 of 4 share keys for evaluate-2: fewer than t = 3
        sites[node] = _keeps_its_next_shares(sites[node], "/train-2")
    grid = FakeGrid(sites)
    clear, clear_obs = _run(_clients(), rounds=3)
    secure, secure_obs = _run({}, privacy=SECURE, rounds=3, fake=grid)
    ids = [str(m.content.config_records[protocol.CONFIG].get(sr.SUM_ID)) for m in grid.sent]
    tag = secure.aggregator.setup.tag
    assert f"{tag}/evaluate-2+" in ids and f"{tag}/evaluate-2" not in ids  # its id was taken by the set-up
    fast = ["train", sr.REVEAL, "evaluate", sr.REVEAL]
    round2 = ["train", sr.REVEAL, "evaluate", sr.SHARE_KEYS, sr.MASK, sr.REVEAL]  # the evaluation starts with its keys
    assert _phases(grid)[4:] == [*fast, *round2, *fast]
    for a, b in zip(clear_obs.records, secure_obs.records, strict=True):
        np.testing.assert_allclose(b.gram, a.gram, rtol=1e-12, atol=1e-14)
        assert b.train_mse == pytest.approx(a.train_mse, rel=1e-14) if a.round else True


def _forges_its_signature(handler):
    """A site whose survivor-list signature with its masked input does not verify (its input is genuine)."""

    def handle(msg):
        reply = handler(msg)
        if sr.SIGNED in reply.content.config_records:
            reply.content[sr.SIGNED] = ConfigRecord({sr.PAYLOAD: sr.pack_signature(b"\x00" * 64)})
        return reply

    return handle


def test_a_signature_that_does_not_verify_is_left_out_and_its_sites_input_counts(task_identity):
    sites = behind_secure_mod(_clients())
    sites[57] = _forges_its_signature(sites[57])
    clear, clear_obs = _run(_clients(), rounds=2)
    secure, secure_obs = _run(sites, privacy=SECURE, rounds=2)
    for a, b in zip(clear_obs.records, secure_obs.records, strict=True):  # every site's head is in every sum
        np.testing.assert_allclose(b.gram, a.gram, rtol=1e-12, atol=1e-14)
        assert b.extra.get("secure_sites", 4) == 4
