"""The secure sum's path without a survivor-list phase: each site signs its full list ``(U2_u + {u}, {})``
with its masked input ([`SecureSumClient.mask_and_sign`][fedhead.federation.secure_site.SecureSumClient.mask_and_sign]),
its one list of the sum; when a site then drops, the others' inputs move to a fresh sum
([`SecureSumClient.move_out`][fedhead.federation.secure_site.SecureSumClient.move_out]). A deviating server
(tests/federation/malicious_server.py) tries to get a second list signed, shares of both kinds, or the same
inputs unmasked in two sums; each attempt is refused in one line and nothing decodes but the whole sum."""

from __future__ import annotations

import numpy as np
import pytest
from malicious_server import Attacker, assert_nothing_decodes, attempt
from secure_helpers import Run

from fedhead.federation.ring_encoding import ring_add
from fedhead.federation.secure_sum import SecureSumError, Unmasking


def _fast(m: int, t: int, *, drop: tuple[int, ...] = ()) -> Attacker:
    """Every site shares its keys with the genuine book, then all but ``drop`` mask with every peer and sign
    their full lists."""
    a = Attacker(m, t)
    for s in a.sites:
        a.share_keys(s)
    for s in a.sites:
        if s not in drop:
            a.mask_and_sign(s, [v for v in a.sites if v != s])
    return a


def _full(a: Attacker) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(sorted(a.sites)), ()


def test_an_honest_fast_sum_decodes_the_whole_sum_and_nothing_else():
    a = _fast(5, 3)
    assert set(a.signatures) == {_full(a)}  # every site signed the same list, the full one
    for s in a.sites:
        a.reveal(s, *_full(a))
    assert_nothing_decodes(a)  # no site's input, no strict part's sum
    expected = np.zeros_like(a.encoded(a.sites[0]))
    for s in a.sites:
        expected = ring_add(expected, a.encoded(s), a.enc.words)
    assert np.array_equal(a.candidates()[_full(a)[0]], expected)


def test_the_server_side_of_a_fast_sum_unmasks_the_sum_over_all_sites():
    run = Run(4)
    masked, signatures = {}, {}
    for s in run.sites:
        masked[s], signatures[s] = run.clients[s].mask_and_sign(run.routed[s], run.xs[s], run.enc)
    unmasking = run.server.collect_masked(masked)
    assert unmasking.dropped == ()
    request = run.server.collect_signatures(signatures)
    result = run.server.unmask(run.reveal(request))
    np.testing.assert_allclose(result.total, sum(run.xs.values()), rtol=0, atol=1e-9)
    assert result.survivors == tuple(sorted(run.sites)) and result.dropped == ()


def test_a_site_that_signed_its_full_list_signs_no_other():
    a = _fast(5, 3)
    u = a.sites[0]
    rest = tuple(s for s in a.sites if s != u)
    for s in rest:  # the server claims u dropped, to get u's mask key revealed
        line = attempt(lambda s=s: a.sign(s, rest, (u,)))
        assert line is not None and "asked for stage 4 (sign the survivors) after stage 4" in line


def test_a_claimed_dropout_after_the_full_lists_reveals_no_mask_key():
    a = _fast(5, 3)
    u = a.sites[0]
    rest = tuple(sorted(s for s in a.sites if s != u))
    forged = {s: a.signatures[_full(a)][s] for s in rest}  # signatures of the full list, shown for another
    for s in rest:
        line = attempt(lambda s=s: a.reveal(s, rest, (u,), forged))
        assert line is not None and "another list than the one it signed" in line
    assert not a.key_shares  # no sk-share of anyone
    assert_nothing_decodes(a)


def test_a_dropout_leaves_a_fast_sum_undecodable_and_reveals_no_mask_key():
    dropped = Attacker(4, 3).sites[0]
    a = _fast(4, 3, drop=(dropped,))
    signers = dict(a.signatures[_full(a)])
    assert dropped not in signers  # it dropped before it masked: it signed nothing
    for s in signers:  # t = 3 valid signatures of the full list: the sites reveal b-shares, no sk-share
        a.reveal(s, *_full(a))
    assert not a.key_shares
    assert_nothing_decodes(a)  # the dropped site's pair masks stay in every survivor's input


@pytest.mark.parametrize("revealed_first", [True, False])
def test_an_input_is_revealed_for_in_one_sum_at_most(revealed_first):
    # 3 sites, t = 2: the server wants sum 1 unmasked (the whole sum) and the same inputs in a second sum over
    # fewer sites, whose difference would be a site's input
    a = _fast(3, 2)
    first, second, third = a.sites
    if revealed_first:
        for s in (first, second):  # t sites reveal: sum 1 decodes to the whole sum, as it may
            a.reveal(s, *_full(a))
        for s in (first, second):
            line = attempt(a.clients[s].move_out)
            assert line is not None and "revealed for it" in line and "refused" in line
        a.clients[third].move_out()  # it has not revealed: its input may move, but alone it makes no sum
        later = Attacker(3, 2, after=a, sites=[first, second, third])
        assert "2 sites" in (attempt(lambda: _book_of(later, [second, third], third)) or "")
    else:
        for s in (first, second):  # the server moves two inputs out first
            a.clients[s].move_out()
        for s in (first, second):
            line = attempt(lambda s=s: a.reveal(s, *_full(a)))
            assert line is not None and "moved its input out of this sum" in line
        a.reveal(third, *_full(a))  # one site's shares: fewer than t
        assert_nothing_decodes(a)
        line = attempt(a.clients[third].move_out)
        assert line is not None and "revealed for it" in line


def _book_of(later: Attacker, sites: list[int], asker: int) -> None:
    """The second sum's stage 2 at ``asker`` with a key book of ``sites`` only."""
    later.share_keys(asker, {s: later.book[s] for s in sites}, 2)


def test_an_input_moves_only_from_a_full_list_signed_with_the_mask():
    a = Attacker(4, 3)
    for s in a.sites:
        a.share_keys(s)
    u = a.sites[0]
    a.mask(u, [v for v in a.sites if v != u])  # the survivor-list path: masked, nothing signed yet
    line = attempt(a.clients[u].move_out)
    assert line is not None and "is at stage 3 of it" in line
    a.sign(u, a.sites, ())  # the full list signed in stage 4 (not with its masked input): it may still move,
    a.clients[u].move_out()  # since it has not revealed; once moved, the sum is over for it
    line = attempt(lambda: a.reveal(u, a.sites, ()))
    assert line is not None and "moved its input out of this sum" in line
    line = attempt(a.clients[u].move_out)
    assert line is not None and "refused this sum at stage 6" in line


def test_the_fast_signature_is_given_once_and_only_after_a_valid_mask():
    a = Attacker(4, 3)
    for s in a.sites:
        a.share_keys(s)
    u = a.sites[0]
    few = a.sites[1:2]  # t = 3: u masks with at least 2 peers
    line = attempt(lambda: a.mask_and_sign(u, few))
    assert line is not None and "masks with at least 2" in line
    assert not a.signatures  # refused before it signed
    with pytest.raises(SecureSumError, match="refused this sum at stage 3"):
        a.clients[u].sign_survivors(Unmasking(tuple(a.sites), ()))
