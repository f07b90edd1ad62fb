"""The nested objects of results.json (``timing``, ``local_optimality``, ``local_steps``, ``dataset``).

Each is a frozen dataclass whose fields are its keys, with the helpers that write and read any
schema dataclass and the [`ABSENT`][fedhead.results.sections.ABSENT] marker of a key the file
does not hold. [`fedhead.results.schema`][fedhead.results.schema] re-exports all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from fedhead.results.rounds import key

__all__ = [
    "ABSENT",
    "SchemaError",
    "Timing",
    "LocalOptimality",
    "LocalSteps",
    "DatasetInfo",
    "section_dict",
    "section_kwargs",
]


class _Absent:
    """The value of an optional key that the file does not hold (falsy; see the module doc)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


class SchemaError(ValueError):
    """A results.json that is not of a known schema version or misses a required key."""


def section_dict(obj: Any) -> dict[str, Any]:
    """The fields of a schema dataclass in declaration order, [`ABSENT`][fedhead.results.sections.ABSENT] ones left
    out."""
    out = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if v is ABSENT:
            continue
        out[f.name] = v.to_dict() if hasattr(v, "to_dict") else v
    return out


def section_kwargs(cls: type, d: Any, where: str) -> dict[str, Any]:
    """``d``'s values of ``cls``'s fields; [`SchemaError`][fedhead.results.sections.SchemaError] for a required one that
    is missing."""
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}: expected a JSON object, got {type(d).__name__}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [n for n in required if n not in d]
    if missing:
        raise SchemaError(f"{where}: missing key(s) {', '.join(missing)}")
    return {f.name: d[f.name] for f in fields(cls) if f.name in d}


@dataclass(frozen=True)
class Timing:
    """``timing``: where a federation's wall time went (seconds); keys absent when not measured."""

    ray_init_seconds: float = field(default=ABSENT, metadata=key("`ray.init` (simulation only)", "float"))
    simulation_seconds: float = field(
        default=ABSENT, metadata=key("the procedure's part of the run_simulation call", "float")
    )
    startup_seconds: float | None = field(
        default=ABSENT, metadata=key("from the ServerApp's start to its first message phase", "float")
    )
    phase_seconds: dict[str, float] = field(
        default=ABSENT, metadata=key("`query`/`train`/`evaluate` message phases, summed by type", "object")
    )
    phases: list[list[Any]] = field(default=ABSENT, metadata=key("every phase in order, `[type, seconds]`", "list"))
    client_train_seconds: float = field(
        default=ABSENT, metadata=key("sum of the clients' local training loops", "float")
    )
    round_train_seconds: list[float] = field(
        default=ABSENT, metadata=key("the same per round (`[t - 1]`: round t)", "(T)")
    )
    client_local_seconds: float = field(
        default=ABSENT,
        metadata=key("sum of the clients' whole local computation (set-up, epochs, finishing step)", "float"),
    )
    round_local_seconds: list[float] = field(default=ABSENT, metadata=key("the same per round", "(T)"))
    total_seconds: float = field(
        default=ABSENT,
        metadata=key(
            "the procedure's wall time (the first procedure of a `fedhead-run` includes data preparation "
            "and the Ray start)",
            "float",
        ),
    )
    figures_wait_seconds: float = field(
        default=ABSENT,
        metadata=key("last procedure of a simulation only: the wait for the figures drawn in the background", "float"),
    )

    def to_dict(self) -> dict[str, Any]:
        return section_dict(self)

    @classmethod
    def from_dict(cls, d: Any) -> Timing:
        return cls(**section_kwargs(cls, d, "timing"))


@dataclass(frozen=True)
class LocalOptimality:
    """``local_optimality``: did every client reach its local optimum, per round?"""

    threshold: float = field(metadata=key("the relative gap a client must reach (1e-2)", "float"))
    rounds_above_threshold: list[int] = field(
        metadata=key("rounds in which some client's trained gap exceeded it", "list")
    )
    last_round_max_trained_gap: float | None = field(metadata=key("the last round's `max_trained_gap`", "float"))
    last_round_max_objective_gap: float | None = field(
        metadata=key("the last round's largest `objective_gaps` entry", "float")
    )
    reached: bool | None = field(metadata=key("every client within the threshold at the last round", "bool"))

    def to_dict(self) -> dict[str, Any]:
        return section_dict(self)

    @classmethod
    def from_dict(cls, d: Any) -> LocalOptimality:
        return cls(**section_kwargs(cls, d, "local_optimality"))


@dataclass(frozen=True)
class LocalSteps:
    """``local_steps``: the local work each client used, summed over the run's rounds, against the
    fixed recipe (``E`` epochs in every round). Every list has one entry per client, partition order."""

    local_epochs: int = field(metadata=key("E, the cap `local_epochs=` (the fixed recipe's epochs per round)", "int"))
    rounds: list[int] = field(
        metadata=key("T_m, the rounds with client m's reply (T unless a round dropped it)", "(M)")
    )
    epochs: list[int] = field(metadata=key("local epochs client m ran, summed over its rounds", "(M)"))
    steps: list[int] = field(metadata=key("optimiser steps client m took (`n_steps`), summed over its rounds", "(M)"))
    fixed_epochs: list[int] = field(metadata=key("the fixed recipe's epochs, E × T_m", "(M)"))
    fixed_steps: list[int | None] = field(
        metadata=key(
            "the fixed recipe's steps, E × T_m × steps per epoch (ceil(N_m / batch size), read off a round as "
            "`n_steps / local_epochs`); `null` where the client never ran an epoch (`exact`)",
            "(M)",
        )
    )
    ratios: list[float | None] = field(
        metadata=key("`fixed_steps / steps` per client (`null` where either is 0 or `null`)", "(M)")
    )
    median_ratio: float | None = field(
        metadata=key("the median of `ratios` over clients: how many times fewer steps than the fixed recipe", "float")
    )

    def to_dict(self) -> dict[str, Any]:
        return section_dict(self)

    @classmethod
    def from_dict(cls, d: Any) -> LocalSteps:
        return cls(**section_kwargs(cls, d, "local_steps"))


@dataclass(frozen=True)
class DatasetInfo:
    """``dataset``: the federation's data set."""

    name: str = field(metadata=key("the data set (`dataset.name`)", "str"))
    num_clients: int = field(metadata=key("M", "int"))
    counts: list[int] = field(
        default=ABSENT, metadata=key("N_m per client, partition order (after the exchange)", "(M)")
    )

    def to_dict(self) -> dict[str, Any]:
        return section_dict(self)

    @classmethod
    def from_dict(cls, d: Any) -> DatasetInfo:
        return cls(**section_kwargs(cls, d, "dataset"))
