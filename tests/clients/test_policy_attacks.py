"""A deviating server against fedhead's ClientApp (data oracles and a site's privacy policy): hand-made messages to real
sites, as a server that bisects would send them. Each run answers a standardisation, the regime question
and a sum once; a site's own policy holds whatever the run config says; no answer depends on a row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_helpers import simulated_sites, table_job, write_table
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedhead.analysis.standardization import FLOAT32_MAX
from fedhead.clients import make_client_app
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.clients.policy import PolicyRefusal
from fedhead.data.site_range import RANGE_RADIUS
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr

ROWS = 40
SITES = simulated_sites(3)  # the simulation's own roster: partition 0 signs as partition-0


def _rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)) + seed
    y = x @ np.array([[1.0, 0.5], [-0.5, 2.0]]) + rng.normal(size=(n, 2)) + np.array([10.0, -5.0])
    test = (np.arange(n) % 5 == 0).astype(float)
    return {"f1": x[:, 0], "f2": x[:, 1], "t1": y[:, 0], "t2": y[:, 1], "is_test": test}


def _job(tmp_path: Path, *overrides: str):
    return table_job(tmp_path / "out", "dataset.num_clients=3", "dataset.test_column=is_test", "rounds=1", *overrides)


def _node(path: Path, run_id: int = 21, **config) -> Context:
    node_config = {"partition-id": 0, "data-path": str(path), **config}
    return Context(run_id=run_id, node_id=1000, node_config=node_config, state=RecordDict(), run_config={})


def _ask(app, context: Context, config: dict, records: dict | None = None, kind: str = "query") -> str:
    """The site's answer as the server sees it: ``ok <metrics>`` or the error's one line."""
    content = RecordDict({protocol.CONFIG: ConfigRecord(config), **(records or {})})
    try:
        reply = app(Message(content=content, dst_node_id=context.node_id, message_type=kind), context)
    except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp is an error reply
        return f"{type(exc).__name__}: {exc}"
    metrics = reply.content.metric_records.get(protocol.METRICS, {})
    return "ok " + repr(sorted((k, v) for k, v in metrics.items() if k != protocol.NUM_EXAMPLES))


def _standardization(offset, scale) -> dict:
    empty = Array(np.zeros(0))
    record = ArrayRecord(
        {
            protocol.TARGET_OFFSET: Array(np.asarray(offset, dtype=np.float64)),
            protocol.TARGET_SCALE: Array(np.asarray(scale, dtype=np.float64)),
            protocol.INPUT_OFFSET: empty,
            protocol.INPUT_SCALE: empty,
        }
    )
    return {protocol.STANDARDIZATION: record}


@pytest.fixture
def twin_sites(tmp_path):
    """Two files with the same training rows (so the same statistics); ``far``'s one test row lies 1e5
    standard deviations out, which a check of the rows against the server's scales would tell."""
    near = _rows(ROWS, 1)
    far = {k: v.copy() for k, v in near.items()}
    far["t1"][0] = near["t1"].mean() + 1e5 * near["t1"].std()  # row 0 is a test row
    CLIENT_CACHE.clear()
    return write_table(tmp_path / "near.csv", near), write_table(tmp_path / "far.csv", far), near


def _bisect(ask, low: float, high: float, steps: int) -> list[tuple[float, str]]:
    """The scale at which a site starts to refuse, bisected (geometric means): every scale and answer, in order."""
    answers = []
    for _ in range(steps):
        mid = float(np.sqrt(low * high))
        answers.append((mid, ask(mid)))
        if answers[-1][1].startswith("ok"):
            high = mid
        else:
            low = mid
    return answers


def test_a_bisection_of_the_standardisation_gets_one_answer_per_run(tmp_path, task_identity, twin_sites):
    """Old: refused exactly when max |y - o| / s leaves float32, so 100 bisected scales told a column's
    extremes. Now: the run's first standardisation is taken (or refuses the run) from the site's
    statistics alone, every other is refused with one line: the twins answer alike."""
    job = _job(tmp_path, "procedure=exact")
    app = make_client_app(job, SITES)
    mean = twin_sites[2]["t1"][twin_sites[2]["is_test"] == 0].mean()
    transcripts = []
    for path in twin_sites[:2]:
        context = _node(path)
        ask = lambda s, ctx=context: _ask(app, ctx, {}, _standardization([mean, 0.0], [s, 1.0]))  # noqa: E731
        transcripts.append(_bisect(ask, 1e-60, 1.0, 100))
    assert transcripts[0] == transcripts[1]
    (accepted, first), *rest = transcripts[0]
    assert first.startswith("ok")
    refusal = "PolicyRefusal: refused: this site accepts one standardisation per run, and this message carries another"
    for scale, answer in rest:  # the accepted standardisation again is answered alike; any other is refused
        assert answer == (first if scale == accepted else refusal), (scale, answer)
    assert len({scale for scale, answer in rest if answer == refusal}) > 30  # the bisection's probes, all refused


