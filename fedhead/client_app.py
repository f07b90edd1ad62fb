"""The fedhead ClientApp of ``flwr run .`` (``[tool.flwr.app.components] clientapp``): the app of
[`fedhead.clients.app`][fedhead.clients.app] whose job the run config names, built once per run at each node
and kept in the node's state ([`job_of_run`][fedhead.client_app.job_of_run]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import Context

from fedhead.clients import make_client_app
from fedhead.clients.cache import CLIENT_CACHE, job_in_state

if TYPE_CHECKING:
    from fedhead.settings.job import JobConfig


def job_of_run(context: Context) -> JobConfig:
    """The job of ``context``'s run config: the process's, else the one kept in the node's state
    ([`job_in_state`][fedhead.clients.cache.job_in_state]), else built
    ([`job_from_context`][fedhead.settings.config.job_from_context]) at the run's first message at this node."""
    return CLIENT_CACHE.job(context, lambda ctx: job_in_state(ctx, _built_job))


def _built_job(context: Context) -> JobConfig:
    from fedhead.settings.config import job_from_context  # Hydra: only where the node's state holds no job

    return job_from_context(context)


app = make_client_app(job_of_run)
