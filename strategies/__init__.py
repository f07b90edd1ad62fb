"""Flower strategies of fedhead (Message API, flwr 1.42), thin over the numpy modules
(:mod:`fedhead.aggregation`, :mod:`fedhead.diagnosis`, :mod:`fedhead.tracking`)."""

from strategies.head_averaging import FederationError, HeadAveraging, MomentExchange, RunObserver
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
