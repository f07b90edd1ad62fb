"""``HeadAveraging(privacy=PrivacyPolicy(mode="secure"))`` with hand-made replies: closed-form clients
behind fedhead's secure mod. The strategy gets the clear run's pooled moments and heads from sums only,
and what it cannot see it cannot check (a lying site's sum is refused as a whole)."""

from __future__ import annotations

import numpy as np
import pytest
from app_helpers import FakeGrid, Lying, NumpyClient, Recorder, simulated_sites, targets_with_moments, train_lie
from flwr.app import Context, RecordDict

from fedhead.clients import SecureSite, secure_mod
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


def _run(handlers, privacy=None, rounds=2):
    obs = Recorder()
    strategy = HeadAveraging(
        lambda_h=LH,
        lambda_w=LW,
        min_nodes=len(NODES),
        gamma=1.0,
        observer=obs,
        timeouts=FAST,
        privacy=privacy,
        roster=simulated_sites(len(NODES)).roster,
    )
    grid = ProgressGrid(FakeGrid(handlers), show=False, poll=0.005)
    grid.timeouts = FAST
    strategy.run(grid, (np.eye(3, 5), np.zeros(3)), rounds)
    return strategy, obs


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
