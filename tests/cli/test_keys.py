"""fedhead-keys (fedhead/cli/keys.py): a site's signing key and the roster; every refusal is one
``fedhead-keys: error:`` line with exit status 2 and leaves the files as they were."""

from __future__ import annotations

import stat

from fedhead.cli.keys import main
from fedhead.federation.roster import Roster, public_key, read_signing_key


def test_new_site_then_roster_makes_the_federations_roster(tmp_path, capsys):
    keys = tmp_path / "keys"
    for name in ("site-a", "site-b", "site-c"):
        assert main(["new-site", name, "--dir", str(keys)]) == 0
    assert "signing key" in capsys.readouterr().out
    assert stat.S_IMODE((keys / "site-a.key").stat().st_mode) == 0o600
    entries = sorted(str(p) for p in keys.glob("*.roster.json"))
    out = tmp_path / "roster.json"
    assert main(["roster", *entries, "--out", str(out)]) == 0
    roster = Roster.load(out)
    assert roster.names == ("site-a", "site-b", "site-c")
    for name in roster.names:
        assert roster.keys[name] == public_key(read_signing_key(keys / f"{name}.key"))
    assert f"3 sites -> {out}, sha256 {roster.digest()}" in capsys.readouterr().out


def test_an_existing_key_is_not_replaced_without_force(tmp_path, capsys):
    assert main(["new-site", "a", "--dir", str(tmp_path)]) == 0
    key, entry = (tmp_path / "a.key").read_bytes(), (tmp_path / "a.roster.json").read_bytes()
    capsys.readouterr()
    assert main(["new-site", "a", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedhead-keys: error: ") and "pass --force" in err and err.count("\n") == 1
    assert (tmp_path / "a.key").read_bytes() == key and (tmp_path / "a.roster.json").read_bytes() == entry
    assert main(["new-site", "a", "--dir", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "a.key").read_bytes() != key
    assert Roster.load(tmp_path / "a.roster.json").keys["a"] == public_key(read_signing_key(tmp_path / "a.key"))


def test_roster_refusals_are_one_line_and_write_nothing(tmp_path, capsys):
    assert main(["new-site", "a", "--dir", str(tmp_path / "one")]) == 0
    assert main(["new-site", "a", "--dir", str(tmp_path / "two")]) == 0
    assert main(["new-site", "bad/name", "--dir", str(tmp_path)]) == 2
    capsys.readouterr()
    out = tmp_path / "roster.json"
    twice = [str(tmp_path / "one" / "a.roster.json"), str(tmp_path / "two" / "a.roster.json")]
    assert main(["roster", *twice, "--out", str(out)]) == 2
    assert "site 'a' appears twice" in capsys.readouterr().err and not out.exists()
    (tmp_path / "junk.json").write_text("{}")
    assert main(["roster", str(tmp_path / "junk.json"), "--out", str(out)]) == 2
    assert "not a roster" in capsys.readouterr().err and not out.exists()
    assert main(["roster", twice[0], "--out", str(out)]) == 0
    assert main(["roster", twice[1], "--out", str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["roster", twice[1], "--out", str(out), "--force"]) == 0
