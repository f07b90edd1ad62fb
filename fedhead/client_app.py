"""The fedhead ClientApp of ``flwr run .`` (``[tool.flwr.app.components] clientapp``): the app of
[`fedhead.clients.app`][fedhead.clients.app] whose job the run config names, built once per process and run config
(the process's [`ClientCache`][fedhead.clients.cache.ClientCache]).
"""

from __future__ import annotations

from flwr.app import Context

from fedhead.clients import make_client_app
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.settings.config import JobConfig, job_from_context


def job_of_run(context: Context) -> JobConfig:
    """The job of ``context``'s run config, built once
    ([`job_from_context`][fedhead.settings.config.job_from_context])."""
    return CLIENT_CACHE.job(context, job_from_context)


app = make_client_app(job_of_run)
