"""``privacy.mode=secure`` end to end, in process (real ClientApps, no Ray): the server reaches the
same ``G_cen``, standardisation and Grams as in clear mode while every array it receives is masked;
dropouts are recovered from the shares; too few survivors end the run with one line.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, simulated_sites
from flwr.app import Error, Message
from test_site_local import SIZES, _rows, _sites

from fedhead.clients import make_client_app
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.settings.config import compose_config, load_config
from fedhead.strategies.secure import SecureSumFailed

SECURE = "privacy.mode=secure"
#: the metrics a secure reply may carry (no count, no statistic, no gap)
SAFE_METRICS = {
    protocol.PARTITION_ID,
    protocol.SERVER_ROUND,
    sr.FULLY_ACTIVE,
    sr.LOCAL_OPTIMUM,
    sr.TARGETS,
    sr.FEATURES,
}
HOPPER = [
    "model=free",
    "dataset.n_train=240",
    "num_clients=4",
    "rounds=2",
    "local_epochs=400",
    "train.lr=3e-3",
    "local_tol=1e-5",
    "output.tensorboard=false",
    "output.figures=false",
]

#: a silent site is given up after a second (the straggler rule), not after the default waits
FAST_WAITS = ("timeouts.straggler=1", "timeouts.straggler_factor=1")


class RecordingGrid(InProcessGrid):
    """Every message and reply, kept; ``faults[(node, step)]`` makes a node fail (``"error"``) or never answer
    (``"silent"``) at a secure step (``share-keys``, ``mask``, ``sign``, ``reveal``) or a phase (``train``)."""

    def __init__(self, app, num_nodes: int, faults=None):
        super().__init__(app, num_nodes)
        self.replies: list[Message] = []
        self.faults = dict(faults or {})
        self._replies: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = f"msg-{len(self.sent)}"
            self.sent.append(m)
            ids.append(m.metadata.message_id)
            cfg = m.content.config_records.get("config")
            step = cfg.get(sr.STEP) if cfg is not None else None
            fault = self.faults.get((m.metadata.dst_node_id, step or m.metadata.message_type))
            if fault == "silent":
                continue
            if fault == "error":
                reply = Message(Error(code=0, reason="ConnectionError: the site went away"), reply_to=m)
            else:
                try:
                    reply = self.handlers[m.metadata.dst_node_id](m)
                except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp -> an error reply
                    reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=m)
                self.replies.append(reply)
            self._replies[m.metadata.message_id] = reply
        return ids


def _hopper_job(tmp_path: Path, *overrides: str):
    cfg = load_config(compose_config([*HOPPER, f"dataset.cache_dir={tmp_path.parent / 'cache'}", *overrides]))
    return cfg.jobs(tmp_path / "out")[0]


def _run(job, faults=None):
    grid = RecordingGrid(
        make_client_app(job, simulated_sites(job.settings.num_clients)), job.settings.num_clients, faults
    )
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False, roster=simulated_sites(job.settings.num_clients).roster)
    return recorder.finish("completed"), grid


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def test_secure_mode_reaches_clear_mode_with_only_sums(tmp_path, task_identity):
    clear, _ = _run(_hopper_job(tmp_path / "clear", "procedure=corrected_proximal"))
    secure, grid = _run(_hopper_job(tmp_path / "secure", "procedure=corrected_proximal", SECURE))
    assert _rel(secure.targets["g_cen"], clear.targets["g_cen"]) < 1e-9
    assert _rel(secure.moments["sigma_cen"], clear.moments["sigma_cen"]) < 1e-9
    assert _rel(secure.moments["sigma_within"], clear.moments["sigma_within"]) < 1e-9
    for a, b in zip(clear.rounds, secure.rounds, strict=True):  # the run's local tolerance is 1e-5
        assert _rel(b.gram, a.gram) < 1e-6
    assert secure.rounds[-1].e_f_cen < 1e-2  # corrected proximal reaches G_cen
    np.testing.assert_allclose(secure.rounds[-1].train_mse, clear.rounds[-1].train_mse, rtol=1e-6)
    # what needs per-site values is absent, with the reason
    assert secure.targets["g_star"] is None and secure.moments["covs"] is None
    assert secure.diagnosis["margins"] == [] and secure.diagnosis["trace_m_a"] is None
    assert "secure" in secure.diagnosis["absent"] and secure.privacy["mode"] == "secure"
    assert all(r.delta is None and r.trained_gaps is None for r in secure.rounds)
    assert secure.local_optimality.reached is True
    # the server saw keys, masked words and pass/fail metrics only
    for reply in grid.replies:
        assert not reply.has_error(), reply.error
        for record in reply.content.metric_records.values():
            assert set(record) <= SAFE_METRICS, set(record)
        for record in reply.content.array_records.values():
            assert list(record) == [sr.MASKED] and record[sr.MASKED].numpy().dtype == np.uint64


def _site_vectors(job) -> list[np.ndarray]:
    from fedhead.clients.state import client_data, client_moments

    out = []
    for pid in range(job.settings.num_clients):
        _, cd = client_data(job, pid)
        y, mu, sigma = client_moments(job, pid, cd.y_train.numpy())
        out.append(sr.moment_vector(y.shape[0], mu, sigma))
    return out


def test_no_received_array_decodes_to_a_site_or_a_partial_sum(tmp_path, task_identity):
    job = _hopper_job(tmp_path / "a", SECURE, "procedure=proximal", "rounds=1")
    _, grid = _run(job)
    sites = _site_vectors(job)
    m = len(sites)
    encoding = sr.encoding_for(sr.moment_bound(job.trust.max_abs), m)
    masked = [
        r.content.array_records[sr.SECURE][sr.MASKED].numpy()
        for r in grid.replies
        if sr.SECURE in r.content.array_records
    ]
    width = encoding.width(sites[0].size)
    assert sum(w.size == width for w in masked) == m, (
        [w.size for w in masked],
        width,
        sites[0].size,
    )  # the exchange's masked inputs (the round's: another length)
    partial = [np.sum([sites[i] for i in c], axis=0) for k in range(1, m) for c in itertools.combinations(range(m), k)]
    for words in masked:
        if words.size != width:
            continue
        decoded = encoding.decode(words)
        for target in partial:
            assert not np.allclose(decoded, target, rtol=1e-6, atol=1e-6)
    # fresh masks: the same site's masked input differs between two runs on the same data
    _, again = _run(_hopper_job(tmp_path / "b", SECURE, "procedure=proximal", "rounds=1"))

    def first_masked(g):
        for reply in g.replies:
            if sr.SECURE in reply.content.array_records:
                return reply.metadata.src_node_id, reply.content.array_records[sr.SECURE][sr.MASKED].numpy()
        raise AssertionError("no masked input")

    (n1, w1), (n2, w2) = first_masked(grid), first_masked(again)
    assert n1 == n2 and w1.shape == w2.shape and np.mean(w1 == w2) < 0.01


@pytest.mark.parametrize("step", ["mask", "reveal"])
def test_a_site_that_drops_is_recovered_from_the_shares(tmp_path, task_identity, step):
    """``mask``: the site drops before its masked input (the others' inputs move to a fresh sum, which is
    over them); ``reveal``: after it (its input counts, its shares are not needed)."""
    over = ("procedure=proximal", "rounds=1", "failure.min_clients=3", *FAST_WAITS)
    clear, _ = _run(_hopper_job(tmp_path / "clear", *over))
    secure, grid = _run(_hopper_job(tmp_path / "secure", SECURE, *over), faults={(1002, step): "silent"})
    if step != "mask":  # all four inputs are in the sum
        assert _rel(secure.targets["g_cen"], clear.targets["g_cen"]) < 1e-9
    else:
        assert secure.privacy["sites"] == 3
        dropped = [d for d in secure.rounds[0].dropped if d["node"] == 1002]
        assert dropped and "mask" in dropped[0]["stage"]
        steps = [m.content.config_records["config"].get(sr.STEP) for m in grid.sent]
        assert steps.count(sr.RESUM) == 3  # the exchange's sum moved once, to the other three sites
        assert _rel(secure.targets["g_cen"], clear.targets["g_cen"]) > 1e-6  # three sites' moments, not four


def test_too_few_survivors_end_the_run_naming_the_threshold(tmp_path, task_identity):
    over = ("procedure=proximal", "rounds=1", "failure.min_clients=2", "privacy.threshold=3", *FAST_WAITS)
    job = _hopper_job(tmp_path, SECURE, *over)
    with pytest.raises(SecureSumFailed, match=r"2 sites survived, the threshold is 3 \(privacy.threshold=3\)"):
        _run(job, faults={(1001, "mask"): "silent", (1002, "mask"): "error"})


def test_site_local_tables_secure_equals_clear(tmp_path, task_identity):
    files = _sites(tmp_path)
    listed = ",".join(f'"{f}"' for f in files)

    def job(name: str, *extra: str):
        cfg = load_config(
            compose_config(
                [
                    "dataset=table",
                    f"dataset.files=[{listed}]",
                    "dataset.targets=[t1,t2]",
                    "model=free",
                    "rounds=2",
                    "local_epochs=300",
                    "local_tol=1e-6",
                    "procedure=corrected_proximal",
                    "output.tensorboard=false",
                    "output.figures=false",
                    *extra,
                ]
            )
        )
        return cfg.jobs(tmp_path / name)[0]

    clear, _ = _run(job("clear"))
    secure, grid = _run(job("secure", SECURE))
    assert len(SIZES) == 3 and secure.privacy["sites"] == 3
    assert _rel(secure.targets["g_cen"], clear.targets["g_cen"]) < 1e-9
    for part in ("targets", "inputs"):
        for key in ("offset", "scale"):
            got, want = secure.standardization[part][key], clear.standardization[part][key]
            np.testing.assert_allclose(got, want, rtol=1e-9)
    assert _rel(secure.rounds[-1].gram, clear.rounds[-1].gram) < 1e-5
    assert secure.diagnosis["fully_active"] is True  # each site's own margin, in the pooled standardisation
    values = {float(v) for i, n in enumerate(SIZES) for col in _rows(n, i).values() for v in col}
    for reply in grid.replies:  # no row value in any metric
        for record in reply.content.metric_records.values():
            assert not values & {float(v) for v in record.values() if isinstance(v, int | float)}


def test_differential_privacy_noises_every_sum_and_accounts_every_release(tmp_path, task_identity):
    from fedhead.federation.privacy_noise import privacy_spent

    dp = ("privacy.dp_max_rows=60", "privacy.dp_clip=10", "privacy.dp_delta=1e-5")
    over = ("procedure=corrected_proximal", "rounds=1")
    clear, _ = _run(_hopper_job(tmp_path / "clear", *over))
    weak, _ = _run(_hopper_job(tmp_path / "weak", SECURE, *over, *dp, "privacy.dp_noise=1e-9"))
    # z = 0.03: each sum's noise has std z K Delta = 18 against the 240 rows of its count entry (13 std from 0)
    strong, _ = _run(_hopper_job(tmp_path / "strong", SECURE, *over, *dp, "privacy.dp_noise=0.03"))
    for res, z in ((weak, 1e-9), (strong, 0.03)):
        spent = res.privacy["dp"]
        assert spent["releases"] == 1 + 2  # the exchange, the round, its evaluation
        want = privacy_spent(z, spent["releases"], 4, 1e-5).epsilon
        assert spent["epsilon"] == pytest.approx(want, rel=1e-12)
        assert [r.extra["dp_releases"] for r in res.rounds] == [1, 3]
    assert strong.privacy["dp"]["epsilon"] < weak.privacy["dp"]["epsilon"]
    # no clipping binds at this Delta and K (the sites' rows <= 60): a tiny noise leaves the result
    assert _rel(weak.targets["g_cen"], clear.targets["g_cen"]) < 1e-6
    assert _rel(weak.rounds[-1].gram, clear.rounds[-1].gram) < 1e-5
    assert _rel(strong.targets["g_cen"], clear.targets["g_cen"]) > 1e-3  # the server never saw an un-noised sum


def test_a_site_that_requires_secure_mode_sends_nothing_in_the_clear(tmp_path, task_identity):
    """``--node-config "privacy-mode=secure"``: the site refuses a clear run's data messages (it is dropped,
    the run goes on without it under the failure policy) and takes part in a secure run."""
    over = ("procedure=proximal", "rounds=1", "failure.min_clients=3", *FAST_WAITS)
    for mode, sites in (("clear", 3), ("secure", 4)):
        job = _hopper_job(tmp_path / mode, f"privacy.mode={mode}", *over)
        grid = RecordingGrid(make_client_app(job, simulated_sites(job.settings.num_clients)), job.settings.num_clients)
        grid.contexts[1001].node_config = {**grid.contexts[1001].node_config, "privacy-mode": "secure"}
        recorder = RunRecorder(job, show_progress=False)
        serve(grid, job, recorder, show_progress=False, roster=simulated_sites(job.settings.num_clients).roster)
        res = recorder.finish("completed")
        if mode == "clear":
            (gone,) = res.rounds[0].dropped
            assert gone["node"] == 1001 and "sends nothing in the clear" in gone["reason"]
            assert len(res.moments["counts"]) == 3
        else:
            assert res.privacy["sites"] == sites
