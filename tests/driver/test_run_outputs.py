"""What a researcher sees of a run: the console, run.log, TensorBoard events and figures.

An in-process federation (real ClientApp, free features, no Ray) of two procedures writing into
one run folder, with the logging of ``fedhead-run`` (:func:`fedhead.driver.logs.configure_run_logging`).
"""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from app_helpers import InProcessGrid

matplotlib.use("Agg")

from fedhead import plotting
from fedhead.clients import make_client_app
from fedhead.driver import logs
from fedhead.driver.checks import prepare_data
from fedhead.driver.console import start_line
from fedhead.driver.figures import write_procedures_figure
from fedhead.driver.recorder import RunRecorder, target_axes
from fedhead.driver.server import finish_job, serve
from fedhead.settings.config import compose_config, load_config

HOPPER_ACTIONS = ["thigh_joint", "leg_joint", "foot_joint"]


@pytest.fixture
def run_logging(tmp_path):
    stream = io.StringIO()
    path = logs.configure_run_logging(tmp_path / "out", stream=stream)
    try:
        yield stream, path
    finally:
        logs.remove_run_logging()


def _cfg(tmp_path: Path):
    return load_config(
        compose_config(
            [
                "dataset.n_train=240",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "model=free",
                "experiment.procedures=[proximal,corrected_proximal]",
                "rounds=2",
                "local_epochs=3",
                "num_clients=3",
                "output.tensorboard=true",
                "output.figures=true",
            ]
        )
    )


def test_console_and_run_log_of_a_run(tmp_path, task_identity, run_logging, monkeypatch):
    stream, log_path = run_logging
    cfg = _cfg(tmp_path)
    jobs = cfg.jobs(tmp_path / "out")
    logs.console.info("%s", start_line(cfg.experiment.name, jobs, tmp_path / "out"))
    prepare_data(jobs[0])  # the driver's data load: target names for the figures
    assert target_axes(jobs[0]) == (HOPPER_ACTIONS, "torque command")

    drawn = []
    real_save = plotting.save_figure

    def capture(fig, path, **kw):
        fig.canvas.draw()
        drawn.append((Path(path).name, fig))
        return real_save(fig, path, **kw)

    monkeypatch.setattr(plotting, "save_figure", capture)
    _emit_third_party_noise()
    results = []
    for job in jobs:
        rec = RunRecorder(job, show_progress=False)
        pgrid = serve(InProcessGrid(make_client_app(job), 3), job, rec, show_progress=False)
        finish_job(job, rec, pgrid, 0.0, 1.0)
        results.append(rec.results)
    write_procedures_figure(results, tmp_path / "out" / "procedures.png")
    _check_console(stream.getvalue(), tmp_path / "out")
    _check_run_log(log_path.read_text())
    _check_tensorboard(jobs)
    _check_figures(drawn, jobs, tmp_path / "out")
    assert np.isfinite(results[0].last.e_f_star)


def _emit_third_party_noise() -> None:
    """Third-party log lines and warnings that must stay off the console (and go to run.log)."""
    logging.getLogger("flwr").warning("DEPRECATED FEATURE: run_simulation")
    logging.getLogger("alembic.runtime.plugins").info("setup plugin alembic.autogenerate.schemas")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn_explicit(
            "Tip: In future versions of Ray", FutureWarning, "/site-packages/ray/_private/worker.py", 2051
        )


def _check_console(text: str, out: Path) -> None:
    """The start line, the diagnosis once, one line per round per procedure, and fedhead's advice only."""
    lines = text.splitlines()
    assert lines[0].startswith("fedhead-run") and str(out) in lines[0] and "run.log" in lines[0]
    assert sum(line.startswith("Diagnosis") for line in lines) == 1
    assert lines[1].startswith("Diagnosis") and "relative gap" in "\n".join(lines[2:6])
    rounds = [line for line in lines if line.startswith("[") and "] round " in line]
    assert [r.split(":")[0] for r in rounds] == [
        f"[{p}] round {t}/2" for p in ("proximal", "corrected_proximal") for t in range(3)
    ]
    assert all("e_F(G_t, G_star)" in r and "e_F(G_t, G_cen)" in r for r in rounds)
    rest = [line for line in lines[6:] if line not in rounds]
    assert all(line.startswith("WARNING: [") for line in rest), rest  # only fedhead's own advice
    for noise in ("alembic", "DEPRECATED", "FutureWarning", "HeadAveraging", "running procedure"):
        assert noise not in text


