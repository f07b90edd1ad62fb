"""The fedhead ClientApp (handlers), the client step a user's own ClientApp calls, the backbone store."""

from fedhead.clients.app import make_client_app
from fedhead.clients.state import ClientError
from fedhead.clients.step import evaluate_step, moment_reply, train_step
from fedhead.clients.store import BackboneStore, StoreError

__all__ = [
    "BackboneStore",
    "ClientError",
    "StoreError",
    "evaluate_step",
    "make_client_app",
    "moment_reply",
    "train_step",
]
