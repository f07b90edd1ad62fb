"""The run's next secure sum, set up within the messages of the sum before it, so that a secure phase costs
two messages in steady state (its phase message, the reveal) instead of five.

A phase message names the next sum (``secure-next-sum``); each site's reply, which carries its input, also
carries its signed keys for the next sum. The reveal message then carries the next sum's key book, and each
site's unmasking shares come back with its key shares for it. The next phase message carries each site's
routed shares and the encoding (its mask request), and the reply is the masked input at once, with the
site's signature of its full list ([`finish_sum`][fedhead.strategies.secure.finish_sum]; a sum in which a
site drops has a survivor list to sign, and that message carries the book). Every check of the protocol
stays as it is: only the messages that carry the stages change
([`PreparedSum`][fedhead.strategies.secure_pipeline.PreparedSum]). A sum that was not set up this way
(the first of a run, after a resume, or when the set-up failed) starts with its own key messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.reply_checks import ReplyError
from fedhead.federation.roster import Roster
from fedhead.federation.secure_server import SecureSumServer
from fedhead.federation.secure_sum import MIN_SITES, KeyShares, PublicKeys, SecureSumError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NextBook:
    """The next sum's server after its keys (stage 1) and the key book its sites receive with the reveal (or
    the survivor list) of the sum before."""

    sum_id: str
    server: SecureSumServer
    book: Mapping[int, PublicKeys]


@dataclass(frozen=True)
class PreparedSum:
    """A sum whose keys and key shares went with the previous sum's messages: its ``server`` (stages 1-2
    done) and the ciphertexts ``routed`` to each of its sites, which their phase message carries."""

    sum_id: str
    server: SecureSumServer
    routed: Mapping[int, Mapping[int, bytes]]


class SumPipeline:
    """The run's one prepared sum (at most one at a time), and the ids announced as a next sum that was not
    set up: the sites that advertised keys for one hold its id as used, so the sum runs under a fresh one."""

    def __init__(self) -> None:
        self.prepared: PreparedSum | None = None
        self.announced: set[str] = set()

    def sum_id(self, sum_id: str) -> str:
        """The id the sum ``sum_id`` runs under: itself, unless it was announced and not set up (then
        ``<sum_id>+``, new to every site)."""
        return f"{sum_id}+" if sum_id in self.announced and self.prepared_id != sum_id else sum_id

    @property
    def prepared_id(self) -> str | None:
        """The id of the prepared sum (None: none)."""
        return None if self.prepared is None else self.prepared.sum_id

    def announce(self, sum_id: str | None, prepared: PreparedSum | None) -> None:
        """The sites were told that ``sum_id`` comes next; ``prepared``: the sum set up (None: it was not)."""
        if sum_id is not None:
            self.announced.add(sum_id)
        self.prepared = prepared

    def peek(self, sum_id: str) -> PreparedSum | None:
        """The prepared sum when it is ``sum_id`` (another is forgotten: the run went another way)."""
        if self.prepared is not None and self.prepared.sum_id != sum_id:
            log.info(
                "secure sum %s was set up but %s came next; it starts with its own keys", self.prepared.sum_id, sum_id
            )
            self.prepared = None
        return self.prepared

    def take(self, sum_id: str) -> PreparedSum | None:
        """The prepared sum ``sum_id``, removed (None when the sum was not set up)."""
        prepared = self.peek(sum_id)
        self.prepared = None
        return prepared


def next_book(
    sum_id: str | None, keys: Mapping[int, PublicKeys], roster: Roster, threshold_of: Callable[[int], int]
) -> NextBook | None:
    """The next sum's key book from the sites' signed ``keys`` (a site whose advertisement fails the
    server's checks is left out of it), of ``threshold_of(sites)`` shares; None when there is no next sum or
    too few sites for one."""
    remaining = dict(keys)
    while sum_id is not None and len(remaining) >= MIN_SITES:
        try:
            server = SecureSumServer(
                sorted(remaining), None, None, sum_id=sum_id, roster=roster, threshold=threshold_of(len(remaining))
            )
            return NextBook(sum_id, server, server.collect_keys(remaining))
        except ReplyError as exc:
            log.info("secure sum %s: keys of node %s left out (%s)", sum_id, exc.node_id, exc)
            remaining.pop(int(exc.node_id), None)
        except (SecureSumError, ConfigError) as exc:
            log.info("secure sum %s is not set up ahead (%s); it starts with its own keys", sum_id, exc)
            return None
    return None


def prepare(book: NextBook, shares: Mapping[int, KeyShares], roster: Roster) -> PreparedSum | None:
    """The next sum ready for its phase message: the key shares of the sites that sent valid ones routed
    (a site whose shares fail the server's checks is left out); None when too few remain."""
    remaining, server = dict(shares), book.server
    while len(remaining) >= server.threshold:
        try:
            return PreparedSum(book.sum_id, server, server.route_shares(remaining))
        except ReplyError as exc:
            log.info("secure sum %s: key shares of node %s left out (%s)", book.sum_id, exc.node_id, exc)
            remaining.pop(int(exc.node_id), None)
        except (SecureSumError, ConfigError):
            break
        # the failed routing used up this server's stage 2: the same book on a fresh one
        server = SecureSumServer(
            server.sites, None, None, sum_id=book.sum_id, roster=roster, threshold=server.threshold
        )
        server.collect_keys(book.book)
    log.info("secure sum %s: too few sites shared their keys ahead; it starts with its own keys", book.sum_id)
    return None
