"""Who a site is in the secure sums (fedhead.clients.identity): its node config's key and roster files
(written by fedhead-keys), or a simulation's own roster; every refusal is one line."""

from __future__ import annotations

import pickle

import pytest
from app_helpers import simulated_sites
from flwr.app import Context, RecordDict

from fedhead.cli.keys import assemble, new_site
from fedhead.clients.identity import SimulatedSites, site_identity
from fedhead.clients.messages import ClientError
from fedhead.federation.roster import public_key


def _context(**node_config) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def test_a_deployed_site_is_its_roster_entry(tmp_path):
    paths = {name: new_site(name, tmp_path / "keys") for name in ("site-a", "site-b", "site-c")}
    roster = assemble([entry for _, entry in paths.values()], tmp_path / "roster.json")
    key_b = paths["site-b"][0]
    me = site_identity(_context(**{"signing-key": str(key_b), "roster": str(tmp_path / "roster.json")}))
    assert me.name == "site-b" and me.roster == roster and public_key(me.key) == roster.keys["site-b"]


def test_a_site_without_its_key_in_the_roster_or_without_files_refuses(tmp_path):
    key, entry = new_site("site-a", tmp_path)
    other_key, other_entry = new_site("site-b", tmp_path / "other")
    assemble([entry], tmp_path / "roster.json")
    with pytest.raises(ClientError, match=r"^secure sum: this site's signing key is not in the roster \(node config"):
        site_identity(_context(**{"signing-key": str(other_key), "roster": str(tmp_path / "roster.json")}))
    with pytest.raises(ClientError, match="the node config names only one of signing-key and roster"):
        site_identity(_context(**{"signing-key": str(key)}))
    with pytest.raises(ClientError, match="this site has no signing key and roster"):
        site_identity(_context(**{"partition-id": 0}))
    with pytest.raises(ClientError, match="cannot be read"):
        site_identity(_context(**{"signing-key": str(tmp_path / "nope.key"), "roster": str(tmp_path / "roster.json")}))


def test_a_simulation_makes_its_own_roster_which_pickles_with_the_app():
    sites = SimulatedSites.make(3)
    again = pickle.loads(pickle.dumps(sites))
    assert again == sites and sites.roster.names == ("partition-0", "partition-1", "partition-2")
    me = site_identity(_context(**{"partition-id": 2}), again)
    assert me.name == "partition-2" and public_key(me.key) == sites.roster.keys["partition-2"]
    assert SimulatedSites.make(3).roster.digest() != sites.roster.digest()  # fresh keys per simulation
    with pytest.raises(ClientError, match="the simulation made no signing key for partition 3"):
        site_identity(_context(**{"partition-id": 3}), sites)
    files = simulated_sites(3)
    assert files is simulated_sites(3)  # the tests' helper makes one per size
