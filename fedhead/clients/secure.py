"""A site's part in the secure sums of ``privacy.mode=secure``
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]), as a Flower mod
([`secure_mod`][fedhead.clients.secure.secure_mod]) that any ClientApp built on fedhead's client steps adds.

A phase message that names a sum (``config["secure-sum"]``) makes its handler compute the site's
vector as usual, then [`begin_sum`][fedhead.clients.secure.begin_sum] enters it in the sum: masked at
once when the message carries the sum's mask request (a sum set up within the previous sum's messages,
[`fedhead.clients.secure_sums`][fedhead.clients.secure_sums]), else kept with a fresh
[`SecureSumClient`][fedhead.federation.secure_site.SecureSumClient] in the node's own state while the
reply carries the site's signed public keys. The later steps (``stage="secure-sum"`` queries) run in
[`handle_secure_step`][fedhead.clients.secure.handle_secure_step]. The vector never leaves the site
but masked; nothing here is logged but sizes. The site signs as its roster identity
([`fedhead.clients.identity`][fedhead.clients.identity]) and never takes part twice in a sum of one id
(the record lives in its ledger).

Whatever the run config says, the site enforces its own policy
([`fedhead.clients.policy`][fedhead.clients.policy]) and keeps a ledger of each run
([`fedhead.clients.ledger`][fedhead.clients.ledger]): a sum is begun once per run (a re-issued phase message
gets no fresh release), a noised release is charged to the site's epsilon budget before it is sent, and a
sum is not unmasked over fewer survivors than the site's floor or than its noise was drawn for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict

from fedhead.clients import secure_sums as sums
from fedhead.clients.identity import SimulatedSites, SiteIdentity, site_identity
from fedhead.clients.ledger import SiteLedger, run_scope
from fedhead.clients.messages import ClientError
from fedhead.clients.policy import PolicyRefusal, SitePolicy, site_policy
from fedhead.clients.sum_inputs import sum_input
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.federation.privacy_noise import dp_contribution
from fedhead.federation.secure_site import SecureSumClient
from fedhead.federation.secure_sum import MIN_SITES, SecureSumError, default_threshold
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.settings.trust import TrustPolicy

log = logging.getLogger(__name__)

#: What a run refused at a step whose failure could depend on the site's values is told (nothing else).
_NO_FURTHER_PART = "this site's input could not enter the sum; it takes no further part in this run"


def sum_id(msg: Message) -> str | None:
    """The secure sum a phase message starts (None: clear mode)."""
    return sums.config_name(msg, sr.SUM_ID)


def site_floor(policy: SitePolicy, identity: SiteIdentity) -> int:
    """The smallest threshold this site accepts: its policy's ``min-survivors``, else a majority of its roster
    (so that a server cannot make it mask with, or reveal to, a minority of the federation)."""
    if policy.min_survivors is not None:
        return max(2, int(policy.min_survivors))
    return default_threshold(len(identity.roster))


def begin_sum(
    msg: Message,
    context: Context,
    vector: np.ndarray,
    metrics: Mapping[str, int | float],
    *,
    identity: SiteIdentity,
    floor: int,
    bound: float,
    noised_for: int = 0,
) -> RecordDict:
    """Enter ``vector`` (this site's input to the sum the message names) in the sum; the reply, with
    ``metrics`` (which must reveal no row) and the next sum's signed keys when the message names one
    ([`advertise_next`][fedhead.clients.secure_sums.advertise_next]).

    A message that carries the sum's mask request (a sum set up within the previous sum's messages) is
    answered with the masked input at once; otherwise a fresh site of the sum keeps ``vector`` in the
    node's state and replies with its signed public keys. ``identity``: who the site is; ``floor``: the
    smallest threshold it accepts ([`site_floor`][fedhead.clients.secure.site_floor]); ``bound``: the
    public bound of the vector's entries (its layout's, from run constants: the sum's encoding is checked
    against it, [`check_encoding`][fedhead.federation.secure_records.check_encoding]), which an entry
    beyond refuses here; ``noised_for``: the fewest survivors the vector's noise was drawn for (0: not
    noised), below which the site will not help unmask the sum. A sum id this site took part in before (in
    any run) is refused."""
    name = sum_id(msg)
    if name is None:
        raise ClientError("a secure sum was begun by a message that names none")
    values = np.ascontiguousarray(vector, dtype=np.float64).ravel()
    if not np.all(np.isfinite(values)):
        raise ClientError(f"secure sum {name}: this site's input has non-finite entries")
    if float(np.max(np.abs(values), initial=0.0)) > bound:
        raise ClientError(f"secure sum {name}: this site's input exceeds the sum's public bound {bound:g}")
    request = msg.content.config_records.get(sr.SECURE)
    out = RecordDict({protocol.METRICS: MetricRecord(dict(metrics))})
    fields = {"noised-for": int(noised_for), "bound": float(bound)}
    prepared = None if request is None else sums.take_prepared(context, name, identity)
    following = sums.advertise_next(msg, context, identity, floor)  # refused before anything is masked
    if following is not None:
        out[sr.NEXT] = following
    if prepared is not None and request is not None:  # set up in the previous sum's messages: mask now
        record, client = prepared
        try:
            ciphertexts, requested = sr.unpack_mask_request(sr.payload_of(request))
        except (ValueError, KeyError, TypeError) as exc:
            raise ClientError(f"secure sum {name}, step {sr.MASK}: {exc}") from None
        encoding = sums.checked_encoding(requested, fields["bound"], record.get("sites"))
        sums.drop_input(context)  # an input the site kept for the sum before is gone with it
        try:
            out.update(_masked_reply(client, ciphertexts, values, encoding, sums.signs_now(msg), context))
        except (SecureSumError, ValueError) as exc:
            raise ClientError(f"secure sum {name}, step {sr.MASK}: {exc}") from None
        finally:
            sums.save(context, sums.CURRENT, client, record, fields)
        log.debug("secure sum %s: %d entries masked", name, values.size)
    else:
        client = sums.new_client(context, identity, name, floor)
        out[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack(client.advertise())})
        sums.save(context, sums.CURRENT, client, None, fields)
        sums.keep_input(context, values)
        log.debug("secure sum %s: %d entries kept for masking", name, values.size)
    return out


def handle_secure_step(
    msg: Message, context: Context, identity: SiteIdentity, policy: SitePolicy | None = None
) -> Message:
    """One later step of a sum this node holds: ``share-keys``, ``mask`` (its masked input), ``sign`` (the
    survivor list; with the next sum's key book, also that sum's key shares) or ``reveal`` (refused over
    fewer survivors than the site's ``policy`` allows,
    [`SitePolicy.check_reveal`][fedhead.clients.policy.SitePolicy.check_reveal]). The site's state is kept
    after a refused step too: a refusal ends its part in the sum."""
    cfg = msg.content.config_records.get(protocol.CONFIG)
    name = sum_id(msg)
    step = None if cfg is None else cfg.get(sr.STEP)
    if name is None:
        raise ClientError("a secure step that names no sum")
    policy = policy or SitePolicy()
    if step == sr.RESUM:
        return Message(sums.move_input(msg, context, name, identity), reply_to=msg)
    slot = sums.slot_of(context, name)
    record = sums.held(context, slot)
    assert record is not None
    client = sums.load(record, identity)
    try:
        payload = sr.payload_of(msg.content.config_records.get(sr.SECURE))
        out = _secure_step(client, step, payload, context, record, policy, sums.signs_now(msg))
    except (SecureSumError, ValueError, KeyError) as exc:
        raise ClientError(f"secure sum {name}, step {step}: {exc}") from None
    finally:
        sums.save(context, slot, client, record)
    if step in (sr.SIGN, sr.REVEAL) and sr.NEXT in msg.content.config_records:
        shares = sums.share_next(msg, context, identity)
        if shares is not None:
            out[sr.NEXT] = shares
    return Message(out, reply_to=msg)


def _masked_reply(
    client: SecureSumClient,
    ciphertexts: Mapping[int, bytes],
    values: np.ndarray,
    encoding,
    sign_now: bool,
    context: Context,
) -> RecordDict:
    """The masked input and, ``sign_now``, the site's signature of its full list with it
    ([`mask_and_sign`][fedhead.federation.secure_site.SecureSumClient.mask_and_sign]); then ``values`` are kept
    in the node's state until the site reveals, or its input moves to a fresh sum (else nothing of it is)."""
    if not sign_now:
        return RecordDict({sr.SECURE: ArrayRecord({sr.MASKED: Array(client.mask(ciphertexts, values, encoding))})})
    masked, signature = client.mask_and_sign(ciphertexts, values, encoding)
    sums.keep_input(context, values)
    return RecordDict(
        {
            sr.SECURE: ArrayRecord({sr.MASKED: Array(masked)}),
            sr.SIGNED: ConfigRecord({sr.PAYLOAD: sr.pack_signature(signature)}),
        }
    )


