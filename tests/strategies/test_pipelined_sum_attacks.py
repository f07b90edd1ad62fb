"""A deviating server against the pipelined secure sum: a sum set up within the previous sum's messages
(its keys with the phase replies, its key shares with the reveal) and masked by the phase message that
carries its mask request, whose reply signs the site's full list; when a site drops, the others' inputs move
to a fresh sum. Real sites behind fedhead's secure mod; the server is the secure
aggregator, and the attacker changes its messages on the way. Each attempt is refused with one line."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from app_helpers import FakeGrid, instruction
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.primitives.asymmetric import generate_key_pairs, public_key_to_bytes
from test_aggregators import NODES, ROSTER, C, P, _phase, _replies, _settings, _sites
from test_secure_strategy import behind_secure_mod

from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.secure_sum import PublicKeys
from fedhead.strategies.aggregator import Phase
from fedhead.strategies.secure import SumSetup
from fedhead.strategies.secure_aggregator import SecureAggregator
from fedhead.strategies.secure_steps import stage_messages


def _first_sum(handlers: dict | None = None):
    """Round 1's training sum, which sets up round 1's evaluation sum: the aggregator, the sites, the grid and
    the evaluation phase."""
    settings = _settings()
    exchange = _phase("train", settings).exchange
    counts = [int(c) for c in exchange.moments.counts]
    sites = behind_secure_mod(_sites(counts))
    grid = FakeGrid(handlers(sites) if handlers else sites)
    secure = SecureAggregator(SumSetup(ROSTER))
    train = Phase("train", 1, exchange, settings, sent=NODES, grid=grid, head_shape=(C, P), next_sum="evaluate-1")
    secure.aggregate_train(train, _replies(grid.handlers, "train", secure, train))
    evaluate = Phase("evaluate", 1, exchange, settings, sent=NODES, grid=grid, head_shape=(C, P), next_sum="train-2")
    return secure, sites, evaluate


def _messages(secure: SecureAggregator, phase: Phase) -> dict[int, Message]:
    """The evaluation phase's messages as the aggregator addresses them, by node."""
    config = ConfigRecord({protocol.SERVER_ROUND: 1})
    content = RecordDict({protocol.HEAD: protocol.head_record(*phase.broadcast or _head()), protocol.CONFIG: config})
    messages = secure.address(phase, [instruction(n, "evaluate", content) for n in NODES])
    return {int(m.metadata.dst_node_id): m for m in messages}


def _head() -> tuple[np.ndarray, np.ndarray]:
    return np.eye(C, P), np.zeros(C)


def _answer(handler, msg: Message) -> str:
    """``ok`` and what the reply carries, or the refusal's one line."""
    try:
        reply = handler(msg)
    except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp is an error reply
        return f"{type(exc).__name__}: {exc}"
    return "ok " + " ".join(sorted(reply.content))


def _with_config(msg: Message, **changes) -> Message:
    content = RecordDict(dict(msg.content.items()))
    config = ConfigRecord(dict(content.config_records[protocol.CONFIG]))
    config.update(changes)
    content[protocol.CONFIG] = config
    return Message(content=content, dst_node_id=msg.metadata.dst_node_id, message_type=msg.metadata.message_type)


def test_the_honest_pipeline_masks_with_the_phase_message(task_identity):
    secure, sites, evaluate = _first_sum()
    messages = _messages(secure, evaluate)
    assert all(sr.SECURE in m.content.config_records for m in messages.values())  # each carries its mask request
    # the masked input at once with the signature of the site's full list, and its keys for the sum after
    assert {_answer(sites[n], messages[n]) for n in NODES} == {"ok metrics secure secure-next secure-signed"}


def test_a_mask_request_for_a_sum_the_site_did_not_set_up_is_refused(task_identity):
    secure, sites, evaluate = _first_sum()
    other = secure.setup.sum_id("evaluate-9")
    answer = _answer(sites[57], _with_config(_messages(secure, evaluate)[57], **{sr.SUM_ID: other}))
    assert answer.startswith("PolicyRefusal") and "takes no further part in this run" in answer


