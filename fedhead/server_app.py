"""The fedhead ServerApp of ``flwr run .`` (``[tool.flwr.app.components] serverapp``).

The body lives in [`fedhead.driver.server`][fedhead.driver.server]: it reads the job from the run config
([`fedhead.settings.config.job_from_context`][fedhead.settings.config.job_from_context]), resumes from ``<output-dir>``
with ``resume = true`` and serves the rounds as the simulation driver does. Before, it gives the ServerApp
process's pulls of the sites' replies shorter retries
([`fedhead.federation.pull_retry`][fedhead.federation.pull_retry]): flwr waits 1 s or more for a reply's part
that its site is still pushing.
"""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedhead.driver.server import deployment_main
from fedhead.federation.pull_retry import retry_sooner

log = logging.getLogger(__name__)

#: the flwr module whose grid pulls the replies' objects in a deployed ServerApp
REPLY_PULLS = "flwr.superlink.grid.http_grid"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Sooner retries of the replies' pulls (with flwr's, and one warning, where this flwr has others), then
    [`deployment_main`][fedhead.driver.server.deployment_main]."""
    try:
        retry_sooner(REPLY_PULLS)
    except RuntimeError as err:
        log.warning("%s; the ServerApp pulls the replies with flwr's retries", err)
    deployment_main(grid, context)
