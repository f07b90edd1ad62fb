"""TensorBoard logging of a federation: per-round scalars, Gram ellipses, the diagnosis as text.

Uses :class:`torch.utils.tensorboard.SummaryWriter`; figures come from :mod:`fedhead.plots`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedhead import plots


def ellipse_figure(gram: np.ndarray, targets: Any, *, round_: int, gram0: np.ndarray | None = None):
    """Figure of ``G_t`` against ``G_star`` and ``G_cen`` (and ``G_within``, ``G_0``) as ellipses.

    Two-dimensional: the first two target coordinates (SPEC 11 displays).
    """
    grams = {f"G_{round_}": gram, "G_star": targets.g_star, "G_cen": targets.g_cen, "G_within": targets.g_within}
    styles = ["-", "--", "--", ":"]
    colors = ["C0", "C1", "C3", "C2"]
    if targets.g_star is None:  # undefined outside the fully active regime
        del grams["G_star"], styles[1], colors[1]
    if gram0 is not None:
        grams["G_0"] = gram0
        styles.append(":")
        colors.append("0.5")
    fig, (ax,) = plots.new_figure(1)
    plots.plot_ellipses(ax, grams, colors=colors, linestyles=styles, title=f"round {round_}")
    return fig


def diagnosis_markdown(diagnosis: Any) -> str:
    """The diagnosis as a Markdown bullet list (TensorBoard text)."""
    return "\n".join(f"- {line}" for line in diagnosis.format().splitlines())


class TensorBoardLogger:
    """Writes one federation's events into ``log_dir``."""

    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

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
            fig = ellipse_figure(record.gram, targets, round_=t, gram0=self._gram0)
            self.writer.add_figure("gram/ellipses", fig, global_step=t, close=True)
        self.writer.flush()

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
