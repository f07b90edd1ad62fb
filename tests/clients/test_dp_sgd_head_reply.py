"""A head trained with DP-SGD under ``privacy.dp_unit=row`` (fedhead/clients/secure.py ``secure_reply``): it
enters the round's secure sum as ``K [vec W_m, b_m, 1]``, weighted by the public ``privacy.dp_max_rows`` instead
of the site's row count and with no client-level noise; any other head under ``privacy.dp_noise > 0`` is
clipped, capped and noised."""

from __future__ import annotations

import numpy as np
import pytest
from app_helpers import simulated_sites
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from fedhead.clients import secure
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.settings.privacy import PrivacyPolicy

ROWS, K = 37, 100
WEIGHT, BIAS = np.array([[0.5, -1.0, 2.0], [0.25, 0.0, -0.75]]), np.array([0.1, -0.2])
ROW = PrivacyPolicy(mode="secure", dp_noise=1.0, dp_max_rows=K, dp_clip=10.0, dp_unit="row")


def _head_vector(monkeypatch, privacy: PrivacyPolicy, private_heads: bool) -> np.ndarray:
    """The vector a site's reply of a trained head sends into the round's sum (``begin_sum``'s input)."""
    entered: list[np.ndarray] = []

    def begin_sum(msg, context, vector, metrics, **_):
        entered.append(np.asarray(vector))
        return RecordDict()

    monkeypatch.setattr(secure, "begin_sum", begin_sum)
    metrics = MetricRecord({protocol.NUM_EXAMPLES: ROWS, protocol.PARTITION_ID: 0})
    content = RecordDict({protocol.HEAD: protocol.head_record(WEIGHT, BIAS), protocol.METRICS: metrics})
    config = ConfigRecord({protocol.SERVER_ROUND: 1, sr.SUM_ID: "heads/train-1"})
    msg = Message(RecordDict({protocol.CONFIG: config}), dst_node_id=1000, message_type="train")
    context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    secure.secure_reply(
        msg,
        context,
        content,
        lambdas=(0.1, 0.1),
        privacy=privacy,
        min_sites=2,
        identity=simulated_sites(3).identity(0),
        floor=0,
        private_heads=private_heads,
    )
    (vector,) = entered
    return vector


def test_a_dp_sgd_head_enters_its_sum_weighted_by_dp_max_rows_without_noise(monkeypatch, task_identity):
    got = _head_vector(monkeypatch, ROW, private_heads=True)
    np.testing.assert_array_equal(got, sr.head_vector(K, WEIGHT, BIAS))  # exact: no noise, no row count


@pytest.mark.parametrize("privacy", [ROW, PrivacyPolicy(mode="secure", dp_noise=1.0, dp_max_rows=K, dp_clip=10.0)])
def test_a_head_without_dp_sgd_is_noised(monkeypatch, task_identity, privacy):
    got = _head_vector(monkeypatch, privacy, private_heads=False)
    clear = sr.head_vector(min(ROWS, K), WEIGHT, BIAS)  # the capped weight N_m (no clip binds at Delta = 10)
    noise = got - clear
    # each entry's noise: std z K Delta / sqrt(m_min) = 707 over 9 entries, far from the head's own values
    assert float(np.sqrt(np.mean(noise**2))) > 50.0
    again = _head_vector(monkeypatch, privacy, private_heads=False)
    assert not np.array_equal(again, got)  # fresh noise, from the operating system's entropy
