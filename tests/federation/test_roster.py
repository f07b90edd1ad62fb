"""The roster of signing keys and the signatures of the actively secure sum (fedhead.federation.roster)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.roster import (
    Roster,
    UsedSumIds,
    advertisement_message,
    check_site_name,
    check_sum_id,
    new_signing_key,
    public_key,
    read_signing_key,
    sign_advertisement,
    sign_survivors,
    simulation_roster,
    survivors_message,
    verify_advertisement,
    verify_survivors,
    write_signing_key,
)

C_PK, S_PK = b"c-public-key", b"s-public-key"


@pytest.fixture(scope="module")
def sites():
    return simulation_roster(["a", "b", "c"])


def test_a_simulation_roster_has_one_distinct_key_per_site(sites):
    roster, keys = sites
    assert roster.names == ("a", "b", "c") and set(keys) == {"a", "b", "c"}
    assert {roster.keys[n] for n in roster.names} == {public_key(k) for k in keys.values()}
    assert all(roster.keys[n] == public_key(keys[n]) for n in roster.names)
    again, _ = simulation_roster(["a", "b", "c"])
    assert again.digest() != roster.digest()  # fresh keys every time


def test_the_roster_file_round_trips_with_one_text(sites, tmp_path):
    roster, _ = sites
    path = roster.save(tmp_path / "roster.json")
    loaded = Roster.load(path)
    assert loaded == roster and loaded.digest() == roster.digest()
    assert json.loads(path.read_text())["format"] == "fedhead-roster/1"
    shuffled = Roster(dict(reversed(list(roster.keys.items()))))
    assert shuffled.to_json() == roster.to_json()
    with pytest.raises(FileExistsError):
        roster.save(path)
    other, _ = simulation_roster(["z"])
    other.save(path, force=True)
    assert Roster.load(path) == other


@pytest.mark.parametrize(
    "text, msg",
    [
        ("[", "not a JSON roster"),
        ('{"sites": {}}', "not a roster"),
        ('{"format": "fedhead-roster/1", "sites": {"a": "%%%"}}', "site 'a''s public key is not base64"),
        ('{"format": "fedhead-roster/1", "sites": {"a": "AAAA"}}', "must be 32 raw bytes"),
        ('{"format": "fedhead-roster/1", "sites": {"-a": "' + "A" * 43 + '="}}', "a site name is"),
    ],
)
def test_a_bad_roster_file_is_one_line_naming_it(text, msg, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=msg) as err:
        Roster.load(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_roster_refuses_a_shared_key_and_a_name_twice(sites):
    roster, keys = sites
    with pytest.raises(ConfigError, match="sites 'a' and 'b' have the same public key"):
        Roster({"a": roster.keys["a"], "b": roster.keys["a"]})
    with pytest.raises(ConfigError, match="site 'a' appears twice"):
        Roster.merge([roster, Roster({"a": roster.keys["a"]})])
    merged = Roster.merge(Roster({n: k}) for n, k in roster.keys.items())
    assert merged == roster
    with pytest.raises(ConfigError, match="cannot be read"):
        Roster.load("/nonexistent/roster.json")


def test_site_names_and_sum_ids():
    assert check_site_name("hospital-a.2_x") == "hospital-a.2_x"
    for bad in ("", ".hidden", "a/b", "a b", "x" * 65, 3, None):
        with pytest.raises(ConfigError, match="a site name is"):
            check_site_name(bad)
    assert check_sum_id("run-7/train-2") == "run-7/train-2"
    for bad in ("", "a\nb", "x" * 257, 5):
        with pytest.raises(ConfigError, match="a sum id is"):
            check_sum_id(bad)


def test_an_advertisement_signature_binds_every_field(sites):
    roster, keys = sites
    fields = ("sum-1", 2**64 - 1, "a", C_PK, S_PK)
    sig = sign_advertisement(keys["a"], *fields)
    assert verify_advertisement(roster, sig, *fields)
    changed = [
        ("sum-2", 2**64 - 1, "a", C_PK, S_PK),
        ("sum-1", 5, "a", C_PK, S_PK),
        ("sum-1", 2**64 - 1, "b", C_PK, S_PK),
        ("sum-1", 2**64 - 1, "a", S_PK, C_PK),
        ("sum-1", 2**64 - 1, "a", C_PK, S_PK + b"x"),
    ]
    assert not any(verify_advertisement(roster, sig, *f) for f in changed)
    # a name outside the roster, a signature by a key outside it, a malformed signature
    assert not verify_advertisement(roster, sig, "sum-1", 2**64 - 1, "mallory", C_PK, S_PK)
    assert not verify_advertisement(roster, new_signing_key().sign(b"x"), *fields)
    assert not verify_advertisement(roster, None, *fields) and not verify_advertisement(roster, sig[:-1], *fields)
    # the framing: moving bytes between fields changes the message
    assert advertisement_message("s", 1, "a", b"xy", b"z") != advertisement_message("s", 1, "a", b"x", b"yz")


def test_a_survivor_signature_binds_the_sum_and_both_sets_and_no_other_kind(sites):
    roster, keys = sites
    sig = sign_survivors(keys["b"], "sum-1", [3, 1, 2], [9])
    assert verify_survivors(roster, sig, "b", "sum-1", (1, 2, 3), {9})
    assert not verify_survivors(roster, sig, "a", "sum-1", (1, 2, 3), {9})
    assert not verify_survivors(roster, sig, "b", "sum-2", (1, 2, 3), {9})
    assert not verify_survivors(roster, sig, "b", "sum-1", (1, 2), {3, 9})
    assert not verify_survivors(roster, sig, "b", "sum-1", (1, 2, 3), ())
    assert survivors_message("s", [1], [2, 3]) != survivors_message("s", [1, 2], [3])
    assert survivors_message("s", [1], []) != advertisement_message("s", 1, "a", b"", b"")


def test_a_signing_key_file_is_private_from_its_first_byte_and_never_replaced_silently(tmp_path, monkeypatch):
    path = tmp_path / "keys" / "site.key"
    key = new_signing_key()
    modes = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (modes.append(os.fstat(fd).st_mode), real_fsync(fd))[1])
    write_signing_key(path, key)
    assert modes and all(stat.S_IMODE(m) == 0o600 for m in modes)  # the temporary file too
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key(read_signing_key(path)) == public_key(key)
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        write_signing_key(path, new_signing_key())
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["site.key"]
    other = new_signing_key()
    write_signing_key(path, other, force=True)
    assert public_key(read_signing_key(path)) == public_key(other)


def test_a_signing_key_file_that_others_may_read_or_not_ed25519_is_refused(tmp_path):
    path = write_signing_key(tmp_path / "k.key", new_signing_key())
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"others may read it \(mode 644\); run chmod 600"):
        read_signing_key(path)
    ecdsa = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "ec.key").write_bytes(ecdsa)
    (tmp_path / "ec.key").chmod(0o600)
    with pytest.raises(ConfigError, match="not an Ed25519 key"):
        read_signing_key(tmp_path / "ec.key")
    (tmp_path / "junk.key").write_bytes(b"junk")
    (tmp_path / "junk.key").chmod(0o600)
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        read_signing_key(tmp_path / "junk.key")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_signing_key(tmp_path / "missing.key")


def test_used_sum_ids_round_trip_and_refuse_damage():
    used = UsedSumIds()
    assert "train-1" not in used
    used.add("train-1")
    used.add("train-1")
    used.add("exchange")
    assert "train-1" in used and "exchange" in used and "train-2" not in used and len(used) == 2
    again = UsedSumIds.from_bytes(used.to_bytes())
    assert "train-1" in again and "exchange" in again and len(again) == 2
    assert 7 not in again
    with pytest.raises(ConfigError, match="damaged"):
        UsedSumIds.from_bytes(b"x" * 31)
