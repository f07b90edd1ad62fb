"""The secure sum against a deviating server (tests/federation/malicious_server.py drives it)."""

from __future__ import annotations

import pytest
from malicious_server import Attacker, assert_nothing_decodes


def _original_attack(m: int, t: int) -> Attacker:
    """The reviewer's attack: u gets the shares of t-1 peers only and masks with them; the others are told
    that u survived and its peers dropped, each peer that u and the other peers survived."""
    a = Attacker(m, t)
    u, peers, others = a.sites[0], a.sites[1:t], a.sites[t:]
    a.mask(u, peers)
    for s in a.sites[1:]:
        a.mask(s, [v for v in a.sites if v != s])
    for w in others:
        a.reveal(w, [u, *others], peers)
    for v in peers:
        a.reveal(v, [u, v, *others][: max(t, 3)], [p for p in peers if p != v])
    return a


@pytest.mark.parametrize("m, t", [(5, 3), (7, 4)])
def test_the_original_attack_reads_the_targets_input(m, t):
    a = _original_attack(m, t)
    assert a.recovered(a.sites[0])


def test_the_harness_sees_the_leak_and_an_honest_run_has_none():
    with pytest.raises(AssertionError, match=r"decodes .*: \{\(18446744073709551615,\): \(18446744073709551615,\)\}$"):
        assert_nothing_decodes(_original_attack(5, 3))
    honest = Attacker(5, 3)
    for s in honest.sites:
        honest.mask(s, [v for v in honest.sites if v != s])
    for s in honest.sites:
        honest.reveal(s, honest.sites, ())
    assert_nothing_decodes(honest)
    total = honest.candidates()[tuple(sorted(honest.sites))]
    assert (total == sum(honest.encoded(s) for s in honest.sites)).all()  # the whole sum, as it should
