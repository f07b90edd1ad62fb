"""fedhead/federation/pull_retry.py: flwr's pulls of a message's objects retried within 0.05 to 0.5 s instead of 1 to
10 s, with as many more tries as keep flwr's patience; only flwr 1.42's own ``pull_objects`` is wrapped."""

from __future__ import annotations

import importlib
import types

import pytest
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

from fedhead.federation import pull_retry


def _recording():
    calls = []

    def pull_objects(object_ids, pull_object_fn, **kwargs):
        calls.append(kwargs)
        return {}

    return pull_objects, calls


def test_sooner_shortens_flwrs_retries_and_keeps_its_patience():
    fake, calls = _recording()
    pull = pull_retry.sooner(fake)
    pull(["a"], lambda i: b"")  # flwr's defaults: 1 s doubling to 10 s, 500 tries per object
    pull(["a"], lambda i: b"", initial_backoff=1, backoff_cap=10, max_tries_per_object=500)
    pull(["a"], lambda i: b"", initial_backoff=0.01, backoff_cap=0.2, max_tries_per_object=None)  # a caller's own
    assert calls[0] == calls[1] == {"initial_backoff": 0.05, "backoff_cap": 0.5, "max_tries_per_object": 10_000}
    assert calls[2] == {"initial_backoff": 0.01, "backoff_cap": 0.2, "max_tries_per_object": None}


def test_flwrs_pull_with_sooner_retries_gets_an_object_that_comes_late():
    from flwr.supercore.inflatable import inflatable_utils

    asked = []

    def pull_object(object_id: str) -> bytes:
        asked.append(object_id)
        if len(asked) < 4:  # its sender has not pushed it yet
            raise ObjectUnavailableError(object_id)
        return b"content"

    pulled = pull_retry.sooner(inflatable_utils.pull_objects)(["late"], pull_object)
    assert pulled == {"late": b"content"} and asked == ["late"] * 4


def test_retry_sooner_wraps_flwrs_pull_once_and_refuses_another(monkeypatch):
    loop = importlib.import_module("flwr.supernode.start_client_internal")
    pulls = importlib.import_module(pull_retry.PULLS)
    flwrs = pulls.pull_objects
    monkeypatch.setattr(loop, "pull_objects", flwrs)
    monkeypatch.setattr(pulls, "pull_objects", flwrs)
    pull_retry.retry_sooner(pull_retry.PULLS)
    pull_retry.retry_sooner("flwr.supernode.start_client_internal")
    pull_retry.retry_sooner("flwr.supernode.start_client_internal")  # given already: kept
    assert loop.pull_objects.__wrapped__ is flwrs and pulls.pull_objects.__wrapped__ is flwrs
    other = types.ModuleType("other_pulls")
    other.pull_objects = lambda *a, **k: {}
    monkeypatch.setitem(importlib.sys.modules, "other_pulls", other)
    with pytest.raises(RuntimeError, match="not flwr 1.42's"):
        pull_retry.retry_sooner("other_pulls")


def test_the_serverapp_gives_its_reply_pulls_sooner_retries_then_serves(monkeypatch, caplog):
    from fedhead import server_app

    grid_module = importlib.import_module(server_app.REPLY_PULLS)
    monkeypatch.setattr(grid_module, "pull_objects", pull_retry._flwrs())
    served = []
    monkeypatch.setattr(server_app, "deployment_main", lambda grid, context: served.append((grid, context)))
    server_app.main("grid", "context")
    assert served == [("grid", "context")] and grid_module.pull_objects.fedhead_sooner
    monkeypatch.setattr(grid_module, "pull_objects", lambda *a, **k: {})  # another flwr's: one warning, then serve
    with caplog.at_level("WARNING", logger="fedhead.server_app"):
        server_app.main("grid", "context")
    assert len(served) == 2 and "pulls the replies with flwr's retries" in caplog.text
