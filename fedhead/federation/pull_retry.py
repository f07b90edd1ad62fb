"""How soon fedhead's site programs pull again a part of a message that was not there yet.

flwr 1.42 sends a message as separate objects (the message, each record, each array), each pushed and pulled
with a request of its own. A receiver pulls a message's objects as soon as it sees the message, and an object
its sender has not pushed yet is pulled again after 1 s, then 2, 4, up to 10 s
(``flwr.supercore.constant.PULL_INITIAL_BACKOFF`` and ``PULL_BACKOFF_CAP``; no setting). The ServerApp pushes a
training message's objects one request at a time, so a SuperNode that pulls at once finds some missing and
waits a second or more, and so does its ClientApp pulling from it in turn: about 2 s of a training phase of
5 s on loopback (docs/deployment.md, "What a message costs").

[`retry_sooner`][fedhead.federation.pull_retry.retry_sooner] gives a flwr module that pulls objects a first retry
of ``FIRST_RETRY_S`` doubling up to ``RETRY_CAP_S``, and as many more tries per object as keep flwr's patience
(its ``max_time`` is unchanged). ``fedhead-supernode`` does it for its pulls from the SuperLink, the warm
ClientApp parent for its children's pulls from their SuperNode.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from typing import Any

from flwr.supercore.constant import PULL_BACKOFF_CAP, PULL_INITIAL_BACKOFF, PULL_MAX_TRIES_PER_OBJECT

#: flwr's own first retry and cap, in seconds (1 and 10 in flwr 1.42)
FLWR_FIRST_RETRY_S, FLWR_RETRY_CAP_S = float(PULL_INITIAL_BACKOFF), float(PULL_BACKOFF_CAP)
#: fedhead's: a missing object is asked for again within 0.05 to 0.5 s
FIRST_RETRY_S, RETRY_CAP_S = 0.05, 0.5
#: where flwr defines ``pull_objects``
PULLS = "flwr.supercore.inflatable.inflatable_utils"


def sooner(
    pull_objects: Callable[..., Any], first: float = FIRST_RETRY_S, cap: float = RETRY_CAP_S
) -> Callable[..., Any]:
    """flwr's ``pull_objects`` with its retries after ``first`` seconds, doubling up to ``cap`` (or a caller's
    shorter ones), and its tries per object scaled so that the longest wait stays flwr's."""

    @functools.wraps(pull_objects)
    def pull(*args: Any, **kwargs: Any) -> Any:
        kwargs["initial_backoff"] = min(float(kwargs.get("initial_backoff", first)), first)
        kwargs["backoff_cap"] = min(float(kwargs.get("backoff_cap", cap)), cap)
        tries = kwargs.get("max_tries_per_object", PULL_MAX_TRIES_PER_OBJECT)
        if tries is not None:
            kwargs["max_tries_per_object"] = int(tries) * math.ceil(FLWR_RETRY_CAP_S / kwargs["backoff_cap"])
        return pull_objects(*args, **kwargs)

    pull.fedhead_sooner = True  # type: ignore[attr-defined]
    return pull


def _flwrs() -> Callable[..., Any] | None:
    """flwr's own ``pull_objects`` (unwrapped, when its module was given sooner retries)."""
    found = importlib.import_module(PULLS).__dict__.get("pull_objects")
    return getattr(found, "__wrapped__", None) if getattr(found, "fedhead_sooner", False) else found


def retry_sooner(module_name: str, first: float = FIRST_RETRY_S, cap: float = RETRY_CAP_S) -> None:
    """Give ``module_name`` (a flwr module that calls ``pull_objects`` by that name, flwr's own module among them)
    [`sooner`][fedhead.federation.pull_retry.sooner] retries; ``RuntimeError`` when its ``pull_objects`` is not flwr
    1.42's. A module given them already keeps them."""
    module = importlib.import_module(module_name)
    current = getattr(module, "pull_objects", None)
    if getattr(current, "fedhead_sooner", False):
        return
    if current is None or current is not _flwrs() or getattr(current, "__module__", "") != PULLS:
        raise RuntimeError(f"{module_name}.pull_objects is not flwr 1.42's: this flwr is not supported")
    module.pull_objects = sooner(current, first, cap)  # type: ignore[attr-defined]
