"""fedhead's Flower strategies (Message API, flwr 1.42): head averaging with the one-time moment
exchange, its variants, and the observer protocol the run layer implements. The numbers come
from the numpy layers ([`fedhead.federation.aggregation`][fedhead.federation.aggregation],
[`fedhead.analysis.diagnosis`][fedhead.analysis.diagnosis]).
"""

from fedhead.strategies.exchange import MomentExchange
from fedhead.strategies.head_averaging import HeadAveraging
from fedhead.strategies.mismatch_heads import MismatchHeadAveraging
from fedhead.strategies.observer import RunObserver
from fedhead.strategies.replies import FederationError
from fedhead.strategies.variants import AlignedHeadAveraging, FullModelAveraging, make_strategy

__all__ = [
    "AlignedHeadAveraging",
    "FederationError",
    "FullModelAveraging",
    "HeadAveraging",
    "MismatchHeadAveraging",
    "MomentExchange",
    "RunObserver",
    "make_strategy",
]
