"""A site's rules against a deviating server (fedhead.federation.secure_site): the key book, the
threshold and its floor, the peers it masks with, the survivor list it signs, the signatures it
reveals on, its stages and its sum ids. Each refusal is one line naming the rule, no key bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from secure_helpers import IDS, SUM, Federation, Run

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.roster import new_signing_key, sign_advertisement, sign_survivors
from fedhead.federation.secure_site import SecureSumClient
from fedhead.federation.secure_sum import PublicKeys, SecureSumError, Unmasking


def _refused(call, message: str) -> str:
    """Run ``call``; it must raise one SecureSumError line matching ``message`` and quoting no key."""
    with pytest.raises(SecureSumError, match=message) as err:
        call()
    line = str(err.value)
    assert "\n" not in line and "KEY" not in line and line.startswith("secure sum: "), line
    return line


def _advertised(m: int = 4):
    fed = Federation(IDS[:m])
    clients = {s: fed.client(s) for s in fed.sites}
    return fed, clients, {s: c.advertise() for s, c in clients.items()}


def _signed(fed: Federation, name: str, node: int, keys: PublicKeys, sum_id: str = SUM, key=None) -> PublicKeys:
    """An advertisement of ``keys`` for ``node`` signed by roster member ``name`` (or by ``key``)."""
    signer = key or fed.keys[name]
    return PublicKeys(keys.encryption, keys.mask, name, sign_advertisement(signer, sum_id, node, name, *_pair(keys)))


def _pair(keys: PublicKeys) -> tuple[bytes, bytes]:
    return keys.encryption, keys.mask


def _own_keys() -> PublicKeys:
    """A key pair of the server's own, as an advertisement would carry it."""
    other = Federation(IDS[7:8]).client(IDS[7])
    return other.advertise()


@pytest.mark.parametrize(
    "case, message",
    [
        ("stranger", r"entry of site 17 names 'mallory', who is not in the roster$"),
        ("substituted", r"entry of site 17 is not 'site-1''s signed advertisement$"),
        ("unsigned", r"entry of site 17 is not 'site-1''s signed advertisement$"),
        ("other sum", r"entry of site 17 is not 'site-1''s signed advertisement$"),
        ("other node", r"entry of site 17 is not 'site-2''s signed advertisement$"),
        ("name twice", r"sites 17 and 9223372036854775813 both claim roster name 'site-2'; refused$"),
        ("own altered", r"the key book alters or omits site 18446744073709551615's own entry; refused$"),
        ("own omitted", r"the key book alters or omits site 18446744073709551615's own entry; refused$"),
        ("key twice", r"the key book repeats a public key; refused$"),
        ("two sites", r"the key book holds 2 sites, a secure sum needs at least 3; refused$"),
    ],
)
def test_a_site_refuses_a_key_book_that_breaks_a_rule(case, message):
    fed, clients, book = _advertised()
    u, v, w = IDS[0], IDS[1], IDS[2]
    own = _own_keys()
    if case == "stranger":
        book[v] = _signed(fed, "mallory", v, own, key=new_signing_key())
    elif case == "substituted":  # the server's own key pair under v's name, signed by a key outside the roster
        book[v] = _signed(fed, "site-1", v, own, key=new_signing_key())
    elif case == "unsigned":
        book[v] = replace(own, name="site-1", signature=b"")
    elif case == "other sum":  # v's genuine advertisement of another sum, replayed
        book[v] = _signed(fed, "site-1", v, book[v], sum_id="run-1/sum-0")
    elif case == "other node":  # w's genuine advertisement under v's node id
        book[v] = book[w]
    elif case == "name twice":  # a colluding member w advertises under two node ids
        book[v] = _signed(fed, "site-2", v, own)
    elif case == "own altered":
        book[u] = replace(book[u], mask=book[v].mask)
    elif case == "own omitted":
        del book[u]
    elif case == "two sites":
        book = {u: book[u], v: book[v]}
    else:  # w signs an advertisement of v's public keys
        book[w] = _signed(fed, "site-2", w, book[v])
    _refused(lambda: clients[u].share_keys(book, 3), message)
    _refused(lambda: clients[u].mask({}, [1.0], None), "refused this sum at stage 2; it takes no further part")


def test_a_site_refuses_a_threshold_below_its_floor_or_below_a_majority():
    fed, _, book = _advertised(5)
    for floor, t, message in [
        (4, 3, r"the threshold 3 is below site 17's floor of 4$"),
        (2, 2, r"the threshold must be an integer in \[3, 5\] for 5 sites"),
    ]:
        client = fed.client(IDS[1], f"sum-{floor}", min_survivors=floor)
        entries = {**book, IDS[1]: client.advertise()}
        entries = {s: _signed(fed, k.name, s, k, sum_id=f"sum-{floor}") for s, k in entries.items()}
        _refused(lambda c=client, e=entries, t=t: c.share_keys(e, t), message)
    with pytest.raises(ConfigError, match="min_survivors must be an integer >= 2"):
        fed.client(IDS[0], "sum-x", min_survivors=1)


def test_a_site_masks_only_with_the_peers_whose_shares_it_holds_and_enough_of_them():
    run = Run(5)
    u = run.sites[0]
    one_peer = dict(list(run.routed[u].items())[:1])
    _refused(
        lambda: run.clients[u].mask(one_peer, run.xs[u], run.enc),
        rf"^secure sum: site {u} holds the key shares of 1 peers; it masks with at least 2$",
    )
    v = run.sites[1]
    two_peers = dict(list(run.routed[v].items())[:2])
    run.clients[v].mask(two_peers, run.xs[v], run.enc)
    assert run.clients[v]._peers == tuple(sorted(two_peers))  # t - 1 peers: it masks with exactly those


