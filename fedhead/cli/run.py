"""``fedhead-run``: the Hydra entry point of the simulation (see ``conf/config.yaml``)."""

from __future__ import annotations

import logging
import sys

from fedhead.driver.errors import check_overrides, debug_enabled, report
from fedhead.driver.logs import configure_run_logging
from fedhead.driver.simulation import run_experiment
from fedhead.federation.config import hydra_config_path, load_config


def main() -> None:
    """Console entry point ``fedhead-run`` (Hydra; see ``conf/config.yaml``)."""
    # imported when the command runs, not at start-up (--help stays fast)
    import hydra

    logging.getLogger("alembic").setLevel(logging.WARNING)  # flwr's link state: plugin set-up chatter
    check_overrides("fedhead-run", "config")

    @hydra.main(config_path=hydra_config_path(), config_name="config", version_base=None)
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

    _app()


if __name__ == "__main__":  # pragma: no cover
    main()
