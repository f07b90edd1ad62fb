"""A deviating server against the steps of a secure sum at fedhead's ClientApp: three real sites run a
sum's first steps from hand-made messages.

The encoding: the server sends one site a mask request of its own encoding. A bound below the site's
largest entry made the site refuse exactly when its values exceed it (an oracle on their magnitude, one
bit per sum); fewer fractional bits made each site round its entries to a step of the server's choosing
(per-site rounding in the sum). The site now takes only the encoding it derives from its vector's public
bound and the key book, whatever its values.

Replays: a step or a phase message sent again, before or after the node restarted (a fresh node state, the
same state-dir), gets a refusal; so does a sum id of an earlier run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_helpers import simulated_sites, table_job, write_table
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedhead.clients import make_client_app
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.ring_encoding import RingFixedPoint

ROWS = 40
SITES = simulated_sites(3)
SUM = "attack/exchange"


def _rows(n: int, seed: int, scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = scale * (x @ np.array([[1.0, 0.5], [-0.5, 2.0]]) + rng.normal(size=(n, 2)) + 3.0)
    return {"f1": x[:, 0], "f2": x[:, 1], "t1": y[:, 0], "t2": y[:, 1]}


def _send(app, context: Context, config: dict, payload: bytes | None = None):
    records = {protocol.CONFIG: ConfigRecord(config)}
    if payload is not None:
        records[sr.SECURE] = ConfigRecord({sr.PAYLOAD: payload})
    message = Message(content=RecordDict(records), dst_node_id=context.node_id, message_type="query")
    return app(message, context)


def _mask(app, context: Context, ciphertexts: dict[int, bytes], encoding: RingFixedPoint) -> str:
    """The mask step's answer as the server sees it: ``ok`` or the one line the site refused with (flwr sends a
    raising ClientApp's error as its reply)."""
    try:
        _send(app, context, _step(sr.MASK), sr.pack_mask_request(ciphertexts, encoding))
    except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp is an error reply
        return f"{type(exc).__name__}: {exc}"
    return "ok"


BEGIN = {protocol.STAGE: protocol.STAGE_STATISTICS, sr.SUM_ID: SUM}  # the phase message that begins the sum


def _step(step: str) -> dict:
    return {protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: SUM, sr.STEP: step}


