"""The models layer's error, in a module of its own so that the configs and the backbones both raise it
without importing each other."""

from __future__ import annotations

__all__ = ["ModelError"]


class ModelError(ValueError):
    """Bad model configuration or input: the message says what and where."""
