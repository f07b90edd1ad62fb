"""TensorBoard logging of a federation: per-round scalars, Gram ellipses, the diagnosis as text.

Uses :class:`torch.utils.tensorboard.SummaryWriter`; figures come from :mod:`fedhead.plots`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedhead import plots


def ellipse_figure(
    gram: np.ndarray,
    targets: Any,
    *,
    round_: int,
    gram0: np.ndarray | None = None,
    target_names: Sequence[str] | None = None,
    unit: str | None = None,
    procedure: str | None = None,
    view: str = "pairs",
):
    """Figure of ``G_t`` against ``G_star``, ``G_cen``, ``G_within`` (and ``G_0``) as ellipses.

    Delegates to :func:`fedhead.plots.gram_ellipse_figure` (palette colours, one panel per pair
    of target coordinates, a caption saying what an ellipse is and what is projected), titled
    ``"<procedure>: head Gram after round <t>"``.
    """
    grams = {"G_t": gram, "G_star": targets.g_star, "G_cen": targets.g_cen, "G_within": targets.g_within}
    if gram0 is not None:
        grams["G_0"] = gram0
    grams = {(f"G_{round_}" if k == "G_t" else k): v for k, v in grams.items()}
    return plots.gram_ellipse_figure(grams, target_names=target_names, unit=unit, procedure=procedure,
                                     round_=round_, view=view)  # G_star None: left out


def diagnosis_markdown(diagnosis: Any) -> str:
    """The diagnosis as a Markdown bullet list (TensorBoard text)."""
    return "\n".join(f"- {line}" for line in diagnosis.format().splitlines())


class TensorBoardLogger:
    """Writes one federation's events into ``log_dir``."""

    def __init__(self, log_dir: str | Path, *, target_names: Sequence[str] | None = None,
                 unit: str | None = None, procedure: str | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.target_names = None if target_names is None else list(target_names)
        self.unit = unit
        self.procedure = procedure

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self._gram0: np.ndarray | None = None

    def diagnosis(self, diagnosis: Any, *, title: str = "diagnosis") -> None:
        self.writer.add_text(title, diagnosis_markdown(diagnosis), global_step=0)
        for key in ("rel_gap", "share_mu", "share_sigma", "share_a", "bw_variance"):
            value = float(getattr(diagnosis, key))
            if np.isfinite(value):
                self.writer.add_scalar(f"diagnosis/{key}", value, 0)
        for i, m in enumerate(np.asarray(diagnosis.margins)):
            self.writer.add_scalar(f"diagnosis/margin_client_{i}", float(m), 0)
        self.writer.flush()

    def round(self, record: Any, targets: Any, *, ellipses: bool = True) -> None:
        """Every scalar of a :class:`fedhead.tracking.RoundRecord` and the ellipse picture."""
        t = int(record.round)
        for key, value in record.scalars().items():
            if value is not None and np.isfinite(value):
                self.writer.add_scalar(f"round/{key}", float(value), t)
        if t == 0:
            self._gram0 = np.asarray(record.gram)
        if ellipses and targets is not None and record.gram.shape[0] >= 2:
            fig = ellipse_figure(record.gram, targets, round_=t, gram0=self._gram0,
                                 target_names=self.target_names, unit=self.unit, procedure=self.procedure)
            self.writer.add_figure("gram/ellipses", fig, global_step=t, close=True)
        self.writer.flush()

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
