"""Where a site keeps its secure sums between messages: its node's own state holds at most two, the sum it
is in (its [`SecureSumClient`][fedhead.federation.secure_site.SecureSumClient] and, until it is masked, its
input; a site that signed its full list with its masked input keeps the input until it reveals, so that it
may move to a fresh sum should a peer drop) and the next one, set up within this one's messages
([`fedhead.federation.secure_records.NEXT_SUM`][fedhead.federation.secure_records.NEXT_SUM]): its keys
advertised with this sum's phase reply, its key shares sent with this sum's reveal (or its survivor-list
signature, in a sum that has that step).

A phase message that carries its mask request takes the next sum out of the state and masks at once
([`take_prepared`][fedhead.clients.secure_sums.take_prepared]); a site never holds a sum's private keys
after the message that follows it. A sum id is new to the site whichever slot it enters
([`new_client`][fedhead.clients.secure_sums.new_client]: the ledger's used ids).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fedhead.clients.identity import SiteIdentity
from fedhead.clients.ledger import SiteLedger
from fedhead.clients.messages import ClientError
from fedhead.clients.policy import PolicyRefusal
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.ring_encoding import RingFixedPoint
from fedhead.federation.secure_site import SecureSumClient
from fedhead.federation.secure_sum import SecureSumError

log = logging.getLogger(__name__)

#: The node state's records: the sum the site is in (ConfigRecord: id, client, noised-for), its input until
#: masked (ArrayRecord), and the next sum (ConfigRecord: id, client).
CURRENT, VALUES, NEXT = "secure-sum-state", "secure-sum-state-values", "secure-sum-next"


def config_name(msg: Message, key: str) -> str | None:
    """The non-empty string ``key`` of the message's config (a sum id), else None."""
    cfg = msg.content.config_records.get(protocol.CONFIG)
    value = None if cfg is None else cfg.get(key)
    return value if isinstance(value, str) and value else None


def phase_of(msg: Message) -> str:
    """What a phase message asks the site to release, whatever the server names its sum: ``the exchange``
    (the statistics or moment query), else ``<type> round <r>``."""
    if msg.metadata.message_type == MessageType.QUERY:
        return "the exchange"
    cfg = msg.content.config_records.get(protocol.CONFIG)
    return f"{msg.metadata.message_type} round {None if cfg is None else cfg.get(protocol.SERVER_ROUND)}"


def new_client(context: Context, identity: SiteIdentity, name: str, floor: int) -> SecureSumClient:
    """A fresh site of the sum ``name`` (keys drawn now); a sum id this site took part in before, in any run,
    is refused ([`PolicyRefusal`][fedhead.clients.policy.PolicyRefusal])."""
    try:
        return SiteLedger(context).with_used_sum_ids(
            lambda used: SecureSumClient(
                int(context.node_id),
                identity.name,
                sum_id=name,
                roster=identity.roster,
                signing_key=identity.key,
                used=used,
                min_survivors=floor,
            )
        )
    except SecureSumError as exc:  # a sum id used before: a replayed or repeated sum
        raise PolicyRefusal(f"secure sum {name}: {exc}") from None


def held(context: Context, slot: str) -> ConfigRecord | None:
    """The record of ``slot`` (``CURRENT`` or ``NEXT``), if the node holds one."""
    return context.state.config_records.get(slot)


def load(record: ConfigRecord, identity: SiteIdentity) -> SecureSumClient:
    """The client kept in ``record``, with this site's roster and signing key."""
    blob = record.get("client")
    if not isinstance(blob, bytes):
        raise ClientError(f"secure sum {record.get('id')}: the site's state is damaged")
    try:
        return SecureSumClient.from_bytes(blob, identity.roster, identity.key)
    except (SecureSumError, ValueError) as exc:
        raise ClientError(f"secure sum {record.get('id')}: {exc}") from None


def save(
    context: Context,
    slot: str,
    client: SecureSumClient,
    record: ConfigRecord | None = None,
    fields: Mapping[str, int | float] | None = None,
) -> ConfigRecord:
    """Keep ``client`` in ``slot``, with what ``record`` held and ``fields`` (the input's public bound, the
    fewest survivors its noise was drawn for, the sites of the key book it checked); returns the record."""
    kept = ConfigRecord(dict(record or {}))
    kept.update({**(fields or {}), "id": client.sum_id, "client": client.to_bytes()})
    context.state[slot] = kept
    return kept


def keep_input(context: Context, values: np.ndarray) -> None:
    """Keep the current sum's input until it is masked."""
    context.state[VALUES] = ArrayRecord({"values": Array(values)})


def holds_input(context: Context) -> bool:
    """Whether the node keeps an input of its current sum."""
    return VALUES in context.state.array_records


def drop_input(context: Context) -> None:
    """Forget the current sum's kept input, if any."""
    if holds_input(context):
        del context.state[VALUES]


def signs_now(msg: Message) -> bool:
    """Whether a mask request asks for the site's signature of its full list with the masked input
    ([`SIGN_NOW`][fedhead.federation.secure_records.SIGN_NOW])."""
    cfg = msg.content.config_records.get(protocol.CONFIG)
    return cfg is not None and cfg.get(sr.SIGN_NOW) is True


def take_input(context: Context) -> np.ndarray:
    """The current sum's input, removed from the state (it is about to be masked)."""
    record = context.state.array_records.get(VALUES)
    if record is None:
        raise ClientError("secure sum: this site holds no input to mask")
    values = record["values"].numpy()
    del context.state[VALUES]
    return values


