"""Who may take part in a secure sum: each site's long-term Ed25519 signing key, the roster of
their public keys, and the signatures of the actively secure sum
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]).

A site keeps its private signing key in a file of its own (PEM, mode 0600); the federation
assembles the sites' public keys into one roster file (JSON) and distributes it out of band, so
that the server, which routes every message, cannot change it. A site signs

* its advertisement: ``(sum id, node id, site name, c_pk, s_pk)``
  ([`sign_advertisement`][fedhead.federation.roster.sign_advertisement]), so that a server cannot
  put a key pair of its own in the key book;
* the survivor set: ``(sum id, survivors, dropped)``
  ([`sign_survivors`][fedhead.federation.roster.sign_survivors]), the consistency round.

Every signed message starts with its own domain tag and frames each field with its length, so that
no signature of one kind verifies as another. A site never takes part twice in a sum of one id
([`UsedSumIds`][fedhead.federation.roster.UsedSumIds]). ``fedhead-keys`` ([`fedhead.cli.keys`][fedhead.cli.keys])
writes the key files and the roster.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedhead.analysis.constraints import ConfigError
from fedhead.results.io import write_bytes_atomic

__all__ = [
    "ROSTER_FORMAT",
    "Roster",
    "UsedSumIds",
    "check_site_name",
    "check_sum_id",
    "new_signing_key",
    "public_key",
    "read_signing_key",
    "sign_advertisement",
    "sign_survivors",
    "simulation_roster",
    "verify_advertisement",
    "verify_survivors",
    "write_signing_key",
]

#: The ``format`` entry of a roster file.
ROSTER_FORMAT = "fedhead-roster/1"
#: A site name: a letter or digit, then up to 63 letters, digits, ``.``, ``_`` or ``-`` (it names files too).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Longest sum id (characters).
_MAX_SUM_ID = 256
_PUBLIC_BYTES = 32
_SIGNATURE_BYTES = 64
_ADVERTISEMENT = b"fedhead secure sum: advertisement"
_SURVIVORS = b"fedhead secure sum: survivors"


def check_site_name(name: object) -> str:
    """``name`` when it is a valid site name, else a one-line
    [`ConfigError`][fedhead.analysis.constraints.ConfigError]."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"roster: a site name is 1 to 64 letters, digits, '.', '_' or '-' (starting with a letter or digit), "
            f"got {name!r}"
        )
    return name


def check_sum_id(sum_id: object) -> str:
    """``sum_id`` when it is a non-empty printable string of at most 256 characters."""
    if not isinstance(sum_id, str) or not 0 < len(sum_id) <= _MAX_SUM_ID or not sum_id.isprintable():
        raise ConfigError(f"secure sum: a sum id is 1 to {_MAX_SUM_ID} printable characters, got {sum_id!r}")
    return sum_id


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


