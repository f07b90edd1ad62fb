"""The server's set-up of a next sum (``fedhead.strategies.secure_pipeline``) with hand-made sites: the key
book from the sites' signed keys, then their key shares routed; a site whose reply fails the server's checks
is left out, and too few left set nothing up."""

from __future__ import annotations

from secure_helpers import IDS, Federation

from fedhead.federation.secure_sum import KeyShares
from fedhead.strategies.secure_pipeline import next_book, prepare

SUM = "run-1/train-2"


def _set_up(m: int):
    fed = Federation(IDS[:m])
    clients = {s: fed.client(s, SUM) for s in fed.sites}
    book = next_book(SUM, {s: c.advertise() for s, c in clients.items()}, fed.roster, lambda n: n // 2 + 1)
    assert book is not None and sorted(book.book) == sorted(fed.sites)
    shares = {s: c.share_keys(book.book, book.server.threshold) for s, c in clients.items()}
    return fed, book, shares


def test_the_sites_key_shares_are_routed_to_each_other():
    fed, book, shares = _set_up(5)
    prepared = prepare(book, shares, fed.roster)
    assert prepared is not None and prepared.sum_id == SUM and sorted(prepared.routed) == sorted(fed.sites)
    for dst, routed in prepared.routed.items():
        assert routed == {src: shares[src].ciphertexts[dst] for src in fed.sites if src != dst}


def test_a_malformed_share_reply_is_left_out_and_the_others_routed():
    fed, book, shares = _set_up(5)
    bad = fed.sites[1]
    shares[bad] = KeyShares({}, shares[bad].seed_digest)  # no ciphertext for any peer
    prepared = prepare(book, shares, fed.roster)
    assert prepared is not None and bad not in prepared.routed and len(prepared.routed) == 4
    assert all(bad not in routed for routed in prepared.routed.values())


def test_too_few_valid_share_replies_set_nothing_up():
    fed, book, shares = _set_up(5)  # t = 3
    for bad in fed.sites[:3]:
        shares[bad] = KeyShares({}, shares[bad].seed_digest)
    assert prepare(book, shares, fed.roster) is None
