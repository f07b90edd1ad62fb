"""The secure sum against a deviating server (tests/federation/malicious_server.py drives honest sites):
every attack ends with the honest sites refusing in one line, and nothing the attacker holds decodes
to a site's input or to the sum of a strict subset of the sites. The withholding attack succeeds
exactly when ``n_C >= 2t - M`` sites collude (the bound of fedhead.federation.secure_sum is tight)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
from malicious_server import Attacker, assert_nothing_decodes, attempt
from secure_helpers import IDS, Federation, Given, ring_sum

from fedhead.federation import secure_records as sr
from fedhead.federation.ring_encoding import RingFixedPoint
from fedhead.federation.roster import new_signing_key, sign_advertisement
from fedhead.federation.secure_sum import PublicKeys, SecureSumError, Unmasking


def _start(a: Attacker, full_mask: Iterable[int] = ()) -> None:
    """Stage 2 at every site with the genuine book; stage 3 with every peer at ``full_mask``."""
    for s in a.sites:
        a.share_keys(s)
    for s in full_mask:
        a.mask(s, [v for v in a.sites if v != s])


def _everyone_else(a: Attacker, u: int) -> list[int]:
    return [s for s in a.sites if s != u]


def _honest(m: int, t: int) -> Attacker:
    """An attacker that runs the whole sum as the protocol says."""
    a = Attacker(m, t)
    _start(a, a.sites)
    for s in a.sites:
        a.sign(s, a.sites, ())
    for s in a.sites:
        a.reveal(s, a.sites, ())
    return a


def test_the_harness_decodes_the_whole_sum_of_an_honest_run_and_nothing_else():
    a = _honest(5, 3)
    assert_nothing_decodes(a)
    total = a.candidates()[tuple(sorted(a.sites))]
    assert (total == ring_sum(a.enc, [a.encoded(s) for s in a.sites])).all()


def _withholding(m: int, t: int, colluders: int) -> tuple[Attacker, dict[int, str | None]]:
    """The withholding attack with one list: ``u`` gets the shares of ``t - 1`` peers only (the colluders
    first), every other site all; the list names ``u``, the colluders and the sites outside ``u``'s peers
    survivors and ``u``'s honest peers dropped. Returns the attacker and each site's refusal."""
    a = Attacker(m, t, colluding=range(1, 1 + colluders))
    u = a.sites[0]
    honest_peers = a.sites[1 + colluders : t]
    peers = [*sorted(a.colluding), *honest_peers]
    others = [s for s in a.honest if s != u and s not in peers]
    _start(a, _everyone_else(a, u))
    a.mask(u, peers)
    survivors = [u, *sorted(a.colluding), *others]
    refusals = {s: attempt(lambda s=s: a.sign(s, survivors, honest_peers)) for s in [u, *sorted(a.colluding), *others]}
    for s in others:
        refusals[s] = attempt(lambda s=s: a.reveal(s, survivors, honest_peers))
    return a, refusals


@pytest.mark.parametrize("m, t", [(5, 3), (7, 4), (7, 5)])
def test_withholding_with_one_list_fails_below_the_bound(m, t):
    colluders = max(0, 2 * t - m - 1)  # the most the bound allows
    a, refusals = _withholding(m, t, colluders)
    u = a.sites[0]
    assert "holds no shares of survivor(s)" in refusals[u]
    signers = m - t + colluders
    others = [s for s in a.honest if s != u and s not in a.peers[u]]
    for s in others:
        assert refusals[s] == f"secure sum: {signers} sites signed the survivor list, the reveal needs {t}"
    assert not a.recovered(u)
    assert_nothing_decodes(a)


@pytest.mark.parametrize("m, t", [(5, 3), (7, 4), (7, 5)])
def test_withholding_reads_the_target_at_the_bound(m, t):
    """With ``n_C = 2t - M`` colluders the same attack reads ``u``'s input: the bound is tight and the
    harness's reconstruction is sound."""
    a, refusals = _withholding(m, t, 2 * t - m)
    assert all(r is None for s, r in refusals.items() if s != a.sites[0])
    assert a.recovered(a.sites[0])
    with pytest.raises(AssertionError, match=r"decodes .*\(18446744073709551615,\): \(18446744073709551615,\)"):
        assert_nothing_decodes(a)