# --------------------------------------------------------------------------------------------
# the roster
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roster:
    """The sites of a federation: ``keys`` maps each site name to its raw 32-byte Ed25519 public key.

    Names and keys are distinct. [`to_json`][fedhead.federation.roster.Roster.to_json] /
    [`from_json`][fedhead.federation.roster.Roster.from_json] give the file format::

        {"format": "fedhead-roster/1", "sites": {"<name>": "<base64 public key>", ...}}
    """

    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        keys = dict(self.keys)
        for name, key in keys.items():
            check_site_name(name)
            if not isinstance(key, bytes) or len(key) != _PUBLIC_BYTES:
                raise ConfigError(f"roster: site {name!r}'s public key must be {_PUBLIC_BYTES} raw bytes")
        owners: dict[bytes, str] = {}
        for name, key in sorted(keys.items()):
            if key in owners:
                raise ConfigError(f"roster: sites {owners[key]!r} and {name!r} have the same public key")
            owners[key] = name
        object.__setattr__(self, "keys", {n: keys[n] for n in sorted(keys)})

    @property
    def names(self) -> tuple[str, ...]:
        """The site names, sorted."""
        return tuple(self.keys)

    def __contains__(self, name: object) -> bool:
        return name in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def to_json(self) -> str:
        """The roster file's text (sorted, so that one roster always has one text)."""
        sites = {n: base64.b64encode(k).decode("ascii") for n, k in self.keys.items()}
        return json.dumps({"format": ROSTER_FORMAT, "sites": sites}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "roster") -> Roster:
        """The roster of a file's text; a bad one is a one-line
        [`ConfigError`][fedhead.analysis.constraints.ConfigError] naming ``source``."""
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError):
            raise ConfigError(f"{source}: not a JSON roster") from None
        if not isinstance(data, dict) or data.get("format") != ROSTER_FORMAT or not isinstance(data.get("sites"), dict):
            raise ConfigError(f'{source}: not a roster (it needs "format": {ROSTER_FORMAT!r} and a "sites" object)')
        keys = {}
        for name, text_key in data["sites"].items():
            try:
                keys[name] = base64.b64decode(str(text_key).encode("ascii"), validate=True)
            except (ValueError, binascii.Error):
                raise ConfigError(f"{source}: site {name!r}'s public key is not base64") from None
        try:
            return cls(keys)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> Roster:
        """The roster file at ``path``."""
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"roster {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
        return cls.from_json(text, source=f"roster {path}")

    def save(self, path: str | os.PathLike, *, force: bool = False) -> Path:
        """Write the roster file atomically; an existing file is replaced only with ``force``."""
        return write_bytes_atomic(path, self.to_json().encode("utf-8"), overwrite=force)

    @classmethod
    def merge(cls, rosters: Iterable[Roster]) -> Roster:
        """One roster of the sites of ``rosters`` (a name twice is refused, even with the same key)."""
        keys: dict[str, bytes] = {}
        for roster in rosters:
            for name, key in roster.keys.items():
                if name in keys:
                    raise ConfigError(f"roster: site {name!r} appears twice")
                keys[name] = key
        return cls(keys)

    def digest(self) -> str:
        """SHA-256 (hex) of the roster's text: two sites hold the same roster when their digests agree."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def verify(self, name: str, message: bytes, signature: object) -> bool:
        """Whether ``signature`` is site ``name``'s Ed25519 signature of ``message`` (False for a name not here)."""
        key = self.keys.get(name)
        if key is None or not isinstance(signature, bytes) or len(signature) != _SIGNATURE_BYTES:
            return False
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
        except InvalidSignature:
            return False
        return True


# --------------------------------------------------------------------------------------------
# signing keys
# --------------------------------------------------------------------------------------------


