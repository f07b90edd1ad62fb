"""The fedhead ClientApp (query/train/evaluate handlers) and the private backbone store."""

from fedhead.clients.app import make_client_app
from fedhead.clients.state import ClientError
from fedhead.clients.store import BackboneStore, StoreError

__all__ = ["BackboneStore", "ClientError", "StoreError", "make_client_app"]
