"""The fedhead ServerApp of ``flwr run .`` (``[tool.flwr.app.components] serverapp``).

The body lives in [`fedhead.driver.server`][fedhead.driver.server]: it reads the job from the run config
([`fedhead.settings.config.job_from_context`][fedhead.settings.config.job_from_context]), resumes from ``<output-dir>``
with ``resume = true`` and serves the rounds as the simulation driver does.
"""

from __future__ import annotations

from flwr.serverapp import ServerApp

from fedhead.driver.server import deployment_main

app = ServerApp()
app.main()(deployment_main)