@pytest.mark.parametrize("m, t", [(5, 3), (7, 4)])
def test_the_original_attack_reads_nothing(m, t):
    """The reviewer's attack: ``u`` masks with ``t - 1`` peers; the others are told that ``u`` survived and
    its peers dropped, each peer that ``u``, itself and some others survived; then each is asked to reveal
    (with the signatures its list got), the others also with every signature of every list."""
    a = Attacker(m, t)
    u, peers, others = a.sites[0], a.sites[1:t], a.sites[t:]
    _start(a, a.sites[1:])
    a.mask(u, peers)
    lists = {w: ([u, *others], list(peers)) for w in others}
    for v in peers:
        alive = [u, v, *others][: max(t, 3)]
        lists[v] = (alive, [s for s in a.sites if s not in alive])
    lists[u] = lists[others[0]]
    refusals = {s: attempt(lambda s=s: a.sign(s, *lists[s])) for s in a.sites}
    assert "holds no shares of survivor(s)" in refusals[u]
    assert all(refusals[s] is None for s in [*peers, *others])
    everything = {s: sig for sigs in a.signatures.values() for s, sig in sigs.items()}
    for s in [*peers, *others]:
        mixed = s == others[0]
        line = attempt(lambda s=s, m=mixed: a.reveal(s, *lists[s], everything if m else None))
        assert line is not None and ("do not verify" in line if mixed else "signed the survivor list" in line), line
    assert not a.recovered(u)
    assert_nothing_decodes(a)


def test_withholding_below_t_minus_one_peers_is_refused():
    a = Attacker(5, 3)
    u = a.sites[0]
    _start(a, _everyone_else(a, u))
    line = attempt(lambda: a.mask(u, a.sites[1:2]))
    assert line == f"secure sum: site {u} holds the key shares of 1 peers; it masks with at least 2"
    assert u not in a.masked
    assert_nothing_decodes(a)


def test_inconsistent_lists_get_no_site_unmasked():
    """Two lists: ``u`` dropped for two sites (their sk-shares of ``u``), a survivor for three (its b-shares):
    the first list gets two signatures, fewer than ``t``, so no sk-share of ``u`` is revealed."""
    a = Attacker(5, 3)
    u = a.sites[0]
    _start(a, a.sites)
    first, second = a.sites[1:3], [u, *a.sites[3:]]
    dropped_u = (_everyone_else(a, u), [u])
    for s in first:
        a.sign(s, *dropped_u)
    for s in second:
        a.sign(s, a.sites, ())
    for s in first:
        assert attempt(lambda s=s: a.reveal(s, *dropped_u)) == (
            "secure sum: 2 sites signed the survivor list, the reveal needs 3"
        )
    for s in second:  # the list every survivor is in: its sum is the protocol's own result
        a.reveal(s, a.sites, ())
    assert not a.key_shares and not a.recovered(u)
    assert_nothing_decodes(a)


@pytest.mark.parametrize("signed", [True, False])
def test_a_substituted_key_is_refused_by_every_site(signed):
    a = Attacker(4, 3)
    v = a.sites[1]
    own = Federation(IDS[7:8]).client(IDS[7]).advertise()  # a key pair the server holds
    fields = (a.sum_id, v, "site-1", own.encryption, own.mask)
    signature = sign_advertisement(new_signing_key(), *fields) if signed else b""
    book = {**a.book, v: PublicKeys(own.encryption, own.mask, "site-1", signature)}
    for s in a.sites:
        line = attempt(lambda s=s: a.share_keys(s, book))
        expected = (
            f"secure sum: the key book alters or omits site {v}'s own entry; refused"
            if s == v
            else f"secure sum: the key book's entry of site {v} is not 'site-1''s signed advertisement"
        )
        assert line == expected
    assert not a.ciphertexts  # no share was encrypted, to the server's key or any other
    assert_nothing_decodes(a)


