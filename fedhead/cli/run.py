"""``fedhead-run``: the Hydra entry point of the simulation (see ``conf/config.yaml``)."""

from __future__ import annotations

import logging
import sys

from fedhead.driver.errors import debug_enabled, report, run_hydra_app
from fedhead.driver.logs import configure_run_logging
from fedhead.driver.simulation import run_experiment
from fedhead.settings.config import load_config


def main() -> None:
    """Console entry point ``fedhead-run`` (Hydra; see ``conf/config.yaml``)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # flwr's link state: plugin set-up chatter

    def _app(cfg) -> None:
        # imported when the command runs, not at start-up (--help stays fast)
        from hydra.core.hydra_config import HydraConfig

        out = HydraConfig.get().runtime.output_dir
        try:
            typed = load_config(cfg)
            configure_run_logging(typed.output_root(out))
            run_experiment(typed, out)
        except BaseException as exc:  # one line and an exit code (tracebacks with FEDHEAD_DEBUG=1)
            if isinstance(exc, SystemExit) or debug_enabled(cfg.get("debug")):
                raise
            sys.exit(report("fedhead-run", exc, unused_dir=out))

    run_hydra_app("fedhead-run", "config", _app)


if __name__ == "__main__":  # pragma: no cover
    main()
