"""Sweeps of the network experiments (``fedhead-sweep``): presets, packing runs, the manifest.

* :mod:`fedhead.sweep.presets`: the named presets as pure lists of :class:`RunSpec`;
* :mod:`fedhead.sweep.manifest`: ``<out>/manifest.json``, written atomically after every run;
* :mod:`fedhead.sweep.runner`: skip finished runs, check data, pack runs into simulations;
* :mod:`fedhead.cli.sweep`: the Hydra entry point (``conf/sweep.yaml``).
"""

from fedhead.sweep.manifest import Manifest
from fedhead.sweep.presets import PRESETS, RunSpec, plan
from fedhead.sweep.runner import SweepConfig, SweepResult, run_sweep
from fedhead.sweep.scales import SCALES

__all__ = ["Manifest", "PRESETS", "SCALES", "RunSpec", "SweepConfig", "SweepResult", "plan", "run_sweep"]