def _secure_step(
    client: SecureSumClient,
    step: object,
    payload: bytes,
    context: Context,
    held: ConfigRecord,
    policy: SitePolicy,
    sign_now: bool = False,
) -> RecordDict:
    """The reply of ``client`` to ``step``'s ``payload`` (``sign_now``: a mask request that asks for the full
    list's signature with the masked input)."""
    out = RecordDict()
    if step == sr.SHARE_KEYS:
        book, threshold = sr.unpack_book(payload)
        out[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack(client.share_keys(book, threshold))})
        held["sites"] = len(book)  # the book the site checked: the sum's encoding is for this many sites
    elif step == sr.MASK:
        ciphertexts, requested = sr.unpack_mask_request(payload)
        encoding = sums.checked_encoding(requested, held.get("bound"), held.get("sites"))
        out.update(_masked_reply(client, ciphertexts, sums.take_input(context), encoding, sign_now, context))
    elif step == sr.SIGN:
        signature = client.sign_survivors(sr.unpack_unmasking(payload))
        out[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack_signature(signature)})
    elif step == sr.REVEAL:
        unmasking = sr.unpack_unmasking(payload)
        noised_for = held.get("noised-for", 0)
        policy.check_reveal(len(set(unmasking.survivors)), noised_for if isinstance(noised_for, int) else 0)
        out[sr.SECURE] = ConfigRecord({sr.PAYLOAD: sr.pack(client.reveal(unmasking))})
        sums.drop_input(context)  # revealed for: its input can no longer move
    else:
        raise ClientError(f"unknown step {step!r}")
    return out