def advertise_next(msg: Message, context: Context, identity: SiteIdentity, floor: int) -> ConfigRecord | None:
    """When ``msg`` names the run's next sum: a fresh site of it kept in the ``NEXT`` slot (replacing any
    other) and the record of its signed keys for the reply; else None."""
    name = config_name(msg, sr.NEXT_SUM)
    if name is None:
        return None
    if name == config_name(msg, sr.SUM_ID):
        raise PolicyRefusal(f"secure sum {name}: the next sum must differ from this one; refused")
    client = new_client(context, identity, name, floor)
    keys = client.advertise()
    save(context, NEXT, client)
    return ConfigRecord({sr.PAYLOAD: sr.pack(keys)})


def take_prepared(context: Context, name: str, identity: SiteIdentity) -> tuple[ConfigRecord, SecureSumClient]:
    """The record and site of ``name`` that the ``NEXT`` slot holds, taken out of it (the phase message of
    ``name`` carries its mask request); a ``ClientError`` when the site did not set that sum up."""
    record = held(context, NEXT)
    if record is None or record.get("id") != name:
        have = None if record is None else record.get("id")
        raise ClientError(f"secure sum {name}: a mask request for a sum this site did not set up (it holds {have})")
    del context.state[NEXT]
    return record, load(record, identity)


def is_set_up(msg: Message, context: Context, name: str) -> bool:
    """Whether ``msg`` carries the mask request of the sum ``name`` that this site set up (it holds it in the
    ``NEXT`` slot: its id was recorded as used then)."""
    record = held(context, NEXT)
    return sr.SECURE in msg.content.config_records and record is not None and record.get("id") == name


def slot_of(context: Context, name: str) -> str:
    """The slot that holds the sum ``name`` (``CURRENT`` first); a ``ClientError`` when neither does."""
    for slot in (CURRENT, NEXT):
        record = held(context, slot)
        if record is not None and record.get("id") == name:
            return slot
    have = [r.get("id") for r in (held(context, CURRENT), held(context, NEXT)) if r is not None]
    raise ClientError(f"secure sum {name}: this site has not begun it (it holds {have or None})")


def checked_encoding(requested: RingFixedPoint, bound: object, sites: object) -> RingFixedPoint:
    """The sum's encoding when ``requested`` is the one of the site's ``bound`` over the ``sites`` of the key
    book it checked; refused with one line otherwise (the request alone, not the values, fails)."""
    if not isinstance(bound, float) or not isinstance(sites, int):
        raise ClientError("the site's state lacks the sum's bound or its book")
    try:
        return sr.check_encoding(requested, bound, sites)
    except SecureSumError as exc:  # said as it is, once per request
        raise PolicyRefusal(str(exc)) from None


def share_next(msg: Message, context: Context, identity: SiteIdentity) -> ConfigRecord | None:
    """The next sum's key shares for its key book (sent with this sum's survivor list); None, with a warning,
    when the site holds no such sum or refuses the book (it then takes no part in that sum)."""
    name = config_name(msg, sr.NEXT_SUM)
    record = held(context, NEXT)
    if name is None or record is None or record.get("id") != name:
        log.warning("secure sum %s: a key book for a next sum this site did not set up; not shared", name)
        return None
    client = load(record, identity)
    try:
        book, threshold = sr.unpack_book(sr.payload_of(msg.content.config_records.get(sr.NEXT)))
        shares = client.share_keys(book, threshold)
        record["sites"] = len(book)  # the book the site checked: the sum's encoding is for this many sites
        return ConfigRecord({sr.PAYLOAD: sr.pack(shares)})
    except (SecureSumError, ValueError, KeyError) as exc:
        log.warning("secure sum %s: %s; this site takes no part in it", name, exc)
        return None
    finally:
        save(context, NEXT, client, record)


def move_input(msg: Message, context: Context, name: str, identity: SiteIdentity) -> RecordDict:
    """The ``resum`` step: the input of the sum ``name``, which the site signed in full with its masked input
    and has not revealed for, moves to the fresh sum the payload names
    ([`move_out`][fedhead.federation.secure_site.SecureSumClient.move_out]); the reply carries the site's
    signed keys for it. The fresh sum takes the old one's place, with its bound and noise floor."""
    record = held(context, CURRENT)
    if record is None or record.get("id") != name:
        raise ClientError(f"secure sum {name}, step {sr.RESUM}: this site is not in that sum now")
    if not holds_input(context):
        raise ClientError(f"secure sum {name}, step {sr.RESUM}: this site keeps no input of that sum")
    try:
        fresh = sr.payload_of(msg.content.config_records.get(sr.SECURE)).decode("utf-8")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ClientError(f"secure sum {name}, step {sr.RESUM}: the fresh sum's id does not parse ({exc})") from None
    old = load(record, identity)
    client = new_client(context, identity, fresh, old.min_survivors)  # an id used before: refused here
    try:
        old.move_out()
    except SecureSumError as exc:
        raise ClientError(f"secure sum {name}, step {sr.RESUM}: {exc}") from None
    finally:
        save(context, CURRENT, old, record)
    kept = {k: v for k, v in record.items() if k in ("bound", "noised-for") and isinstance(v, int | float)}
    keys = client.advertise()
    save(context, CURRENT, client, None, kept)
    log.debug("secure sum %s: this site's input moved to sum %s", name, fresh)
    return RecordDict({sr.SECURE: ConfigRecord({sr.PAYLOAD: sr.pack(keys)})})
