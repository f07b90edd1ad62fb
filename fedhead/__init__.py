"""fedhead: federated multivariate regression with private backbones and a shared linear head.

Layers, one folder each; imports point down only (``tests/test_layers.py`` checks it):

``ufm`` (math, numpy/scipy), ``progress`` <- ``analysis`` (numpy) <- ``results`` (files) <-
``plotting`` <- ``data`` / ``models`` (torch) <- ``train`` <- ``settings`` (the run's config) <-
``federation`` (protocol, aggregation) <- ``strategies`` / ``clients`` (Flower) <- ``driver``
(simulation, recorder) <- ``sweep`` / ``experiments`` <- ``report`` <- ``cli`` and the two
Flower components ``server_app`` and ``client_app``. docs/architecture.md has the table.

``fedhead.strategies``, ``fedhead.clients`` and ``fedhead.conf`` are the Flower-facing folders;
the repository also shows them at its top level as links (``strategies/`` ...), for reading only.
"""

__version__ = "0.1.0"
