"""Read-only containers for the frozen config objects: [`freeze`][fedhead.analysis.frozen.freeze]
turns nested dicts and lists into [`FrozenDict`][fedhead.analysis.frozen.FrozenDict] and tuples.

``FrozenDict`` is a ``dict`` whose mutators raise: JSON, ``isinstance(x, dict)`` and pickling
(configs travel to Ray workers) keep working, which ``types.MappingProxyType`` would not allow.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["FrozenDict", "freeze"]


class FrozenDict(dict):
    """A ``dict`` that cannot be changed after it is built (hashable when its values are)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a FrozenDict cannot be changed (build a new one)")

    __setitem__ = __delitem__ = _refuse
    # one refusal stands in for dict's overloaded mutators, whatever their signatures
    clear = pop = popitem = setdefault = update = _refuse  # pyright: ignore[reportAssignmentType]
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda kv: repr(kv[0]))))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


def freeze(value: Any) -> Any:
    """``value`` with every dict a [`FrozenDict`][fedhead.analysis.frozen.FrozenDict] and every
    list a tuple, recursively; other values as they are."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value
