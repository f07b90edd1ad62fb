"""Flower strategies of fedhead (Message API, flwr 1.42), thin over the numpy modules
(:mod:`fedhead.federation.aggregation`, :mod:`fedhead.analysis.diagnosis`, :mod:`fedhead.federation.tracking`)."""

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