def test_a_standardisation_beyond_the_sites_range_refuses_the_whole_run_once(tmp_path, task_identity, twin_sites):
    job = _job(tmp_path, "procedure=exact")
    app = make_client_app(job, SITES)
    honest = _standardization([10.0, -5.0], [2.0, 3.0])
    mean = twin_sites[2]["t1"][twin_sites[2]["is_test"] == 0].mean()
    tiny = RANGE_RADIUS * abs(mean) / FLOAT32_MAX / 4  # a bound beyond float32 from the statistics alone
    answers = {}
    for path in twin_sites[:2]:
        context = _node(path)
        answers[path.name] = [
            _ask(app, context, {}, _standardization([mean, 0.0], [tiny, 1.0])),
            _ask(app, context, {}, honest),
            _ask(app, context, {protocol.STAGE: protocol.STAGE_STATISTICS}),
            _ask(app, context, {}, _standardization([mean, 0.0], [tiny, 1.0])),
        ]
        assert _ask(app, _node(path, run_id=22), {}, honest).startswith("ok")  # the next run starts afresh
    assert answers["near.csv"] == answers["far.csv"]
    line = (
        "PolicyRefusal: node 1000: refused: the run's standardisation does not fit this site's range; "
        "it takes no further part in this run"
    )
    assert answers["near.csv"] == [line] * 4


def test_a_row_beyond_the_sites_own_range_is_refused_for_every_run_naming_only_the_column(tmp_path, task_identity):
    cols = _rows(ROWS, 2)
    cols["t2"][5] = 1e30  # a test row, in no statistic the site sends
    path = write_table(tmp_path / "wild.csv", cols)
    CLIENT_CACHE.clear()
    app = make_client_app(_job(tmp_path, "procedure=exact"), SITES)
    for run_id, (config, records) in enumerate(
        [({protocol.STAGE: protocol.STAGE_STATISTICS}, {}), ({}, _standardization([10.0, -5.0], [2.0, 3.0]))]
    ):
        answer = _ask(app, _node(path, run_id=run_id), config, records)
        assert "wild.csv: target column 't2' has a row farther from its training mean than 2^20 times" in answer
        assert "1e" not in answer and "30" not in answer


def test_the_regime_question_is_answered_once_per_run(tmp_path, task_identity, twin_sites):
    """Old: ``stage=regime`` answered pass/fail for any scales, any number of times (240 bits told a site's
    2 x 2 Sigma_m). Now: once per run, whatever the message carries."""
    job = _job(tmp_path, "procedure=exact", "privacy.mode=secure")
    app = make_client_app(job, SITES)
    context = _node(twin_sites[0])
    honest = _standardization([10.0, -5.0], [2.0, 3.0])
    regime = {protocol.STAGE: sr.STAGE_REGIME}
    answers = [_ask(app, context, regime, honest)]
    for k in range(30):
        answers.append(_ask(app, context, regime, honest if k % 2 else _standardization([10.0, -5.0], [2.0, k + 1.0])))
    assert answers[0].startswith("ok") and sr.FULLY_ACTIVE in answers[0]
    assert set(answers[1:]) == {"PolicyRefusal: refused: this site answers the regime question once per run"}


@pytest.mark.parametrize("rows", [30, 45])
def test_a_bisection_of_min_rows_over_runs_learns_nothing_from_a_site_with_a_policy(tmp_path, task_identity, rows):
    """Old: privacy.min_rows (the server's) decided, so runs with bisected minimums told N_m. A site with its
    own minimum answers alike for every run minimum, lowered or raised."""
    path = write_table(tmp_path / "site.csv", _rows(rows, 3))
    CLIENT_CACHE.clear()
    answers = []
    for run_id, run_min in enumerate((1, 10, 20, 25, 31, 40, 46, 60, 500)):
        app = make_client_app(_job(tmp_path / str(run_min), "procedure=exact", f"privacy.min_rows={run_min}"), SITES)
        answer = _ask(app, _node(path, run_id=run_id, **{"min-rows": 12}), {protocol.STAGE: protocol.STAGE_STATISTICS})
        answers.append(answer)
    assert answers[0].startswith("ok") and answers == [answers[0]] * 9
    # a run config lowering the minimum changes nothing at a site whose own minimum is above its rows
    app = make_client_app(_job(tmp_path / "low", "procedure=exact", "privacy.min_rows=1"), SITES)
    answer = _ask(app, _node(path, **{"min-rows": 50}), {protocol.STAGE: protocol.STAGE_STATISTICS})
    assert answer.endswith("fewer training rows than the site's minimum (node config min-rows=50)"), answer
    assert str(rows) not in answer


def _secure_exchange(sum_name: str = "exchange") -> dict:
    return {protocol.STAGE: protocol.STAGE_STATISTICS, sr.SUM_ID: sum_name}


