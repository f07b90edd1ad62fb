"""TensorBoard events of a federation: per-round scalars, Gram ellipses, the diagnosis, the hyperparameters.

Every procedure writes into ``<run dir>/<procedure>/tensorboard`` with the same tags
([`TensorBoardLogger`][fedhead.driver.tensorboard.TensorBoardLogger] lists them), so
``tensorboard --logdir <run dir>`` draws the procedures of a run in one chart per tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedhead import plotting


def ellipse_figure(
    gram: np.ndarray,
    targets: Any,
    *,
    round_: int,
    gram0: np.ndarray | None = None,
    target_names: Sequence[str] | None = None,
    unit: str | None = None,
    procedure: str | None = None,
    view: Literal["pairs", "3d"] = "pairs",
):
    """Figure of ``G_t`` against ``G_star``, ``G_cen``, ``G_within`` (and ``G_0``) as ellipses.

    Delegates to [`fedhead.plotting.gram_ellipse_figure`][fedhead.plotting.gram_ellipse_figure] (palette colours, one
    panel per pair of target coordinates, a caption saying what an ellipse is and what is projected), titled
    ``"<procedure>: head Gram after round <t>"``.
    """
    grams = {"G_t": gram, "G_star": targets.g_star, "G_cen": targets.g_cen, "G_within": targets.g_within}
    if gram0 is not None:
        grams["G_0"] = gram0
    grams = {(f"G_{round_}" if k == "G_t" else k): v for k, v in grams.items()}
    return plotting.gram_ellipse_figure(
        grams, target_names=target_names, unit=unit, procedure=procedure, round_=round_, view=view
    )  # G_star None: left out


#: RoundRecord field -> TensorBoard tag (the same in every procedure's folder)
SCALAR_TAGS = {
    "e_f_star": "e_F/G_star",
    "e_f_cen": "e_F/G_cen",
    "e_f_within": "e_F/G_within",
    "e_f_recursion": "e_F/recursion",
    "e_f_reference": "e_F/reference",
    "d_star": "direction/G_star",
    "d_cen": "direction/G_cen",
    "d_within": "direction/G_within",
}
#: the hparams plugin's metrics (scalar tags of every run)
HPARAM_METRICS = ("e_F/G_star", "e_F/G_cen", "e_F/reference")


def scalar_tag(key: str) -> str:
    """TensorBoard tag of a
    [`fedhead.federation.tracking.RoundRecord.scalars`][fedhead.results.rounds.RoundRecord.scalars] key."""
    return SCALAR_TAGS.get(key, f"round/{key}")


def diagnosis_markdown(diagnosis: Any) -> str:
    """The diagnosis as a Markdown bullet list (TensorBoard text)."""
    return "\n".join(f"- {line}" for line in diagnosis.format().splitlines())


class TensorBoardLogger:
    """Writes one federation's events into ``log_dir``.

    Tags: ``e_F/<reference>`` and ``direction/<reference>`` ([`SCALAR_TAGS`][fedhead.driver.tensorboard.SCALAR_TAGS]),
    ``round/<key>`` for every other per-round scalar, ``diagnosis/<key>`` and the ``diagnosis``
    text at step 0, the ``summary`` text at the end, the ``gram/ellipses`` image of every round,
    and the run's hyperparameters with the metrics
    [`HPARAM_METRICS`][fedhead.driver.tensorboard.HPARAM_METRICS] (TensorBoard's HParams tab).
    """

    def __init__(
        self,
        log_dir: str | Path,
        *,
        target_names: Sequence[str] | None = None,
        unit: str | None = None,
        procedure: str | None = None,
    ):
        # TensorBoard (slow to import): only when a run writes events
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
        """Every scalar of a [`fedhead.federation.tracking.RoundRecord`][fedhead.results.rounds.RoundRecord] and
        (``ellipses``) the ellipse picture; with ``ellipses=False`` draw it later with
        [`ellipses`][fedhead.driver.tensorboard.TensorBoardLogger.ellipses] (the recorder does, off the server's
        critical path)."""
        t = int(record.round)
        for key, value in record.scalars().items():
            if value is not None and np.isfinite(value):
                self.writer.add_scalar(scalar_tag(key), float(value), t)
        if t == 0:
            self._gram0 = np.asarray(record.gram)
        if ellipses:
            self.ellipses(record, targets, gram0=self._gram0)
        self.writer.flush()

    def ellipses(self, record: Any, targets: Any, *, gram0: np.ndarray | None = None) -> None:
        """The ``gram/ellipses`` image of round ``record.round`` (``gram0``: the round-0 Gram drawn
        beside it; the one [`round`][fedhead.driver.tensorboard.TensorBoardLogger.round] kept by default)."""
        if targets is None or record.gram.shape[0] < 2:
            return
        from fedhead.plotting.canvas import FIGURE_LOCK

        t = int(record.round)
        with FIGURE_LOCK:  # figures are drawn from several threads (background drawing, concurrent jobs)
            fig = ellipse_figure(
                record.gram,
                targets,
                round_=t,
                gram0=self._gram0 if gram0 is None else gram0,
                target_names=self.target_names,
                unit=self.unit,
                procedure=self.procedure,
            )
            self.writer.add_figure("gram/ellipses", fig, global_step=t, close=True)
        self.writer.flush()

    def hparams(self, values: dict[str, Any], metrics: Sequence[str] = HPARAM_METRICS) -> None:
        """The run's hyperparameters for TensorBoard's hparams plugin (into this run's folder, so
        the plugin pairs them with this run's scalars ``metrics``; the session ends in
        [`finish`][fedhead.driver.tensorboard.TensorBoardLogger.finish])."""
        # TensorBoard (slow to import): only when a run writes events
        from torch.utils.tensorboard.summary import hparams

        clean = {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in values.items()}
        exp, ssi, _ = hparams(clean, {m: 0.0 for m in metrics})
        fw = self.writer._get_file_writer()
        fw.add_summary(exp)
        fw.add_summary(ssi)
        self.writer.flush()

    def finish(self, status: str) -> None:
        """End the hparams session: ``completed``/``diagnosed`` -> success, else failure."""
        # TensorBoard (slow to import): only when a run writes events
        # the *_pb2 modules build their classes at import time and ship no stubs: pyright cannot see the names
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.plugins.hparams.api_pb2 import Status  # pyright: ignore[reportAttributeAccessIssue]
        from tensorboard.plugins.hparams.metadata import PLUGIN_DATA_VERSION, PLUGIN_NAME, SESSION_END_INFO_TAG
        from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo  # pyright: ignore[reportAttributeAccessIssue]

        code = "STATUS_SUCCESS" if status in ("completed", "diagnosed") else "STATUS_FAILURE"
        content = HParamsPluginData(
            session_end_info=SessionEndInfo(status=Status.Value(code)), version=PLUGIN_DATA_VERSION
        )
        smd = SummaryMetadata(
            plugin_data=SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content.SerializeToString())
        )
        self.writer._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag=SESSION_END_INFO_TAG, metadata=smd)])
        )
        self.writer.flush()

    def text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
