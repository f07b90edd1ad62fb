"""The client side of fedhead: the library steps a user's own ClientApp calls
([`fedhead.clients.step`][fedhead.clients.step]), fedhead's own ClientApp, and the private backbone store.

The steps are imported on first use, and only the training and evaluation steps import torch: a deployed
message that touches no model (a statistics query, a SecAgg step, the moment query) imports the package
without torch.
"""

from typing import TYPE_CHECKING

from fedhead.analysis.lazy import lazy_exports
from fedhead.clients.app import make_client_app
from fedhead.clients.messages import ClientError
from fedhead.clients.secure import SecureSite, secure_mod
from fedhead.clients.store import BackboneStore, StoreError

if TYPE_CHECKING:
    from fedhead.clients.moments import moment_reply
    from fedhead.clients.step import evaluate_step, train_step

__getattr__ = lazy_exports(
    __name__, {"fedhead.clients.step": ("evaluate_step", "train_step"), "fedhead.clients.moments": ("moment_reply",)}
)

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