@pytest.mark.parametrize(
    ("run", "expect"),
    [
        ("privacy.dp_noise=0.5", "(node config dp-noise=1.0): the run's privacy.dp_noise=0.5 is weaker"),
        ("privacy.dp_noise=0", "(node config dp-noise=1.0): the run's privacy.dp_noise=0 is weaker"),
        ("privacy.dp_noise=2", None),
    ],
)
def test_a_run_with_weaker_dp_than_the_sites_floor_is_refused(tmp_path, task_identity, twin_sites, run, expect):
    job = _job(tmp_path, "procedure=exact", "privacy.mode=secure", "privacy.dp_max_rows=60", run)
    app = make_client_app(job, SITES)
    context = _node(twin_sites[0], **{"dp-noise": 1.0})
    answer = _ask(app, context, _secure_exchange())
    if expect is None:
        assert answer.startswith("ok"), answer
    else:
        assert answer == f"PolicyRefusal: refused by this site's privacy policy {expect}"
    # a clear run is refused by the same floor: DP needs secure mode
    clear = make_client_app(_job(tmp_path / "clear", "procedure=exact"), SITES)
    answer = _ask(clear, _node(twin_sites[0], run_id=3, **{"dp-noise": 1.0}), {protocol.STAGE: "statistics"})
    assert answer == (
        "PolicyRefusal: this site sends nothing in the clear (node config dp-noise=1.0): run the federation "
        "with privacy.mode=secure"
    )


def test_a_replayed_phase_message_gets_no_fresh_release(tmp_path, task_identity, twin_sites):
    """The same phase twice in a run is refused (a second noised release of the same values would average
    the noise away), also after the node restarted (its ledger is in its state-dir); a sum id used in an
    earlier run is refused too (every signature and mask of a sum binds its id)."""
    job = _job(tmp_path, "procedure=exact", "privacy.mode=secure", "privacy.dp_max_rows=60", "privacy.dp_noise=1")
    app = make_client_app(job, SITES)
    state = {"state-dir": str(tmp_path / "state")}
    first = _ask(app, _node(twin_sites[0], **state), _secure_exchange())
    assert first.startswith("ok"), first
    again = "PolicyRefusal: refused: this site releases the exchange once per run, into one secure sum"
    assert _ask(app, _node(twin_sites[0], **state), _secure_exchange()) == again  # a restarted node
    context = _node(twin_sites[0])  # in a simulation (no state-dir): the run's context state
    assert _ask(app, context, _secure_exchange()).startswith("ok")
    assert [_ask(app, context, _secure_exchange()) for _ in range(5)] == [again] * 5
    another_run = _node(twin_sites[0], run_id=99, **state)
    assert _ask(app, another_run, _secure_exchange("tag-2/exchange")).startswith("ok")  # another run, its own sum id
    begun = "PolicyRefusal: refused: secure sum exchange was begun before (one release per sum id, over all runs)"
    assert _ask(app, _node(twin_sites[0], run_id=98, **state), _secure_exchange()) == begun  # the record of ids


def test_a_release_over_the_sites_budget_is_refused_before_anything_is_sent(tmp_path, task_identity, twin_sites):
    from fedhead.clients.policy import release_epsilon

    job = _job(tmp_path, "procedure=exact", "privacy.mode=secure", "privacy.dp_max_rows=60", "privacy.dp_noise=1")
    app = make_client_app(job, SITES)
    budget = release_epsilon([1.0, 1.0], 3, 1e-5) * 1.001  # two releases at z = 1
    policy = tmp_path / "policy.toml"
    policy.write_text(f'mode = "secure"\nepsilon-budget = {budget!r}\n')
    node = {"state-dir": str(tmp_path / "state"), "privacy-policy": str(policy)}
    answers = [_ask(app, _node(twin_sites[0], run_id=r, **node), _secure_exchange(f"{r}/exchange")) for r in range(3)]
    assert answers[0].startswith("ok") and answers[1].startswith("ok")
    assert answers[2] == (
        f"PolicyRefusal: refused by this site's privacy policy ({policy} epsilon-budget={budget}): this release "
        "would take the site over its budget"
    )
    assert PolicyRefusal.__mro__[1].__name__ == "ClientError"  # flwr sends its one line to the server


def test_a_failed_mask_step_ends_the_sites_part_in_the_run(tmp_path, task_identity, twin_sites):
    """A mask step can fail on the site's values (an entry beyond the encoding's bound, which the server
    chooses): any failure there refuses the run, so that a server learns it once per run."""
    job = _job(tmp_path, "procedure=exact", "privacy.mode=secure")
    app = make_client_app(job, SITES)
    context = _node(twin_sites[0])
    step = {protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: "train-1"}
    shares = _ask(app, context, {**step, sr.STEP: sr.SHARE_KEYS})
    assert "secure sum train-1: this site has not begun it" in shares  # a protocol error: the run goes on
    assert _ask(app, context, _secure_exchange()).startswith("ok")
    line = "PolicyRefusal: secure sum train-1: this site's input could not enter the sum; it takes no further part"
    assert _ask(app, context, {**step, sr.STEP: sr.MASK}).startswith(line)
    for config in ({**step, sr.STEP: sr.REVEAL}, {protocol.STAGE: protocol.STAGE_STATISTICS}, _secure_exchange("x")):
        assert _ask(app, context, config).startswith(line)
