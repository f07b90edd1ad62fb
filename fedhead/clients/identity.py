"""Who a site is in the secure sums: its roster name, its long-term signing key and the federation's
roster ([`fedhead.federation.roster`][fedhead.federation.roster]).

A deployed site names two files in its SuperNode's node config, ``--node-config
"signing-key='/keys/site-a.key' roster='/keys/roster.json'"`` (``fedhead-keys`` writes both); its name
is the roster's entry of its key. A simulation makes its own roster instead, one fresh key per
simulated site ([`SimulatedSites`][fedhead.clients.identity.SimulatedSites]), which travels with the
ClientApp and never reaches a file. A site that has neither takes no part in a secure sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Context

from fedhead.analysis.constraints import ConfigError
from fedhead.clients.messages import ClientError
from fedhead.clients.state import PARTITION_ID_KEY
from fedhead.federation.roster import Roster, public_key, read_signing_key, simulation_roster

#: The node config keys of a site's signing key file and of the roster file.
SIGNING_KEY_KEY, ROSTER_KEY = "signing-key", "roster"


@dataclass(frozen=True)
class SiteIdentity:
    """A site's ``name`` in ``roster`` and its signing ``key``."""

    name: str
    roster: Roster
    key: Ed25519PrivateKey


def identity_of(roster: Roster, key: Ed25519PrivateKey, where: str) -> SiteIdentity:
    """The identity of ``key``: its roster entry's name (``where`` names the files in a refusal)."""
    own = public_key(key)
    names = [n for n, k in roster.keys.items() if k == own]
    if not names:
        raise ClientError(f"secure sum: this site's signing key is not in the roster ({where})")
    return SiteIdentity(names[0], roster, key)


@lru_cache(maxsize=8)
def _from_files(key_path: str, roster_path: str) -> SiteIdentity:
    try:
        key, roster = read_signing_key(key_path), Roster.load(roster_path)
    except ConfigError as exc:
        raise ClientError(str(exc)) from None
    return identity_of(roster, key, f"node config {SIGNING_KEY_KEY}={key_path}, {ROSTER_KEY}={roster_path}")


@dataclass(frozen=True)
class SimulatedSites:
    """A simulation's own roster: ``roster`` (its JSON text) and each simulated site's raw signing key by
    partition id, site ``partition-<i>``. Plain bytes, so that it pickles with the ClientApp."""

    roster_json: str
    keys: tuple[bytes, ...]

    @classmethod
    def make(cls, sites: int) -> SimulatedSites:
        """Fresh keys for partitions ``0 .. sites - 1``
        ([`simulation_roster`][fedhead.federation.roster.simulation_roster])."""
        roster, keys = simulation_roster(f"partition-{i}" for i in range(int(sites)))
        return cls(roster.to_json(), tuple(keys[f"partition-{i}"].private_bytes_raw() for i in range(int(sites))))

    @property
    def roster(self) -> Roster:
        """The roster (what the simulation's server holds too)."""
        return Roster.from_json(self.roster_json, source="the simulation's roster")

    def identity(self, partition: int) -> SiteIdentity:
        """Simulated site ``partition``'s identity."""
        if not 0 <= partition < len(self.keys):
            raise ClientError(f"secure sum: the simulation made no signing key for partition {partition}")
        key = Ed25519PrivateKey.from_private_bytes(self.keys[partition])
        return identity_of(self.roster, key, "the simulation's roster")


def site_identity(context: Context, simulated: SimulatedSites | None = None) -> SiteIdentity:
    """This node's identity: its node config's key and roster files, else (a simulation) ``simulated``'s
    key of its partition; a one-line [`ClientError`][fedhead.clients.messages.ClientError] when it has none."""
    key_path, roster_path = context.node_config.get(SIGNING_KEY_KEY), context.node_config.get(ROSTER_KEY)
    if key_path and roster_path:
        return _from_files(str(key_path), str(roster_path))
    if key_path or roster_path:
        raise ClientError(f"secure sum: the node config names only one of {SIGNING_KEY_KEY} and {ROSTER_KEY}")
    if simulated is not None and PARTITION_ID_KEY in context.node_config:
        return simulated.identity(int(context.node_config[PARTITION_ID_KEY]))
    raise ClientError(
        f"secure sum: this site has no signing key and roster (node config {SIGNING_KEY_KEY}, {ROSTER_KEY}; "
        "fedhead-keys makes them)"
    )
