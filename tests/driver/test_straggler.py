"""A ClientApp that is connected but never answers, in a real Ray simulation (free features).

The straggler rule (``timeouts.straggler``, shortened here) gives up on it once the other
clients have replied: without enough survivors the run stops with one line naming the node,
its partition and the rule, results.json says ``failed`` with the same line and the checkpoint
of the last complete round stays; with ``failure.min_clients`` allowing it the round continues
without it. Either way the simulation engine, which waits for every ClientApp it started, does
not keep the process waiting (:func:`fedhead.federation.watchdog.end_hung_clients`).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from app_helpers import handlers_app

from fedhead.federation.checkpoint import checkpoint_path, read_checkpoint
from fedhead.settings.config import compose_config, load_config

pytestmark = pytest.mark.usefixtures("ray_session")  # one Ray start for the session (tests/conftest.py)

GRACE = 5  # timeouts.straggler of these tests (default 45); straggler_factor stays 2: the query
# phase's replies come as each Ray actor has started (tens of seconds apart on a busy machine)
HUNG = 1  # the partition whose ClientApp never answers a training message


def _jobs(tmp_path: Path, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "model=free",
                "dataset.n_train=240",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "num_clients=3",
                "procedure=proximal",
                "rounds=1",
                "local_epochs=5",
                "resources.client_cpus=1",
                "resources.ray_num_cpus=3",
                "output.tensorboard=false",
                "output.figures=false",
                f"timeouts.straggler={GRACE}",
                "timeouts.round=600",
                "timeouts.exchange=600",
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")


def _hanging_client_app(jobs, stamps: Path):
    """The real handlers, except that partition HUNG sleeps on every training message; the
    others write when they replied (seconds since the epoch) into ``stamps``."""

    def around(stage, handle):
        if stage != "train":
            return handle

        def train(msg, context):
            pid = int(context.node_config["partition-id"])
            if pid == HUNG:
                time.sleep(3600)  # "forever": the test's process ends it (end_hung_clients)
            reply = handle(msg, context)
            stamps.mkdir(parents=True, exist_ok=True)
            (stamps / f"train_{pid}").write_text(repr(time.time()))
            return reply

        return train

    return handlers_app(jobs[0], around)


def _others_replied(stamps: Path) -> float:
    return max(float(p.read_text()) for p in stamps.glob("train_*"))


def _no_engine_threads_left(deadline: float = 10.0) -> None:
    end = time.perf_counter() + deadline
    while any(t.name != "MainThread" and not t.daemon and t.is_alive() for t in threading.enumerate()):
        assert time.perf_counter() < end, [t.name for t in threading.enumerate()]
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_silent_client_stops_the_run_soon_after_the_others_replied(tmp_path):
    """In a real Ray simulation (slow: mostly waiting for the rule's deadline). The default suite
    checks the same rule in process: tests/strategies/test_failure_policy.py::
    test_the_straggler_rule_drops_a_silent_client_long_before_the_phase_deadline."""
    from fedhead.driver.simulation import run_federations
    from fedhead.strategies.failures import TooFewReplies

    jobs = _jobs(tmp_path)
    stamps = tmp_path / "stamps"
    with pytest.raises(TooFewReplies) as err:
        run_federations(jobs, show_progress=False, client_app=_hanging_client_app(jobs, stamps))
    ended = time.time()
    message = str(err.value)
    assert "\n" not in message
    assert f"(partition {HUNG}): no reply" in message and "straggler rule" in message, message
    assert message.startswith("training: 2 valid of 3 clients, 3 required (failure.min_clients)"), message
    from fedhead.driver.errors import exit_code, one_line

    assert one_line(err.value) == message and exit_code(err.value) == 1  # fedhead-run: that line, exit 1
    # the others replied, then max(GRACE, 2 T) seconds (T: a few seconds of training), then the
    # engine's teardown (the hung actor ended 2 s after the server)
    after = ended - _others_replied(stamps)
    assert GRACE <= after < 90, after
    res = json.loads((jobs[0].output_dir / "results.json").read_text())
    assert res["status"] == "failed" and res["error"] == message
    assert read_checkpoint(checkpoint_path(jobs[0].output_dir)).round == 0  # kept for resume=
    _no_engine_threads_left()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_with_min_clients_the_round_continues_without_the_silent_client(tmp_path):
    from fedhead.driver.simulation import run_federations

    jobs = _jobs(tmp_path, "failure.min_clients=2")
    (res,) = run_federations(jobs, show_progress=False, client_app=_hanging_client_app(jobs, tmp_path / "stamps"))
    assert res["status"] == "completed" and [r["round"] for r in res["rounds"]] == [0, 1]
    dropped = res["rounds"][1]["dropped"]
    train = [d for d in dropped if d["stage"] == "training"]
    assert len(train) == 1 and train[0]["partition"] == HUNG and train[0]["kind"] == "missing"
    assert "straggler rule" in train[0]["reason"]
    # the evaluation of that round drops it too (it has no backbone of the round), with its reason
    assert [d["partition"] for d in dropped if d["stage"] == "evaluation"] == [HUNG]
    _no_engine_threads_left()
