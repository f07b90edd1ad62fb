"""What a strategy reports: the observer protocol the run layer implements (results, TensorBoard,
progress), and the observer that ignores everything (the default). The strategies do no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fedhead.federation.tracking import RoundRecord

if TYPE_CHECKING:
    from fedhead.strategies.exchange import MomentExchange


class RunObserver(Protocol):
    """Receives what the strategy measures (implemented by the run layer,
    [`fedhead.driver.recorder`][fedhead.driver.recorder]).

    A resumed run hands its restored records to ``HeadAveraging.run(on_resume=...)`` instead.
    """

    def on_exchange(self, exchange: MomentExchange) -> None: ...

    def on_round(self, record: RoundRecord) -> None: ...


class NullObserver:
    """The observer of a strategy built without one: ignores every report."""

    def on_exchange(self, exchange: MomentExchange) -> None:
        pass

    def on_round(self, record: RoundRecord) -> None:
        pass