def test_a_replayed_step_is_refused():
    a = Attacker(5, 3)
    u, v, w = a.sites[:3]
    old = a.fed.client(v, "run-1/sum-0").advertise()  # v's genuine advertisement of an earlier sum
    line = attempt(lambda: a.share_keys(w, {**a.book, v: old}))
    assert line == f"secure sum: the key book's entry of site {v} is not 'site-1''s signed advertisement"
    b = Attacker(5, 3)
    _start(b, _everyone_else(b, u))
    b.mask(u, b.sites[1:3])
    first = b.masked[u]
    line = attempt(lambda: b.mask(u, b.sites[1:4]))  # a second masked input under the same self mask
    assert line == f"secure sum: site {u} asked for stage 3 (mask) after stage 3"
    assert b.masked[u] is first
    for s in b.sites[1:]:
        b.sign(s, b.sites, ())
    line = attempt(lambda: b.sign(u, b.sites, ()))
    assert line == f"secure sum: site {u} refused this sum at stage 3; it takes no further part"
    assert_nothing_decodes(b)


def test_a_repeated_sum_id_is_refused():
    a = _honest(4, 3)
    for s in a.sites:
        line = attempt(lambda s=s: a.fed.client(s, a.sum_id))
        assert line == f"secure sum: site {s} already took part in a sum with id {a.sum_id!r}; refused"


def test_both_kinds_of_share_of_one_site_are_refused():
    a = Attacker(5, 3)
    u = a.sites[0]
    _start(a, a.sites)
    for s in a.sites:
        line = attempt(lambda s=s: a.sign(s, a.sites, [u]))
        assert line == f"secure sum: site {s} was asked for both shares of site(s) [{u}]; refused"
        line = attempt(lambda s=s: a.clients[s].reveal(Unmasking(tuple(a.sites), (u,), {})))
        assert line == f"secure sum: site {s} refused this sum at stage 4; it takes no further part"
    assert not a.seed_shares and not a.key_shares
    assert_nothing_decodes(a)


def test_a_threshold_below_the_floor_is_refused():
    """The server shows ``u`` a book of itself and two colluders with ``t = 2`` (a majority of that book)."""
    a = Attacker(5, 3, colluding=(1, 2))
    u = a.sites[0]
    small = {s: a.book[s] for s in a.sites[:3]}
    line = attempt(lambda: a.share_keys(u, small, 2))
    assert line == f"secure sum: the threshold 2 is below site {u}'s floor of 3"
    assert u not in a.ciphertexts
    assert_nothing_decodes(a)


def test_a_coarse_encoding_of_the_servers_choosing_shows_more_than_the_sum():
    """What choosing the encoding gave a server (the mask request carries it): at 0 fractional bits each site
    rounds its own entries, so the unmasked words count the sites on each side of half a step, and two input
    sets of one sum unmask to different words. In the encoding of the sum's bound they unmask alike; a site
    takes no other (``secure_records.check_encoding``, and at the ClientApp
    tests/clients/test_secure_step_attacks.py)."""
    first = {s: np.array([0.75, -0.75, 0.25]) for s in IDS[:3]}
    moved = {
        IDS[0]: np.array([1.0, -1.0, 0.5]),
        IDS[1]: np.array([0.5, -0.5, 0.25]),
        IDS[2]: np.array([0.75, -0.75, 0.0]),
    }
    np.testing.assert_array_equal(sum(first.values()), sum(moved.values()))  # dyadic: the same sum exactly
    coarse, own = RingFixedPoint(0, 1.0, 1), sr.encoding_for(1.0, 3)
    assert not np.array_equal(Given(first, coarse).run().encoded, Given(moved, coarse).run().encoded)
    np.testing.assert_array_equal(Given(first, own).run().encoded, Given(moved, own).run().encoded)
    for server_choice in (coarse, RingFixedPoint(own.frac_bits, 0.5, own.words)):
        with pytest.raises(SecureSumError, match="^secure sum: the mask request's encoding"):
            sr.check_encoding(server_choice, 1.0, 3)
