"""The client side of fedhead: the library steps a user's own ClientApp calls
([`fedhead.clients.step`][fedhead.clients.step]), fedhead's own ClientApp, and the private backbone store."""

from fedhead.clients.app import make_client_app
from fedhead.clients.messages import ClientError
from fedhead.clients.secure import SecureSite, secure_mod
from fedhead.clients.step import evaluate_step, moment_reply, train_step
from fedhead.clients.store import BackboneStore, StoreError

__all__ = [
    "BackboneStore",
    "ClientError",
    "SecureSite",
    "StoreError",
    "evaluate_step",
    "make_client_app",
    "moment_reply",
    "secure_mod",
    "train_step",
]