def new_signing_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key."""
    return Ed25519PrivateKey.generate()


def write_signing_key(path: str | os.PathLike, key: Ed25519PrivateKey, *, force: bool = False) -> Path:
    """Write ``key`` (PEM, PKCS#8) to ``path`` with mode 0600 from its first byte, atomically; an existing
    file is replaced only with ``force`` (else ``FileExistsError``, the file left as it was)."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return write_bytes_atomic(path, pem, private=True, overwrite=force)


def read_signing_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The Ed25519 signing key of the PEM file at ``path``; refuses a file others may read or write."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        pem = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"signing key {path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if mode & 0o077:
        raise ConfigError(f"signing key {path}: others may read it (mode {mode & 0o777:o}); run chmod 600 on it")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"signing key {path}: not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"signing key {path}: not an Ed25519 key (got {type(key).__name__})")
    return key


def public_key(key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public key of a signing key (its roster entry)."""
    return _raw(key.public_key())


def simulation_roster(names: Iterable[str]) -> tuple[Roster, dict[str, Ed25519PrivateKey]]:
    """A simulation's own roster, in memory: a fresh signing key per site name, and the roster of their public keys."""
    keys = {check_site_name(n): new_signing_key() for n in names}
    return Roster({n: public_key(k) for n, k in keys.items()}), keys


# --------------------------------------------------------------------------------------------
# what is signed
# --------------------------------------------------------------------------------------------


def _frame(tag: bytes, *fields: bytes) -> bytes:
    """``tag`` then each field after its 8-byte length: no two field lists frame to the same bytes."""
    return tag + b"".join(len(f).to_bytes(8, "big") + f for f in fields)


def _ids(sites: Iterable[int]) -> bytes:
    return b"".join(int(s).to_bytes(8, "big") for s in sorted(set(sites)))


def advertisement_message(sum_id: str, node: int, name: str, encryption: bytes, mask: bytes) -> bytes:
    """The bytes a site signs to advertise its public keys ``(c_pk, s_pk)`` in sum ``sum_id``."""
    fields = (check_sum_id(sum_id).encode(), int(node).to_bytes(8, "big"), name.encode(), encryption, mask)
    return _frame(_ADVERTISEMENT, *fields)


def survivors_message(sum_id: str, survivors: Iterable[int], dropped: Iterable[int]) -> bytes:
    """The bytes a site signs in the consistency round: sum ``sum_id``'s survivors and dropped sites (sets)."""
    return _frame(_SURVIVORS, check_sum_id(sum_id).encode(), _ids(survivors), _ids(dropped))


def sign_advertisement(
    key: Ed25519PrivateKey, sum_id: str, node: int, name: str, encryption: bytes, mask: bytes
) -> bytes:
    """Site ``name``'s signature of its advertisement (see
    [`advertisement_message`][fedhead.federation.roster.advertisement_message])."""
    return key.sign(advertisement_message(sum_id, node, name, encryption, mask))


def verify_advertisement(
    roster: Roster, signature: object, sum_id: str, node: int, name: str, encryption: bytes, mask: bytes
) -> bool:
    """Whether ``signature`` is roster member ``name``'s signature of this advertisement."""
    return roster.verify(name, advertisement_message(sum_id, node, name, encryption, mask), signature)


def sign_survivors(key: Ed25519PrivateKey, sum_id: str, survivors: Iterable[int], dropped: Iterable[int]) -> bytes:
    """A site's signature of the survivor set
    (see [`survivors_message`][fedhead.federation.roster.survivors_message])."""
    return key.sign(survivors_message(sum_id, survivors, dropped))


def verify_survivors(
    roster: Roster, signature: object, name: str, sum_id: str, survivors: Iterable[int], dropped: Iterable[int]
) -> bool:
    """Whether ``signature`` is roster member ``name``'s signature of ``(sum_id, survivors, dropped)``."""
    return roster.verify(name, survivors_message(sum_id, survivors, dropped), signature)


# --------------------------------------------------------------------------------------------
# sum ids already used
# --------------------------------------------------------------------------------------------


class UsedSumIds:
    """The sum ids a site has taken part in (their SHA-256 digests): a second sum with one of them is
    refused, so a replayed or repeated sum never gets a second masked input. The caller keeps it
    between sums ([`to_bytes`][fedhead.federation.roster.UsedSumIds.to_bytes])."""

    def __init__(self, digests: Iterable[bytes] = ()):
        self._digests = set(digests)

    @staticmethod
    def _digest(sum_id: str) -> bytes:
        return hashlib.sha256(check_sum_id(sum_id).encode()).digest()

    def __contains__(self, sum_id: object) -> bool:
        return isinstance(sum_id, str) and self._digest(sum_id) in self._digests

    def __len__(self) -> int:
        return len(self._digests)

    def add(self, sum_id: str) -> None:
        """Record ``sum_id`` as used."""
        self._digests.add(self._digest(sum_id))

    def to_bytes(self) -> bytes:
        """The record as bytes (32 per id)."""
        return b"".join(sorted(self._digests))

    @classmethod
    def from_bytes(cls, blob: bytes) -> UsedSumIds:
        """The record of [`to_bytes`][fedhead.federation.roster.UsedSumIds.to_bytes]."""
        if not isinstance(blob, bytes) or len(blob) % 32:
            raise ConfigError("secure sum: the record of used sum ids is damaged (not 32-byte digests)")
        return cls(blob[i : i + 32] for i in range(0, len(blob), 32))