@pytest.mark.parametrize(
    "case, message",
    [
        ("both", r"asked for both shares of site\(s\) \[17\]; refused$"),
        ("not me", r"asked to unmask but is not named a survivor$"),
        ("stranger", r"holds no shares of survivor\(s\) \[424242\]$"),
        ("not the rest", r"the dropped sites \[\] are not the rest of site 3's peers \[17\]; refused$"),
        ("too few", r"2 sites survived, the threshold is 3$"),
    ],
)
def test_a_site_signs_only_a_list_within_its_peers(case, message):
    run = Run(5)
    alive = run.mask().survivors  # (3, 17, 123456789, 2^63 + 5, 2^64 - 1)
    u = alive[0]
    lists = {
        "both": Unmasking(alive, (17,)),
        "not me": Unmasking(alive[1:], ()),
        "stranger": Unmasking((*alive, 424242), ()),
        "not the rest": Unmasking(tuple(s for s in alive if s != 17), ()),
        "too few": Unmasking(alive[:2], alive[2:]),
    }
    _refused(lambda: run.clients[u].sign_survivors(lists[case]), message)


def test_a_site_signs_one_list_once():
    run = Run(5)
    unmasking = run.mask()
    u = unmasking.survivors[0]
    run.clients[u].sign_survivors(unmasking)
    other = Unmasking(unmasking.survivors[:4], unmasking.survivors[4:])
    _refused(lambda: run.clients[u].sign_survivors(other), r"stage 4 \(sign the survivors\) after stage 4$")


@pytest.mark.parametrize("case", ["other list", "forged", "wrong list", "outsider", "too few"])
def test_a_site_reveals_only_on_enough_valid_signatures_of_the_list_it_signed(case):
    run = Run(5)
    unmasking = run.mask()
    signatures = {s: run.clients[s].sign_survivors(unmasking) for s in unmasking.survivors}
    u, v = unmasking.survivors[:2]
    fed = run.fed
    other = Unmasking(unmasking.survivors[:4], unmasking.survivors[4:])
    message = {
        "other list": rf"site {u} was asked to reveal for another list than the one it signed; refused$",
        "forged": rf"the survivor-list signature\(s\) of site\(s\) \[{v}\] do not verify; refused$",
        "wrong list": rf"the survivor-list signature\(s\) of site\(s\) \[{v}\] do not verify; refused$",
        "outsider": r"the survivor-list signature\(s\) of site\(s\) \[424242\] do not verify; refused$",
        "too few": r"2 sites signed the survivor list, the reveal needs 3$",
    }[case]
    if case == "other list":
        request = Unmasking(other.survivors, other.dropped, signatures)
    elif case == "forged":
        request = replace(
            unmasking, signatures={**signatures, v: sign_survivors(new_signing_key(), SUM, *_lists(unmasking))}
        )
    elif case == "wrong list":
        request = replace(
            unmasking, signatures={**signatures, v: sign_survivors(fed.keys[fed.names[v]], SUM, *_lists(other))}
        )
    elif case == "outsider":
        request = replace(unmasking, signatures={**signatures, 424242: signatures[v]})
    else:
        request = replace(unmasking, signatures={s: signatures[s] for s in (u, v)})
    _refused(lambda: run.clients[u].reveal(request), message)
    _refused(lambda: run.clients[u].reveal(replace(unmasking, signatures=signatures)), "refused this sum at stage 5")


def _lists(unmasking: Unmasking):
    return unmasking.survivors, unmasking.dropped


def test_a_site_runs_each_stage_once_in_order_and_a_refusal_ends_its_part():
    run = Run(3)
    u = run.sites[0]
    run.clients[u].mask(run.routed[u], run.xs[u], run.enc)
    _refused(lambda: run.clients[u].mask(run.routed[u], run.xs[u] + 1.0, run.enc), r"stage 3 \(mask\) after stage 3$")
    _refused(lambda: run.clients[u].share_keys(run.book, 2), r"refused this sum at stage 3; it takes no further part$")
    v = run.sites[1]
    _refused(lambda: run.clients[v].share_keys(run.book, 2), r"stage 2 \(share keys\) after stage 2$")  # a replay
    fresh = run.fed.client(u, "sum-2")
    _refused(lambda: fresh.reveal(Unmasking((), ())), r"stage 5 \(reveal\) before stage 1$")
    _refused(lambda: fresh.advertise(), r"refused this sum at stage 5; it takes no further part$")


def test_a_site_takes_part_in_a_sum_of_one_id_once():
    fed = Federation(IDS[:3])
    fed.client(IDS[0], "run-1/train-1")
    fed.client(IDS[1], "run-1/train-1")  # another site's record
    fed.client(IDS[0], "run-1/train-2")
    _refused(
        lambda: fed.client(IDS[0], "run-1/train-1"),
        rf"^secure sum: site {IDS[0]} already took part in a sum with id 'run-1/train-1'; refused$",
    )
    _refused(lambda: fed.client(IDS[0], ""), "a sum id is 1 to 256 printable characters")
    with pytest.raises(ConfigError, match="the signing key of site 'site-0' is not its key in the roster"):
        SecureSumClient(
            IDS[0],
            "site-0",
            sum_id="s",
            roster=fed.roster,
            signing_key=new_signing_key(),
            used=fed.used[IDS[0]],
            min_survivors=2,
        )