def secure_reply(
    msg: Message,
    context: Context,
    content: RecordDict,
    *,
    lambdas: tuple[float, float],
    privacy: PrivacyPolicy,
    min_sites: int,
    identity: SiteIdentity,
    floor: int,
    max_abs: float = TrustPolicy.max_abs,
    private_heads: bool = False,
) -> RecordDict:
    """The secure form of a clear reply ``content`` (never sent): its
    [`sum_input`][fedhead.clients.sum_inputs.sum_input] enters the sum the message names
    ([`begin_sum`][fedhead.clients.secure.begin_sum] as ``identity``, ``floor``, the layout's bound from the
    run's ``max_abs``); sent: the site's keys or masked input, partition id and pass/fail self-checks.
    ``privacy.dp_noise > 0`` clips, caps and noises the vector first
    ([`dp_contribution`][fedhead.federation.privacy_noise.dp_contribution], ``min_sites``: the fewest sites whose
    sum the server may decode), unless it is already private for one row (a row-level exchange release, a head of
    ``private_heads``); ``lambdas``: ``(lambda_h, lambda_w)``."""
    given = sum_input(msg, content, lambdas=lambdas, privacy=privacy, max_abs=max_abs, private_heads=private_heads)
    vector = given.vector
    if privacy.dp_noise > 0 and not given.private:
        assert privacy.dp_max_rows is not None  # the policy refuses dp_noise without it
        vector = dp_contribution(
            vector,
            given.rows,
            clip=privacy.clip_of(given.heads),
            max_rows=privacy.dp_max_rows,
            noise_multiplier=privacy.dp_noise,
            min_sites=min_sites,
            rng=np.random.default_rng(),  # the operating system's entropy: no seed the server could know
        )
    noised = min_sites if privacy.dp_noise > 0 else 0
    safe = dict(given.safe)
    reply = begin_sum(msg, context, vector, safe, identity=identity, floor=floor, bound=given.bound, noised_for=noised)
    if given.site is not None:
        reply[protocol.SITE] = given.site  # column names and the file's key
    return reply


def refuse_clear(msg: Message, policy: SitePolicy) -> None:
    """A site whose policy keeps everything secure (``--node-config "privacy-mode='secure'"``, a DP floor or
    an epsilon budget) refuses every message that would make it send a statistic, a head or an objective
    in the clear (the server's run is not secure)."""
    if not policy.secure_only or sum_id(msg) is not None:
        return
    cfg = msg.content.config_records.get(protocol.CONFIG)
    stage = None if cfg is None else cfg.get(protocol.STAGE)
    if stage not in (sr.STAGE_REGIME, sr.STAGE_SECURE):
        rule = "mode" if policy.mode == "secure" else "dp-noise" if policy.dp_noise > 0 else "epsilon-budget"
        raise PolicyRefusal(
            f"this site sends nothing in the clear ({policy.named(rule)}): run the federation with privacy.mode=secure"
        )


