"""One malicious ClientApp among four, in a real Ray simulation (free features, one round).

Each attack is refused or bounded by the server's ``trust:`` policy and ``failure.min_clients=3``:
the run completes, the attacker is dropped (or held to its weight cap), and where it was dropped
the honest sites' Grams are those of the same run with that site down (the run without the
attacker). The default suite runs the head attack; the others need a minute each and are slow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_helpers import handlers_app, moments_lie, train_lie
from flwr.app import Message

from fedhead.federation import protocol
from fedhead.settings.config import compose_config, load_config

pytestmark = pytest.mark.usefixtures("ray_session")  # one Ray start for the session (tests/conftest.py)

ATTACKER = 2  # partition of the malicious ClientApp


def _job(tmp_path: Path, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "model=free",
                "dataset.n_train=400",
                f"dataset.cache_dir={tmp_path.parent / 'cache'}",
                "num_clients=4",
                "procedure=proximal",
                "rounds=1",
                "local_epochs=200",
                "resources.client_cpus=1",
                "resources.ray_num_cpus=2",
                "resources.evaluate_mse=false",
                "output.tensorboard=false",
                "output.figures=false",
                "failure.min_clients=3",
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


DOWN = object()  # the attacker's place in the run without it: that site fails at that stage


def _client_app(job, lies):
    """The real handlers; partition ATTACKER rewrites its replies to the stages named in ``lies``
    (stage -> ``RecordDict -> RecordDict``), or fails there (``DOWN``)."""

    def attacked(stage, handle):
        def handler(msg, context):
            reply = handle(msg, context)
            lie = lies.get(stage)
            if lie is None or int(context.node_config["partition-id"]) != ATTACKER:
                return reply
            if lie is DOWN:
                raise RuntimeError("this site is down")
            return Message(lie(reply.content), reply_to=msg)

        return handler

    return handlers_app(job, attacked)


def _run(tmp_path: Path, name: str, **lies):
    from fedhead.driver.simulation import run_federations

    job = _job(tmp_path / name)
    (res,) = run_federations([job], show_progress=False, client_app=_client_app(job, lies))
    assert res["status"] == "completed" and [r["round"] for r in res["rounds"]] == [0, 1]
    return res


def _dropped(res, stage):
    return [d for r in res["rounds"] for d in r["dropped"] if d["stage"] == stage]


def _same_grams(res, ref):
    for key in ("g_star", "g_cen"):
        np.testing.assert_array_equal(res["targets"][key], ref["targets"][key])
    np.testing.assert_allclose(res["rounds"][1]["gram"], ref["rounds"][1]["gram"], rtol=1e-12, atol=1e-14)


@pytest.mark.slow  # the default suite's tests/strategies/test_trust.py drops the same head in a hand-made round
@pytest.mark.timeout(300)
def test_a_head_of_1e200_drops_the_attacker_and_the_run_completes(tmp_path):
    res = _run(tmp_path, "attack", train=train_lie(head=lambda w: np.full_like(w, 1e200)))
    (dropped,) = _dropped(res, "training")
    assert dropped["partition"] == ATTACKER and dropped["kind"] == "invalid"
    assert "head weight exceeds the magnitude bound" in dropped["reason"]
    _same_grams(res, _run(tmp_path, "down", train=DOWN))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_huge_count_is_held_to_the_cap(tmp_path):
    huge = 10**15  # claimed in the exchange and in every training reply
    res = _run(
        tmp_path, "attack", query=moments_lie(count=huge), train=train_lie(metrics={protocol.NUM_EXAMPLES: huge})
    )
    assert _dropped(res, "training") == []
    weights = res["moments"]["weights"]
    assert weights[ATTACKER] == 0.5 and sum(weights) == pytest.approx(1.0, abs=1e-15)
    assert any("capped at 0.5" in f for f in res["diagnosis"]["flags"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_fake_covariance_drops_the_attacker_at_the_exchange(tmp_path):
    res = _run(tmp_path, "attack", query=moments_lie(cov=1e14 * np.eye(3)))
    (dropped,) = _dropped(res, "moment exchange")
    assert dropped["partition"] == ATTACKER and "Sigma_m exceeds the magnitude bound" in dropped["reason"]
    _same_grams(res, _run(tmp_path, "down", query=DOWN))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_junk_metrics_are_ignored_and_counted(tmp_path):
    junk = {f"junk_{i}": float(i) for i in range(2008)} | {"objective": float("nan"), "train_seconds": float("inf")}
    res = _run(tmp_path, "attack", train=train_lie(metrics=junk))
    assert res["rounds"][1]["ignored_metrics"] == 2010 and _dropped(res, "training") == []
    assert not any(k.startswith("junk_") for m in res["rounds"][1]["client_metrics"] for k in m)
    _same_grams(res, _run(tmp_path, "honest"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_another_partition_id_drops_the_attacker(tmp_path):
    res = _run(tmp_path, "attack", train=train_lie(metrics={protocol.PARTITION_ID: 0}))
    (dropped,) = _dropped(res, "training")
    assert dropped["partition"] == ATTACKER and "reports partition 0, but it is partition 2" in dropped["reason"]
    _same_grams(res, _run(tmp_path, "down", train=DOWN))
