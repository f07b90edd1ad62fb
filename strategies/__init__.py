"""Flower strategies of fedhead (Message API, flwr 1.42), thin over :mod:`fedhead.aggregation`."""

from strategies.head_averaging import (
    AlignedHeadAveraging,
    FederationError,
    FullModelAveraging,
    HeadAveraging,
    MomentExchange,
    RunObserver,
    make_strategy,
)

__all__ = [
    "AlignedHeadAveraging",
    "FederationError",
    "FullModelAveraging",
    "HeadAveraging",
    "MomentExchange",
    "RunObserver",
    "make_strategy",
]
