"""Declarative validation of config objects: each config class states its rules as a table, and
[`check`][fedhead.analysis.constraints.check] checks any table.

A table, not Hydra structured configs: the config classes are also built outside Hydra (the
library API, tests, ``fedhead-data``), their rules reach across fields and layers (``rho``,
``gamma``: [`rho_problem`][fedhead.analysis.procedure.rho_problem]), and each error
([`ConfigError`][fedhead.analysis.constraints.ConfigError]) must name the key as users type it
(``dataset.files``, ``TrainConfig.lr``) with the value and what is allowed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ConfigError",
    "Field",
    "Together",
    "check",
    "integer",
    "number",
    "one_of",
    "optional",
    "boolean",
    "names",
    "safe_name",
    "SAFE_NAME_NEED",
]


class ConfigError(ValueError):
    """Invalid configuration: the message names the key, the value and what is allowed.

    Every config class's rule table raises it, and so do the layers that check a setting of their
    own (a site's table, a user's model, the privacy parameters): it lives here, in the lowest layer
    they all import.
    """


@dataclass(frozen=True)
class Field:
    """``field`` must satisfy ``ok(value)``; else ``<prefix><field> <need>, got <value!r>``."""

    field: str
    ok: Callable[[Any], bool]
    need: str


@dataclass(frozen=True)
class Together:
    """A rule across fields: ``ok(obj)`` must hold; else ``message`` (formatted with the fields)."""

    ok: Callable[[Any], bool]
    message: str


def check(obj: object, rules: Iterable[Field | Together], *, prefix: str = "", error: type[Exception]) -> None:
    """Raise ``error`` for the first rule of ``rules`` that ``obj`` breaks (in table order)."""
    for rule in rules:
        if isinstance(rule, Field):
            value = getattr(obj, rule.field)
            if not rule.ok(value):
                raise error(f"{prefix}{rule.field} {rule.need}, got {value!r}")
        elif not rule.ok(obj):
            raise error(rule.message.format(**{k: getattr(obj, k) for k in _field_names(obj)}))


def _field_names(obj: object) -> list[str]:
    fields = getattr(type(obj), "__dataclass_fields__", {})
    return list(fields)


# ------------------------------------------------------------------ predicates of the tables
def integer(minimum: int | None = None) -> Callable[[Any], bool]:
    """An ``int`` (not a ``bool``) of at least ``minimum``."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and (minimum is None or v >= minimum)


def number(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> Callable[[Any], bool]:
    """A finite ``int`` or ``float`` (not a ``bool``) in the interval given by ``low``/``high``."""

    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        if low is not None and (v <= low if low_open else v < low):
            return False
        return high is None or (v < high if high_open else v <= high)

    return ok


def one_of(values: Sequence[Any]) -> Callable[[Any], bool]:
    """One of ``values``."""
    return lambda v: v in values


def optional(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """None, or what ``ok`` accepts."""
    return lambda v: v is None or ok(v)


def boolean(v: Any) -> bool:
    """``True`` or ``False``."""
    return isinstance(v, bool)


def names(v: Any) -> bool:
    """A sequence of non-empty strings (not one string)."""
    return not isinstance(v, (str, bytes)) and isinstance(v, Iterable) and all(isinstance(s, str) and s for s in v)


#: What [`safe_name`][fedhead.analysis.constraints.safe_name] accepts, as an error message says it.
SAFE_NAME_NEED = "must be letters, digits, '_', '.' or '-', starting with a letter or digit, without '..'"
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def safe_name(v: Any) -> bool:
    """A string usable as one folder name: ``[A-Za-z0-9][A-Za-z0-9_.-]*`` without ``..`` (no path
    separator, no parent folder, not hidden)."""
    return isinstance(v, str) and _SAFE_NAME.fullmatch(v) is not None and ".." not in v
