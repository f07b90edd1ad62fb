"""The one aggregation seam of the strategy: [`Aggregator`][fedhead.strategies.aggregator.Aggregator].

[`HeadAveraging`][fedhead.strategies.HeadAveraging] gets every sum it needs through one aggregator,
chosen once from ``privacy.mode`` ([`make_aggregator`][fedhead.strategies.privacy_modes.make_aggregator]):
the one-time exchange, each round's heads, each evaluation's errors, the regime check, what a phase's
messages carry for its sum and the privacy spent. In clear mode
([`ClearAggregator`][fedhead.strategies.clear.ClearAggregator]) the sites' values reach the server
one by one; in secure mode ([`SecureAggregator`][fedhead.strategies.secure_aggregator.SecureAggregator])
only their sums; differential privacy wraps the secure one
([`DifferentialPrivacy`][fedhead.strategies.privacy_modes.DifferentialPrivacy]).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid

from fedhead.federation import aggregation as agg
from fedhead.strategies.exchange import ExchangeSettings, MomentExchange
from fedhead.strategies.failures import Dropped
from fedhead.strategies.phases import TrainReplies, screen_phase

T = TypeVar("T", bound=tuple)

#: A phase's kind (its message type) -> its name in messages to people.
STAGES = {"train": "training", "evaluate": "evaluation"}


class ReplyChecks(Protocol):
    """A strategy variant's own checks of the training replies it sees one by one (clear mode)."""

    def check_reply(self, msg: Message, weight: np.ndarray) -> None: ...

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]: ...


class NoChecks:
    """The checks of a strategy without its own: none, and no measurement."""

    def check_reply(self, msg: Message, weight: np.ndarray) -> None:
        pass

    def verify_replies(self, msgs: Sequence[Message], heads: np.ndarray) -> dict[str, float]:
        return {}


@dataclass(frozen=True)
class Phase:
    """One message phase of a round as an aggregator sees it (the strategy builds one per phase).

    Attributes
    ----------
    kind : str
        ``"train"`` or ``"evaluate"``: the phase's message type (a secure sum is named ``<kind>-<round>``).
    server_round : int
        The run's round (counted on after a resume).
    exchange : MomentExchange
        The one-time exchange: the clients that take part, their partitions and counts.
    settings : ExchangeSettings
        The failure policy, the deadlines, the trust policy and the entries of every message.
    sent : sequence of int or None
        The nodes the phase went to (a missing reply drops its node); None: not known.
    grid : Grid or None
        Where further messages of the phase go (the steps of a secure sum).
    head_shape : (int, int)
        ``(C, P)`` of the shared head.
    broadcast : (ndarray, ndarray) or None
        The head ``(W_t, b_t)`` the phase's clients trained from.
    checks : ReplyChecks
        A variant's own checks of the training replies seen one by one.
    next_sum : str or None
        The phase that comes after this one (``<kind>-<round>``; None: the last), so that a secure sum can
        set up the next one within its own messages.
    """

    kind: str
    server_round: int
    exchange: MomentExchange
    settings: ExchangeSettings
    sent: Sequence[int] | None = None
    grid: Grid | None = None
    head_shape: tuple[int, int] = (0, 0)
    broadcast: tuple[np.ndarray, np.ndarray] | None = None
    checks: ReplyChecks = field(default_factory=NoChecks)
    next_sum: str | None = None

    @property
    def stage(self) -> str:
        """The phase's name in messages to people (``training``, ``evaluation``)."""
        return STAGES[self.kind]

    def screen(
        self, replies: Iterable[Message], parse: Callable[[Message], T]
    ) -> tuple[list[tuple[Message, T]], list[Dropped]]:
        """The phase's valid replies by partition and its dropped clients
        ([`screen_phase`][fedhead.strategies.phases.screen_phase] against the nodes it was sent to)."""
        return screen_phase(
            replies,
            parse,
            stage=self.stage,
            exchange=self.exchange,
            required=self.settings.required,
            sent=self.sent,
            timeout=self.settings.timeouts.round,
        )


def next_phase(kind: str, server_round: int, evaluate: bool, num_rounds: int | None) -> str | None:
    """The phase after ``kind`` of round ``server_round`` (``<kind>-<round>``; None after the last), when each
    round ``evaluate``s after training and the run has ``num_rounds`` (None: not known)."""
    if kind == "train" and evaluate:
        return f"evaluate-{server_round}"
    if num_rounds is not None and server_round >= num_rounds:
        return None
    return f"train-{server_round + 1}"


@dataclass(frozen=True)
class HeadSum:
    """A training phase's new head ``(weight (C, P), bias (C,))`` and what its round record takes from the
    replies: those seen one by one (``kept``; none in secure mode), their averaging ``shares``
    (unnormalised), the dropped clients, each client's declared metrics, the round's scalars
    (``extra``) and, in clear mode, the local fit, the clients ``present`` (indices into the exchange)
    and the trust policy's counts, Gram errors and flags."""

    weight: np.ndarray
    bias: np.ndarray
    kept: TrainReplies
    shares: np.ndarray
    dropped: Sequence[Dropped]
    client_metrics: list[dict[str, float]]
    extra: dict[str, float]
    fit: agg.LocalFit | None = None
    present: list[int] | None = None
    ignored_metrics: int = 0
    clipped_updates: int = 0
    gram_errors: list[float] | None = None
    flags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MseSum:
    """An evaluation phase's train and test MSE (``test`` None when not every client reported one) and the
    clients it dropped."""

    train: float
    test: float | None
    dropped: Sequence[Dropped]


class Aggregator(ABC):
    """How the server gets its sums, whatever the privacy mode: one instance per strategy."""

    @abstractmethod
    def exchange(self, settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> MomentExchange:
        """The one-time exchange over ``grid`` with the nodes ``node_ids``."""

    @abstractmethod
    def check_regime(self, exchange: MomentExchange, settings: ExchangeSettings, allow_outside_regime: bool) -> None:
        """Refuse to train outside the fully active regime unless ``allow_outside_regime`` (then warn once)."""

    @abstractmethod
    def address(self, phase: Phase, messages: list[Message]) -> list[Message]:
        """A phase's ``messages`` as they are sent: each names the sum its reply enters and carries what the
        sum needs of that site (the messages as they are when there is no sum)."""

    @abstractmethod
    def aggregate_train(self, phase: Phase, replies: Iterable[Message]) -> HeadSum:
        """The round's new head from the training replies."""

    @abstractmethod
    def aggregate_evaluate(self, phase: Phase, replies: Iterable[Message]) -> MseSum:
        """The shared head's errors from the evaluation replies."""

    def privacy_spent(self) -> dict[str, float]:
        """Round scalars of the privacy spent so far (empty: none is accounted)."""
        return {}
