"""The fedhead ClientApp of ``flwr run .`` (``[tool.flwr.app.components] clientapp``).

The handlers live in :mod:`fedhead.clients.app`; here the app resolves its job from the run config
(:func:`fedhead.federation.config.job_from_context`), as the ServerApp of :mod:`fedhead.server_app` does.
"""

from __future__ import annotations

from fedhead.clients import make_client_app
from fedhead.federation.config import job_from_context

app = make_client_app(job_from_context)