def test_a_replayed_phase_message_of_a_set_up_sum_is_refused(task_identity):
    secure, sites, evaluate = _first_sum()
    msg = _messages(secure, evaluate)[33]
    assert _answer(sites[33], msg) == "ok metrics secure secure-next secure-signed"
    again = _answer(sites[33], msg)
    assert again == "PolicyRefusal: refused: this site releases evaluate round 1 once per run, into one secure sum"


def test_a_phase_message_reissued_under_another_sum_id_gets_no_fresh_release(task_identity):
    secure, sites, evaluate = _first_sum()
    msg = _messages(secure, evaluate)[33]
    assert _answer(sites[33], msg) == "ok metrics secure secure-next secure-signed"
    content = RecordDict(dict(msg.content.items()))
    del content[sr.SECURE]  # a fresh sum of the same phase, as one that starts with its own keys
    renamed = Message(content=content, dst_node_id=33, message_type="evaluate")
    renamed = _with_config(renamed, **{sr.SUM_ID: secure.setup.sum_id("evaluate-1-again")})
    answer = _answer(sites[33], renamed)
    assert answer == "PolicyRefusal: refused: this site releases evaluate round 1 once per run, into one secure sum"


def test_a_mask_request_that_withholds_the_peers_shares_is_refused(task_identity):
    secure, sites, evaluate = _first_sum()
    msg = _messages(secure, evaluate)[12]
    ciphertexts, encoding = sr.unpack_mask_request(sr.payload_of(msg.content.config_records[sr.SECURE]))
    one = dict(list(ciphertexts.items())[:1])  # t = 3 of 4: the site masks with at least 2 peers
    content = RecordDict(dict(msg.content.items()))
    content[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack_mask_request(one, encoding)})
    tampered = Message(content=content, dst_node_id=12, message_type="evaluate")
    answer = _answer(sites[12], tampered)
    assert answer.startswith("PolicyRefusal") and "takes no further part in this run" in answer


def test_a_mask_request_of_another_encoding_is_refused_naming_both(task_identity):
    secure, sites, evaluate = _first_sum()
    msg = _messages(secure, evaluate)[101]
    ciphertexts, encoding = sr.unpack_mask_request(sr.payload_of(msg.content.config_records[sr.SECURE]))
    coarse = dataclasses.replace(encoding, frac_bits=8)  # each site would round to a step of the server's choice
    content = RecordDict(dict(msg.content.items()))
    content[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack_mask_request(ciphertexts, coarse)})
    answer = _answer(sites[101], Message(content=content, dst_node_id=101, message_type="evaluate"))
    assert answer.startswith("PolicyRefusal: secure sum: the mask request's encoding (8 fractional bits")
    assert "is not this sum's encoding for 4 sites" in answer


@pytest.mark.parametrize("which", ["this sum's", "a used one"])
def test_a_next_sum_of_a_used_id_is_refused(task_identity, which):
    secure, sites, evaluate = _first_sum()
    msg = _messages(secure, evaluate)[101]
    used = secure.setup.sum_id("evaluate-1" if which == "this sum's" else "train-1")
    answer = _answer(sites[101], _with_config(msg, **{sr.NEXT_SUM: used}))
    assert answer.startswith("PolicyRefusal") and used in answer
    assert ("next sum must differ" in answer) if which == "this sum's" else ("already took part" in answer)


def _substitute_next_key(target: int):
    """Handlers whose ``target`` receives the next sum's key book with site 33's keys replaced."""

    def wrap(sites: dict) -> dict:
        def tampering(msg: Message) -> Message:
            if sr.NEXT in msg.content.config_records and msg.metadata.dst_node_id == target:
                book, t = sr.unpack_book(sr.payload_of(msg.content.config_records[sr.NEXT]))
                fresh = public_key_to_bytes(generate_key_pairs()[1])
                book[33] = PublicKeys(fresh, book[33].mask, book[33].name, book[33].signature)
                msg.content[sr.NEXT] = ConfigRecord({sr.PAYLOAD: sr.pack_book(book, t)})
            return sites[target](msg)

        return {**sites, target: tampering}

    return wrap


