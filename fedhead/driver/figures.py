"""PNG figures of a federation (error curves, ellipses) and of an experiment (procedures.png)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fedhead import plotting
from fedhead.driver.tensorboard import ellipse_figure
from fedhead.federation.tracking import Targets
from fedhead.plotting.canvas import FIGURE_LOCK
from fedhead.results.schema import Results

__all__ = ["write_run_figures", "write_procedures_figure"]


def write_run_figures(
    results: Results,
    targets: Targets | None,
    folder: Path,
    *,
    target_names: Sequence[str] | None,
    unit: str,
) -> list[Path]:
    """``error_curves.png`` ([`fedhead.plotting.run_error_figure`][fedhead.plotting.run_error_figure]) and, for
    ``C >= 2``, the final Gram ellipses ``ellipses.png`` with the data set's target names and unit, into ``folder``."""
    with FIGURE_LOCK:
        recs = results.rounds
        paths = [plotting.save_figure(plotting.run_error_figure(results), folder / "error_curves.png")]
        if targets is not None and recs[-1].gram.shape[0] >= 2:
            fig = ellipse_figure(
                recs[-1].gram,
                targets,
                round_=recs[-1].round,
                gram0=recs[0].gram,
                target_names=target_names,
                unit=unit,
                procedure=results.name,
            )
            paths.append(plotting.save_figure(fig, folder / "ellipses.png"))
        return paths


def write_procedures_figure(results: Sequence[Results], path: str | Path) -> Path:
    """``procedures.png`` of an experiment: per procedure, e_F to G_star and to G_cen per round
    with the diagnosis's predicted gap ([`fedhead.plotting.procedures_figure`][fedhead.plotting.procedures_figure])."""
    return plotting.save_figure(plotting.procedures_figure([r for r in results if r.rounds]), path)
