"""Sweeps of the network experiments (``fedhead-sweep``): presets, packing runs, the manifest.

* [`fedhead.sweep.presets`][fedhead.sweep.presets]: the named presets as pure lists of
  [`RunSpec`][fedhead.sweep.RunSpec] ([`fedhead.sweep.specs`][fedhead.sweep.specs]: one run, its
  overrides);
* [`fedhead.sweep.manifest`][fedhead.sweep.manifest]: ``<out>/manifest.json``, written atomically after every run;
* [`fedhead.sweep.runner`][fedhead.sweep.runner]: skip finished runs, check data, pack runs into simulations;
* [`fedhead.cli.sweep`][fedhead.cli.sweep]: the Hydra entry point (``conf/sweep.yaml``).
"""

from fedhead.sweep.manifest import Manifest
from fedhead.sweep.presets import PRESETS, plan
from fedhead.sweep.runner import SweepConfig, SweepResult, run_sweep
from fedhead.sweep.scales import SCALES
from fedhead.sweep.specs import RunSpec

__all__ = ["Manifest", "PRESETS", "SCALES", "RunSpec", "SweepConfig", "SweepResult", "plan", "run_sweep"]