def _check_run_log(log_text: str) -> None:
    """run.log holds everything, third-party lines included."""
    for expected in (
        "[alembic.runtime.plugins][INFO]",
        "[flwr][WARNING] DEPRECATED",
        "FutureWarning",
        "[fedhead.console][INFO] [proximal] round 2/2",
        "HeadAveraging",
    ):
        assert expected in log_text, expected


def _check_tensorboard(jobs) -> None:
    """The same tags in every procedure's TensorBoard folder, the text summaries and the hparams."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    for job in jobs:
        acc = EventAccumulator(str(job.output_dir / "tensorboard"), size_guidance={"tensors": 0, "images": 0})
        acc.Reload()
        tags = acc.Tags()
        for tag in (
            "e_F/G_star",
            "e_F/G_cen",
            "e_F/G_within",
            "e_F/reference",
            "direction/G_star",
            "diagnosis/rel_gap",
        ):
            assert tag in tags["scalars"], (job.name, tag)
        assert [e.step for e in acc.Scalars("e_F/G_star")] == [0, 1, 2]
        assert not [t for t in tags["scalars"] if t.startswith("round/e_f")]
        assert "gram/ellipses" in tags["images"] and len(acc.Images("gram/ellipses")) == 3
        texts = {t: acc.Tensors(t) for t in tags["tensors"] if t.endswith("text_summary")}
        assert set(texts) == {"diagnosis/text_summary", "summary/text_summary"}
        assert len(texts["diagnosis/text_summary"]) == 1
        diag = texts["diagnosis/text_summary"][0].tensor_proto.string_val[0].decode()
        assert "relative gap" in diag
        content = acc.PluginTagToContent("hparams")
        parsed = {tag: HParamsPluginData.FromString(c) for tag, c in content.items()}
        exp = next(p.experiment for p in parsed.values() if p.HasField("experiment"))
        assert {m.name.tag for m in exp.metric_infos} == {"e_F/G_star", "e_F/G_cen", "e_F/reference"}
        start = next(p.session_start_info for p in parsed.values() if p.HasField("session_start_info"))
        assert start.hparams["procedure"].string_value == job.name
        assert start.hparams["dataset"].string_value == "hopper"
        assert start.hparams["rounds"].number_value == 2 and start.hparams["num_clients"].number_value == 3
        end = next(p.session_end_info for p in parsed.values() if p.HasField("session_end_info"))
        assert end.status == 1  # STATUS_SUCCESS


def _check_figures(drawn, jobs, out: Path) -> None:
    """Error curves and ellipses per procedure (target names and unit), and the procedures figure."""
    names = [n for n, _ in drawn]
    assert names == ["error_curves.png", "ellipses.png"] * 2 + ["procedures.png"]
    for (name, fig), proc in zip(drawn[:4], ("proximal", "proximal", "corrected_proximal", "corrected_proximal")):
        if name == "error_curves.png":
            assert fig.axes[0].get_title().startswith(f"{proc}: head Gram error per round")
            continue
        assert fig.get_suptitle() == f"{proc}: head Gram after round 2"
        labels = {ax.get_xlabel() for ax in fig.axes} | {ax.get_ylabel() for ax in fig.axes}
        assert labels == {f"{n} (torque command)" for n in HOPPER_ACTIONS}
    fig = drawn[-1][1]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "proximal" in legend and "corrected_proximal" in legend
    assert sum("predicted gap" in s for s in legend) == 2
    assert (out / "procedures.png").stat().st_size > 0
    for job in jobs:
        res = job.output_dir / "results.json"
        assert res.is_file() and (job.output_dir / "ellipses.png").is_file()


def test_console_filter_keeps_actionable_warnings_only(tmp_path):
    stream = io.StringIO()
    try:
        logs.configure_run_logging(tmp_path, stream=stream)
        logging.getLogger("fedhead.strategies.x").warning("a client failed: raise local_epochs")
        logging.getLogger("ray").warning("ray internals")
        logging.getLogger("flwr").error("a ClientApp raised (reported by the driver)")
        logging.getLogger("ray").error("a worker died")
        logging.getLogger("fedhead.driver.simulation").info("details for the log")
        logs.console.info("for the console")
    finally:
        logs.remove_run_logging()
    assert stream.getvalue().splitlines() == [
        "WARNING: a client failed: raise local_epochs",
        "ERROR: a worker died",
        "for the console",
    ]
    assert "ray internals" in (tmp_path / "run.log").read_text()
    assert "details for the log" in (tmp_path / "run.log").read_text()