def test_a_substituted_key_in_the_next_sums_book_keeps_the_site_out_of_that_sum(task_identity, caplog):
    with caplog.at_level(logging.WARNING):
        secure, sites, evaluate = _first_sum(_substitute_next_key(57))
    assert any("not 'partition-2''s signed advertisement" in r.getMessage() for r in caplog.records)
    prepared = secure.setup.pipeline.prepared
    assert prepared is not None and 57 not in prepared.routed  # it shared no keys for the tampered book
    messages = _messages(secure, evaluate)
    assert sr.SECURE not in messages[57].content.config_records
    forged = RecordDict(dict(messages[57].content.items()))
    forged[sr.SECURE] = messages[12].content.config_records[sr.SECURE]  # another site's mask request
    answer = _answer(sites[57], Message(content=forged, dst_node_id=57, message_type="evaluate"))
    assert answer.startswith("PolicyRefusal") and "takes no further part in this run" in answer


def _masked_everywhere(secure: SecureAggregator, sites: dict, evaluate: Phase) -> None:
    """Every site answers the evaluation's phase message: its masked input, signed in full."""
    messages = _messages(secure, evaluate)
    assert {_answer(sites[n], messages[n]) for n in NODES} == {"ok metrics secure secure-next secure-signed"}


def _step_message(node: int, sum_id: str, step: str, payload: bytes) -> Message:
    return stage_messages({node: payload}, sum_id, step, {})[0]


def test_an_input_moves_to_a_fresh_sum_once_and_the_old_sum_is_over_for_it(task_identity):
    secure, sites, evaluate = _first_sum()
    _masked_everywhere(secure, sites, evaluate)
    old = secure.setup.pipeline.sum_id(secure.setup.sum_id("evaluate-1"))
    fresh = f"{old}~"
    assert _answer(sites[12], _step_message(12, old, sr.RESUM, fresh.encode())) == "ok secure"  # its keys
    again = _answer(sites[12], _step_message(12, old, sr.RESUM, f"{old}~~".encode()))
    assert again.startswith("ClientError") and "not in that sum now" in again
    chained = _answer(sites[12], _step_message(12, fresh, sr.RESUM, f"{old}~~".encode()))
    assert chained.startswith("ClientError") and "is at stage 1 of it" in chained
    reveal = _answer(sites[12], _step_message(12, old, sr.REVEAL, b"{}"))
    assert reveal.startswith("ClientError") and "has not begun it" in reveal


def test_an_input_does_not_move_to_a_used_sum_id(task_identity):
    secure, sites, evaluate = _first_sum()
    _masked_everywhere(secure, sites, evaluate)
    old = secure.setup.pipeline.sum_id(secure.setup.sum_id("evaluate-1"))
    used = secure.setup.sum_id("train-1")
    answer = _answer(sites[57], _step_message(57, old, sr.RESUM, used.encode()))
    assert answer.startswith("PolicyRefusal") and "already took part in a sum" in answer
    # the old sum is untouched: its input may still move to a fresh id
    assert _answer(sites[57], _step_message(57, old, sr.RESUM, f"{old}~".encode())) == "ok secure"


def test_an_input_revealed_for_does_not_move(task_identity):
    secure, sites, evaluate = _first_sum()
    messages = _messages(secure, evaluate)
    old = secure.setup.pipeline.sum_id(secure.setup.sum_id("evaluate-1"))
    replies = [sites[n](messages[n]) for n in NODES]
    secure.aggregate_evaluate(evaluate, replies)  # the honest sum: every site reveals
    answer = _answer(sites[101], _step_message(101, old, sr.RESUM, f"{old}~".encode()))
    assert answer.startswith("ClientError") and "keeps no input of that sum" in answer