def _contexts(tmp_path: Path, target_scale: float, run_id: int, state_dir: bool = False) -> list[Context]:
    """Three sites (site 0's targets scaled by ``target_scale``), with a ``state-dir`` each or not."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    contexts = []
    for i in range(3):
        path = tmp_path / f"site-{i}-{target_scale:g}.csv"
        if not path.exists():
            write_table(path, _rows(ROWS, i, target_scale if i == 0 else 1.0))
        node = {"partition-id": i, "data-path": str(path)} | (
            {"state-dir": str(tmp_path / f"state-{i}")} if state_dir else {}
        )
        contexts.append(Context(run_id=run_id, node_id=1000 + i, node_config=node, state=RecordDict(), run_config={}))
    return contexts


def _run_to_mask(tmp_path: Path, target_scale: float, run_id: int, state_dir: bool = False):
    """Three sites (site 0's targets scaled by ``target_scale``) begin the exchange's sum and share their keys;
    returns the app, the contexts and each site's routed ciphertexts (the mask step is the attacker's)."""
    job = table_job(tmp_path / "out", "dataset.num_clients=3", "rounds=1", "procedure=exact", "privacy.mode=secure")
    app = make_client_app(job, SITES)
    contexts = _contexts(tmp_path, target_scale, run_id, state_dir)
    replies = {c.node_id: _send(app, c, BEGIN).content.config_records[sr.SECURE] for c in contexts}
    book = {node: sr.unpack_keys(sr.payload_of(record)) for node, record in replies.items()}
    blob = sr.pack_book(book, 2)
    routed: dict[int, dict[int, bytes]] = {c.node_id: {} for c in contexts}
    for c in contexts:
        reply = _send(app, c, _step(sr.SHARE_KEYS), blob)
        shares = sr.unpack_shares(sr.payload_of(reply.content.config_records[sr.SECURE]))
        for dst, token in shares.ciphertexts.items():
            routed[dst][c.node_id] = token
    return app, contexts, routed, blob


def _entries() -> int:
    return sr.moment_length(2) + 2 * 2  # a site-local table's statistics: two targets, two inputs


HONEST = sr.encoding_for(sr.statistics_bound(), 3)
ATTACKS = {
    "a bound between the two sites' largest entries": RingFixedPoint.for_sites(ROWS * 1e3, 3, words=2),
    "the honest bound at 8 fractional bits": RingFixedPoint(8, HONEST.bound, HONEST.words),
    "the honest bound in more words": RingFixedPoint(HONEST.frac_bits, HONEST.bound, HONEST.words + 1),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_mask_request_of_the_servers_encoding_is_refused_alike_whatever_the_values(tmp_path, task_identity, attack):
    """Old: the site masked with any encoding whose bound its entries kept (a small site's went through, a
    large one's was refused: the magnitude's bit, one per sum), and with any number of fractional bits.
    Now: both sites give the same one-line refusal, naming the encoding (nothing of the values), and then
    mask with the honest encoding alike."""
    CLIENT_CACHE.clear()
    answers = {}
    for scale in (1.0, 1e4):  # site 0's statistics: entries below 40e3, then far above
        app, contexts, routed, _ = _run_to_mask(tmp_path / attack.replace(" ", "-"), scale, run_id=int(scale))
        target = contexts[0]
        answers[scale] = [_mask(app, target, routed[target.node_id], enc) for enc in (ATTACKS[attack], HONEST)]
        other = contexts[1]  # the other sites take the honest encoding
        assert _mask(app, other, routed[other.node_id], HONEST) == "ok"
    assert answers[1.0] == answers[1e4], answers
    refusal, honest = answers[1.0]
    assert honest == "ok", honest
    assert refusal.startswith("PolicyRefusal: secure sum: the mask request's encoding (") and "\n" not in refusal
    own = f"({HONEST.frac_bits} fractional bits, bound {HONEST.bound:g}, {HONEST.words} words); refused"
    assert refusal.endswith(f"is not this sum's encoding for 3 sites {own}"), refusal


def test_the_honest_encoding_goes_through_at_every_site(tmp_path, task_identity):
    CLIENT_CACHE.clear()
    app, contexts, routed, _ = _run_to_mask(tmp_path, 1e4, run_id=5)
    for c in contexts:
        reply = _send(app, c, _step(sr.MASK), sr.pack_mask_request(routed[c.node_id], HONEST))
        assert reply.content.array_records[sr.SECURE][sr.MASKED].numpy().size == HONEST.width(_entries())


def test_an_input_beyond_its_public_bound_is_refused_before_any_key_is_sent(task_identity):
    """The site checks its own range when it begins a sum (the bound comes from run constants, so one answer per
    run: the mod then refuses the run); nothing of the sum is kept."""
    from fedhead.clients.identity import site_identity
    from fedhead.clients.messages import ClientError
    from fedhead.clients.secure import begin_sum

    context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    config = ConfigRecord({protocol.STAGE: protocol.STAGE_STATISTICS, sr.SUM_ID: SUM})
    msg = Message(content=RecordDict({protocol.CONFIG: config}), dst_node_id=1000, message_type="query")
    identity = site_identity(context, SITES)
    with pytest.raises(ClientError, match=r"^secure sum attack/exchange: this site's input exceeds the sum's public"):
        begin_sum(msg, context, np.array([0.5, -2.0]), {}, identity=identity, floor=2, bound=1.0)
    assert not context.state.config_records and not context.state.array_records
    reply = begin_sum(msg, context, np.array([0.5, -1.0]), {}, identity=identity, floor=2, bound=1.0)
    assert sr.SECURE in reply.config_records


def _answer(app, context: Context, config: dict, payload: bytes | None = None) -> str:
    try:
        _send(app, context, config, payload)
    except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp is an error reply
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_a_replayed_step_or_sum_id_stays_refused_across_a_restart_of_the_node(tmp_path, task_identity):
    """The ledger's one record of sum ids (in the state-dir) and the sum's stage (in the node state): a replay
    before the restart meets the stage, after it the record; an earlier run's sum id meets the record."""
    CLIENT_CACHE.clear()
    app, contexts, routed, book = _run_to_mask(tmp_path, 1.0, run_id=7, state_dir=True)
    site = contexts[0]
    assert _mask(app, site, routed[site.node_id], HONEST) == "ok"
    stage = _answer(app, site, _step(sr.SHARE_KEYS), book)
    assert stage.startswith("ClientError: secure sum attack/exchange, step share-keys: ") and "after stage 3" in stage
    begun = (
        "PolicyRefusal: refused: secure sum attack/exchange was begun before (one release per sum id, over all runs)"
    )
    once = "PolicyRefusal: refused: this site releases the exchange once per run, into one secure sum"
    assert _answer(app, site, BEGIN) == once
    for run_id, refusal in ((7, once), (8, begun)):  # a restarted node (same state-dir): the same run, the next
        fresh = _contexts(tmp_path, 1.0, run_id, state_dir=True)[0]
        assert _answer(app, fresh, BEGIN) == refusal
        lost = _answer(app, fresh, _step(sr.SHARE_KEYS), book)
        assert lost.startswith("ClientError: secure sum attack/exchange: this site has not begun it"), lost
    assert _mask(app, fresh, routed[site.node_id], HONEST).startswith("PolicyRefusal: secure sum attack/exchange: ")


def test_a_sites_noise_is_not_a_function_of_the_run_config(tmp_path, task_identity):
    """A server that knows the run config (its ``seed`` included) cannot predict a site's noise: the same site,
    the same run config, twice, keeps two different noised vectors for its sum (the OS's entropy)."""
    CLIENT_CACHE.clear()
    dp = ("privacy.dp_noise=1", "privacy.dp_max_rows=60", "seed=3")
    job = table_job(tmp_path / "out", "dataset.num_clients=3", "procedure=exact", "privacy.mode=secure", *dp)
    app = make_client_app(job, SITES)
    kept = []
    for _ in range(2):
        site = _contexts(tmp_path, 1.0, run_id=4)[0]
        _send(app, site, BEGIN)
        kept.append(site.state.array_records["secure-sum-state-values"]["values"].numpy())
    assert kept[0].shape == kept[1].shape == (_entries(),) and np.all(kept[0] != kept[1])