def admit(msg: Message, context: Context, site: SecureSite, policy: SitePolicy, ledger: SiteLedger, scope: str) -> None:
    """What a site checks of every message before it serves it: the run is not refused
    ([`SiteLedger.refusal`][fedhead.clients.ledger.SiteLedger.refusal]), it keeps the site's ``policy`` (its
    mode, its DP floor, its budget), the regime question comes once, and a phase is released once, into a sum
    begun once (and charged)."""
    refused = ledger.refusal(scope)
    if refused is not None:
        raise PolicyRefusal(refused)
    refuse_clear(msg, policy)
    policy.check_run(site.privacy)
    cfg = msg.content.config_records.get(protocol.CONFIG)
    stage = None if cfg is None else cfg.get(protocol.STAGE)
    if stage == sr.STAGE_REGIME:
        ledger.answer_once(scope, "regime")
    name = sum_id(msg)
    if name is not None and stage != sr.STAGE_SECURE:
        ledger.release_once(scope, sums.phase_of(msg))  # a phase re-issued under another sum id: refused
        set_up = sums.is_set_up(msg, context, name)
        exchange = stage in (protocol.STAGE_MOMENTS, protocol.STAGE_STATISTICS)
        unit = "row" if site.privacy.row_level and exchange else "site"  # the row exchange
        # a private head is charged already: with its round's training (DP-SGD, SiteLedger.charge_training), or
        # with the site's own release it is the closed form of (the exact rule)
        private_head = site.private_heads and msg.metadata.message_type == MessageType.TRAIN
        noise = 0.0 if private_head else site.privacy.dp_noise
        if unit == "row" and site.exchange_noise is not None:
            noise = site.exchange_noise
        ledger.begin_sum(
            scope, name, policy, noise=noise, sites=site.sites, unit=unit, set_up=set_up, charged=not private_head
        )


@dataclass(frozen=True)
class SecureSite:
    """What a site's secure replies need of its run: ``lambdas`` ``(lambda_h, lambda_w)`` (its own margin),
    ``privacy`` (differential privacy), ``min_sites``, the fewest sites whose sum the server may decode
    (the failure policy's minimum, at least 3), ``sites``, the run's number of sites, and ``job_key``, the
    job's key where one app serves several jobs in a run
    ([`run_scope`][fedhead.clients.ledger.run_scope]); ``max_abs``, the run's ``trust.max_abs``."""

    lambdas: tuple[float, float]
    privacy: PrivacyPolicy = PrivacyPolicy()
    min_sites: int = MIN_SITES
    sites: int = MIN_SITES
    job_key: str = ""
    max_abs: float = TrustPolicy.max_abs
    #: the heads are private for one row ([`JobConfig.private_heads`][fedhead.settings.job.JobConfig.private_heads])
    private_heads: bool = False
    #: [`JobConfig.exchange_row_noise`][fedhead.settings.job.JobConfig.exchange_row_noise]
    exchange_noise: float | None = None


def secure_mod(site_of: Callable[[Message, Context], SecureSite], simulated: SimulatedSites | None = None):
    """A Flower mod (``ClientApp(mods=[secure_mod(...)])``) that serves secure mode for the app's handlers:
    it answers the secure sum's later steps itself, and turns a reply to a message that names a sum into its
    secure form ([`secure_reply`][fedhead.clients.secure.secure_reply]). Clear-mode messages pass through.
    Every message is first [`admit`][fedhead.clients.secure.admit]ted under the node's own
    [`SitePolicy`][fedhead.clients.policy.SitePolicy]; a step whose failure could depend on the site's
    values (a mask, the secure reply) refuses the whole run, so that it is answered once.

    ``site_of(msg, context)``: the [`SecureSite`][fedhead.clients.secure.SecureSite] of the message's run;
    ``simulated``: a simulation's own roster and keys (a deployed site's come from its node config,
    [`site_identity`][fedhead.clients.identity.site_identity]).
    """

    def mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        site = site_of(msg, context)
        policy, ledger = site_policy(context), SiteLedger(context)
        scope = run_scope(context, site.job_key)
        admit(msg, context, site, policy, ledger, scope)
        cfg = msg.content.config_records.get(protocol.CONFIG)
        name = sum_id(msg)
        identity = None if name is None else site_identity(context, simulated)
        if identity is not None and cfg is not None and cfg.get(protocol.STAGE) == sr.STAGE_SECURE:
            try:
                return handle_secure_step(msg, context, identity, policy)
            except PolicyRefusal:
                raise
            except ClientError as exc:  # a mask that fails may depend on the input: one answer per run
                if cfg.get(sr.STEP) != sr.MASK:
                    raise
                log.warning("%s: %s", scope, exc)
                raise ledger.refuse_run(scope, f"secure sum {name}: {_NO_FURTHER_PART}") from None
        reply = call_next(msg, context)
        if identity is None or reply.has_error():
            return reply
        try:
            content = secure_reply(
                msg,
                context,
                reply.content,
                lambdas=site.lambdas,
                privacy=site.privacy,
                min_sites=site.min_sites,
                identity=identity,
                floor=site_floor(policy, identity),
                max_abs=site.max_abs,
                private_heads=site.private_heads,
            )
        except PolicyRefusal:
            raise
        except (ClientError, ValueError) as exc:  # e.g. a non-finite input (rows-dependent): one answer per run
            log.warning("%s: %s", scope, exc)
            raise ledger.refuse_run(scope, f"secure sum {name}: {_NO_FURTHER_PART}") from None
        return Message(content, reply_to=msg)

    return mod
