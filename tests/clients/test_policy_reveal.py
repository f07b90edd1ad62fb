"""A server that asks the sites to unmask a secure sum over fewer survivors than they allow (a site's
privacy policy): the ServerApp body against real ClientApps in process, its ``reveal`` requests forged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, simulated_sites, table_job, write_table
from flwr.app import ConfigRecord, Message

from fedhead.clients import make_client_app
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.secure_sum import Unmasking
from fedhead.strategies.secure import SecureSumFailed

SIZES = (40, 50, 45)


class ForgingGrid(InProcessGrid):
    """Serves real ClientApps; with ``forge``, every ``reveal`` request names one survivor fewer (it claims
    the last one dropped) and goes to the others only. Every reply is kept."""

    def __init__(self, app, num_nodes: int, forge: bool):
        super().__init__(app, num_nodes)
        self.forge = forge
        self.replies: list[Message] = []

    def push_messages(self, messages):
        kept = []
        for m in messages:
            cfg = m.content.config_records.get(protocol.CONFIG)
            if self.forge and cfg is not None and cfg.get(sr.STEP) == sr.REVEAL:
                asked = sr.unpack_unmasking(sr.payload_of(m.content.config_records[sr.SECURE]))
                *alive, gone = asked.survivors
                if m.metadata.dst_node_id == gone:
                    continue
                forged = Unmasking(tuple(alive), (*asked.dropped, gone))
                m.content.config_records[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack(forged)})
            kept.append(m)
        ids = super().push_messages(kept)
        self.replies += [self._replies[i] for i in ids if i in self._replies]
        return ids


def _sites(tmp_path: Path) -> list[Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = []
    for i, n in enumerate(SIZES):
        rng = np.random.default_rng(i)
        x = rng.normal(size=(n, 2)) + i
        y = x @ np.array([[1.0, 0.5], [-0.5, 2.0]]) + rng.normal(size=(n, 2))
        cols = {"f1": x[:, 0], "f2": x[:, 1], "t1": y[:, 0], "t2": y[:, 1]}
        out.append(write_table(tmp_path / f"site_{i}.csv", cols))
    return out


def _run(tmp_path: Path, forge: bool, node: dict, *overrides: str):
    listed = ",".join(f'"{f}"' for f in _sites(tmp_path))
    job = table_job(
        tmp_path / "out", f"dataset.files=[{listed}]", "rounds=1", "procedure=exact", "privacy.mode=secure", *overrides
    )
    CLIENT_CACHE.clear()
    grid = ForgingGrid(make_client_app(job, simulated_sites(len(SIZES))), len(SIZES), forge)
    for context in grid.contexts.values():
        context.node_config = {**context.node_config, **node}
    recorder = RunRecorder(job, show_progress=False)
    try:
        serve(grid, job, recorder, show_progress=False, roster=simulated_sites(len(SIZES)).roster)
    except SecureSumFailed as exc:
        return None, grid, str(exc)
    return recorder.finish("completed"), grid, None


@pytest.mark.parametrize(
    ("node", "overrides", "refusal"),
    [
        (  # the sum's threshold must be at least the sites' floor (they refuse a lower one at share-keys)
            {"min-survivors": 3},
            ("privacy.threshold=3",),
            "refused by this site's privacy policy (node config min-survivors=3): the reveal names fewer surviving "
            "sites",
        ),
        (  # no policy: a noised sum is not unmasked over fewer sites than its noise was drawn for
            {},
            ("privacy.dp_noise=1e-9", "privacy.dp_max_rows=100"),
            "refused: the reveal names fewer surviving sites than the sum's noise was drawn for (m_min=3",
        ),
    ],
)
def test_a_reveal_over_fewer_survivors_than_a_site_allows_is_refused(tmp_path, task_identity, node, overrides, refusal):
    honest, _, failed = _run(tmp_path / "honest", False, node, *overrides)
    assert failed is None and honest is not None and honest.status == "completed"  # the floor holds honest runs
    res, grid, failed = _run(tmp_path / "forged", True, node, *overrides)
    assert res is None and failed is not None and "secure sum of the exchange" in failed
    revealed = [r for r in grid.replies if not r.has_error() and sr.SECURE in r.content.config_records]
    unmasked = [r for r in revealed if "seed_shares" in sr.payload_of(r.content.config_records[sr.SECURE]).decode()]
    assert unmasked == []  # no site gave a share of the forged reveal
    refusals = [r.error.reason for r in grid.replies if r.has_error()]
    assert len(refusals) == 2 and all(refusal in reason for reason in refusals), refusals
