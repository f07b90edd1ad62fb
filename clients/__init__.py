"""The fedhead ClientApp (query/train/evaluate handlers) and the private backbone store."""

from clients.app import ClientError, make_client_app
from clients.store import BackboneStore, StoreError

__all__ = ["BackboneStore", "ClientError", "StoreError", "make_client_app"]
