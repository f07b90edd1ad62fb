"""Flower strategies of fedhead (Message API, flwr 1.42), thin over the numpy modules
(:mod:`fedhead.aggregation`, :mod:`fedhead.diagnosis`, :mod:`fedhead.tracking`)."""

from strategies.exchange import MomentExchange
from strategies.head_averaging import HeadAveraging
from strategies.observer import RunObserver
from strategies.replies import FederationError
from strategies.mismatch import MismatchHeadAveraging
from strategies.variants import AlignedHeadAveraging, FullModelAveraging, make_strategy

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
