"""fedhead: federated multivariate regression with private backbones and a shared linear head.

Layers (imports point down only): ``fedhead.ufm`` (pure math) <- ``fedhead.data`` /
``fedhead.models`` (torch) <- ``fedhead.train`` <- ``strategies`` / ``clients`` (Flower) <-
entry points (``fedhead.run``, ``fedhead.data.cli``, ``fedhead.experiments.cli``).
"""

__version__ = "0.1.0"
